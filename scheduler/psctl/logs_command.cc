#include "scheduler/psctl/logs_command.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "scheduler/job_state.h"
#include "scheduler/psctl/format.h"

namespace pscluster::psctl {
namespace {

bool Ended(v1::JobState s) {
  return s == v1::JOB_SUCCEEDED || s == v1::JOB_FAILED || s == v1::JOB_CANCELLED;
}

struct RankCursor {
  uint32_t rank = 0;
  std::string worker;
  uint32_t attempt = 0;
  uint64_t after_seq = 0;
  bool seen = false;      // Read at least once.
  bool finished = false;  // Its task ended and every line was printed.
  std::string problem;    // Last error, printed when it changes.
};

// Prints what is new for one rank; false when nothing could be read.
bool ReadRank(const PsctlOptions& o, SchedulerClient& c, const std::string& job_id, bool prefix,
              RankCursor& cur, std::ostream& out, std::ostream& err) {
  const std::string tag = prefix ? absl::StrCat("[rank ", cur.rank, "] ") : std::string();
  for (int pages = 0; pages < 100; ++pages) {
    v1::TaskLogsRequest req;
    req.set_job_id(job_id);
    req.set_rank(cur.rank);
    req.set_after_seq(cur.after_seq);
    req.set_max_lines(1000);
    auto got = c.GetTaskLogs(req);
    if (!got.ok()) {
      const std::string problem(got.status().message());
      if (problem != cur.problem) err << "psctl: " << tag << problem << std::endl;
      cur.problem = problem;
      return false;
    }
    cur.problem.clear();
    if (cur.seen && (got->worker() != cur.worker || got->attempt() != cur.attempt)) {
      // Another worker, or a new attempt: its lines from the beginning.
      err << "psctl: " << tag << "attempt " << got->attempt() << " on worker " << got->worker()
          << std::endl;
      cur.worker = got->worker();
      cur.attempt = got->attempt();
      cur.after_seq = 0;
      cur.finished = false;
      continue;
    }
    cur.seen = true;
    cur.worker = got->worker();
    cur.attempt = got->attempt();
    if (cur.after_seq > 0 && got->first_seq() > cur.after_seq + 1) {
      err << "psctl: " << tag << "(" << got->first_seq() - cur.after_seq - 1
          << " lines dropped by the worker's bounded buffer)" << std::endl;
    }
    if (o.output != OutputFormat::kTable) {
      out << (o.output == OutputFormat::kYaml ? ToYaml(*got) : ToJson(*got) + "\n");
    } else {
      for (const v1::TaskLogLine& l : got->lines()) {
        (l.stream() == "stderr" ? err : out) << tag << l.text() << "\n";
      }
      out.flush();
      err.flush();
    }
    cur.after_seq = got->next_seq();
    cur.finished = got->finished();
    if (got->lines_size() < static_cast<int>(req.max_lines())) return true;
  }
  return true;
}

}  // namespace

int RunLogs(const PsctlOptions& o, SchedulerClient& c, const std::string& job_id,
            std::ostream& out, std::ostream& err) {
  auto job = c.GetJob(job_id);
  if (!job.ok()) {
    err << "psctl: " << job.status().message() << std::endl;
    return 1;
  }
  const uint32_t n = job->spec().num_workers();
  if (o.logs_rank >= 0 && static_cast<uint32_t>(o.logs_rank) >= n) {
    err << "psctl: --rank: " << o.logs_rank << " is not a rank of " << job_id << " (ranks 0-"
        << (n == 0 ? 0 : n - 1) << ")" << std::endl;
    return 2;
  }
  std::vector<RankCursor> cursors;
  for (uint32_t r = 0; r < n; ++r) {
    if (o.logs_rank >= 0 && r != static_cast<uint32_t>(o.logs_rank)) continue;
    RankCursor cur;
    cur.rank = r;
    cursors.push_back(cur);
  }
  const bool prefix = cursors.size() > 1;
  if (o.interrupt != nullptr) o.interrupt->handled.store(true);
  while (true) {
    // The job's state before the read: once it has ended, this read gets every last line.
    auto now = c.GetJob(job_id);
    const bool ended = now.ok() && Ended(now->state());
    int read = 0;
    for (RankCursor& cur : cursors) read += ReadRank(o, c, job_id, prefix, cur, out, err) ? 1 : 0;
    if (!o.follow) return read > 0 ? 0 : 1;
    bool all_done = ended;
    for (const RankCursor& cur : cursors) all_done = all_done && (cur.finished || !cur.problem.empty());
    if (all_done) return 0;
    const absl::Time until = absl::Now() + o.interval;
    while (absl::Now() < until) {
      if (o.interrupt != nullptr && o.interrupt->requested.load()) return 130;
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
}

}  // namespace pscluster::psctl
