#include "kernels/backend.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace pscluster::kernels {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

const char* ActivationName(Activation f) {
  switch (f) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGelu:
      return "gelu";
  }
  return "unknown";
}

// ---- Buffer ----

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      on_host_(other.on_host_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    on_host_ = other.on_host_;
  }
  return *this;
}

Buffer::~Buffer() { Reset(); }

void Buffer::Reset() {
  if (owner_ != nullptr && ptr_ != nullptr) owner_->DoFree(ptr_, on_host_);
  owner_ = nullptr;
  ptr_ = nullptr;
  size_ = 0;
}

// ---- Event ----

const char* StreamName(Stream stream) {
  switch (stream) {
    case Stream::kOps:
      return "ops";
    case Stream::kUpload:
      return "upload";
    case Stream::kDownload:
      return "download";
  }
  return "unknown";
}

Event::Event(Event&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      handle_(std::exchange(other.handle_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Event::~Event() { Reset(); }

void Event::Reset() {
  if (owner_ != nullptr) owner_->DoDestroyEvent(handle_);
  owner_ = nullptr;
  handle_ = nullptr;
}

// ---- Argument checks shared by both backends ----

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 46;  // Far beyond any device; keeps products safe.
constexpr int64_t kMaxIndexable = int64_t{1} << 31;  // int32 indices address at most this many.

absl::Status Invalid(const char* op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

absl::Status CheckDim(const char* op, const char* name, int64_t v) {
  if (v < 0) return Invalid(op, absl::StrCat(name, " = ", v, " must be >= 0"));
  if (v > kMaxElements) return Invalid(op, absl::StrCat(name, " = ", v, " is too large"));
  return absl::OkStatus();
}

// Size of a tensor with the given dims; INVALID_ARGUMENT when it overflows kMaxElements.
absl::StatusOr<int64_t> Product(const char* op, std::initializer_list<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (d != 0 && p > kMaxElements / d) return Invalid(op, "tensor is too large");
    p *= d;
  }
  return p;
}

absl::Status CheckPtr(const char* op, const char* name, const void* p, int64_t elements) {
  if (elements > 0 && p == nullptr) {
    return Invalid(op, absl::StrCat(name, " is null but must hold ", elements, " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckConv(const char* op, const ConvGeometry& g) {
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "batch", g.batch));
  if (g.height < 1 || g.width < 1 || g.channels < 1) {
    return Invalid(op, absl::StrCat("height, width and channels must be >= 1, got ", g.height,
                                    "x", g.width, "x", g.channels));
  }
  if (g.kernel_h < 1 || g.kernel_w < 1) return Invalid(op, "kernel_h and kernel_w must be >= 1");
  if (g.pad_h < 0 || g.pad_w < 0) return Invalid(op, "pad_h and pad_w must be >= 0");
  if (g.stride < 1) return Invalid(op, "stride must be >= 1");
  if (g.pad_h >= g.kernel_h || g.pad_w >= g.kernel_w) {
    return Invalid(op, "padding must be smaller than the kernel");
  }
  if (g.height + 2 * g.pad_h < g.kernel_h || g.width + 2 * g.pad_w < g.kernel_w) {
    return Invalid(op, "kernel is larger than the padded input");
  }
  KERNELS_ASSIGN_OR_RETURN(int64_t in, Product(op, {g.batch, g.height, g.width, g.channels}));
  KERNELS_ASSIGN_OR_RETURN(int64_t cols, Product(op, {g.batch, g.out_h(), g.out_w(),
                                                      g.kernel_h, g.kernel_w, g.channels}));
  (void)in;
  (void)cols;
  return absl::OkStatus();
}

absl::Status CheckPool(const char* op, const PoolGeometry& g) {
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "batch", g.batch));
  if (g.height < 1 || g.width < 1 || g.channels < 1) {
    return Invalid(op, "height, width and channels must be >= 1");
  }
  if (g.window < 1 || g.stride < 1) return Invalid(op, "window and stride must be >= 1");
  if (g.window > g.height || g.window > g.width) return Invalid(op, "window exceeds the input");
  KERNELS_ASSIGN_OR_RETURN(int64_t in, Product(op, {g.batch, g.height, g.width, g.channels}));
  if (in >= kMaxIndexable) return Invalid(op, "input has 2^31 or more elements");
  return absl::OkStatus();
}

}  // namespace

// ---- Memory ----

namespace {

absl::Status RefuseWhileCapturing(const Backend& backend, const char* op) {
  if (!backend.capturing()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(op, ": not allowed while ops are being recorded (BeginCapture)"));
}

}  // namespace

absl::StatusOr<Buffer> Backend::Allocate(size_t bytes) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "Allocate"));
  if (bytes == 0) return Buffer();
  KERNELS_ASSIGN_OR_RETURN(void* p, DoAllocate(bytes, /*on_host=*/false));
  return Buffer(this, p, bytes, /*on_host=*/false);
}

