#include "scheduler/job_table.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster::scheduler {

JobTable::JobTable(Store* store, const Clock* clock, FailureListener on_failure)
    : store_(store), clock_(clock), on_failure_(std::move(on_failure)) {}

JobRecord* JobTable::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobRecord* JobTable::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<JobRecord*> JobTable::FindOrError(const std::string& job_id) {
  JobRecord* rec = Find(job_id);
  if (rec == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  return rec;
}

const JobRecord* JobTable::FindByToken(const std::string& client_token) const {
  if (client_token.empty()) return nullptr;
  auto it = by_token_.find(client_token);
  return it == by_token_.end() ? nullptr : Find(it->second);
}

absl::StatusOr<JobRecord*> JobTable::Add(JobRecord rec) {
  if (!error_.ok()) return error_;
  absl::Status s = store_->PutJob(rec.job, rec.client_token, nullptr, rec.owner);
  if (!s.ok()) {
    Fail(s);
    return error_;
  }
  rec.last_persist = clock_->Now();
  return &Load(std::move(rec));
}

JobRecord& JobTable::Load(JobRecord rec) {
  const std::string id = rec.job.job_id();
  if (!rec.client_token.empty()) by_token_[rec.client_token] = id;
  order_.push_back(id);
  return jobs_.emplace(id, std::move(rec)).first->second;
}

void JobTable::Clear() {
  jobs_.clear();
  order_.clear();
  by_token_.clear();
}

absl::Status JobTable::Persist(JobRecord& rec, const v1::ShardMap* map) {
  if (!error_.ok()) return error_;
  absl::Status s = store_->PutJob(rec.job, rec.client_token, map, rec.owner);
  if (!s.ok()) {
    Logger("scheduler")->error("saving job {}: {}", rec.job.job_id(), s);
    Fail(s);
    return error_;
  }
  rec.last_persist = clock_->Now();
  rec.progress_dirty = false;
  rec.history.Observe(rec.job, rec.last_persist);
  return s;
}

void JobTable::Fail(const absl::Status& cause) {
  if (!error_.ok()) return;
  error_ = absl::UnavailableError(absl::StrCat(
      "the scheduler cannot write its state (", cause.message(),
      "); it makes no change until its store works again"));
  if (on_failure_) on_failure_(cause);
}

}  // namespace pscluster::scheduler
