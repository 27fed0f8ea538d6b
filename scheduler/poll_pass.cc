// The poll pass (its own thread, every status_poll_interval / 2): the servers of running jobs
// are asked for their Status: who a waiting step waits for (BSP, SSP), which backups a primary
// cannot reach (replicas), and the bytes the job holds (quotas on server memory).
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/parallel.h"
#include "scheduler/pass_helpers.h"
#include "scheduler/passes.h"
#include "scheduler/progress.h"

namespace pscluster::scheduler {
namespace {

class PollPass final : public Pass {
 public:
  explicit PollPass(SchedulerCore& core) : core_(core) {}
  const char* name() const override { return "poll_servers"; }
  void Run() override;

 private:
  SchedulerCore& core_;
};

}  // namespace

void PollPass::Run() {
  struct Poll {
    std::string job_id;
    std::vector<std::string> addresses;
    std::vector<std::string> nodes;  // node_id of each address
  };
  std::vector<Poll> polls;
  absl::Time now = core_.clock().Now();
  {
    absl::MutexLock l(&core_.mu());
    // A quota on server memory needs every running job's memory.
    const bool memory = core_.quotas() != nullptr && core_.quotas()->limits_memory();
    for (JobRecord& rec : core_.jobs()) {
      const std::string& id = rec.job.job_id();
      if (rec.job.state() != v1::JOB_RUNNING) continue;
      // Who is waited for (BSP, SSP); whether primaries reach their backups (replicas).
      if (rec.job.spec().consistency().mode() == v1::ConsistencySpec::ASP &&
          rec.job.spec().replication() <= 1 && !memory) {
        continue;
      }
      if (now - rec.last_poll < core_.options().status_poll_interval) continue;
      rec.last_poll = now;
      Poll p{id, {}, {}};
      for (const v1::ServerEndpoint& ep : rec.shard_map.servers()) {
        p.addresses.push_back(ep.address());
        p.nodes.push_back(ep.node_id());
      }
      polls.push_back(std::move(p));
    }
  }
  ParallelFor(polls.size(), [&](size_t i) {
    const Poll& p = polls[i];
    std::set<uint32_t> waiting;
    std::set<std::pair<std::string, std::string>> unreachable;  // (primary, backup address)
    bool any = false;
    uint64_t bytes = 0;
    for (size_t k = 0; k < p.addresses.size(); ++k) {
      auto st = core_.rpc().ServerStatus(p.addresses[k], p.job_id);
      if (!st.ok()) {
        Log()->debug("job {}: {}", p.job_id, st.status());
        continue;
      }
      any = true;
      for (const v1::JobOnServer& j : st->jobs()) {
        if (j.job_id() != p.job_id) continue;
        waiting.insert(j.waiting_for().begin(), j.waiting_for().end());
        for (const std::string& b : j.unreachable_backups()) unreachable.emplace(p.nodes[k], b);
        for (const v1::TableStatus& t : j.tables()) bytes += t.bytes();
      }
    }
    if (!any) return;
    absl::MutexLock l(&core_.mu());
    JobRecord* rec = core_.jobs().Find(p.job_id);
    if (rec == nullptr || rec->job.state() != v1::JOB_RUNNING) return;
    for (const auto& [primary, address] : unreachable) {
      for (const v1::ServerEndpoint& ep : rec->shard_map.servers()) {
        if (ep.address() == address) rec->unreachable_backups.emplace(primary, ep.node_id());
      }
    }
    rec->server_waiting_for.assign(waiting.begin(), waiting.end());
    rec->server_bytes = bytes;
    Summarize(rec->job.spec(), rec->server_waiting_for, rec->job.mutable_progress());
  });
}

std::unique_ptr<Pass> MakePollPass(SchedulerCore& core) { return std::make_unique<PollPass>(core); }

}  // namespace pscluster::scheduler