absl::StatusOr<Buffer> Backend::AllocateHost(size_t bytes) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "AllocateHost"));
  if (bytes == 0) return Buffer(nullptr, nullptr, 0, /*on_host=*/true);
  KERNELS_ASSIGN_OR_RETURN(void* p, DoAllocate(bytes, /*on_host=*/true));
  return Buffer(this, p, bytes, /*on_host=*/true);
}

absl::Status Backend::CopyToDevice(const void* host_src, void* device_dst, size_t bytes) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "CopyToDevice"));
  if (bytes == 0) return absl::OkStatus();
  if (host_src == nullptr || device_dst == nullptr) return Invalid("CopyToDevice", "null pointer");
  return DoCopy(host_src, device_dst, bytes, kToDevice);
}

absl::Status Backend::CopyToHost(const void* device_src, void* host_dst, size_t bytes) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "CopyToHost"));
  if (bytes == 0) return absl::OkStatus();
  if (host_dst == nullptr || device_src == nullptr) return Invalid("CopyToHost", "null pointer");
  return DoCopy(device_src, host_dst, bytes, kToHost);
}

absl::Status Backend::CopyOnDevice(const void* device_src, void* device_dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (device_src == nullptr || device_dst == nullptr) {
    return Invalid("CopyOnDevice", "null pointer");
  }
  return DoCopy(device_src, device_dst, bytes, kOnDevice);
}

// ---- Side streams and events ----

namespace {

absl::Status CheckEvent(const Backend& backend, const char* op, const Event& event) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(backend, op));
  if (!event.valid()) return Invalid(op, "the event is empty (not from CreateEvent)");
  if (event.owner() != &backend) return Invalid(op, "the event is another backend's");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Event> Backend::CreateEvent() {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "CreateEvent"));
  KERNELS_ASSIGN_OR_RETURN(void* handle, DoCreateEvent());
  return Event(this, handle);
}

absl::Status Backend::CopyToDeviceAsync(const void* host_src, void* device_dst, size_t bytes) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "CopyToDeviceAsync"));
  if (bytes == 0) return absl::OkStatus();
  if (host_src == nullptr || device_dst == nullptr) {
    return Invalid("CopyToDeviceAsync", "null pointer");
  }
  return DoCopyAsync(host_src, device_dst, bytes, kToDevice);
}

absl::Status Backend::CopyToHostAsync(const void* device_src, void* host_dst, size_t bytes) {
  KERNELS_RETURN_IF_ERROR(RefuseWhileCapturing(*this, "CopyToHostAsync"));
  if (bytes == 0) return absl::OkStatus();
  if (device_src == nullptr || host_dst == nullptr) {
    return Invalid("CopyToHostAsync", "null pointer");
  }
  return DoCopyAsync(device_src, host_dst, bytes, kToHost);
}

absl::Status Backend::RecordEvent(Stream stream, const Event& event) {
  KERNELS_RETURN_IF_ERROR(CheckEvent(*this, "RecordEvent", event));
  return DoRecordEvent(stream, event.handle());
}

absl::Status Backend::WaitEvent(Stream stream, const Event& event) {
  KERNELS_RETURN_IF_ERROR(CheckEvent(*this, "WaitEvent", event));
  return DoWaitEvent(stream, event.handle());
}

absl::Status Backend::WaitForEvent(const Event& event) {
  KERNELS_RETURN_IF_ERROR(CheckEvent(*this, "WaitForEvent", event));
  return DoWaitForEvent(event.handle());
}

// ---- Recording ----

absl::Status Backend::BeginCapture() {
  if (!records_graphs()) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginCapture: backend ", name(), " does not record ops"));
  }
  if (capturing_) return absl::FailedPreconditionError("BeginCapture: already capturing");
  KERNELS_RETURN_IF_ERROR(DoBeginCapture());
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OpGraph>> Backend::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("EndCapture: no capture under way");
  capturing_ = false;
  return DoEndCapture();
}

