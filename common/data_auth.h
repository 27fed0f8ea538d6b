// Authentication of the fast data plane (the TCP and Unix data sockets of ps_server).
//
// Each job has a data secret: 32 bytes the scheduler derives from its cluster key and the job id
// and hands to the job's servers (UpdateShardMapRequest.data_secret) and tasks
// (AssignTaskRequest.data_secret), never to anyone else. A data connection proves that it
// knows the secret before its first message, by a challenge-response: the server sends a fresh
// random nonce, the client answers with HMAC-SHA256(secret, context) where the context binds the
// nonce, the job, the worker and its attempt (so a proof is worth nothing on another connection,
// for another job or for another attempt). The connection is then bound to that job: messages
// for any other job are refused. The frames are in server/tcp_frame.h.
#ifndef PSCLUSTER_COMMON_DATA_AUTH_H_
#define PSCLUSTER_COMMON_DATA_AUTH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

inline constexpr size_t kDataSecretBytes = 32;
inline constexpr size_t kDataNonceBytes = 32;
inline constexpr size_t kDataProofBytes = 32;
// The `worker` a server names when it copies a primary's updates to a backup.
inline constexpr uint32_t kReplicaWorker = 0xFFFFFFFFu;

// What a client proves on a data connection: the job, who it is, and the job's secret (empty:
// the client has none and asks for an unauthenticated connection).
struct DataAuth {
  std::string job_id;
  uint32_t worker = 0;
  uint32_t attempt = 0;
  std::string secret;
};

// `n` bytes from OpenSSL's random generator.
absl::StatusOr<std::string> RandomBytes(size_t n);

// The job's data secret: HMAC-SHA256(cluster_key, "pscluster job data secret v1" | job_id).
std::string DeriveJobDataSecret(absl::string_view cluster_key, absl::string_view job_id);

// HMAC-SHA256(secret, "pscluster data auth v1" | nonce | job_id | worker | attempt), the
// lengths and integers fixed-width little-endian so that no two contexts share an encoding.
std::string DataAuthProof(absl::string_view secret, absl::string_view nonce,
                          absl::string_view job_id, uint32_t worker, uint32_t attempt);

// gRPC data calls (Pull, Push, PushPull) have no challenge round: they carry their proof in the
// call's metadata `x-pscluster-data-auth` as "<worker>:<attempt>:<proof in hex>", the proof
// DataAuthProof(secret, kGrpcDataNonce, job, worker, attempt). It binds the job, the rank and
// the attempt, not the call: like the bearer token beside it, only TLS keeps it from whoever
// watches the traffic.
inline constexpr char kGrpcDataAuthKey[] = "x-pscluster-data-auth";
inline constexpr char kGrpcDataNonce[] = "pscluster grpc data call v1";

// The metadata value proving `auth` (empty when auth.secret is empty: nothing to prove).
std::string GrpcDataAuthValue(const DataAuth& auth);

// A parsed metadata value: who the call says it is and its proof (bytes).
struct GrpcDataClaim {
  uint32_t worker = 0;
  uint32_t attempt = 0;
  std::string proof;
};
// INVALID_ARGUMENT naming what is malformed.
absl::StatusOr<GrpcDataClaim> ParseGrpcDataAuth(absl::string_view value);

// Constant-time comparison (false when the sizes differ).
bool SameSecret(absl::string_view a, absl::string_view b);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_DATA_AUTH_H_
