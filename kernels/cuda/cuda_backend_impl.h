// The CudaBackend class and what its kernels share (.cu files only; includes CUDA headers).
#ifndef PSCLUSTER_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_
#define PSCLUSTER_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace cuda {

// Codes a kernel writes into the backend's device error word when it meets bad index data;
// Synchronize() turns the first one into INVALID_ARGUMENT.
enum DeviceError : int {
  kNoError = 0,
  kBadLabel = 1,
  kBadGatherIndex = 2,
  kBadScatterIndex = 3,
  kBadBagForward = 4,
  kBadBagBackward = 5,
  kBadBinaryLabel = 6,
};
const char* DeviceErrorMessage(int code);

// Records `code` unless an earlier error is already recorded.
__device__ inline void ReportError(int* flag, int code) { atomicCAS(flag, 0, code); }

constexpr int kThreads = 256;

// Kernels index in int32 when every index stays below this (the margin keeps grid-stride loops
// from overflowing past the end).
constexpr int64_t kInt32IndexLimit = (int64_t{1} << 31) - (int64_t{1} << 26);

// Makes the backend's device current on the calling thread (cheap when it already is), so a
// backend may be created on one thread and used on another.
#define KERNELS_CUDA_ACTIVATE() CUDA_RETURN_IF_ERROR(cudaSetDevice(device_))

// Blocks for a grid-stride loop over n items: enough to fill the device, no more than needed.
inline unsigned GridFor(int64_t n, int sm_count, int threads = kThreads) {
  const int64_t needed = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sm_count) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  bool shares_host_memory() const override { return false; }
  absl::Status Synchronize() override;
  bool records_graphs() const override { return graphs_; }
  uint64_t memory_epoch() const override { return scratch_epoch_; }

 protected:
  absl::StatusOr<void*> DoAllocate(size_t bytes, bool on_host) override;
  void DoFree(void* ptr, bool on_host) override;
  absl::Status DoCopy(const void* src, void* dst, size_t bytes, int direction) override;
  absl::Status DoFill(int64_t n, float value, float* x) override;
  absl::Status DoBeginCapture() override;
  absl::StatusOr<std::unique_ptr<OpGraph>> DoEndCapture() override;
  absl::StatusOr<void*> DoCreateEvent() override;
  void DoDestroyEvent(void* event) override;
  absl::Status DoCopyAsync(const void* src, void* dst, size_t bytes, int direction) override;
  absl::Status DoRecordEvent(Stream stream, void* event) override;
  absl::Status DoWaitEvent(Stream stream, void* event) override;
  absl::Status DoWaitForEvent(void* event) override;
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
  CudaBackend() = default;
  absl::Status Init(const BackendOptions& options);
  // Device scratch memory valid until the next call; grows (never shrinks) as needed, so a
  // steady-state training step allocates nothing. Growing bumps scratch_epoch_ (memory_epoch())
  // and is FAILED_PRECONDITION while capturing.
  absl::StatusOr<void*> Scratch(size_t bytes);
  // Device memory in stream order (see Init): valid for work queued on stream_ after the call;
  // freed behind the work queued before DeviceFree. DeviceFree(nullptr) does nothing.
  absl::StatusOr<void*> DeviceAlloc(size_t bytes);
  void DeviceFree(void* p);
  cudaStream_t StreamOf(Stream stream) const;
  // Makes the op stream wait for the work queued so far on the copy streams, so that memory
  // freed in the op stream's order is freed behind them too.
  void JoinCopyStreams();
  // Waits on the host for all three streams (errors cannot be reported: used when freeing).
  void SynchronizeAllStreams();

  int device_ = 0;
  int sm_count_ = 1;
  std::string name_;
  cudaStream_t stream_ = nullptr;           // Stream::kOps.
  cudaStream_t upload_stream_ = nullptr;    // Stream::kUpload: CopyToDeviceAsync.
  cudaStream_t download_stream_ = nullptr;  // Stream::kDownload: CopyToHostAsync.
  cudaEvent_t join_events_[2] = {nullptr, nullptr};  // JoinCopyStreams: upload, download.
  cudaMemPool_t pool_ = nullptr;  // Null where the device has no memory pools.
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  int* error_flag_ = nullptr;       // Device word the kernels report bad index data into.
  int* error_flag_host_ = nullptr;  // Page-locked copy read by Synchronize().
  void* scratch_ = nullptr;
  size_t scratch_size_ = 0;
  uint64_t scratch_epoch_ = 0;
  bool graphs_ = false;  // BackendOptions::cuda_graphs.
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_
