// CudaBackend: softmax cross-entropy (one warp per row) and sigmoid cross-entropy (one thread per
// row), each with its accuracy count.
#include <cmath>

#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/row_argmax.h"

namespace pscluster::kernels {
namespace cuda {
namespace {

__global__ void SoftmaxCrossEntropyKernel(int64_t rows, int64_t classes, const float* logits,
                                          const int32_t* labels, float grad_scale,
                                          float* dlogits, float* row_stats, int* error) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t r = warp; r < rows; r += warps) {
    const float* z = logits + r * classes;
    const int32_t label = labels[r];
    if (label < 0 || label >= classes) {
      if (lane == 0) {
        ReportError(error, kBadLabel);
        row_stats[2 * r] = NAN;
        row_stats[2 * r + 1] = 0.0f;
      }
      continue;
    }
    // Every lane reads what it needs before any lane writes: dlogits may alias logits.
    const float z_label = z[label];
    const float z0 = z[0];
    // The CPU backend's argmax, NaN included (row_argmax.h): each lane scans its strided
    // elements in increasing order, then the lanes combine.
    argmax::Candidate c = argmax::None(classes);
    for (int64_t j = lane; j < classes; j += 32) argmax::Offer(&c, z[j], j, classes);
    for (int offset = 16; offset > 0; offset >>= 1) {
      argmax::Candidate o;
      o.value = __shfl_xor_sync(0xffffffffu, c.value, offset);
      o.index = __shfl_xor_sync(0xffffffffu, c.index, offset);
      c = argmax::Better(c, o, classes);
    }
    // The largest non-NaN logit (a NaN anywhere makes the loss NaN either way).
    const float best = c.value;
    const int64_t arg = argmax::Finish(c, z0, classes);
    float sum = 0.0f;
    for (int64_t j = lane; j < classes; j += 32) sum += expf(z[j] - best);
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    __syncwarp();
    if (lane == 0) {
      row_stats[2 * r] = logf(sum) - (z_label - best);
      row_stats[2 * r + 1] = arg == label ? 1.0f : 0.0f;
    }
    if (dlogits != nullptr) {
      const float scale = grad_scale / sum;
      float* d = dlogits + r * classes;
      for (int64_t j = lane; j < classes; j += 32) {
        const float p = scale * expf(z[j] - best);
        d[j] = j == label ? p - grad_scale : p;
      }
    }
  }
}

// Binary cross-entropy with logits; the CPU backend's formulas (cpu_dense_ops.cc).
__global__ void SigmoidCrossEntropyKernel(int64_t rows, const float* logits,
                                          const int32_t* labels, float grad_scale,
                                          float* dlogits, float* row_stats, int* error) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int32_t label = labels[r];
    if (label != 0 && label != 1) {
      ReportError(error, kBadBinaryLabel);
      row_stats[2 * r] = NAN;
      row_stats[2 * r + 1] = 0.0f;
      continue;
    }
    const float z = logits[r];  // Read before dlogits (which may alias) is written.
    const float y = static_cast<float>(label);
    row_stats[2 * r] = fmaxf(z, 0.0f) - z * y + log1pf(expf(-fabsf(z)));
    row_stats[2 * r + 1] = (z > 0.0f) == (label == 1) ? 1.0f : 0.0f;
    if (dlogits != nullptr) {
      float p;
      if (z >= 0.0f) {
        p = 1.0f / (1.0f + expf(-z));
      } else {
        const float e = expf(z);
        p = e / (1.0f + e);
      }
      dlogits[r] = grad_scale * (p - y);
    }
  }
}

}  // namespace
}  // namespace cuda

absl::Status CudaBackend::DoSoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                                const float* logits, const int32_t* labels,
                                                float grad_scale, float* dlogits,
                                                float* row_stats) {
  KERNELS_CUDA_ACTIVATE();
  const unsigned grid = cuda::GridFor(rows * 32, sm_count_);
  cuda::SoftmaxCrossEntropyKernel<<<grid, cuda::kThreads, 0, stream_>>>(
      rows, classes, logits, labels, grad_scale, dlogits, row_stats, error_flag_);
  CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropyKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoSigmoidCrossEntropy(int64_t rows, const float* logits,
                                                const int32_t* labels, float grad_scale,
                                                float* dlogits, float* row_stats) {
  KERNELS_CUDA_ACTIVATE();
  cuda::SigmoidCrossEntropyKernel<<<cuda::GridFor(rows, sm_count_), cuda::kThreads, 0,
                                    stream_>>>(rows, logits, labels, grad_scale, dlogits,
                                               row_stats, error_flag_);
  CUDA_RETURN_IF_LAUNCH_FAILED("SigmoidCrossEntropyKernel");
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
