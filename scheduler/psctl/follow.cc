#include "scheduler/psctl/follow.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "scheduler/job_state.h"
#include "scheduler/psctl/format.h"

namespace pscluster::psctl {
namespace {

constexpr absl::Duration kUnreachableGrace = absl::Seconds(60);

bool Interrupted(const PsctlOptions& o) {
  return o.interrupt != nullptr && o.interrupt->requested.load();
}

// Sleeps up to `d`, waking early on an interrupt.
void Nap(const PsctlOptions& o, absl::Duration d) {
  absl::Time end = absl::Now() + d;
  while (absl::Now() < end && !Interrupted(o)) absl::SleepFor(absl::Milliseconds(20));
}

}  // namespace

absl::StatusOr<v1::Job> FollowJob(SchedulerClient& client, const std::string& job_id,
                                  const PsctlOptions& o, const FollowOptions& f,
                                  std::ostream& out) {
  std::string last;
  absl::Time unreachable_since = absl::InfiniteFuture();
  bool in_place = false;  // A line drawn with \r is on screen.
  while (true) {
    if (Interrupted(o)) {
      if (in_place) out << "\n";
      return absl::CancelledError("interrupted");
    }
    if (f.check) {
      absl::Status s = f.check();
      if (!s.ok()) {
        if (in_place) out << "\n";
        return s;
      }
    }
    auto job = client.GetJob(job_id);
    if (!job.ok()) {
      if (job.status().code() != absl::StatusCode::kUnavailable) return job.status();
      if (unreachable_since == absl::InfiniteFuture()) unreachable_since = absl::Now();
      if (absl::Now() - unreachable_since > kUnreachableGrace) return job.status();
      if (in_place) out << "\n";
      in_place = false;
      out << "scheduler unreachable, retrying: " << job.status().message() << std::endl;
      Nap(o, o.interval);
      continue;
    }
    unreachable_since = absl::InfiniteFuture();
    bool final = scheduler::IsTerminal(job->state());
    if (f.detail) {
      std::vector<v1::NodeStatus> nodes;
      auto st = client.ClusterStatus(job_id);
      if (st.ok()) nodes.assign(st->nodes().begin(), st->nodes().end());
      int64_t now = absl::ToUnixMillis(absl::Now());
      std::string view = JobDetail(*job, nodes, now);
      if (o.tty) {
        out << "\033[H\033[2J" << view << std::flush;
      } else if (view != last) {
        out << view << "\n" << std::flush;
      }
      last = view;
    } else {
      std::string line = JobLine(*job);
      if (o.tty) {
        out << "\r\033[K" << line << std::flush;
        in_place = true;
      } else if (line != last) {
        out << line << std::endl;
      }
      last = line;
    }
    if (final) {
      if (in_place) out << "\n";
      return *job;
    }
    Nap(o, o.interval);
  }
}

std::string FinalSummary(const v1::Job& job) {
  std::string s = absl::StrCat(job.job_id(), " ", scheduler::JobStateName(job.state()));
  if (job.finished_unix_ms() > 0) {
    int64_t start = job.started_unix_ms() > 0 ? job.started_unix_ms() : job.submitted_unix_ms();
    absl::StrAppend(&s, " in ", HumanDuration((job.finished_unix_ms() - start) / 1000.0));
  }
  if (job.state() == v1::JOB_SUCCEEDED) {
    const v1::JobProgress& p = job.progress();
    absl::StrAppend(&s, ": test accuracy ",
                    p.test_accuracy() >= 0 ? absl::StrFormat("%.4f", p.test_accuracy())
                                           : std::string("not reported"));
    absl::StrAppend(&s, ", model exported to ",
                    job.export_path().empty() ? "(no export reported)" : job.export_path());
  } else if (!job.reason().empty()) {
    absl::StrAppend(&s, ": ", job.reason());
  }
  return s;
}

}  // namespace pscluster::psctl
