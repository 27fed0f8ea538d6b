// The compute backend interface: device memory, ordering/synchronisation, and the ops the models
// are built from. Two implementations: CPU (OpenBLAS sgemm + multi-threaded loops, cpu/) and CUDA
// (cuBLAS + hand-written kernels, cuda/). CreateBackend() in create_backend.h picks one.
//
// Conventions for every op:
//  * Tensors are float32, row-major and contiguous; pointers are device pointers obtained from
//    this backend's Allocate() (on a backend with shares_host_memory(), any host pointer).
//  * Ops are queued in order on the backend's op stream. On the CPU backend they run before
//    the call returns; on the CUDA backend they run asynchronously and Synchronize() waits.
//    Two more streams carry asynchronous copies beside the ops, ordered by events (see
//    "Copies beside the ops" below).
//  * Arguments are validated before anything is queued: negative sizes, null pointers for
//    non-empty tensors and inconsistent geometry are INVALID_ARGUMENT and change nothing.
//    Index data (gather/scatter indices, CSR offsets, labels) lives in device memory: the CPU
//    backend reports a bad index from the op itself, the CUDA backend from the next
//    Synchronize(); in both cases as INVALID_ARGUMENT naming the op, and no memory outside the
//    tensors is touched. Any CUDA runtime or cuBLAS failure becomes an absl::Status.
//  * An output pointer may equal an input pointer only where the op says so.
//
// Thread model: a Backend is not thread-safe; use one per thread (each has its own streams and
// thread pool). A Buffer or Event must not outlive the Backend that made it.
#ifndef PSCLUSTER_KERNELS_BACKEND_H_
#define PSCLUSTER_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pscluster::kernels {

enum class DeviceKind { kCpu, kCuda };
enum class Trans { kNo, kYes };
enum class Activation { kRelu, kGelu };  // GELU is the exact erf form, 0.5 x (1 + erf(x / sqrt 2)).
enum class HalfType { kFloat16, kBFloat16 };

const char* DeviceKindName(DeviceKind kind);
const char* ActivationName(Activation f);

struct BackendOptions {
  // CPU: threads for loops and GEMM (the caller's thread included); 0 = all hardware threads.
  int cpu_threads = 0;
  // CUDA: device ordinal used when the device string names none ("cuda" rather than "cuda:1").
  int cuda_device = 0;
  // CUDA: let cuBLAS run float32 GEMMs on TF32 tensor cores (faster, ~1e-3 relative error).
  bool cuda_allow_tf32 = false;
  // CUDA: let models record a step's ops as a CUDA Graph and replay it when the same shapes
  // recur (records_graphs()). The CPU backend launches nothing, so there is nothing to record:
  // it reports records_graphs() false whatever this says.
  bool cuda_graphs = false;
};

// A 2-D convolution over an NHWC input [batch, height, width, channels] with zero padding.
// Its im2col matrix has one row per output pixel (b, oy, ox) and one column per
// (ky, kx, c), in that order, so a weight [out_channels, kernel_h, kernel_w, channels] multiplies
// it as cols x weight^T and the result is the NHWC output [batch, out_h, out_w, out_channels].
struct ConvGeometry {
  int64_t batch = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  int64_t kernel_h = 0;
  int64_t kernel_w = 0;
  int64_t pad_h = 0;
  int64_t pad_w = 0;
  int64_t stride = 1;

  int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride + 1; }
  int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride + 1; }
  int64_t patch_size() const { return kernel_h * kernel_w * channels; }
  int64_t num_patches() const { return batch * out_h() * out_w(); }
  int64_t input_size() const { return batch * height * width * channels; }
};

// Max-pooling over an NHWC input; output [batch, out_h, out_w, channels].
struct PoolGeometry {
  int64_t batch = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  int64_t window = 2;
  int64_t stride = 2;

  int64_t out_h() const { return (height - window) / stride + 1; }
  int64_t out_w() const { return (width - window) / stride + 1; }
  int64_t input_size() const { return batch * height * width * channels; }
  int64_t output_size() const { return batch * out_h() * out_w() * channels; }
};

class Backend;

// Ops recorded between Backend::BeginCapture() and EndCapture() (a CUDA Graph on the CUDA
// backend). Launch() queues them again on the backend's stream with exactly the arguments they
// were recorded with: the same pointers, sizes and scalars, so it is only valid while every
// recorded pointer still points at memory laid out as it was. Must not outlive its backend; may
// be destroyed while a launch of it is still queued (that launch completes).
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  virtual absl::Status Launch() = 0;
};

