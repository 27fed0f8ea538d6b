// Each rank's clock in one job on one server (the steps it completed here), the fences that
// refuse its replaced attempts, and the ranks that left the job.
//
// Thread model: not thread-safe; its owner (Job) guards it with its clock lock. No I/O.
#ifndef PSCLUSTER_SERVER_WORKER_CLOCKS_H_
#define PSCLUSTER_SERVER_WORKER_CLOCKS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

class WorkerClocks {
 public:
  // Every rank at clock 0, no fence, none left. `job_id` names the job in errors.
  WorkerClocks(std::string job_id, uint32_t num_workers);

  uint32_t size() const { return static_cast<uint32_t>(clocks_.size()); }
  // REQUIRES: worker < size().
  int64_t clock(uint32_t worker) const { return clocks_[worker]; }
  // Whether `worker` left the job (false for a rank outside it).
  bool HasLeft(uint32_t worker) const { return worker < left_.size() && left_[worker]; }
  const std::vector<int64_t>& clocks() const { return clocks_; }
  const std::vector<bool>& left() const { return left_; }
  // The ranks that left, ascending.
  std::vector<uint32_t> LeftWorkers() const;

  // The slowest clock of the ranks still in the job (0 when there is none).
  int64_t Min() const;
  // The slowest clock of the ranks other than `worker` still in the job (INT64_MAX when none).
  int64_t MinOfOthers(uint32_t worker) const;
  // The fastest clock of any rank (0 when there is none).
  int64_t Max() const;

  // ---- Clocks.

  // A rank's push of `step`: on a server that joined the job mid-run (ClocksUnknown), the
  // rank's first push sets where it stands (its clock becomes at least `step`).
  // REQUIRES: worker < size().
  void ObservePush(uint32_t worker, int64_t step);
  // `worker` completed `step`: its clock becomes step + 1 unless it is there already. Returns
  // whether the slowest clock (Min) moved. REQUIRES: worker < size().
  bool Complete(uint32_t worker, int64_t step);
  // No rank's clock is known (a server joining a running job): each is set by the rank's first
  // push (ObservePush) or by a copy's clocks (Join).
  void MarkUnknown();
  // Joins another copy's clocks: each rank's becomes the lower of the two (the copy's, when
  // this one's is unknown).
  void Join(const std::vector<int64_t>& other);
  // Every rank at `step`, every clock known (a recovery's rewind).
  void SetAll(int64_t step);
  // One rank's clock, as a checkpoint recorded it (ignored for a rank outside the job).
  void Set(uint32_t worker, int64_t clock);
  // Every rank's clock from `clocks` (ranks beyond it keep theirs); all become known.
  void SetEach(const std::vector<int64_t>& clocks);

  // ---- Fencing (Tag.attempt).

  // Refuses attempts of `worker` below `attempt` from now on (never lowered). Returns (the
  // rank's clock, the fence in force); (-1, 0) for a rank outside the job.
  std::pair<int64_t, uint32_t> Fence(uint32_t worker, uint32_t attempt);
  void FenceAll(uint32_t attempt);
  // ABORTED, naming `field`, when `attempt` of `worker` is fenced off (or the rank left).
  absl::Status CheckAttempt(uint32_t worker, uint32_t attempt, absl::string_view field) const;

  // ---- Leaving and rejoining.

  // `worker` leaves for good: every attempt of it is refused and its clock gates nothing. Sets
  // *newly when it had not left before. Returns its clock, final now. INVALID_ARGUMENT for a
  // rank outside the job; FAILED_PRECONDITION for the last rank still in it.
  absl::StatusOr<int64_t> Leave(uint32_t worker, bool* newly);
  // A rank that left takes part again at the slowest clock of the others (returned), refusing
  // its attempts below `attempt`. FAILED_PRECONDITION when it has not left.
  absl::StatusOr<int64_t> Rejoin(uint32_t worker, uint32_t attempt);

 private:
  bool Unknown(uint32_t w) const { return w < unknown_.size() && unknown_[w]; }
  absl::Status CheckRank(uint32_t worker, absl::string_view field) const;

  const std::string job_id_;
  std::vector<int64_t> clocks_;
  // Ranks whose clock is not known yet (MarkUnknown). Empty: every clock is known.
  std::vector<bool> unknown_;
  std::vector<uint32_t> fences_;  // Per rank: the lowest attempt accepted.
  std::vector<bool> left_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_WORKER_CLOCKS_H_
