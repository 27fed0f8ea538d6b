// One round trip on a data-plane stream: the chunks sent to one server under one request_id and
// the PullChunks that come back, copied (and widened from fp16/bf16) straight into the
// caller's buffers as they arrive.
#ifndef PSCLUSTER_SERVER_CLIENT_ROUND_H_
#define PSCLUSTER_SERVER_CLIENT_ROUND_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "server/payload.h"

namespace pscluster {

// Where the reply to one chunk of the round goes.
struct ReplyDest {
  uint64_t elems = 0;          // Elements the reply covers (0: the chunk asks for no reply).
  v1::DataType dtype = v1::DT_FLOAT32;
  float* base = nullptr;       // DENSE: element 0 of the slice in the caller's buffer.
  // SPARSE: row r of the slice goes to rows + pos[r] * width.
  const uint32_t* pos = nullptr;
  uint32_t width = 1;
  float* rows = nullptr;
  // DENSE with pull compression: the client's copy of the block (its `elems` values, what the
  // server's view of this worker holds) and its view id. A reply updates both (only the
  // elements it names, when it names them), then the block goes to `base`.
  float* mirror = nullptr;
  uint64_t* view = nullptr;
};

class Round {
 public:
  // `copy_ns` (optional) accumulates the time spent copying replies.
  Round(uint64_t request_id, std::vector<ReplyDest> dests,
        std::atomic<int64_t>* copy_ns = nullptr)
      : request_id_(request_id), dests_(std::move(dests)), copy_ns_(copy_ns) {}

  uint64_t request_id() const { return request_id_; }

  // A reply chunk arrived (called in arrival order, before the next reply is read). Returns
  // false when the round is over and the chunk must be dropped.
  bool Enter(const v1::PullChunk& chunk);
  // Copies an entered chunk into place (may run concurrently with later chunks). Malformed
  // replies fail the round.
  void Copy(const v1::PullChunk& chunk, const Payload& values);
  // For an entered chunk whose `bytes` of values can be received straight into the caller's
  // buffer (dense float32 whose dtype matches): where they go. nullptr: receive them elsewhere
  // and Copy(). The chunk is checked as Copy() checks it.
  float* DirectTarget(const v1::PullChunk& chunk, size_t bytes) const;
  // Ends an entered chunk whose values were received at DirectTarget; `st` is the receive's
  // status (an error fails the round).
  void Received(const absl::Status& st);
  // Ends the round with an error (the first one wins).
  void Fail(const absl::Status& st);

  // A zero-copy slice of this round was handed to gRPC / released by it.
  void AddSlice();
  void ReleaseSlice();

  // True (and the round's status in `st`, if given) once every reply arrived or the round
  // failed, and no copy into the caller's memory is running.
  bool Finished(absl::Status* st = nullptr) const;
  // Waits until every reply arrived or the round failed, or `deadline` (DEADLINE_EXCEEDED).
  absl::Status Wait(absl::Time deadline);
  // Waits until Finished() or `until`, whichever is first, and returns Finished(); unlike
  // Wait(), reaching `until` leaves the round as it is.
  bool AwaitFinished(absl::Time until) const;
  // Waits until gRPC released every slice of the caller's memory.
  void WaitSlicesReleased();

  int64_t min_clock() const;

 private:
  // OK when the chunk's `bytes` of values fit its destination.
  absl::Status Check(const v1::PullChunk& chunk, size_t bytes) const;
  void CopyIn(const v1::PullChunk& chunk, const Payload& values, const ReplyDest& d);
  // A reply to a block with a mirror: into the mirror (only the elements it names, or its whole
  // range), the block to the caller, and the reply's view id.
  void CopyViaMirror(const v1::PullChunk& chunk, const Payload& values, const ReplyDest& d);
  // Ends an entered chunk (`bad`: it failed the round).
  void Leave(const absl::Status& bad);

  const uint64_t request_id_;
  const std::vector<ReplyDest> dests_;
  std::atomic<int64_t>* const copy_ns_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool last_seen_ ABSL_GUARDED_BY(mu_) = false;
  int copying_ ABSL_GUARDED_BY(mu_) = 0;
  int slices_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t min_clock_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_CLIENT_ROUND_H_
