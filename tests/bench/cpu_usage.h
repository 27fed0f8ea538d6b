// CPU use over a window of a benchmark: the whole machine's busy time (/proc/stat) and that of
// chosen processes (/proc/PID/stat), sampled by a background thread and interpolated between
// samples, so a benchmark can say how many cores a run kept busy and how much CPU it spent per
// step, beside its throughput.
#ifndef PSCLUSTER_TESTS_BENCH_CPU_USAGE_H_
#define PSCLUSTER_TESTS_BENCH_CPU_USAGE_H_

#include <sys/types.h>

#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pscluster::bench {

// Busy clock ticks of the whole machine from /proc/stat's first ("cpu") line: user + nice +
// system + irq + softirq (idle, iowait and steal excluded). nullopt if the text is not such a
// line.
std::optional<double> MachineBusyTicks(absl::string_view proc_stat);

// utime + stime, in clock ticks, from a /proc/PID/stat line (the command name may hold spaces
// and parentheses). nullopt if malformed.
std::optional<double> ProcessTicks(absl::string_view pid_stat);

class CpuSampler {
 public:
  struct Usage {
    double wall_sec = 0;
    double machine_busy_sec = 0;       // CPU-seconds, all cores together.
    std::vector<double> process_sec;   // CPU-seconds of each watched process, in order.
    // Average number of busy cores over the window.
    double cores_busy() const { return wall_sec > 0 ? machine_busy_sec / wall_sec : 0; }
  };

  // Watches `pids` (0: this process) every `period` until destroyed.
  explicit CpuSampler(std::vector<pid_t> pids, absl::Duration period = absl::Milliseconds(10));
  ~CpuSampler();
  CpuSampler(const CpuSampler&) = delete;
  CpuSampler& operator=(const CpuSampler&) = delete;

  // The CPU used between `from` and `to` (linear between the samples around each end). Waits
  // for a sample taken after `to`. A process whose stat cannot be read counts as 0.
  Usage Between(absl::Time from, absl::Time to);

 private:
  struct Sample {
    absl::Time at;
    double machine = 0;
    std::vector<double> procs;
  };
  Sample Take() const;
  void Loop();
  // The value of every counter at `t` (clamped to the samples' span).
  Sample At(absl::Time t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<pid_t> pids_;
  const absl::Duration period_;
  const double ticks_per_sec_;
  absl::Mutex mu_;
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pscluster::bench

#endif  // PSCLUSTER_TESTS_BENCH_CPU_USAGE_H_
