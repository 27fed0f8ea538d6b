// PsHandler: the data secrets of jobs and the check of a data connection's proof
// (common/data_auth.h, server/tcp_data_server.h).
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/ps_handler.h"

namespace pscluster {

absl::Status PsHandler::SetDataSecret(const std::string& job_id, const std::string& secret) {
  if (secret.size() != kDataSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data_secret: ", secret.size(), " bytes (",
                                                   kDataSecretBytes, " expected)"));
  }
  absl::MutexLock l(&secrets_mu_);
  auto [it, inserted] = data_secrets_.emplace(job_id, secret);
  if (!inserted && !SameSecret(it->second, secret)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "data_secret: job ", job_id, " already has a different data secret on this server"));
  }
  return absl::OkStatus();
}

std::string PsHandler::DataSecret(const std::string& job_id) const {
  absl::MutexLock l(&secrets_mu_);
  auto it = data_secrets_.find(job_id);
  return it == data_secrets_.end() ? std::string() : it->second;
}

absl::StatusOr<bool> PsHandler::AuthenticateData(const DataAuth& hello, const std::string& proof,
                                                 const std::string& nonce, bool proof_required,
                                                 const std::string& peer) const {
  auto refuse = [&](absl::Status st) {
    Logger("server")->warn("data connection {} refused: {}", peer, st.message());
    return st;
  };
  if (proof.empty()) {
    if (proof_required) {
      return refuse(absl::UnauthenticatedError(absl::StrCat(
          "data connection for job ", hello.job_id, " gave no proof of the job's data secret; "
          "this server authenticates its callers (--token_file or TLS)")));
    }
    return false;
  }
  const std::string secret = DataSecret(hello.job_id);
  if (secret.empty()) {
    return refuse(absl::UnavailableError(absl::StrCat(
        "job ", hello.job_id, " has no data secret on this server yet (its shard map from the "
        "scheduler has not arrived)")));
  }
  if (!SameSecret(proof, DataAuthProof(secret, nonce, hello.job_id, hello.worker, hello.attempt))) {
    return refuse(absl::PermissionDeniedError(absl::StrCat(
        "data connection for job ", hello.job_id, " (worker ", hello.worker,
        "): wrong proof of the job's data secret")));
  }
  if (hello.worker != kReplicaWorker) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock l(&mu_);
      auto it = jobs_.find(hello.job_id);
      if (it != jobs_.end()) job = it->second;
    }
    if (job != nullptr) {
      absl::Status fenced = job->CheckAttempt(hello.worker, hello.attempt, "attempt");
      if (!fenced.ok()) return refuse(fenced);
    }
  }
  return true;
}

absl::Status PsHandler::CheckGrpcDataProof(const std::string& job, uint32_t worker,
                                           const GrpcDataProof& proof) const {
  if (DataSecret(job).empty()) return absl::OkStatus();
  absl::Status st;
  if (!proof.present) {
    st = absl::UnauthenticatedError(absl::StrCat(
        "job ", job, " takes data over gRPC only from calls that prove its data secret (",
        kGrpcDataAuthKey, " metadata)"));
  } else if (!proof.malformed.ok()) {
    st = absl::UnauthenticatedError(proof.malformed.message());
  } else if (worker != proof.claim.worker) {
    st = absl::PermissionDeniedError(absl::StrCat("this call proves worker ", proof.claim.worker,
                                                  " of job ", job, ", not worker ", worker));
  }
  if (!st.ok()) {
    Logger("server")->warn("gRPC data call {} refused: {}", proof.peer, st.message());
    return st;
  }
  // Checks the proof and the attempt's fencing, and logs a refusal.
  DataAuth hello{job, proof.claim.worker, proof.claim.attempt, ""};
  absl::StatusOr<bool> ok =
      AuthenticateData(hello, proof.claim.proof, kGrpcDataNonce, true, proof.peer);
  return ok.status();
}

}  // namespace pscluster