absl::Status Backend::DoBeginCapture() {
  return absl::UnimplementedError("this backend does not record ops");
}

absl::StatusOr<std::unique_ptr<OpGraph>> Backend::DoEndCapture() {
  return absl::UnimplementedError("this backend does not record ops");
}

absl::Status Backend::Fill(int64_t n, float value, float* x) {
  KERNELS_RETURN_IF_ERROR(CheckDim("Fill", "n", n));
  KERNELS_RETURN_IF_ERROR(CheckPtr("Fill", "x", x, n));
  if (n == 0) return absl::OkStatus();
  return DoFill(n, value, x);
}

// ---- Dense ops ----

absl::Status Backend::Gemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                           const float* a, const float* b, float beta, float* c) {
  constexpr const char* op = "Gemm";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "m", m));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "n", n));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "k", k));
  KERNELS_ASSIGN_OR_RETURN(int64_t mk, Product(op, {m, k}));
  KERNELS_ASSIGN_OR_RETURN(int64_t kn, Product(op, {k, n}));
  KERNELS_ASSIGN_OR_RETURN(int64_t mn, Product(op, {m, n}));
  // cuBLAS and OpenBLAS take int dimensions.
  if (m > std::numeric_limits<int>::max() || n > std::numeric_limits<int>::max() ||
      k > std::numeric_limits<int>::max()) {
    return Invalid(op, "a dimension exceeds 2^31 - 1");
  }
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "a", a, mn > 0 ? mk : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "b", b, mn > 0 ? kn : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "c", c, mn));
  if (mn == 0) return absl::OkStatus();
  return DoGemm(ta, tb, m, n, k, alpha, a, b, beta, c);
}

absl::Status Backend::AddBias(int64_t rows, int64_t cols, const float* x, const float* bias,
                              float* y) {
  constexpr const char* op = "AddBias";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "rows", rows));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "cols", cols));
  KERNELS_ASSIGN_OR_RETURN(int64_t size, Product(op, {rows, cols}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "bias", bias, size > 0 ? cols : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "y", y, size));
  if (size == 0) return absl::OkStatus();
  return DoAddBias(rows, cols, x, bias, y);
}

absl::Status Backend::ColumnSum(int64_t rows, int64_t cols, const float* x, bool accumulate,
                                float* out) {
  constexpr const char* op = "ColumnSum";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "rows", rows));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "cols", cols));
  KERNELS_ASSIGN_OR_RETURN(int64_t size, Product(op, {rows, cols}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "out", out, cols));
  if (cols == 0) return absl::OkStatus();
  if (rows == 0) return accumulate ? absl::OkStatus() : DoFill(cols, 0.0f, out);
  return DoColumnSum(rows, cols, x, accumulate, out);
}

absl::Status Backend::ActivationForward(Activation f, int64_t n, const float* x, float* y) {
  constexpr const char* op = "ActivationForward";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "n", n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "y", y, n));
  if (f != Activation::kRelu && f != Activation::kGelu) return Invalid(op, "unknown activation");
  if (n == 0) return absl::OkStatus();
  return DoActivationForward(f, n, x, y);
}

absl::Status Backend::ActivationBackward(Activation f, int64_t n, const float* x, const float* dy,
                                         float* dx) {
  constexpr const char* op = "ActivationBackward";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "n", n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dy", dy, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dx", dx, n));
  if (f != Activation::kRelu && f != Activation::kGelu) return Invalid(op, "unknown activation");
  if (n == 0) return absl::OkStatus();
  return DoActivationBackward(f, n, x, dy, dx);
}

absl::Status Backend::SoftmaxCrossEntropy(int64_t rows, int64_t classes, const float* logits,
                                          const int32_t* labels, float grad_scale,
                                          float* dlogits, float* row_stats) {
  constexpr const char* op = "SoftmaxCrossEntropy";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "rows", rows));
  if (classes < 1 || classes >= kMaxIndexable) {
    return Invalid(op, absl::StrCat("classes = ", classes, " must be in [1, 2^31)"));
  }
  KERNELS_ASSIGN_OR_RETURN(int64_t size, Product(op, {rows, classes}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "logits", logits, size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "labels", labels, rows));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "row_stats", row_stats, 2 * rows));
  if (rows == 0) return absl::OkStatus();
  return DoSoftmaxCrossEntropy(rows, classes, logits, labels, grad_scale, dlogits, row_stats);
}

