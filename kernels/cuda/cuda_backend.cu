// CudaBackend: creation, stream-ordered memory, copies (on the op stream and the two copy
// streams), events, synchronisation and cuBLAS GEMM.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_impl.h"

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {
namespace cuda {

const char* DeviceErrorMessage(int code) {
  switch (code) {
    case kBadLabel:
      return "SoftmaxCrossEntropy: a label is outside [0, classes)";
    case kBadBinaryLabel:
      return "SigmoidCrossEntropy: a label is not 0 or 1";
    case kBadGatherIndex:
      return "GatherRows: an index is outside [0, table_rows)";
    case kBadScatterIndex:
      return "ScatterAddRows: an index is outside [0, table_rows)";
    case kBadBagForward:
      return "EmbeddingBagForward: offsets are not non-decreasing within [0, nnz] or an index "
             "is outside [0, table_rows)";
    case kBadBagBackward:
      return "EmbeddingBagBackward: offsets are not non-decreasing within [0, nnz] or an index "
             "is outside [0, table_rows)";
    default:
      return "a kernel reported an unknown error";
  }
}

namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

__global__ void FillKernel(int64_t n, float value, float* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

__global__ void ScaleKernel(int64_t n, float beta, float* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = beta * x[i];
  }
}

// A captured step: an instantiated CUDA Graph, launched on the backend's stream.
class CudaOpGraph final : public OpGraph {
 public:
  CudaOpGraph(int device, cudaStream_t stream, cudaGraphExec_t exec)
      : device_(device), stream_(stream), exec_(exec) {}
  ~CudaOpGraph() override {
    // A graph still running is freed when it completes (cudaGraphExecDestroy does not wait).
    cudaSetDevice(device_);
    cudaGraphExecDestroy(exec_);
  }
  absl::Status Launch() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream_));
    return absl::OkStatus();
  }

 private:
  const int device_;
  const cudaStream_t stream_;
  const cudaGraphExec_t exec_;
};

}  // namespace
}  // namespace cuda

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  return CudaBackend::Create(options);
}

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(const BackendOptions& options) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend());
  KERNELS_RETURN_IF_ERROR(backend->Init(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::Status CudaBackend::Init(const BackendOptions& options) {
  device_ = options.cuda_device;
  graphs_ = options.cuda_graphs;
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device_ < 0 || device_ >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device_, " does not exist (", count, " present)"));
  }
  KERNELS_CUDA_ACTIVATE();
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  sm_count_ = prop.multiProcessorCount;
  name_ = absl::StrCat("cuda:", device_, " (", prop.name, ", sm_", prop.major, prop.minor, ", ",
                       sm_count_, " SMs, TF32 ", options.cuda_allow_tf32 ? "on" : "off",
                       options.cuda_graphs ? ", CUDA graphs" : "", ")");
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // The copy streams: uploads and downloads each on their own, so that an upload never queues
  // behind a download that waits for the ops (devices have a copy engine per direction).
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&download_stream_, cudaStreamNonBlocking));
  for (cudaEvent_t& e : join_events_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  // Device memory comes from a pool of this backend's own, allocated and freed in stream order:
  // a free is queued behind the work that may still use the memory, and nothing waits for the
  // device. Devices without memory pools fall back to cudaMalloc, and a free waits for the
  // stream first.
  int pools = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_));
  if (pools != 0) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&pool_, &props));
  }
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      cublas_, options.cuda_allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  // A fixed workspace: cuBLAS then never allocates during a GEMM.
  CUDA_RETURN_IF_ERROR(cudaMalloc(&cublas_workspace_, cuda::kCublasWorkspaceBytes));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(cublas_, cublas_workspace_, cuda::kCublasWorkspaceBytes));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&error_flag_, sizeof(int)));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(error_flag_, 0, sizeof(int), stream_));
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&error_flag_host_, sizeof(int)));
  *error_flag_host_ = 0;
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  // Errors here cannot be reported; the context may already be broken, so each step is tried.
  // Every Buffer is gone by now (they must not outlive the backend); their queued frees and the
  // scratch's complete with the stream.
  cudaSetDevice(device_);
  DeviceFree(scratch_);
  SynchronizeAllStreams();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaFree(error_flag_);
  if (error_flag_host_ != nullptr) cudaFreeHost(error_flag_host_);
  if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  for (cudaEvent_t e : join_events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaStream_t s : {stream_, upload_stream_, download_stream_}) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
}

