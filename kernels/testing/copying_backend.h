// A backend for tests without a GPU that behaves like a device backend where it matters to the
// code above it: it runs the CPU backend's ops but keeps "device" memory apart from host memory
// (shares_host_memory() false; fresh memory holds garbage), counts copies and synchronisations,
// and, when made with `records` true, records ops between BeginCapture() and EndCapture() the
// way a CUDA Graph does: each op with the arguments it was queued with (pointers, sizes,
// scalars), run again in order by OpGraph::Launch(). A step whose arguments change without its
// recording being replaced therefore goes wrong here just as it would on a device.
#ifndef PSCLUSTER_KERNELS_TESTING_COPYING_BACKEND_H_
#define PSCLUSTER_KERNELS_TESTING_COPYING_BACKEND_H_

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace pscluster::kernels::testing {

class CopyingBackend final : public Backend {
 public:
  explicit CopyingBackend(std::unique_ptr<Backend> cpu, bool records = false)
      : cpu_(std::move(cpu)), records_(records) {}

  DeviceKind kind() const override { return DeviceKind::kCuda; }  // Whatever is not the CPU.
  std::string name() const override { return "copying " + cpu_->name(); }
  bool shares_host_memory() const override { return false; }
  absl::Status Synchronize() override {
    if (capturing()) return absl::FailedPreconditionError("Synchronize while capturing");
    ++syncs;
    return cpu_->Synchronize();
  }
  bool records_graphs() const override { return records_; }
  uint64_t memory_epoch() const override { return epoch; }

  // Counters and knobs for tests.
  int to_device = 0, to_host = 0, syncs = 0;
  int ops_run = 0;       // Ops run (plainly or from a recording).
  int launches = 0;      // OpGraph::Launch() calls.
  int recordings = 0;    // Successful EndCapture() calls.
  uint64_t epoch = 0;    // What memory_epoch() reports.
  bool fail_end_capture = false;  // EndCapture() fails like a refusing driver.

 protected:
  absl::StatusOr<void*> DoAllocate(size_t bytes, bool /*on_host*/) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) return absl::ResourceExhaustedError("copying backend");
    std::memset(p, 0xa5, bytes);  // Garbage, as fresh device memory would be.
    return p;
  }
  void DoFree(void* ptr, bool /*on_host*/) override { std::free(ptr); }
  absl::Status DoCopy(const void* src, void* dst, size_t bytes, int direction) override {
    if (direction == kToDevice) ++to_device;
    if (direction == kToHost) ++to_host;
    return Op([=] {
      std::memmove(dst, src, bytes);
      return absl::OkStatus();
    });
  }
  absl::Status DoBeginCapture() override {
    recording_ = std::make_unique<std::vector<std::function<absl::Status()>>>();
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
  class Recording final : public OpGraph {
   public:
    Recording(CopyingBackend* owner, std::vector<std::function<absl::Status()>> ops)
        : owner_(owner), ops_(std::move(ops)) {}
    absl::Status Launch() override {
      ++owner_->launches;
      for (const auto& op : ops_) {
        ++owner_->ops_run;
        absl::Status s = op();
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }

   private:
    CopyingBackend* const owner_;
    const std::vector<std::function<absl::Status()>> ops_;
  };

  // Runs `op` now, or records it while capturing.
  absl::Status Op(std::function<absl::Status()> op) {
    if (recording_ != nullptr) {
      recording_->push_back(std::move(op));
      return absl::OkStatus();
    }
    ++ops_run;
    return op();
  }

  std::unique_ptr<Backend> cpu_;
  const bool records_;
  std::unique_ptr<std::vector<std::function<absl::Status()>>> recording_;
};

}  // namespace pscluster::kernels::testing

#endif  // PSCLUSTER_KERNELS_TESTING_COPYING_BACKEND_H_