absl::Status Backend::SigmoidCrossEntropy(int64_t rows, const float* logits,
                                          const int32_t* labels, float grad_scale,
                                          float* dlogits, float* row_stats) {
  constexpr const char* op = "SigmoidCrossEntropy";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "rows", rows));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "logits", logits, rows));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "labels", labels, rows));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "row_stats", row_stats, 2 * rows));
  if (rows == 0) return absl::OkStatus();
  return DoSigmoidCrossEntropy(rows, logits, labels, grad_scale, dlogits, row_stats);
}

absl::Status Backend::CopyBlock(int64_t rows, int64_t cols, const float* src,
                                int64_t src_stride, float* dst, int64_t dst_stride,
                                bool accumulate) {
  constexpr const char* op = "CopyBlock";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "rows", rows));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "cols", cols));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "src_stride", src_stride));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "dst_stride", dst_stride));
  if (src_stride < cols) {
    return Invalid(op, absl::StrCat("src_stride = ", src_stride, " must be >= cols = ", cols));
  }
  if (dst_stride < cols) {
    return Invalid(op, absl::StrCat("dst_stride = ", dst_stride, " must be >= cols = ", cols));
  }
  if (rows == 0 || cols == 0) return absl::OkStatus();
  KERNELS_ASSIGN_OR_RETURN(int64_t src_rows, Product(op, {rows - 1, src_stride}));
  KERNELS_ASSIGN_OR_RETURN(int64_t dst_rows, Product(op, {rows - 1, dst_stride}));
  const int64_t src_extent = src_rows + cols, dst_extent = dst_rows + cols;
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "src", src, src_extent));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dst", dst, dst_extent));
  const auto s0 = reinterpret_cast<uintptr_t>(src), d0 = reinterpret_cast<uintptr_t>(dst);
  if (s0 < d0 + sizeof(float) * dst_extent && d0 < s0 + sizeof(float) * src_extent) {
    return Invalid(op, "src and dst overlap");
  }
  return DoCopyBlock(rows, cols, src, src_stride, dst, dst_stride, accumulate);
}

// ---- Feature interactions ----

namespace {

// Checks [rows, vectors, width] and returns its size.
absl::StatusOr<int64_t> CheckInteraction(const char* op, int64_t rows, int64_t vectors,
                                         int64_t width) {
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "rows", rows));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "vectors", vectors));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "width", width));
  if (vectors >= kMaxIndexable) return Invalid(op, "vectors must be < 2^31");
  return Product(op, {rows, vectors, width});
}

}  // namespace

absl::Status Backend::FmForward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                float* out) {
  constexpr const char* op = "FmForward";
  KERNELS_ASSIGN_OR_RETURN(int64_t size, CheckInteraction(op, rows, vectors, width));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "out", out, rows));
  if (rows == 0) return absl::OkStatus();
  if (size == 0) return DoFill(rows, 0.0f, out);
  return DoFmForward(rows, vectors, width, x, out);
}

absl::Status Backend::FmBackward(int64_t rows, int64_t vectors, int64_t width, const float* x,
                                 const float* dout, float* dx) {
  constexpr const char* op = "FmBackward";
  KERNELS_ASSIGN_OR_RETURN(int64_t size, CheckInteraction(op, rows, vectors, width));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dout", dout, size > 0 ? rows : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dx", dx, size));
  if (size == 0) return absl::OkStatus();
  return DoFmBackward(rows, vectors, width, x, dout, dx);
}

absl::Status Backend::DotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                            const float* x, float* out) {
  constexpr const char* op = "DotInteractionForward";
  KERNELS_ASSIGN_OR_RETURN(int64_t size, CheckInteraction(op, rows, vectors, width));
  const int64_t pairs = vectors * (vectors - 1) / 2;
  KERNELS_ASSIGN_OR_RETURN(int64_t out_size, Product(op, {rows, pairs}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, out_size > 0 ? size : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "out", out, out_size));
  if (out_size == 0) return absl::OkStatus();
  if (width == 0) return DoFill(out_size, 0.0f, out);
  return DoDotInteractionForward(rows, vectors, width, x, out);
}