absl::Status CudaBackend::Synchronize() {
  if (capturing()) {
    return absl::FailedPreconditionError("Synchronize: not allowed while ops are being recorded");
  }
  KERNELS_CUDA_ACTIVATE();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(error_flag_host_, error_flag_, sizeof(int),
                                       cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const int code = *error_flag_host_;
  if (code != cuda::kNoError) {
    *error_flag_host_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(error_flag_, 0, sizeof(int), stream_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::InvalidArgumentError(
        absl::StrCat(cuda::DeviceErrorMessage(code), " (reported by the device)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::Scratch(size_t bytes) {
  if (bytes <= scratch_size_) return scratch_;
  if (capturing()) {
    // A recorded graph must not allocate or free: the caller runs the ops unrecorded first.
    return absl::FailedPreconditionError(
        absl::StrCat("scratch would grow to ", bytes, " bytes while ops are being recorded"));
  }
  ++scratch_epoch_;  // Graphs recorded with the old scratch must not run again.
  // Stream-ordered: the old scratch is freed behind the kernels queued to use it.
  DeviceFree(scratch_);
  scratch_ = nullptr;
  scratch_size_ = 0;
  const size_t rounded = std::max<size_t>(bytes + bytes / 2, size_t{1} << 20);
  KERNELS_ASSIGN_OR_RETURN(scratch_, DeviceAlloc(rounded));
  scratch_size_ = rounded;
  return scratch_;
}

absl::StatusOr<void*> CudaBackend::DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (pool_ != nullptr) {
    CUDA_RETURN_IF_ERROR(cudaMallocFromPoolAsync(&p, bytes, pool_, stream_));
  } else {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  }
  if (reinterpret_cast<uintptr_t>(p) % 256 != 0) {
    DeviceFree(p);
    return absl::InternalError("CUDA allocation is not aligned to 256 bytes");
  }
  return p;
}

void CudaBackend::DeviceFree(void* p) {
  if (p == nullptr) return;
  if (pool_ != nullptr) {
    // The copy streams may still use the memory too: the free waits for them as well.
    JoinCopyStreams();
    cudaFreeAsync(p, stream_);
  } else {
    SynchronizeAllStreams();
    cudaFree(p);
  }
}

cudaStream_t CudaBackend::StreamOf(Stream stream) const {
  switch (stream) {
    case Stream::kUpload:
      return upload_stream_;
    case Stream::kDownload:
      return download_stream_;
    case Stream::kOps:
      break;
  }
  return stream_;
}

void CudaBackend::JoinCopyStreams() {
  const cudaStream_t copies[2] = {upload_stream_, download_stream_};
  for (int i = 0; i < 2; ++i) {
    if (copies[i] == nullptr || join_events_[i] == nullptr || stream_ == nullptr) continue;
    if (cudaEventRecord(join_events_[i], copies[i]) != cudaSuccess ||
        cudaStreamWaitEvent(stream_, join_events_[i], 0) != cudaSuccess) {
      cudaStreamSynchronize(copies[i]);  // The slow way, but the memory is not freed early.
    }
  }
}

void CudaBackend::SynchronizeAllStreams() {
  for (cudaStream_t s : {stream_, upload_stream_, download_stream_}) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
}

absl::StatusOr<void*> CudaBackend::DoAllocate(size_t bytes, bool on_host) {
  KERNELS_CUDA_ACTIVATE();
  if (!on_host) return DeviceAlloc(bytes);
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes));
  return p;
}

void CudaBackend::DoFree(void* ptr, bool on_host) {
  // Queued copies may still read or write the memory. Device memory is freed in stream order
  // (behind the copy streams too); page-locked host memory only once every stream has drained.
  cudaSetDevice(device_);
  if (on_host) {
    SynchronizeAllStreams();
    cudaFreeHost(ptr);
  } else {
    DeviceFree(ptr);
  }
}

absl::Status CudaBackend::DoCopy(const void* src, void* dst, size_t bytes, int direction) {
  KERNELS_CUDA_ACTIVATE();
  const cudaMemcpyKind kind = direction == kToDevice ? cudaMemcpyHostToDevice
                              : direction == kToHost ? cudaMemcpyDeviceToHost
                                                     : cudaMemcpyDeviceToDevice;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::DoCreateEvent() {
  KERNELS_CUDA_ACTIVATE();
  cudaEvent_t event = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return static_cast<void*>(event);
}

void CudaBackend::DoDestroyEvent(void* event) {
  // Safe while the event is still pending: its resources go once it completes.
  cudaSetDevice(device_);
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::Status CudaBackend::DoCopyAsync(const void* src, void* dst, size_t bytes, int direction) {
  KERNELS_CUDA_ACTIVATE();
  const bool up = direction == kToDevice;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes,
                                       up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                       up ? upload_stream_ : download_stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoRecordEvent(Stream stream, void* event) {
  KERNELS_CUDA_ACTIVATE();
  CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event), StreamOf(stream)));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoWaitEvent(Stream stream, void* event) {
  KERNELS_CUDA_ACTIVATE();
  CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(StreamOf(stream), static_cast<cudaEvent_t>(event), 0));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoWaitForEvent(void* event) {
  KERNELS_CUDA_ACTIVATE();
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoFill(int64_t n, float value, float* x) {
  KERNELS_CUDA_ACTIVATE();
  cuda::FillKernel<<<cuda::GridFor(n, sm_count_), cuda::kThreads, 0, stream_>>>(n, value, x);
  CUDA_RETURN_IF_LAUNCH_FAILED("FillKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoBeginCapture() {
  KERNELS_CUDA_ACTIVATE();
  // Thread-local mode: only this thread's unsafe calls (allocations, synchronisation) break the
  // capture; other threads and other backends go on as usual.
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OpGraph>> CudaBackend::DoEndCapture() {
  // Always end the capture, whatever else fails, so that the stream runs work again.
  cudaSetDevice(device_);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    // A broken capture is no sticky error: clear it, or the next launch check would report it.
    cudaGetLastError();
    return cuda::CudaStatus(ended, "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    return cuda::CudaStatus(made, "cudaGraphInstantiate");
  }
  return std::unique_ptr<OpGraph>(new cuda::CudaOpGraph(device_, stream_, exec));
}

absl::Status CudaBackend::DoGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                                 const float* a, const float* b, float beta, float* c) {
  KERNELS_CUDA_ACTIVATE();
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: pass B first, with the
  // row-major leading dimensions unchanged.
  const cublasOperation_t opa = ta == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(ta == Trans::kYes ? m : k);
  const int ldb = static_cast<int>(tb == Trans::kYes ? k : n);
  if (k == 0) {
    // cuBLAS returns without touching C when k == 0; the contract is C = beta * C.
    if (beta == 0.0f) return DoFill(m * n, 0.0f, c);
    cuda::ScaleKernel<<<cuda::GridFor(m * n, sm_count_), cuda::kThreads, 0, stream_>>>(m * n,
                                                                                      beta, c);
    CUDA_RETURN_IF_LAUNCH_FAILED("ScaleKernel");
    return absl::OkStatus();
  }
  CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_, opb, opa, static_cast<int>(n), static_cast<int>(m),
                                     static_cast<int>(k), &alpha, b, ldb, a, lda, &beta, c,
                                     static_cast<int>(n)));
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
