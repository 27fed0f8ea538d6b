#include "tests/bench/cpu_usage.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pscluster::bench {
namespace {

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::optional<double> MachineBusyTicks(absl::string_view proc_stat) {
  std::vector<absl::string_view> f =
      absl::StrSplit(proc_stat.substr(0, proc_stat.find('\n')), ' ', absl::SkipEmpty());
  // cpu user nice system idle iowait irq softirq [steal ...]
  if (f.size() < 8 || f[0] != "cpu") return std::nullopt;
  double busy = 0;
  for (int i : {1, 2, 3, 6, 7}) {
    double v;
    if (!absl::SimpleAtod(f[i], &v)) return std::nullopt;
    busy += v;
  }
  return busy;
}

std::optional<double> ProcessTicks(absl::string_view pid_stat) {
  // "pid (comm) state ppid ...": fields after the last ')' start with state (field 3); utime and
  // stime are fields 14 and 15.
  const size_t close = pid_stat.rfind(')');
  if (close == absl::string_view::npos) return std::nullopt;
  std::vector<absl::string_view> f =
      absl::StrSplit(pid_stat.substr(close + 1), ' ', absl::SkipEmpty());
  if (f.size() < 13) return std::nullopt;
  double utime, stime;
  if (!absl::SimpleAtod(f[11], &utime) || !absl::SimpleAtod(f[12], &stime)) return std::nullopt;
  return utime + stime;
}

CpuSampler::CpuSampler(std::vector<pid_t> pids, absl::Duration period)
    : pids_(std::move(pids)),
      period_(period),
      ticks_per_sec_(static_cast<double>(sysconf(_SC_CLK_TCK))) {
  Sample first = Take();
  {
    absl::MutexLock l(&mu_);
    samples_.push_back(std::move(first));
  }
  thread_ = std::thread([this] { Loop(); });
}

CpuSampler::~CpuSampler() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

CpuSampler::Sample CpuSampler::Take() const {
  Sample s;
  s.at = absl::Now();
  s.machine = MachineBusyTicks(FirstLine("/proc/stat")).value_or(0) / ticks_per_sec_;
  for (pid_t pid : pids_) {
    const std::string path = pid == 0 ? "/proc/self/stat" : absl::StrCat("/proc/", pid, "/stat");
    s.procs.push_back(ProcessTicks(FirstLine(path)).value_or(0) / ticks_per_sec_);
  }
  return s;
}

void CpuSampler::Loop() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
    if (stop_) break;
    mu_.Unlock();
    Sample s = Take();
    mu_.Lock();
    samples_.push_back(std::move(s));
  }
}

CpuSampler::Sample CpuSampler::At(absl::Time t) const {
  auto after = std::lower_bound(samples_.begin(), samples_.end(), t,
                                [](const Sample& s, absl::Time x) { return s.at < x; });
  if (after == samples_.begin()) return samples_.front();
  if (after == samples_.end()) return samples_.back();
  const Sample& a = *(after - 1);
  const Sample& b = *after;
  const double w = absl::FDivDuration(t - a.at, std::max(b.at - a.at, absl::Nanoseconds(1)));
  Sample s;
  s.at = t;
  s.machine = a.machine + w * (b.machine - a.machine);
  for (size_t i = 0; i < a.procs.size(); ++i) {
    s.procs.push_back(a.procs[i] + w * (b.procs[i] - a.procs[i]));
  }
  return s;
}

CpuSampler::Usage CpuSampler::Between(absl::Time from, absl::Time to) {
  absl::MutexLock l(&mu_);
  auto taken = [this, to]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return samples_.back().at > to;
  };
  mu_.AwaitWithTimeout(absl::Condition(&taken), 10 * period_ + absl::Seconds(1));
  const Sample a = At(from);
  const Sample b = At(to);
  Usage u;
  u.wall_sec = absl::ToDoubleSeconds(to - from);
  u.machine_busy_sec = b.machine - a.machine;
  for (size_t i = 0; i < a.procs.size(); ++i) u.process_sec.push_back(b.procs[i] - a.procs[i]);
  return u;
}

}  // namespace pscluster::bench