absl::Status Backend::DotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                             const float* x, const float* dout, float* dx) {
  constexpr const char* op = "DotInteractionBackward";
  KERNELS_ASSIGN_OR_RETURN(int64_t size, CheckInteraction(op, rows, vectors, width));
  const int64_t pairs = vectors * (vectors - 1) / 2;
  KERNELS_ASSIGN_OR_RETURN(int64_t dout_size, Product(op, {rows, pairs}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dout", dout, size > 0 ? dout_size : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dx", dx, size));
  if (size == 0) return absl::OkStatus();
  if (pairs == 0) return DoFill(size, 0.0f, dx);
  return DoDotInteractionBackward(rows, vectors, width, x, dout, dx);
}

// ---- Sparse rows ----

absl::Status Backend::GatherRows(int64_t n, int64_t width, const float* table, int64_t table_rows,
                                 const int32_t* idx, float* out) {
  constexpr const char* op = "GatherRows";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "n", n));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "width", width));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "table_rows", table_rows));
  if (table_rows > kMaxIndexable) return Invalid(op, "table_rows exceeds 2^31");
  KERNELS_ASSIGN_OR_RETURN(int64_t out_size, Product(op, {n, width}));
  KERNELS_ASSIGN_OR_RETURN(int64_t table_size, Product(op, {table_rows, width}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "idx", idx, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "out", out, out_size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "table", table, out_size > 0 ? table_size : 0));
  if (n > 0 && table_rows == 0) return Invalid(op, "indices into an empty table");
  if (out_size == 0) return absl::OkStatus();
  return DoGatherRows(n, width, table, table_rows, idx, out);
}

absl::Status Backend::ScatterAddRows(int64_t n, int64_t width, const float* src,
                                     const int32_t* idx, int64_t table_rows, float* table) {
  constexpr const char* op = "ScatterAddRows";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "n", n));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "width", width));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "table_rows", table_rows));
  if (table_rows > kMaxIndexable) return Invalid(op, "table_rows exceeds 2^31");
  KERNELS_ASSIGN_OR_RETURN(int64_t src_size, Product(op, {n, width}));
  KERNELS_ASSIGN_OR_RETURN(int64_t table_size, Product(op, {table_rows, width}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "idx", idx, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "src", src, src_size));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "table", table, src_size > 0 ? table_size : 0));
  if (n > 0 && table_rows == 0) return Invalid(op, "indices into an empty table");
  if (src_size == 0) return absl::OkStatus();
  return DoScatterAddRows(n, width, src, idx, table_rows, table);
}

namespace {

absl::Status CheckBag(const char* op, int64_t bags, int64_t width, int64_t nnz,
                      const int32_t* offsets, const int32_t* idx, const float* weights,
                      const float* table, int64_t table_rows, const float* dense) {
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "bags", bags));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "width", width));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "nnz", nnz));
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "table_rows", table_rows));
  if (table_rows > kMaxIndexable) return Invalid(op, "table_rows exceeds 2^31");
  if (nnz >= kMaxIndexable) return Invalid(op, "nnz must be < 2^31 (int32 offsets)");
  KERNELS_ASSIGN_OR_RETURN(int64_t dense_size, Product(op, {bags, width}));
  KERNELS_ASSIGN_OR_RETURN(int64_t table_size, Product(op, {table_rows, width}));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "offsets", offsets, bags + 1));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "idx", idx, nnz));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "weights", weights, nnz));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "table", table, width > 0 && nnz > 0 ? table_size : 0));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "dense", dense, dense_size));
  if (nnz > 0 && table_rows == 0) return Invalid(op, "indices into an empty table");
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::EmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                          const int32_t* offsets, const int32_t* idx,
                                          const float* weights, const float* table,
                                          int64_t table_rows, float* out) {
  KERNELS_RETURN_IF_ERROR(CheckBag("EmbeddingBagForward", bags, width, nnz, offsets, idx, weights,
                                   table, table_rows, out));
  if (bags == 0 || width == 0) return absl::OkStatus();
  return DoEmbeddingBagForward(bags, width, nnz, offsets, idx, weights, table, table_rows, out);
}

absl::Status Backend::EmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                           const int32_t* offsets, const int32_t* idx,
                                           const float* weights, const float* dout,
                                           int64_t table_rows, float* dtable) {
  KERNELS_RETURN_IF_ERROR(CheckBag("EmbeddingBagBackward", bags, width, nnz, offsets, idx,
                                   weights, dtable, table_rows, dout));
  if (bags == 0 || width == 0 || nnz == 0) return absl::OkStatus();
  return DoEmbeddingBagBackward(bags, width, nnz, offsets, idx, weights, dout, table_rows,
                                dtable);
}

