// Who may call what: the one authorization table of pscluster, and the Authorizer every
// pscluster service asks before it does anything with a call.
//
// The table maps each method's full name ("pscluster.v1.Scheduler.SubmitJob") to the roles
// allowed to call it. authz_test enumerates every method of every pscluster service from the
// protobuf descriptors, so a new RPC without an entry fails the build's tests. Health checking
// (grpc.health.v1) and server reflection are not pscluster services and stay open.
//
// A caller is identified by a bearer token ("authorization: Bearer <token>" metadata, looked up
// by its hash in the daemon's token file) or, without a token, by its verified TLS client
// certificate (subject alternative names, else common name), whose roles come from the token
// file's line for that identity name.
//
// Thread model: Check() is thread-safe and called on gRPC's threads; Reload() (SIGHUP) swaps the
// token file atomically, so a call sees either the old or the new file, never a mix.
#ifndef PSCLUSTER_COMMON_AUTHZ_H_
#define PSCLUSTER_COMMON_AUTHZ_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/token_file.h"
#include "grpcpp/server_context.h"

namespace pscluster {

// The roles allowed to call `method` (a full method name as the descriptor spells it), or
// nullptr when the table has no entry for it (such a call is refused).
const RoleSet* AllowedRoles(absl::string_view method);

// Every entry of the table, for tests and documentation.
const std::vector<std::pair<std::string, RoleSet>>& AuthorizationTable();

class Authorizer {
 public:
  // `token_file` empty: every call is allowed (the open mode of a daemon started without
  // --token_file). Otherwise the file is loaded; errors name the file and line.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const std::string& token_file);

  bool enabled() const { return !path_.empty(); }

  // Reads the token file again; on error the previous one stays in force.
  absl::Status Reload();

  // OK when the caller of `method` may call it. UNAUTHENTICATED when it presents no credential
  // or a token not in the file; PERMISSION_DENIED naming the role needed otherwise. `who`, when
  // given, is set to the caller's identity name once it is known ("" otherwise).
  absl::Status Check(const grpc::ServerContextBase& ctx, absl::string_view method,
                     std::string* who = nullptr) const;

  // The same decision for a call that is not gRPC (the scheduler's web status page):
  // `authorization` is the request's Authorization header ("" = none), "Bearer <token>".
  // UNAUTHENTICATED without one or with a token not in the file; PERMISSION_DENIED naming the
  // role needed otherwise. OK when the authorizer is not enabled.
  absl::Status CheckBearer(absl::string_view authorization, absl::string_view method) const;

  // The decision for a caller already identified (`identity` nullptr = a token not in the
  // file); Check() ends here.
  static absl::Status Decide(absl::string_view method, const Identity* identity);

 private:
  explicit Authorizer(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenFile> file_ ABSL_GUARDED_BY(mu_);
};

// Logs at start how the daemon `component` authenticates callers: which token file, or a
// warning that anyone reaching its port controls it.
void LogAuthMode(absl::string_view component, const Authorizer& authz, bool mutual_tls);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_AUTHZ_H_
