// A backend for tests without a GPU that behaves like a device backend where it matters to the
// code above it: it runs the CPU backend's ops but keeps "device" memory apart from host memory
// (shares_host_memory() false; fresh memory holds garbage), counts copies and synchronisations,
// and, when made with `records` true, records ops between BeginCapture() and EndCapture() the
// way a CUDA Graph does: each op with the arguments it was queued with (pointers, sizes,
// scalars), run again in order by OpGraph::Launch(). A step whose arguments change without its
// recording being replaced therefore goes wrong here just as it would on a device.
//
// Streams. With Schedule::kEager (the default) everything runs when it is queued. With
// kOpsFirst or kCopiesFirst nothing runs when queued: the op, upload and download streams
// (backend.h) each keep their work in order, and it runs only when the host waits for it
// (Synchronize: the op stream; WaitForEvent: an event; freeing memory: everything), one item at
// a time, each time from the first stream in the schedule's order that can go on (its next
// item is not a wait for an event not yet reached). kOpsFirst runs the ops as far ahead of the
// copies as the events allow (and uploads only when nothing else can run), kCopiesFirst the
// copies as far ahead of the ops (uploads before downloads): a consumer that
// does not wait for its producer's event then reads memory that is not written yet (or
// already overwritten), and a host that reads a copy's destination before waiting for it
// finds it unwritten. Errors of queued work (a failing op, a copy made to fail with
// fail_async_copy) are reported by the host's next wait, as on CUDA. Every item that ran is
// appended to `log`, in the order it ran.
#ifndef PSCLUSTER_KERNELS_TESTING_COPYING_BACKEND_H_
#define PSCLUSTER_KERNELS_TESTING_COPYING_BACKEND_H_

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"

namespace pscluster::kernels::testing {

// What ran on a CopyingBackend, in order.
struct CopyingLogEntry {
  enum Kind { kOp, kCopy, kRecord, kWait };
  Kind kind = kOp;
  Stream stream = Stream::kOps;
  const void* src = nullptr;  // kCopy.
  const void* dst = nullptr;  // kCopy.
  size_t bytes = 0;           // kCopy.
  int event = -1;             // kRecord, kWait: the event's number (order of creation).
};

class CopyingBackend final : public Backend {
 public:
  enum class Schedule { kEager, kOpsFirst, kCopiesFirst };

  using LogEntry = CopyingLogEntry;

  explicit CopyingBackend(std::unique_ptr<Backend> cpu, bool records = false,
                          Schedule schedule = Schedule::kEager)
      : cpu_(std::move(cpu)), records_(records), schedule_(schedule) {}
  ~CopyingBackend() override { RunAll().IgnoreError(); }

  DeviceKind kind() const override { return DeviceKind::kCuda; }  // Whatever is not the CPU.
  std::string name() const override { return "copying " + cpu_->name(); }
  bool shares_host_memory() const override { return false; }
  absl::Status Synchronize() override {
    if (capturing()) return absl::FailedPreconditionError("Synchronize while capturing");
    ++syncs;
    absl::Status ran = RunUntil([this] { return queues_[0].empty(); });
    if (!ran.ok()) return ran;
    absl::Status failed = TakeError();
    if (!failed.ok()) return failed;
    return cpu_->Synchronize();
  }
  bool records_graphs() const override { return records_; }
  uint64_t memory_epoch() const override { return epoch; }

  // Items queued and not run yet, per stream.
  size_t queued(Stream stream) const { return queues_[Index(stream)].size(); }

  // Counters and knobs for tests.
  int to_device = 0, to_host = 0, syncs = 0;  // Copies on the op stream; Synchronize() calls.
  int async_to_device = 0, async_to_host = 0;  // CopyToDeviceAsync, CopyToHostAsync calls.
  int host_waits = 0;    // WaitForEvent() calls.
  int ops_run = 0;       // Ops run (plainly or from a recording).
  int launches = 0;      // OpGraph::Launch() calls.
  int recordings = 0;    // Successful EndCapture() calls.
  uint64_t epoch = 0;    // What memory_epoch() reports.
  bool fail_end_capture = false;  // EndCapture() fails like a refusing driver.
  // The asynchronous copy with this number (0 = the first CopyToDeviceAsync or CopyToHostAsync
  // call) copies nothing and fails when it runs.
  int fail_async_copy = -1;
  std::vector<LogEntry> log;

