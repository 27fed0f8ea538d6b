// Data balancing (JobSpec.balance_data, design section 5: "gives larger data partitions to
// faster workers"): the control loop compares the compute rates that a running job's ranks
// report and, when they are out of balance, records new data shares for the job and tells every
// rank its new partition (UpdatePartition; the task takes it before its next batch, with a batch
// of the same share of the job's examples per step). Ranks that could not be told are told again
// at the next pass; a task started later (a hand-over, a rejoin) gets the recorded shares.
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

// "62% / 38%"
std::string Percentages(const google::protobuf::RepeatedField<uint32_t>& shares) {
  double total = 0;
  for (uint32_t s : shares) total += s;
  std::vector<std::string> out;
  for (uint32_t s : shares) out.push_back(absl::StrFormat("%.0f%%", 100.0 * s / total));
  return absl::StrJoin(out, " / ");
}

class DataBalancePass final : public Pass {
 public:
  explicit DataBalancePass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "balance_data"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void DataBalancePass::Run() {
  if (core_.options().data_balance.every <= absl::ZeroDuration()) return;
  struct Work {
    std::string job_id;
    uint32_t num_workers = 0;
    v1::JobRecovery recovery;
    std::vector<std::pair<uint32_t, std::string>> tell;  // Rank, worker address.
  };
  std::vector<Work> work;
  {
    absl::MutexLock l(&core_.mu());
    const int64_t now_ms = absl::ToUnixMillis(core_.clock().Now());
    const int64_t every_ms = absl::ToInt64Milliseconds(core_.options().data_balance.every);
    for (JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
      v1::Job& job = rec.job;
      const uint32_t n = job.spec().num_workers();
      if (job.state() != v1::JOB_RUNNING || !job.spec().balance_data() || n < 2 ||
          job.workers_size() != static_cast<int>(n) ||
          job.progress().workers_size() != static_cast<int>(n)) {
        continue;
      }
      v1::JobRecovery& r = *job.mutable_recovery();
      std::set<uint32_t> ranks = std::move(rec.shares_unsent);
      rec.shares_unsent.clear();
      // While ranks have left, their parts are read by others: the shares wait for them.
      const int64_t since = std::max(r.balanced_unix_ms(), job.started_unix_ms());
      if (r.left_size() == 0 && now_ms - since >= every_ms) {
        // A rate from every rank's current task, measured since the shares last changed.
        std::vector<double> rates;
        for (uint32_t q = 0; q < n; ++q) {
          const v1::WorkerProgress& p = job.progress().workers(q);
          if (p.done() || p.left() || p.attempt() != RankAttempt(r, q) ||
              p.updated_unix_ms() <= r.balanced_unix_ms()) {
            break;
          }
          rates.push_back(p.compute_rate());
        }
        std::vector<uint32_t> current(r.data_shares().begin(), r.data_shares().end());
        std::optional<std::vector<uint32_t>> next;
        if (rates.size() == n) next = PickDataShares(rates, current, core_.options().data_balance);
        if (next.has_value()) {
          r.clear_data_shares();
          for (uint32_t s : *next) r.add_data_shares(s);
          r.set_rebalances(r.rebalances() + 1);
          r.set_balanced_unix_ms(now_ms);
          if (!core_.jobs().Persist(rec).ok()) break;  // Not written: not sent either.
          core_.counters().data_rebalances->Add();
          std::vector<std::string> rate_text;
          for (double v : rates) rate_text.push_back(absl::StrFormat("%.0f", v));
          Log()->info("job {}: data shares now {} (compute rates {} examples/s)", id,
                      Percentages(r.data_shares()), absl::StrJoin(rate_text, " / "));
          for (uint32_t q = 0; q < n; ++q) ranks.insert(q);
        }
      }
      if (ranks.empty()) continue;
      Work w;
      w.job_id = id;
      w.num_workers = n;
      w.recovery = r;
      for (uint32_t q : ranks) {
        if (job.workers(q).empty()) continue;  // Left the job meanwhile.
        auto node = core_.registry().Get(job.workers(q));
        if (!node.has_value()) {
          rec.shares_unsent.insert(q);
          continue;
        }
        w.tell.emplace_back(q, node->info().address());
      }
      work.push_back(std::move(w));
    }
  }
  for (const Work& w : work) {
    std::vector<absl::Status> told(w.tell.size());
    ParallelFor(w.tell.size(), [&](size_t i) {
      told[i] = core_.rpc().UpdatePartition(
          w.tell[i].second, PartitionUpdate(w.job_id, w.recovery, w.tell[i].first, w.num_workers));
    });
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(w.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING) continue;
    for (size_t i = 0; i < w.tell.size(); ++i) {
      const uint32_t q = w.tell[i].first;
      if (told[i].ok()) continue;
      // A task replaced meanwhile started with the recorded shares; this one must hear again.
      if (RankAttempt(rec->job.recovery(), q) != RankAttempt(w.recovery, q)) continue;
      rec->shares_unsent.insert(q);
      Log()->warn(
          "job {}: rank {} was not told of its data share (told again at the next "
          "pass): {}",
          w.job_id, q, told[i].message());
    }
  }
}

std::unique_ptr<Pass> MakeDataBalancePass(SchedulerCore& core) {
  return std::make_unique<DataBalancePass>(core);
}

}  // namespace pscluster::scheduler