// Memory owned by a backend: device memory (Allocate) or host staging memory (AllocateHost,
// page-locked on CUDA). Move-only; frees itself. An empty Buffer has data() == nullptr.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return ptr_; }
  size_t size() const { return size_; }  // Bytes.
  bool on_host() const { return on_host_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void Reset();  // Frees the memory now.

 private:
  friend class Backend;
  Buffer(Backend* owner, void* ptr, size_t size, bool on_host)
      : owner_(owner), ptr_(ptr), size_(size), on_host_(on_host) {}

  Backend* owner_ = nullptr;
  void* ptr_ = nullptr;
  size_t size_ = 0;
  bool on_host_ = false;
};

// The streams of a backend. kOps runs the ops (and the copies of CopyToDevice, CopyToHost and
// CopyOnDevice); kUpload and kDownload run the asynchronous copies to and from the device
// beside it (CopyToDeviceAsync, CopyToHostAsync). Each runs its work in order; only events
// order one against another.
enum class Stream { kOps, kUpload, kDownload };
const char* StreamName(Stream stream);

// A point in one of a backend's streams (Backend::RecordEvent) that other streams
// (Backend::WaitEvent) or the host (Backend::WaitForEvent) can wait for. Move-only; destroys
// itself; must not outlive its backend. An empty Event (default-constructed) cannot be used.
class Event {
 public:
  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  bool valid() const { return owner_ != nullptr; }
  const Backend* owner() const { return owner_; }
  void* handle() const { return handle_; }  // The backend's own (cudaEvent_t on CUDA).
  void Reset();

 private:
  friend class Backend;
  Event(Backend* owner, void* handle) : owner_(owner), handle_(handle) {}

  Backend* owner_ = nullptr;
  void* handle_ = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  // Human-readable description, e.g. "cpu (OpenBLAS 0.3.21, 2 threads)" or "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  // True when device pointers are host pointers (CPU): host memory can be passed to ops directly
  // and the copy functions are plain memcpy.
  virtual bool shares_host_memory() const = 0;

  // ---- Memory and ordering ----

  // Device memory, aligned to 256 bytes; zero bytes gives an empty Buffer. Contents undefined.
  absl::StatusOr<Buffer> Allocate(size_t bytes);
  // Host memory for staging transfers (page-locked on CUDA, so copies run asynchronously).
  absl::StatusOr<Buffer> AllocateHost(size_t bytes);
  // Copies queued on the stream. REQUIRES: the host memory stays valid and unchanged until the
  // next Synchronize() (CopyToHost's destination is only valid after it).
  absl::Status CopyToDevice(const void* host_src, void* device_dst, size_t bytes);
  absl::Status CopyToHost(const void* device_src, void* host_dst, size_t bytes);
  absl::Status CopyOnDevice(const void* device_src, void* device_dst, size_t bytes);
  // x[i] = value for i < n.
  absl::Status Fill(int64_t n, float value, float* x);
  // Waits for all work queued on the op stream (Stream::kOps); reports errors of asynchronous
  // work (CUDA) since the last call. The copy streams are waited for through events.
  // FAILED_PRECONDITION while capturing.
  virtual absl::Status Synchronize() = 0;

  // ---- Copies beside the ops (Stream::kUpload, Stream::kDownload) and events ----
  //
  // What lets a step's copies overlap its computation: the next step's inputs travel to the
  // device on the upload stream and a step's results come back on the download stream while
  // the op stream computes. Nothing orders the streams but events: a consumer waits for an
  // event recorded after its producer. On a backend without such streams (the CPU: the
  // defaults below) every copy runs before the call returns and events are no-ops, so the
  // order of the calls is the order of the work. All of these are FAILED_PRECONDITION while
  // capturing: recordings hold no copies from or to the host and no cross-stream waits.

