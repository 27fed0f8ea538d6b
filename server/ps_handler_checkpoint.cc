// PsHandler's checkpoints, restores and exports: files written under the job's checkpoint
// directory (newest kept, older pruned), restored for recovery, exported as safetensors.
#include "server/ps_handler.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/path_root.h"
#include "common/sharding.h"
#include "common/validate_enums.h"
#include "server/validate.h"

namespace pscluster {
namespace {

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status PsHandler::RestoreForRecovery(Job& job, const v1::UpdateShardMapRequest& req) {
  for (int i = 0; i < req.restore_from_size(); ++i) {
    const std::string& path = req.restore_from(i);
    absl::Status in_root =
        CheckUnderRoot(path, options_.checkpoint_root, absl::StrCat("restore_from[", i, "]"));
    if (!in_root.ok()) return in_root;
    auto file = OpenCheckpointFile(fs(), path);  // Read a piece at a time.
    if (!file.ok()) {
      return absl::Status(file.status().code(), absl::StrCat("restore_from[", i, "]: ",
                                                             file.status().message()));
    }
    auto r = job.Restore(**file, path);
    if (!r.ok()) return r.status();
    if (r->first != req.restore_step()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "restore_from[", i, "]: checkpoint ", path, " is at step ", r->first,
          ", the recovery resumes from step ", req.restore_step()));
    }
  }
  job.RewindClocks(req.restore_step());
  Logger("server")->info("job '{}': recovered at step {} from {} checkpoint file(s)", job.id(),
                         req.restore_step(), req.restore_from_size());
  return absl::OkStatus();
}

std::string PsHandler::CheckpointPrefix() const {
  absl::MutexLock l(&mu_);
  std::string who = !node_id_.empty() ? node_id_
                                      : (address_.empty() ? std::string("server") : address_);
  return absl::StrReplaceAll(who, {{":", "_"}, {"/", "_"}, {"[", ""}, {"]", ""}});
}

absl::StatusOr<v1::CheckpointResponse> PsHandler::WriteCheckpoint(
    const std::shared_ptr<Job>& job, const std::string& dir_override, bool periodic,
    std::shared_ptr<const Job::Snapshot> snapshot, std::optional<int64_t> at) {
  std::string base = !dir_override.empty()            ? dir_override
                     : !job->config().checkpoint_dir.empty() ? job->config().checkpoint_dir
                                                              : options_.checkpoint_dir;
  if (base.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dir: no checkpoint directory for job '", job->id(),
        "' (give one in the request, in CreateTables, or with --checkpoint_dir)"));
  }
  absl::Status in_root = CheckUnderRoot(base, options_.checkpoint_root, "dir");
  if (!in_root.ok()) return in_root;
  absl::MutexLock cl(&checkpoint_mu_);
  const std::string dir = JoinPath(base, job->id());
  absl::Status s = fs()->MakeDirs(dir);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("dir: ", s.message()));
  const std::string prefix = CheckpointPrefix();
  auto path_of = [&](int64_t step) {
    return JoinPath(dir, absl::StrCat(prefix, "-step", step, ".ckpt"));
  };
  std::string path;
  if (snapshot == nullptr && job->HasDiskTier()) {
    std::unique_ptr<AtomicFileWriter> file;  // Removes its temp file unless committed.
    std::unique_ptr<CheckpointWriter> writer;
    auto taken = job->StreamCheckpoint(
        node_id(), absl::ToUnixMillis(clock_->Now()), at,
        [&](int64_t step, uint64_t) -> absl::StatusOr<CheckpointWriter*> {
          path = path_of(step);
          auto f = AtomicFileWriter::Create(fs(), path);
          if (!f.ok()) return f.status();
          file = std::move(*f);
          writer = std::make_unique<CheckpointWriter>(
              [&file](absl::string_view piece) { return file->Append(piece); });
          return writer.get();
        });
    if (!taken.ok()) return taken.status();
    s = file->Commit();
    if (!s.ok()) return s;
    snapshot = std::make_shared<const Job::Snapshot>(std::move(*taken));
  } else {
    if (snapshot == nullptr) {
      auto taken = job->MakeCheckpoint(node_id(), absl::ToUnixMillis(clock_->Now()), at);
      if (!taken.ok()) return taken.status();
      snapshot = std::make_shared<const Job::Snapshot>(std::move(*taken));
    }
    path = path_of(snapshot->step);
    s = WriteFileAtomically(fs(), path, snapshot->bytes);
    if (!s.ok()) return s;
  }
  const Job::Snapshot* snap = snapshot.get();
  job->NoteCheckpoint(path, clock_->Now());
  if (periodic) PruneCheckpoints(dir, prefix);
  v1::CheckpointResponse resp;
  resp.set_path(path);
  resp.set_step(snap->step);
  resp.set_bytes(snap->size);
  resp.set_crc32c(snap->crc);
  Logger("server")->info("job '{}': checkpoint at step {} written to {} ({} bytes)", job->id(),
                         snap->step, path, snap->size);
  return resp;
}

