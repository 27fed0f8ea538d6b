// The BackupTransport of a PsServer: a chunk or an end-of-step marker goes over the backup's TCP
// data port when it offers one (server/client/dialer.h; TLS when the cluster runs with TLS,
// authenticated with the job's data secret as the pseudo-worker kReplicaWorker), else as a gRPC
// Replicate call; parts of a snapshot always go over gRPC. One channel and one data connection
// per backup (and job, when jobs have secrets), kept for reuse.
#ifndef PSCLUSTER_SERVER_NETWORK_BACKUP_TRANSPORT_H_
#define PSCLUSTER_SERVER_NETWORK_BACKUP_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "common/tls.h"
#include "server/backup_transport.h"

namespace pscluster {

// `credential`: the bearer token sent to the backups; `secret_of(job_id)`: the job's data secret
// (empty: none).
std::shared_ptr<BackupTransport> NewNetworkBackupTransport(
    TlsFiles tls, std::string credential,
    std::function<std::string(const std::string& job_id)> secret_of);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_NETWORK_BACKUP_TRANSPORT_H_
