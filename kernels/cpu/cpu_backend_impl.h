// The CpuBackend class, shared by the cpu_*.cc files that implement its ops.
#ifndef PSCLUSTER_KERNELS_CPU_CPU_BACKEND_IMPL_H_
#define PSCLUSTER_KERNELS_CPU_CPU_BACKEND_IMPL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace pscluster::kernels {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return name_; }
  bool shares_host_memory() const override { return true; }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  ThreadPool& pool() { return pool_; }

 protected:
  absl::StatusOr<void*> DoAllocate(size_t bytes, bool on_host) override;
  void DoFree(void* ptr, bool on_host) override;
  absl::Status DoCopy(const void* src, void* dst, size_t bytes, int direction) override;
  absl::Status DoFill(int64_t n, float value, float* x) override;
  absl::Status DoGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, const float* b, float beta, float* c) override;
  absl::Status DoAddBias(int64_t rows, int64_t cols, const float* x, const float* bias,
                         float* y) override;
  absl::Status DoColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate,
                           float* out) override;
  absl::Status DoActivationForward(Activation f, int64_t n, const float* x, float* y) override;
  absl::Status DoActivationBackward(Activation f, int64_t n, const float* x, const float* dy,
                                    float* dx) override;
  absl::Status DoSoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                     const int32_t* labels, float grad_scale, float* dlogits,
                                     float* row_stats) override;
  absl::Status DoSigmoidCrossEntropy(int64_t rows, const float* logits, const int32_t* labels,
                                     float grad_scale, float* dlogits, float* row_stats) override;
  absl::Status DoCopyBlock(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                           float* dst, int64_t dst_stride, bool accumulate) override;
  absl::Status DoFmForward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                           float* out) override;
  absl::Status DoFmBackward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                            const float* dout, float* dx) override;
  absl::Status DoDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                       const float* x, float* out) override;
  absl::Status DoDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                        const float* x, const float* dout, float* dx) override;
  absl::Status DoGatherRows(int64_t n, int64_t width, const float* table, int64_t table_rows,
                            const int32_t* idx, float* out) override;
  absl::Status DoScatterAddRows(int64_t n, int64_t width, const float* src, const int32_t* idx,
                                int64_t table_rows, float* table) override;
  absl::Status DoEmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                     const int32_t* offsets, const int32_t* idx,
                                     const float* weights, const float* table,
                                     int64_t table_rows, float* out) override;
  absl::Status DoEmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                      const int32_t* offsets, const int32_t* idx,
                                      const float* weights, const float* dout,
                                      int64_t table_rows, float* dtable) override;
  absl::Status DoCastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y) override;
  absl::Status DoCastFromHalf(HalfType type, int64_t n, const uint16_t* x, float* y) override;
  absl::Status DoTopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx,
                         float* out_val) override;
  absl::Status DoIm2Col(const ConvGeometry& g, const float* x, float* cols) override;
  absl::Status DoCol2Im(const ConvGeometry& g, const float* cols, float* dx) override;
  absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x, float* y,
                                int32_t* argmax) override;
  absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* dy, const int32_t* argmax,
                                 float* dx) override;

 private:
  ThreadPool pool_;
  std::string name_;
  std::vector<float> column_partials_;  // ColumnSum's per-chunk partial sums, reused.
  std::vector<uint32_t> topk_keys_;     // TopKAbs's scratch, reused.
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CPU_CPU_BACKEND_IMPL_H_
