// Fencing the calls of a deposed scheduler.
//
// With several schedulers over etcd (scheduler/ha_scheduler.h), the leader's term is the etcd
// revision at which it won the election: a number that only grows from one leader to the next.
// The leader sends it with every call it makes to servers and workers, in the metadata header
// `pscluster-scheduler-term`. Each daemon remembers the highest term it has seen and refuses a
// call that carries a lower one with FAILED_PRECONDITION: a leader that was paused (a stopped VM,
// a long GC) and lost its lease meanwhile cannot drop, fence, stop or re-map anything once its
// successor has spoken to the node. (Shard maps are also fenced by their epochs, which every
// leader writes to etcd, fenced by its term, before any server gets them.)
//
// A call without the header (a single scheduler over SQLite, workers' and servers' own calls)
// is neither checked nor counted. The highest term is kept in memory: a restarted daemon learns
// it again from the current leader's first call.
//
// Thread-safe.
#ifndef PSCLUSTER_COMMON_SCHEDULER_TERM_H_
#define PSCLUSTER_COMMON_SCHEDULER_TERM_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace pscluster {

inline constexpr char kSchedulerTermHeader[] = "pscluster-scheduler-term";

// Adds `term` to a call's metadata (term <= 0: nothing, the single-scheduler case).
void AddSchedulerTerm(grpc::ClientContext* ctx, int64_t term);

class SchedulerTermFence {
 public:
  // OK for a call without the header or with a term at least the highest seen (which it then
  // becomes); FAILED_PRECONDITION naming both terms for a lower one; INVALID_ARGUMENT for a
  // header that is not a positive decimal number. `method` names the call in the answer and log.
  absl::Status Admit(const grpc::ServerContextBase& ctx, absl::string_view method);
  // The same for a term already read from a call (tests; 0 = no header).
  absl::Status AdmitTerm(int64_t term, absl::string_view method);

  // The highest term seen (0 = none).
  int64_t term() const { return highest_.load(std::memory_order_acquire); }
  // Calls refused so far.
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> highest_{0};
  std::atomic<int64_t> refused_{0};
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_SCHEDULER_TERM_H_
