#include "common/authz.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace pscluster {
namespace {

constexpr RoleSet kAdmin = Roles(Role::kAdmin);
constexpr RoleSet kRead = Role::kAdmin | Role::kViewer;
constexpr RoleSet kNode = Roles(Role::kNode);
constexpr RoleSet kScheduler = Roles(Role::kScheduler);
constexpr RoleSet kWorker = Roles(Role::kWorker);
constexpr RoleSet kServer = Roles(Role::kServer);

// THE authorization table. Keep it in the order of the .proto files; authz_test checks that
// every method of every pscluster service has exactly one entry.
const std::vector<std::pair<std::string, RoleSet>>& Table() {
  static const auto* table = new std::vector<std::pair<std::string, RoleSet>>{
      // Scheduler: the user's CLI (admin, viewer) and the nodes (node).
      {"pscluster.v1.Scheduler.RegisterNode", kNode},
      {"pscluster.v1.Scheduler.Heartbeat", kNode},
      {"pscluster.v1.Scheduler.Deregister", kNode},
      {"pscluster.v1.Scheduler.SubmitJob", kAdmin},
      {"pscluster.v1.Scheduler.GetJob", kRead},
      {"pscluster.v1.Scheduler.ListJobs", kRead},
      {"pscluster.v1.Scheduler.CancelJob", kAdmin},
      // Workers fetch the map they route by.
      {"pscluster.v1.Scheduler.GetShardMap", kRead | Role::kNode},
      {"pscluster.v1.Scheduler.ReportProgress", kNode},
      {"pscluster.v1.Scheduler.ClusterStatus", kRead},
      {"pscluster.v1.Scheduler.MoveShard", kAdmin},
      {"pscluster.v1.Scheduler.CheckpointJob", kAdmin},
      {"pscluster.v1.Scheduler.ExportJob", kAdmin},
      // An entrypoint task's output, proxied from its worker.
      {"pscluster.v1.Scheduler.GetTaskLogs", kRead},
      {"pscluster.v1.Scheduler.ScaleJob", kAdmin},
      {"pscluster.v1.Scheduler.DrainServer", kAdmin},
      {"pscluster.v1.Scheduler.UndrainServer", kAdmin},
      // ParameterServer: the scheduler's control calls, the workers' data plane, replication.
      // A task creates its job's tables (idempotent) and installs the shard map it was given, so
      // CreateTables and UpdateShardMap also take the worker role.
      {"pscluster.v1.ParameterServer.CreateTables", kScheduler | Role::kWorker},
      {"pscluster.v1.ParameterServer.UpdateShardMap", kScheduler | Role::kWorker},
      {"pscluster.v1.ParameterServer.Pull", kWorker},
      {"pscluster.v1.ParameterServer.Push", kWorker},
      {"pscluster.v1.ParameterServer.PushPull", kWorker},
      {"pscluster.v1.ParameterServer.Checkpoint", kScheduler},
      {"pscluster.v1.ParameterServer.Restore", kScheduler},
      {"pscluster.v1.ParameterServer.Export", kScheduler},
      {"pscluster.v1.ParameterServer.DropJob", kScheduler},
      // Workers ask for the data sockets; a server asks a backup before replicating to it.
      {"pscluster.v1.ParameterServer.Status",
       kRead | Role::kScheduler | Role::kWorker | Role::kServer},
      {"pscluster.v1.ParameterServer.FenceWorker", kScheduler},
      {"pscluster.v1.ParameterServer.Replicate", kServer},
      // A lead worker exporting a model over the user's keys asks which keys hold rows.
      {"pscluster.v1.ParameterServer.ListKeys", kWorker},
      // WorkerControl: the scheduler drives the tasks.
      {"pscluster.v1.WorkerControl.AssignTask", kScheduler},
      {"pscluster.v1.WorkerControl.StopTask", kScheduler},
      {"pscluster.v1.WorkerControl.UpdateShardMap", kScheduler},
      {"pscluster.v1.WorkerControl.UpdatePartition", kScheduler},
      {"pscluster.v1.WorkerControl.Status", kRead | Role::kScheduler},
      {"pscluster.v1.WorkerControl.ExportModel", kScheduler},
      {"pscluster.v1.WorkerControl.GetTaskLogs", kRead | Role::kScheduler},
  };
  return *table;
}

const absl::flat_hash_map<std::string, RoleSet>& Index() {
  static const auto* index = [] {
    auto* m = new absl::flat_hash_map<std::string, RoleSet>();
    for (const auto& [method, roles] : Table()) m->emplace(method, roles);
    return m;
  }();
  return *index;
}

absl::string_view ToView(const grpc::string_ref& s) { return {s.data(), s.size()}; }

}  // namespace

