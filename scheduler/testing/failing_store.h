// A Store that passes everything to a real one (the SQLite store, in the tests) until told to
// fail: then every write returns UNAVAILABLE, as a full or broken disk would, and changes
// nothing. Reads keep working.
#ifndef PSCLUSTER_SCHEDULER_TESTING_FAILING_STORE_H_
#define PSCLUSTER_SCHEDULER_TESTING_FAILING_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/store.h"

namespace pscluster::scheduler::testing {

class FailingStore final : public Store {
 public:
  explicit FailingStore(std::unique_ptr<Store> real) : real_(std::move(real)) {}

  // From now on, writes fail (true) or go through again (false).
  void FailWrites(bool fail) { fail_.store(fail); }
  // Writes refused so far.
  int refused() const { return refused_.load(); }

  absl::StatusOr<uint64_t> NextId(absl::string_view counter) override {
    if (absl::Status s = Refuse(); !s.ok()) return s;
    return real_->NextId(counter);
  }
  absl::StatusOr<uint64_t> NextEpoch(absl::string_view job_id, uint64_t current) override {
    if (absl::Status s = Refuse(); !s.ok()) return s;
    return real_->NextEpoch(job_id, current);
  }
  absl::StatusOr<std::string> ClusterKey() override {
    if (absl::Status s = Refuse(); !s.ok()) return s;
    return real_->ClusterKey();
  }
  absl::Status PutNode(const v1::NodeStatus& node) override {
    if (absl::Status s = Refuse(); !s.ok()) return s;
    return real_->PutNode(node);
  }
  absl::StatusOr<std::vector<v1::NodeStatus>> LoadNodes() override { return real_->LoadNodes(); }
  absl::Status PutJob(const v1::Job& job, absl::string_view client_token,
                      const v1::ShardMap* map, absl::string_view owner) override {
    if (absl::Status s = Refuse(); !s.ok()) return s;
    return real_->PutJob(job, client_token, map, owner);
  }
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override { return real_->LoadJobs(); }
  const std::string& path() const override { return real_->path(); }

 private:
  absl::Status Refuse() {
    if (!fail_.load()) return absl::OkStatus();
    refused_.fetch_add(1);
    return absl::UnavailableError(
        absl::StrCat("scheduler database ", real_->path(), ": cannot write: disk I/O error"));
  }

  std::unique_ptr<Store> real_;
  std::atomic<bool> fail_{false};
  std::atomic<int> refused_{0};
};

}  // namespace pscluster::scheduler::testing

#endif  // PSCLUSTER_SCHEDULER_TESTING_FAILING_STORE_H_
