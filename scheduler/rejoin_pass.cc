// The rejoin pass: ranks that left a running job come back on idle workers (while no job waits
// in the queue), at the slowest clock of the ranks training, and the rank that adopted their
// data gives it back.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "scheduler/job_state.h"
#include "scheduler/membership.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"

namespace pscluster::scheduler {
namespace {

class RejoinPass final : public Pass {
 public:
  explicit RejoinPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "rejoin"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void RejoinPass::Run() {
  struct Work {
    std::string job_id;
    uint32_t rank = 0;
    uint32_t adopter = 0;  // Read its part until now (the rank itself: nobody).
    std::string spare, spare_address;
    v1::JobSpec spec;
    v1::ShardMap map;
    uint32_t num_workers = 0;
    v1::JobRecovery recovery;  // With the rank back in, its new attempt set.
    uint32_t lead_before = 0;
  };
  {
    // Only while no job waits in the queue: queued jobs get idle workers first.
    absl::MutexLock l(&core_.mu());
    bool any = false;
    for (const JobRecord& rec : core_.jobs()) {
      if (rec.job.state() == v1::JOB_QUEUED) return;
      any = any || (rec.job.state() == v1::JOB_RUNNING && !rec.job.recovery().left().empty());
    }
    if (!any) return;
  }
  const std::vector<v1::NodeStatus> nodes = core_.registry().Snapshot();
  std::vector<Work> work;
  {
    absl::MutexLock l(&core_.mu());
    absl::flat_hash_set<std::string> busy;
    for (const JobRecord& rec : core_.jobs()) {
      if (!HoldsResources(rec.job.state())) continue;
      for (const std::string& w : rec.job.workers()) busy.insert(w);
    }
    for (JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
      v1::Job& job = rec.job;
      if (job.state() != v1::JOB_RUNNING || job.recovery().left().empty()) continue;
      if (!rec.lost_ranks.empty()) continue;  // Its losses first.
      std::string spare, address;
      for (const v1::NodeStatus& n : nodes) {
        if (n.info().role() != v1::ROLE_WORKER || n.state() != v1::NODE_ALIVE) continue;
        if (busy.contains(n.info().node_id())) continue;
        if (!WorkerFitsJob(n.info(), job.spec())) continue;
        spare = n.info().node_id();
        address = n.info().address();
        break;
      }
      if (spare.empty()) break;  // No idle worker for this job or any later one.
      busy.insert(spare);
      // The rank that left first comes back first; one per job and pass.
      v1::JobRecovery* rr = job.mutable_recovery();
      const uint32_t n = job.workers_size();
      Work w;
      w.lead_before = LeadRank(*rr, n);
      const v1::LeftRank back = rr->left(0);
      rr->mutable_left()->DeleteSubrange(0, 1);
      StartNewAttempt(rr, back.rank(), n);
      job.set_workers(back.rank(), spare);
      if (static_cast<int>(back.rank()) < job.progress().workers_size()) {
        v1::WorkerProgress* p = job.mutable_progress()->mutable_workers(back.rank());
        p->set_node_id(spare);
        p->set_left(false);
        p->set_done(false);
        p->clear_error();
        p->set_test_accuracy(-1);  // Its evaluation from before it left is stale.
        p->set_test_loss(-1);
      }
      if (!core_.jobs().Persist(rec).ok()) break;  // Not written: not sent either.
      w.job_id = id;
      w.rank = back.rank();
      w.adopter = back.adopted_by();
      w.spare = spare;
      w.spare_address = address;
      w.spec = job.spec();
      w.map = rec.shard_map;
      w.num_workers = n;
      w.recovery = job.recovery();
      work.push_back(std::move(w));
    }
  }

  for (const Work& w : work) {
    // 1. Every server lets the rank back in at the slowest clock of the ranks training there,
    //    refusing its older attempts; the task resumes at the lowest of those.
    std::string why;
    std::vector<int64_t> clocks = ClockOnEveryServer(
        w.map,
        [&](const v1::ServerEndpoint& ep) {
          return core_.rpc().RejoinJob(ep.address(), w.job_id, w.rank,
                                       RankAttempt(w.recovery, w.rank));
        },
        &why);
    const int64_t start = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
    // 2. Its task on the worker, reading its own part again; the rank that read that part
    //    meanwhile drops it (and every rank learns the lead rank if it changed).
    if (why.empty()) {
      v1::JobRecovery at = w.recovery;
      at.set_start_step(start);
      absl::Status s = core_.rpc().AssignTask(
          w.spare_address, TaskFor(w.job_id, w.spec, w.map, w.rank, w.num_workers, at));
      if (!s.ok()) why = absl::StrCat("worker ", w.spare, ": ", s.message());
    }
    if (why.empty()) {
      const uint32_t lead = LeadRank(w.recovery, w.num_workers);
      std::vector<std::pair<uint32_t, std::string>> tell;
      {
        absl::MutexLock l(&core_.mu());
        JobRecord* rec = core_.jobs().Find(w.job_id);
        for (int q = 0; rec != nullptr && q < rec->job.workers_size(); ++q) {
          const std::string& node = rec->job.workers(q);
          if (node.empty() || static_cast<uint32_t>(q) == w.rank) continue;
          if (static_cast<uint32_t>(q) != w.adopter && lead == w.lead_before &&
              !w.spec.consistency().aggregate()) {
            continue;
          }
          auto n = core_.registry().Get(node);
          if (n.has_value()) tell.emplace_back(q, n->info().address());
        }
      }
      ParallelFor(tell.size(), [&](size_t i) {
        absl::Status s = core_.rpc().UpdatePartition(
            tell[i].second, PartitionUpdate(w.job_id, w.recovery, tell[i].first, w.num_workers));
        if (!s.ok()) {
          Log()->warn("job {}: rank {} was not told of its new data partition: {}", w.job_id,
                      tell[i].first, s.message());
        }
      });
    }
    bool undo = false;
    {
      absl::MutexLock l(&core_.mu());
      JobRecord* rec = core_.jobs().Find(w.job_id);
      const bool current = rec != nullptr && rec->job.state() == v1::JOB_RUNNING &&
                           static_cast<int>(w.rank) < rec->job.workers_size() &&
                           rec->job.workers(w.rank) == w.spare;
      if (!current) {
        undo = why.empty();
      } else if (!why.empty()) {
        // Some servers may have let it in already: a rollback puts every server and rank in step.
        core_.StartRecovery(*rec, absl::StrCat("rank ", w.rank, " could not rejoin the job on ",
                                               w.spare, " (", why, ")"));
      } else {
        core_.counters().rejoins->Add();
        v1::JobRecovery* r = rec->job.mutable_recovery();
        r->set_rejoins(r->rejoins() + 1);
        if (!core_.jobs().Persist(*rec).ok()) continue;
        Log()->warn(
            "job {}: rank {} rejoined the job on {} at step {} (it had left; an idle "
            "worker is back)",
            w.job_id, w.rank, w.spare, start);
      }
    }
    if (undo) (void)core_.rpc().StopTask(w.spare_address, w.job_id, "the job changed meanwhile");
  }
}

std::unique_ptr<Pass> MakeRejoinPass(SchedulerCore& core) {
  return std::make_unique<RejoinPass>(core);
}

}  // namespace pscluster::scheduler