  // An event that has never been recorded (waiting for it returns at once).
  absl::StatusOr<Event> CreateEvent();
  // Queued on the upload (to the device) or the download (to the host) stream. REQUIRES: the
  // host memory stays valid and unchanged until an event recorded after the copy on its stream
  // has been waited for by the host (WaitForEvent); CopyToHostAsync's destination is only valid
  // then. The device memory must not be used by another stream meanwhile unless events order
  // the two.
  absl::Status CopyToDeviceAsync(const void* host_src, void* device_dst, size_t bytes);
  absl::Status CopyToHostAsync(const void* device_src, void* host_dst, size_t bytes);
  // Records in `event` the point `stream` has reached: the work queued on it so far.
  absl::Status RecordEvent(Stream stream, const Event& event);
  // Work queued on `stream` from now on starts only once `event`'s latest recording (at the
  // time of this call) has been reached. Does not block the host.
  absl::Status WaitEvent(Stream stream, const Event& event);
  // Blocks the host until `event`'s latest recording has been reached; reports errors of the
  // asynchronous work (a failed copy) as Synchronize() does. (Kernels' reports of bad index
  // data come from Synchronize().)
  absl::Status WaitForEvent(const Event& event);

  // ---- Recording ops (CUDA Graphs) ----

  // True when the backend was asked to (BackendOptions::cuda_graphs) and can record ops: CUDA.
  virtual bool records_graphs() const { return false; }
  // Starts recording: the ops queued until EndCapture() are recorded, not run. While recording,
  // Allocate, AllocateHost, copies from or to host memory and Synchronize() are
  // FAILED_PRECONDITION, and so is an op that would have to grow the backend's own scratch
  // memory: grow everything first (run the same ops once unrecorded). REQUIRES: records_graphs(),
  // no capture under way, no Buffer freed until EndCapture().
  absl::Status BeginCapture();
  // Ends the recording and returns it; always ends it, also when it fails (an op could not be
  // recorded, the driver refused): nothing recorded has run and the backend is usable again.
  absl::StatusOr<std::unique_ptr<OpGraph>> EndCapture();
  bool capturing() const { return capturing_; }
  // Changes whenever the backend replaces memory of its own that recorded ops may point at (the
  // scratch some ops use): graphs recorded under another epoch must not be launched.
  virtual uint64_t memory_epoch() const { return 0; }

  // ---- Dense ops ----

