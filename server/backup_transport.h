// How a primary's copies reach the servers that back its shards: each item of replication (a
// chunk applied here, an end-of-step marker, a part of a live copy's snapshot) is one Replicate
// call to the server at `address`. BackupQueue (backup_queue.h) keeps the items of one backup in
// order and retries them over a transport; PsHandler owns one transport for all its backups.
//
// Implementations: over the network (network_backup_transport.h: the backup's TCP data port
// when it offers one, else its gRPC Replicate); in this process, for tests without sockets
// (testing/in_process_backup_transport.h).
//
// Thread model: Send is called from several threads at once.
#ifndef PSCLUSTER_SERVER_BACKUP_TRANSPORT_H_
#define PSCLUSTER_SERVER_BACKUP_TRANSPORT_H_

#include <string>

#include "absl/status/status.h"
#include "proto/ps.pb.h"
#include "server/payload.h"

namespace pscluster {

class BackupTransport {
 public:
  virtual ~BackupTransport() = default;
  // Delivers `req` to the server at `address`; the chunk's values are `values` (kept out of
  // `req`, so that they can go without a copy). An error names the backup.
  virtual absl::Status Send(const std::string& address, const v1::ReplicateRequest& req,
                            const Payload& values) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_BACKUP_TRANSPORT_H_