// ---- Compression ----

absl::Status Backend::CastToHalf(HalfType type, int64_t n, const float* x, uint16_t* y) {
  KERNELS_RETURN_IF_ERROR(CheckDim("CastToHalf", "n", n));
  KERNELS_RETURN_IF_ERROR(CheckPtr("CastToHalf", "x", x, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr("CastToHalf", "y", y, n));
  if (n == 0) return absl::OkStatus();
  return DoCastToHalf(type, n, x, y);
}

absl::Status Backend::CastFromHalf(HalfType type, int64_t n, const uint16_t* x, float* y) {
  KERNELS_RETURN_IF_ERROR(CheckDim("CastFromHalf", "n", n));
  KERNELS_RETURN_IF_ERROR(CheckPtr("CastFromHalf", "x", x, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr("CastFromHalf", "y", y, n));
  if (n == 0) return absl::OkStatus();
  return DoCastFromHalf(type, n, x, y);
}

absl::Status Backend::TopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx,
                              float* out_val) {
  constexpr const char* op = "TopKAbs";
  KERNELS_RETURN_IF_ERROR(CheckDim(op, "n", n));
  if (n >= kMaxIndexable) return Invalid(op, "n must be < 2^31");
  if (k < 0 || k > n) return Invalid(op, absl::StrCat("k = ", k, " must be in [0, n = ", n, "]"));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "x", x, n));
  KERNELS_RETURN_IF_ERROR(CheckPtr(op, "out_idx", out_idx, k));
  if (k == 0) return absl::OkStatus();
  return DoTopKAbs(n, x, k, out_idx, out_val);
}

// ---- Convolution and pooling ----

absl::Status Backend::Im2Col(const ConvGeometry& g, const float* x, float* cols) {
  KERNELS_RETURN_IF_ERROR(CheckConv("Im2Col", g));
  KERNELS_RETURN_IF_ERROR(CheckPtr("Im2Col", "x", x, g.input_size()));
  KERNELS_RETURN_IF_ERROR(CheckPtr("Im2Col", "cols", cols, g.num_patches() * g.patch_size()));
  if (g.batch == 0) return absl::OkStatus();
  return DoIm2Col(g, x, cols);
}

absl::Status Backend::Col2Im(const ConvGeometry& g, const float* cols, float* dx) {
  KERNELS_RETURN_IF_ERROR(CheckConv("Col2Im", g));
  KERNELS_RETURN_IF_ERROR(CheckPtr("Col2Im", "cols", cols, g.num_patches() * g.patch_size()));
  KERNELS_RETURN_IF_ERROR(CheckPtr("Col2Im", "dx", dx, g.input_size()));
  if (g.batch == 0) return absl::OkStatus();
  return DoCol2Im(g, cols, dx);
}

absl::Status Backend::MaxPoolForward(const PoolGeometry& g, const float* x, float* y,
                                     int32_t* argmax) {
  KERNELS_RETURN_IF_ERROR(CheckPool("MaxPoolForward", g));
  KERNELS_RETURN_IF_ERROR(CheckPtr("MaxPoolForward", "x", x, g.input_size()));
  KERNELS_RETURN_IF_ERROR(CheckPtr("MaxPoolForward", "y", y, g.output_size()));
  KERNELS_RETURN_IF_ERROR(CheckPtr("MaxPoolForward", "argmax", argmax, g.output_size()));
  if (g.batch == 0) return absl::OkStatus();
  return DoMaxPoolForward(g, x, y, argmax);
}

absl::Status Backend::MaxPoolBackward(const PoolGeometry& g, const float* dy,
                                      const int32_t* argmax, float* dx) {
  KERNELS_RETURN_IF_ERROR(CheckPool("MaxPoolBackward", g));
  KERNELS_RETURN_IF_ERROR(CheckPtr("MaxPoolBackward", "dy", dy, g.output_size()));
  KERNELS_RETURN_IF_ERROR(CheckPtr("MaxPoolBackward", "argmax", argmax, g.output_size()));
  KERNELS_RETURN_IF_ERROR(CheckPtr("MaxPoolBackward", "dx", dx, g.input_size()));
  if (g.batch == 0) return absl::OkStatus();
  return DoMaxPoolBackward(g, dy, argmax, dx);
}

}  // namespace pscluster::kernels