  // C[m,n] = alpha * op(A) * op(B) + beta * C, with op(A) [m,k] and op(B) [k,n]. A is stored
  // [m,k] (ta == kNo) or [k,m] (ta == kYes); B is [k,n] or [n,k]. With beta == 0, C's previous
  // contents (NaN included) are ignored.
  absl::Status Gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c);
  // y[i,j] = x[i,j] + bias[j] over a [rows, cols] matrix. y may equal x.
  absl::Status AddBias(int64_t rows, int64_t cols, const float* x, const float* bias, float* y);
  // out[j] = sum_i x[i,j] over a [rows, cols] matrix, added to out[j] when `accumulate`.
  absl::Status ColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate, float* out);
  // y = f(x) elementwise. y may equal x.
  absl::Status ActivationForward(Activation f, int64_t n, const float* x, float* y);
  // dx = dy * f'(x), where x is the forward input. dx may equal dy.
  absl::Status ActivationBackward(Activation f, int64_t n, const float* x, const float* dy,
                                  float* dx);
  // Softmax cross-entropy of each row of logits [rows, classes] against labels[rows]:
  //   row_stats[2i]   = -log(softmax(logits_i)[labels_i])        (computed stably)
  //   row_stats[2i+1] = 1 if labels_i == argmax_j logits_ij (lowest j on ties), else 0
  //   dlogits[i,:]    = grad_scale * (softmax(logits_i) - onehot(labels_i))   (when non-null)
  // Sum row_stats with ColumnSum(rows, 2, ...) to get (total loss, correct count). dlogits may
  // equal logits. A label outside [0, classes) is INVALID_ARGUMENT.
  absl::Status SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                   const int32_t* labels, float grad_scale, float* dlogits,
                                   float* row_stats);

  // Binary cross-entropy with logits, one logit per row and labels in {0, 1}:
  //   row_stats[2i]   = log(1 + exp(z_i)) - y_i z_i                     (computed stably)
  //   row_stats[2i+1] = 1 if (z_i > 0) == (y_i == 1), else 0            (a NaN logit predicts 0)
  //   dlogits[i]      = grad_scale * (sigmoid(z_i) - y_i)               (when non-null)
  // dlogits may equal logits. A label other than 0 or 1 is INVALID_ARGUMENT.
  absl::Status SigmoidCrossEntropy(int64_t rows, const float* logits, const int32_t* labels,
                                   float grad_scale, float* dlogits, float* row_stats);
  // dst[i * dst_stride + j] = src[i * src_stride + j], plus dst's old value when `accumulate`,
  // for i < rows and j < cols: a block of columns copied between row-major matrices
  // (concatenation, slicing, sums of gradients). REQUIRES cols <= both strides; src and dst do
  // not overlap.
  absl::Status CopyBlock(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                         float* dst, int64_t dst_stride, bool accumulate);

  // ---- Feature interactions over x [rows, vectors, width] (row-major) ----

  // Factorization-machine second-order term, one value per row:
  //   out[i] = sum_{a < b} <x[i,a,:], x[i,b,:]>
  //          = 0.5 * sum_k ((sum_a x[i,a,k])^2 - sum_a x[i,a,k]^2)   (the O(vectors) form used)
  absl::Status FmForward(int64_t rows, int64_t vectors, int64_t width, const float* x, float* out);
  // dx[i,a,k] = dout[i] * (sum_b x[i,b,k] - x[i,a,k]) (overwritten).
  absl::Status FmBackward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                          const float* dout, float* dx);
  // DLRM's dot interaction: out[i,p] = <x[i,a,:], x[i,b,:]> for every pair a > b, in the order
  // p = a (a - 1) / 2 + b ((1,0), (2,0), (2,1), (3,0), ...); out is [rows, vectors (vectors-1)/2].
  absl::Status DotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                     const float* x, float* out);
  // dx[i,a,:] = sum_{b != a} dout[i, pair(a, b)] * x[i,b,:] (overwritten).
  absl::Status DotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                      const float* x, const float* dout, float* dx);

  // ---- Sparse rows ----

  // out[i,:] = table[idx[i],:] for i < n; table is [table_rows, width]. REQUIRES 0 <= idx < rows.
  absl::Status GatherRows(int64_t n, int64_t width, const float* table, int64_t table_rows,
                          const int32_t* idx, float* out);
  // table[idx[i],:] += src[i,:] for i < n. Repeated indices all add (no update is lost).
  absl::Status ScatterAddRows(int64_t n, int64_t width, const float* src, const int32_t* idx,
                              int64_t table_rows, float* table);
  // Weighted embedding bag over CSR segments of nnz (index, weight) entries:
  //   out[b,:] = sum_{j in [offsets[b], offsets[b+1])} weights[j] * table[idx[j],:]
  // offsets has bags + 1 entries, non-decreasing, within [0, nnz].
  absl::Status EmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                   const int32_t* offsets, const int32_t* idx,
                                   const float* weights, const float* table, int64_t table_rows,
                                   float* out);
  // The backward pass: dtable[idx[j],:] += weights[j] * dout[b,:] for every j of every bag b.
  // dtable is added to (zero it first for a plain gradient); repeated indices all add.
  absl::Status EmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                    const int32_t* offsets, const int32_t* idx,
                                    const float* weights, const float* dout, int64_t table_rows,
                                    float* dtable);

  // ---- Compression ----

  // float32 -> float16/bfloat16 bits (round to nearest even; NaN stays NaN; fp16 overflow is
  // infinity), and back. Bit-identical to common/dtype.h's conversions.
  absl::Status CastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y);
  absl::Status CastFromHalf(HalfType type, int64_t n, const uint16_t* x, float* y);
  // The k elements of x[n] with the largest |x| (NaN counts as larger than any number; ties go
  // to the lower index): their indices in ascending order in out_idx[k], and their values in
  // out_val[k] when non-null. REQUIRES 0 <= k <= n < 2^31.
  absl::Status TopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx, float* out_val);

  // ---- Convolution (NHWC, im2col + GEMM) and max-pooling ----

  // cols[num_patches, patch_size] from x (see ConvGeometry); padding reads as 0.
  absl::Status Im2Col(const ConvGeometry& g, const float* x, float* cols);
  // The adjoint of Im2Col: dx (overwritten) = sum of every cols entry that read each x element.
  absl::Status Col2Im(const ConvGeometry& g, const float* cols, float* dx);
  // y = max over each window (NaN wins), argmax = flat index into x of the chosen element (first
  // maximum in (wy, wx) order). REQUIRES input_size() < 2^31.
  absl::Status MaxPoolForward(const PoolGeometry& g, const float* x, float* y, int32_t* argmax);
  // dx (overwritten) = sum of dy over the windows whose argmax is that element.
  absl::Status MaxPoolBackward(const PoolGeometry& g, const float* dy, const int32_t* argmax,
                               float* dx);

 protected:
  Backend() = default;

  virtual absl::StatusOr<void*> DoAllocate(size_t bytes, bool on_host) = 0;
  virtual void DoFree(void* ptr, bool on_host) = 0;
  virtual absl::Status DoCopy(const void* src, void* dst, size_t bytes, int direction) = 0;
  // Directions for DoCopy.
  static constexpr int kToDevice = 0;
  static constexpr int kToHost = 1;
  static constexpr int kOnDevice = 2;
  virtual absl::Status DoFill(int64_t n, float value, float* x) = 0;
  // Recording (records_graphs() backends only; the defaults refuse).
  virtual absl::Status DoBeginCapture();
  virtual absl::StatusOr<std::unique_ptr<OpGraph>> DoEndCapture();
  // Side streams and events. The defaults are those of a backend without side streams: an
  // event is nothing (a null handle), an asynchronous copy is DoCopy (run at once), recording
  // and waiting do nothing.
  virtual absl::StatusOr<void*> DoCreateEvent() { return nullptr; }
  virtual void DoDestroyEvent(void* /*event*/) {}
  virtual absl::Status DoCopyAsync(const void* src, void* dst, size_t bytes, int direction) {
    return DoCopy(src, dst, bytes, direction);
  }
  virtual absl::Status DoRecordEvent(Stream /*stream*/, void* /*event*/) {
    return absl::OkStatus();
  }
  virtual absl::Status DoWaitEvent(Stream /*stream*/, void* /*event*/) {
    return absl::OkStatus();
  }
  virtual absl::Status DoWaitForEvent(void* /*event*/) { return absl::OkStatus(); }

  virtual absl::Status DoGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                              const float* a, const float* b, float beta, float* c) = 0;
  virtual absl::Status DoAddBias(int64_t rows, int64_t cols, const float* x, const float* bias,
                                 float* y) = 0;
  virtual absl::Status DoColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate,
                                   float* out) = 0;
  virtual absl::Status DoActivationForward(Activation f, int64_t n, const float* x,
                                           float* y) = 0;
  virtual absl::Status DoActivationBackward(Activation f, int64_t n, const float* x,
                                            const float* dy, float* dx) = 0;
  virtual absl::Status DoSoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                             const int32_t* labels, float grad_scale,
                                             float* dlogits, float* row_stats) = 0;
  virtual absl::Status DoSigmoidCrossEntropy(int64_t rows, const float* logits,
                                             const int32_t* labels, float grad_scale,
                                             float* dlogits, float* row_stats) = 0;
  virtual absl::Status DoCopyBlock(int64_t rows, int64_t cols, const float* src,
                                   int64_t src_stride, float* dst, int64_t dst_stride,
                                   bool accumulate) = 0;
  virtual absl::Status DoFmForward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                   float* out) = 0;
  virtual absl::Status DoFmBackward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                    const float* dout, float* dx) = 0;
  virtual absl::Status DoDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                               const float* x, float* out) = 0;
  virtual absl::Status DoDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                                const float* x, const float* dout,
                                                float* dx) = 0;
  virtual absl::Status DoGatherRows(int64_t n, int64_t width, const float* table,
                                    int64_t table_rows, const int32_t* idx, float* out) = 0;
  virtual absl::Status DoScatterAddRows(int64_t n, int64_t width, const float* src,
                                        const int32_t* idx, int64_t table_rows,
                                        float* table) = 0;
  virtual absl::Status DoEmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                             const int32_t* offsets, const int32_t* idx,
                                             const float* weights, const float* table,
                                             int64_t table_rows, float* out) = 0;
  virtual absl::Status DoEmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                              const int32_t* offsets, const int32_t* idx,
                                              const float* weights, const float* dout,
                                              int64_t table_rows, float* dtable) = 0;
  virtual absl::Status DoCastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y) = 0;
  virtual absl::Status DoCastFromHalf(HalfType type, int64_t n, const uint16_t* x,
                                      float* y) = 0;
  virtual absl::Status DoTopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx,
                                 float* out_val) = 0;
  virtual absl::Status DoIm2Col(const ConvGeometry& g, const float* x, float* cols) = 0;
  virtual absl::Status DoCol2Im(const ConvGeometry& g, const float* cols, float* dx) = 0;
  virtual absl::Status DoMaxPoolForward(const PoolGeometry& g, const float* x, float* y,
                                        int32_t* argmax) = 0;
  virtual absl::Status DoMaxPoolBackward(const PoolGeometry& g, const float* dy,
                                         const int32_t* argmax, float* dx) = 0;

 private:
  friend class Buffer;
  friend class Event;
  bool capturing_ = false;
};

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_BACKEND_H_