void PsHandler::PruneCheckpoints(const std::string& dir, const std::string& prefix) {
  if (options_.keep_checkpoints <= 0) return;
  std::vector<std::pair<int64_t, std::string>> found;
  auto names = fs()->ListDir(dir);
  if (!names.ok()) return;
  const std::string head = prefix + "-step";
  for (const std::string& name : *names) {
    if (!absl::StartsWith(name, head) || !absl::EndsWith(name, ".ckpt")) continue;
    std::string num = name.substr(head.size(), name.size() - head.size() - 5);
    char* end = nullptr;
    long long step = std::strtoll(num.c_str(), &end, 10);
    if (end == nullptr || *end != '\0' || num.empty()) continue;
    found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + options_.keep_checkpoints < found.size(); ++i) {
    (void)fs()->Remove(JoinPath(dir, found[i].second));
  }
}

absl::Status PsHandler::Checkpoint(const v1::CheckpointRequest& req,
                                   v1::CheckpointResponse* resp) {
  auto job = FindJob(req.job_id(), "job_id");
  if (!job.ok()) return job.status();
  auto r = WriteCheckpoint(*job, req.dir(), false);
  if (!r.ok()) return r.status();
  *resp = std::move(*r);
  return absl::OkStatus();
}

absl::Status PsHandler::Restore(const v1::RestoreRequest& req, v1::RestoreResponse* resp) {
  auto job = FindJob(req.job_id(), "job_id");
  if (!job.ok()) return job.status();
  if (req.path().empty()) return absl::InvalidArgumentError("path: empty checkpoint path");
  absl::Status in_root = CheckUnderRoot(req.path(), options_.checkpoint_root, "path");
  if (!in_root.ok()) return in_root;
  auto file = OpenCheckpointFile(fs(), req.path());  // Read a piece at a time.
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("path: ", file.status().message()));
  }
  auto r = (*job)->Restore(**file, req.path());
  if (!r.ok()) return r.status();
  resp->set_step(r->first);
  resp->set_tables(r->second);
  Logger("server")->info("job '{}': restored {} tables at step {} from {}", req.job_id(),
                         r->second, r->first, req.path());
  return absl::OkStatus();
}

absl::Status PsHandler::Export(const v1::ExportRequest& req, v1::ExportResponse* resp) {
  auto job = FindJob(req.job_id(), "job_id");
  if (!job.ok()) return job.status();
  if (req.path().empty()) return absl::InvalidArgumentError("path: empty output path");
  absl::Status in_root = CheckUnderRoot(req.path(), options_.export_root, "path");
  if (!in_root.ok()) return in_root;
  std::vector<std::string> tables(req.tables().begin(), req.tables().end());
  auto bytes = (*job)->Export(tables);
  if (!bytes.ok()) return bytes.status();
  absl::Status s = fs()->MakeDirs(ParentDir(req.path()));
  if (s.ok()) s = WriteFileAtomically(fs(), req.path(), bytes->first);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("path: ", s.message()));
  resp->set_path(req.path());
  resp->set_bytes(bytes->first.size());
  resp->set_tensors(bytes->second);
  return absl::OkStatus();
}

absl::Status PsHandler::ListKeys(const v1::ListKeysRequest& req, v1::ListKeysResponse* resp,
                                 const GrpcDataProof& proof) {
  constexpr uint32_t kDefaultPage = 65536;
  constexpr uint32_t kMaxPage = 1u << 20;
  if (req.table().empty()) return absl::InvalidArgumentError("table: required");
  if (req.limit() > kMaxPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: ", req.limit(), " is over the page limit of ", kMaxPage, " keys"));
  }
  auto job = FindJob(req.job_id(), "job_id");
  if (!job.ok()) return job.status();
  absl::Status allowed = CheckGrpcDataProof(req.job_id(), req.worker(), proof);
  if (!allowed.ok()) return allowed;
  std::vector<uint64_t> keys;
  auto more = (*job)->ListKeys(req.table(), req.epoch(), req.start(),
                               req.limit() == 0 ? kDefaultPage : req.limit(), &keys);
  if (!more.ok()) return more.status();
  resp->set_keys(
      std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t)));
  resp->set_more(*more);
  return absl::OkStatus();
}

}  // namespace pscluster