const RoleSet* AllowedRoles(absl::string_view method) {
  auto it = Index().find(method);
  return it == Index().end() ? nullptr : &it->second;
}

const std::vector<std::pair<std::string, RoleSet>>& AuthorizationTable() { return Table(); }

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const std::string& token_file) {
  std::unique_ptr<Authorizer> a(new Authorizer(token_file));
  if (token_file.empty()) return a;
  absl::Status s = a->Reload();
  if (!s.ok()) return s;
  return a;
}

absl::Status Authorizer::Reload() {
  if (path_.empty()) return absl::OkStatus();
  auto file = TokenFile::Load(path_);
  if (!file.ok()) return file.status();
  auto shared = std::make_shared<const TokenFile>(std::move(*file));
  absl::MutexLock l(&mu_);
  file_ = std::move(shared);
  return absl::OkStatus();
}

absl::Status Authorizer::Decide(absl::string_view method, const Identity* identity) {
  const RoleSet* allowed = AllowedRoles(method);
  if (allowed == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, ": no entry in the authorization table; refused"));
  }
  if (identity == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": the token is not in this daemon's token file"));
  }
  if ((identity->roles & *allowed) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(method, " needs role ", RoleSetText(*allowed),
                                                    "; '", identity->name, "' has ",
                                                    RoleSetText(identity->roles, ",")));
  }
  return absl::OkStatus();
}

absl::Status Authorizer::Check(const grpc::ServerContextBase& ctx, absl::string_view method,
                               std::string* who) const {
  if (who != nullptr) who->clear();
  if (!enabled()) return absl::OkStatus();
  std::shared_ptr<const TokenFile> file;
  {
    absl::MutexLock l(&mu_);
    file = file_;
  }
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    absl::string_view value = ToView(it->second);
    if (!absl::StartsWithIgnoreCase(value, "Bearer ")) {
      return absl::UnauthenticatedError(
          absl::StrCat(method, ": the authorization header is not 'Bearer <token>'"));
    }
    const Identity* id = file->FindByToken(value.substr(7));
    if (id != nullptr && who != nullptr) *who = id->name;
    return Decide(method, id);
  }
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    std::vector<grpc::string_ref> names = auth->GetPeerIdentity();
    for (const auto& cn : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      names.push_back(cn);
    }
    for (const auto& name : names) {
      const Identity* id = file->FindByName(ToView(name));
      if (id != nullptr) {
        if (who != nullptr) *who = id->name;
        return Decide(method, id);
      }
    }
    return absl::PermissionDeniedError(
        absl::StrCat(method, ": the client certificate's identity ",
                     names.empty() ? std::string("(none)") : std::string(ToView(names.front())),
                     " has no line in this daemon's token file"));
  }
  return absl::UnauthenticatedError(
      absl::StrCat(method,
                   ": no credential; send a bearer token (psctl --token_file, a daemon's "
                   "--credential_file) or a client certificate"));
}

absl::Status Authorizer::CheckBearer(absl::string_view authorization,
                                     absl::string_view method) const {
  if (!enabled()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": no credential; send 'Authorization: Bearer <token>'"));
  }
  if (!absl::StartsWithIgnoreCase(authorization, "Bearer ")) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, ": the authorization header is not 'Bearer <token>'"));
  }
  std::shared_ptr<const TokenFile> file;
  {
    absl::MutexLock l(&mu_);
    file = file_;
  }
  return Decide(method, file->FindByToken(authorization.substr(7)));
}

void LogAuthMode(absl::string_view component, const Authorizer& authz, bool mutual_tls) {
  auto log = Logger(std::string_view(component.data(), component.size()));
  if (authz.enabled()) {
    log->info(
        "callers authenticated (bearer tokens{}) and authorized by role; health checking "
        "and reflection stay open",
        mutual_tls ? " and client certificates" : "");
  } else if (mutual_tls) {
    log->warn(
        "no --token_file: any holder of a certificate from --tls_ca may call every method "
        "with every role");
  } else {
    log->warn(
        "no --token_file: authentication is OFF; anyone who can reach this port controls "
        "the cluster (use only on loopback or a trusted network)");
  }
}

}  // namespace pscluster