 protected:
  absl::StatusOr<void*> DoAllocate(size_t bytes, bool /*on_host*/) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) return absl::ResourceExhaustedError("copying backend");
    std::memset(p, 0xa5, bytes);  // Garbage, as fresh device memory would be.
    return p;
  }
  void DoFree(void* ptr, bool /*on_host*/) override {
    // Queued work may still use the memory (CUDA frees behind it): run it first. Its errors
    // stay for the next wait.
    absl::Status ran = RunAll();
    if (!ran.ok() && error_.ok()) error_ = ran;
    std::free(ptr);
  }
  absl::Status DoCopy(const void* src, void* dst, size_t bytes, int direction) override {
    if (direction == kToDevice) ++to_device;
    if (direction == kToHost) ++to_host;
    LogEntry entry{LogEntry::kCopy, Stream::kOps, src, dst, bytes};
    return Op(
        [=] {
          std::memmove(dst, src, bytes);
          return absl::OkStatus();
        },
        entry);
  }
  absl::StatusOr<void*> DoCreateEvent() override {
    events_.emplace_back();
    return reinterpret_cast<void*>(static_cast<uintptr_t>(events_.size()));  // Number + 1.
  }
  absl::Status DoCopyAsync(const void* src, void* dst, size_t bytes, int direction) override {
    const bool up = direction == kToDevice;
    up ? ++async_to_device : ++async_to_host;
    const int number = async_copies_++;
    const bool fail = number == fail_async_copy;
    Item item;
    item.entry = {LogEntry::kCopy, up ? Stream::kUpload : Stream::kDownload, src, dst, bytes};
    item.run = [=]() -> absl::Status {
      if (fail) {
        return absl::InternalError(
            absl::StrCat("copying backend: asynchronous copy ", number, " failed (test)"));
      }
      std::memmove(dst, src, bytes);
      return absl::OkStatus();
    };
    return Enqueue(item.entry.stream, std::move(item));
  }
  absl::Status DoRecordEvent(Stream stream, void* event) override {
    const int e = EventNumber(event);
    const uint64_t target = ++events_[e].recorded;
    Item item;
    item.entry = {LogEntry::kRecord, stream, nullptr, nullptr, 0, e};
    item.run = [this, e, target] {
      events_[e].reached = std::max(events_[e].reached, target);
      return absl::OkStatus();
    };
    return Enqueue(stream, std::move(item));
  }
  absl::Status DoWaitEvent(Stream stream, void* event) override {
    const int e = EventNumber(event);
    Item item;
    item.entry = {LogEntry::kWait, stream, nullptr, nullptr, 0, e};
    item.wait_event = e;
    item.wait_target = events_[e].recorded;
    return Enqueue(stream, std::move(item));
  }
  absl::Status DoWaitForEvent(void* event) override {
    ++host_waits;
    const int e = EventNumber(event);
    const uint64_t target = events_[e].recorded;
    absl::Status ran = RunUntil([this, e, target] { return events_[e].reached >= target; });
    if (!ran.ok()) return ran;
    return TakeError();
  }
  absl::Status DoBeginCapture() override {
    recording_ = std::make_unique<std::vector<Item>>();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<OpGraph>> DoEndCapture() override {
    auto ops = std::move(recording_);
    if (fail_end_capture) return absl::InternalError("recording refused (test)");
    ++recordings;
    return std::unique_ptr<OpGraph>(new Recording(this, std::move(*ops)));
  }
  absl::Status DoFill(int64_t n, float value, float* x) override {
    return Op([=] { return cpu_->Fill(n, value, x); });
  }
  absl::Status DoGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, const float* b, float beta, float* c) override {
    return Op([=] { return cpu_->Gemm(ta, tb, m, n, k, alpha, a, b, beta, c); });
  }
  absl::Status DoAddBias(int64_t rows, int64_t cols, const float* x, const float* bias,
                         float* y) override {
    return Op([=] { return cpu_->AddBias(rows, cols, x, bias, y); });
  }
  absl::Status DoColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate,
                           float* out) override {
    return Op([=] { return cpu_->ColumnSum(rows, cols, x, accumulate, out); });
  }
  absl::Status DoActivationForward(Activation f, int64_t n, const float* x, float* y) override {
    return Op([=] { return cpu_->ActivationForward(f, n, x, y); });
  }
  absl::Status DoActivationBackward(Activation f, int64_t n, const float* x, const float* dy,
                                    float* dx) override {
    return Op([=] { return cpu_->ActivationBackward(f, n, x, dy, dx); });
  }
  absl::Status DoSoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                     const int32_t* labels, float grad_scale, float* dlogits,
                                     float* row_stats) override {
    return Op([=] {
      return cpu_->SoftmaxCrossEntropy(rows, classes, logits, labels, grad_scale, dlogits,
                                       row_stats);
    });
  }
  absl::Status DoSigmoidCrossEntropy(int64_t rows, const float* logits, const int32_t* labels,
                                     float grad_scale, float* dlogits,
                                     float* row_stats) override {
    return Op([=] {
      return cpu_->SigmoidCrossEntropy(rows, logits, labels, grad_scale, dlogits, row_stats);
    });
  }
  absl::Status DoCopyBlock(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                           float* dst, int64_t dst_stride, bool accumulate) override {
    return Op([=] {
      return cpu_->CopyBlock(rows, cols, src, src_stride, dst, dst_stride, accumulate);
    });
  }
  absl::Status DoFmForward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                           float* out) override {
    return Op([=] { return cpu_->FmForward(rows, vectors, width, x, out); });
  }
  absl::Status DoFmBackward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                            const float* dout, float* dx) override {
    return Op([=] { return cpu_->FmBackward(rows, vectors, width, x, dout, dx); });
  }
  absl::Status DoDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                       const float* x, float* out) override {
    return Op([=] { return cpu_->DotInteractionForward(rows, vectors, width, x, out); });
  }
  absl::Status DoDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                        const float* x, const float* dout, float* dx) override {
    return Op([=] { return cpu_->DotInteractionBackward(rows, vectors, width, x, dout, dx); });
  }
  absl::Status DoGatherRows(int64_t n, int64_t width, const float* table, int64_t table_rows,
                            const int32_t* idx, float* out) override {
    return Op([=] { return cpu_->GatherRows(n, width, table, table_rows, idx, out); });
  }
  absl::Status DoScatterAddRows(int64_t n, int64_t width, const float* src, const int32_t* idx,
                                int64_t table_rows, float* table) override {
    return Op([=] { return cpu_->ScatterAddRows(n, width, src, idx, table_rows, table); });
  }
  absl::Status DoEmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                     const int32_t* offsets, const int32_t* idx,
                                     const float* weights, const float* table,
                                     int64_t table_rows, float* out) override {
    return Op([=] {
      return cpu_->EmbeddingBagForward(bags, width, nnz, offsets, idx, weights, table,
                                       table_rows, out);
    });
  }
  absl::Status DoEmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                      const int32_t* offsets, const int32_t* idx,
                                      const float* weights, const float* dout,
                                      int64_t table_rows, float* dtable) override {
    return Op([=] {
      return cpu_->EmbeddingBagBackward(bags, width, nnz, offsets, idx, weights, dout,
                                        table_rows, dtable);
    });
  }
  absl::Status DoCastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y) override {
    return Op([=] { return cpu_->CastToHalf(type, n, x, y); });
  }
  absl::Status DoCastFromHalf(HalfType type, int64_t n, const uint16_t* x, float* y) override {
    return Op([=] { return cpu_->CastFromHalf(type, n, x, y); });
  }
  absl::Status DoTopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx,
                         float* out_val) override {
    return Op([=] { return cpu_->TopKAbs(n, x, k, out_idx, out_val); });
  }
  absl::Status DoIm2Col(const ConvGeometry& g, const float* x, float* cols) override {
    return Op([=] { return cpu_->Im2Col(g, x, cols); });
  }
  absl::Status DoCol2Im(const ConvGeometry& g, const float* cols, float* dx) override {
    return Op([=] { return cpu_->Col2Im(g, cols, dx); });
  }
  absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x, float* y,
                                int32_t* argmax) override {
    return Op([=] { return cpu_->MaxPoolForward(g, x, y, argmax); });
  }
  absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* dy, const int32_t* argmax,
                                 float* dx) override {
    return Op([=] { return cpu_->MaxPoolBackward(g, dy, argmax, dx); });
  }

 private:
  // Work on a stream: `run`, or (when wait_event >= 0) a wait for an event's recording.
  struct Item {
    std::function<absl::Status()> run;
    int wait_event = -1;
    uint64_t wait_target = 0;
    LogEntry entry;
  };
  struct EventState {
    uint64_t recorded = 0;  // Recordings queued.
    uint64_t reached = 0;   // The latest recording reached.
  };

  class Recording final : public OpGraph {
   public:
    Recording(CopyingBackend* owner, std::vector<Item> ops)
        : owner_(owner), ops_(std::move(ops)) {}
    absl::Status Launch() override {
      ++owner_->launches;
      for (const Item& op : ops_) {
        absl::Status s = owner_->Enqueue(Stream::kOps, op);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }

   private:
    CopyingBackend* const owner_;
    const std::vector<Item> ops_;
  };

  static int Index(Stream stream) {
    return stream == Stream::kOps ? 0 : stream == Stream::kUpload ? 1 : 2;
  }
  static int EventNumber(void* event) {
    return static_cast<int>(reinterpret_cast<uintptr_t>(event)) - 1;
  }

  // Queues `op` on the op stream (runs it now when eager), or records it while capturing.
  absl::Status Op(std::function<absl::Status()> op, LogEntry entry = LogEntry()) {
    Item item;
    item.run = std::move(op);
    item.entry = entry;
    if (recording_ != nullptr) {
      recording_->push_back(std::move(item));
      return absl::OkStatus();
    }
    return Enqueue(Stream::kOps, std::move(item));
  }

  absl::Status Enqueue(Stream stream, Item item) {
    if (schedule_ == Schedule::kEager) {
      // Everything before it has run, so a wait is already satisfied.
      if (item.wait_event >= 0) {
        log.push_back(item.entry);
        return absl::OkStatus();
      }
      return Run(item);
    }
    queues_[Index(stream)].push_back(std::move(item));
    return absl::OkStatus();
  }

  absl::Status Run(const Item& item) {
    // Ops and the op stream's copies (as before streams were kept apart).
    if (item.entry.stream == Stream::kOps &&
        (item.entry.kind == LogEntry::kOp || item.entry.kind == LogEntry::kCopy)) {
      ++ops_run;
    }
    log.push_back(item.entry);
    return item.run();
  }

  // Runs one item (see the class comment); false when none can run.
  bool RunOne() {
    static constexpr int kOpsFirst[3] = {0, 2, 1}, kCopiesFirst[3] = {1, 2, 0};
    const int* order = schedule_ == Schedule::kCopiesFirst ? kCopiesFirst : kOpsFirst;
    for (int k = 0; k < 3; ++k) {
      std::deque<Item>& q = queues_[order[k]];
      if (q.empty()) continue;
      Item item = std::move(q.front());
      if (item.wait_event >= 0) {
        if (events_[item.wait_event].reached < item.wait_target) {
          q.front() = std::move(item);
          continue;  // Blocked.
        }
        q.pop_front();
        log.push_back(item.entry);
        return true;
      }
      q.pop_front();
      absl::Status s = Run(item);
      if (!s.ok() && error_.ok()) error_ = s;
      return true;
    }
    return false;
  }

  template <typename Done>
  absl::Status RunUntil(Done done) {
    while (!done()) {
      if (!RunOne()) {
        return absl::InternalError(
            "copying backend: the work waited for waits for an event that is never reached");
      }
    }
    return absl::OkStatus();
  }
  absl::Status RunAll() {
    return RunUntil([this] {
      return queues_[0].empty() && queues_[1].empty() && queues_[2].empty();
    });
  }
  absl::Status TakeError() {
    absl::Status s = std::move(error_);
    error_ = absl::OkStatus();
    return s;
  }

  std::unique_ptr<Backend> cpu_;
  const bool records_;
  const Schedule schedule_;
  std::unique_ptr<std::vector<Item>> recording_;
  std::deque<Item> queues_[3];  // kOps, kUpload, kDownload.
  std::vector<EventState> events_;
  int async_copies_ = 0;
  absl::Status error_;  // The first error of queued work since the host last waited.
};

}  // namespace pscluster::kernels::testing

#endif  // PSCLUSTER_KERNELS_TESTING_COPYING_BACKEND_H_
