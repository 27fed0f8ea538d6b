// CudaBackend: row gather / scatter-add and weighted embedding bags. Bad index data is skipped
// and reported through the device error word (see Synchronize()).
#include "kernels/cuda/cuda_backend_impl.h"

namespace pscluster::kernels {
namespace cuda {
namespace {

template <typename I>
__global__ void GatherRowsKernel(I total, I width, const float* table, I table_rows,
                                 const int32_t* idx, float* out, int* error) {
  for (I e = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       e < total; e += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I i = e / width;
    const I c = e - i * width;
    const int32_t r = idx[i];
    if (r < 0 || r >= table_rows) {
      if (c == 0) ReportError(error, kBadGatherIndex);
      continue;
    }
    out[e] = table[static_cast<I>(r) * width + c];
  }
}

template <typename I>
__global__ void ScatterAddRowsKernel(I total, I width, const float* src, const int32_t* idx,
                                     I table_rows, float* table, int* error) {
  for (I e = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       e < total; e += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I i = e / width;
    const I c = e - i * width;
    const int32_t r = idx[i];
    if (r < 0 || r >= table_rows) {
      if (c == 0) ReportError(error, kBadScatterIndex);
      continue;
    }
    atomicAdd(table + static_cast<I>(r) * width + c, src[e]);
  }
}

__device__ inline bool BadBag(int32_t s, int32_t e, int64_t nnz) { return s < 0 || e < s || e > nnz; }

// Bags with rows of 32 or more floats: one block per bag, threads across the row, entries in
// order (deterministic).
__global__ void BagForwardWideKernel(int64_t bags, int64_t width, int64_t nnz,
                                     const int32_t* offsets, const int32_t* idx,
                                     const float* weights, const float* table, int64_t table_rows,
                                     float* out, int* error) {
  for (int64_t b = blockIdx.x; b < bags; b += gridDim.x) {
    const int32_t s = offsets[b], e = offsets[b + 1];
    if (BadBag(s, e, nnz)) {
      if (threadIdx.x == 0) ReportError(error, kBadBagForward);
      continue;
    }
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      float acc = 0.0f;
      for (int32_t j = s; j < e; ++j) {
        const int32_t r = idx[j];
        if (r < 0 || r >= table_rows) {
          ReportError(error, kBadBagForward);
          continue;
        }
        acc += weights[j] * table[r * width + c];
      }
      out[b * width + c] = acc;
    }
  }
}

// Narrow rows (< 32 floats): one warp per bag; lane l sums column l % width over every
// (32 / width)-th entry, then lanes of the same column combine in lane order (deterministic).
__global__ void BagForwardNarrowKernel(int64_t bags, int64_t width, int64_t nnz,
                                       const int32_t* offsets, const int32_t* idx,
                                       const float* weights, const float* table,
                                       int64_t table_rows, float* out, int* error) {
  __shared__ float partial[kThreads];
  const int lane = threadIdx.x & 31;
  float* mine = partial + (threadIdx.x & ~31);
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  const int phases = 32 / static_cast<int>(width);
  const int c = lane % static_cast<int>(width);
  const int phase = lane / static_cast<int>(width);
  for (int64_t b = warp; b < bags; b += warps) {
    const int32_t s = offsets[b], e = offsets[b + 1];
    if (BadBag(s, e, nnz)) {
      if (lane == 0) ReportError(error, kBadBagForward);
      continue;
    }
    float acc = 0.0f;
    if (phase < phases) {
      for (int32_t j = s + phase; j < e; j += phases) {
        const int32_t r = idx[j];
        if (r < 0 || r >= table_rows) {
          ReportError(error, kBadBagForward);
          continue;
        }
        acc += weights[j] * table[r * width + c];
      }
    }
    mine[lane] = acc;
    __syncwarp();
    if (lane < width) {
      float sum = 0.0f;
      for (int p = 0; p < phases; ++p) sum += mine[p * width + lane];
      out[b * width + lane] = sum;
    }
    __syncwarp();
  }
}

// Backward, wide rows: one block per bag, threads across the row, atomic adds (rows repeat).
__global__ void BagBackwardWideKernel(int64_t bags, int64_t width, int64_t nnz,
                                      const int32_t* offsets, const int32_t* idx,
                                      const float* weights, const float* dout, int64_t table_rows,
                                      float* dtable, int* error) {
  for (int64_t b = blockIdx.x; b < bags; b += gridDim.x) {
    const int32_t s = offsets[b], e = offsets[b + 1];
    if (BadBag(s, e, nnz)) {
      if (threadIdx.x == 0) ReportError(error, kBadBagBackward);
      continue;
    }
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
      const float d = dout[b * width + c];
      for (int32_t j = s; j < e; ++j) {
        const int32_t r = idx[j];
        if (r < 0 || r >= table_rows) {
          ReportError(error, kBadBagBackward);
          continue;
        }
        atomicAdd(dtable + r * width + c, weights[j] * d);
      }
    }
  }
}

// Backward, narrow rows: one warp per bag over its (entry, column) pairs.
__global__ void BagBackwardNarrowKernel(int64_t bags, int64_t width, int64_t nnz,
                                        const int32_t* offsets, const int32_t* idx,
                                        const float* weights, const float* dout,
                                        int64_t table_rows, float* dtable, int* error) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t b = warp; b < bags; b += warps) {
    const int32_t s = offsets[b], e = offsets[b + 1];
    if (BadBag(s, e, nnz)) {
      if (lane == 0) ReportError(error, kBadBagBackward);
      continue;
    }
    const int64_t pairs = (e - s) * width;
    for (int64_t t = lane; t < pairs; t += 32) {
      const int32_t j = s + static_cast<int32_t>(t / width);
      const int64_t c = t % width;
      const int32_t r = idx[j];
      if (r < 0 || r >= table_rows) {
        ReportError(error, kBadBagBackward);
        continue;
      }
      atomicAdd(dtable + r * width + c, weights[j] * dout[b * width + c]);
    }
  }
}

int BagBlockThreads(int64_t width) {
  return static_cast<int>(std::min<int64_t>(kThreads, (width + 31) / 32 * 32));
}

}  // namespace
}  // namespace cuda

absl::Status CudaBackend::DoGatherRows(int64_t n, int64_t width, const float* table,
                                       int64_t table_rows, const int32_t* idx, float* out) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = n * width;
  const unsigned grid = cuda::GridFor(total, sm_count_);
  if (total < cuda::kInt32IndexLimit && table_rows * width < cuda::kInt32IndexLimit) {
    cuda::GatherRowsKernel<int32_t><<<grid, cuda::kThreads, 0, stream_>>>(
        static_cast<int32_t>(total), static_cast<int32_t>(width), table,
        static_cast<int32_t>(table_rows), idx, out, error_flag_);
  } else {
    cuda::GatherRowsKernel<int64_t><<<grid, cuda::kThreads, 0, stream_>>>(
        total, width, table, table_rows, idx, out, error_flag_);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("GatherRowsKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoScatterAddRows(int64_t n, int64_t width, const float* src,
                                           const int32_t* idx, int64_t table_rows, float* table) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t total = n * width;
  const unsigned grid = cuda::GridFor(total, sm_count_);
  if (total < cuda::kInt32IndexLimit && table_rows * width < cuda::kInt32IndexLimit) {
    cuda::ScatterAddRowsKernel<int32_t><<<grid, cuda::kThreads, 0, stream_>>>(
        static_cast<int32_t>(total), static_cast<int32_t>(width), src, idx,
        static_cast<int32_t>(table_rows), table, error_flag_);
  } else {
    cuda::ScatterAddRowsKernel<int64_t><<<grid, cuda::kThreads, 0, stream_>>>(
        total, width, src, idx, table_rows, table, error_flag_);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("ScatterAddRowsKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoEmbeddingBagForward(int64_t bags, int64_t width, int64_t nnz,
                                                const int32_t* offsets, const int32_t* idx,
                                                const float* weights, const float* table,
                                                int64_t table_rows, float* out) {
  KERNELS_CUDA_ACTIVATE();
  if (width < 32) {
    cuda::BagForwardNarrowKernel<<<cuda::GridFor(bags * 32, sm_count_), cuda::kThreads, 0,
                                   stream_>>>(bags, width, nnz, offsets, idx, weights, table,
                                              table_rows, out, error_flag_);
  } else {
    const int threads = cuda::BagBlockThreads(width);
    cuda::BagForwardWideKernel<<<cuda::GridFor(bags * threads, sm_count_, threads), threads, 0,
                                 stream_>>>(bags, width, nnz, offsets, idx, weights, table,
                                            table_rows, out, error_flag_);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("BagForwardKernel");
  return absl::OkStatus();
}

absl::Status CudaBackend::DoEmbeddingBagBackward(int64_t bags, int64_t width, int64_t nnz,
                                                 const int32_t* offsets, const int32_t* idx,
                                                 const float* weights, const float* dout,
                                                 int64_t table_rows, float* dtable) {
  KERNELS_CUDA_ACTIVATE();
  if (width < 32) {
    cuda::BagBackwardNarrowKernel<<<cuda::GridFor(bags * 32, sm_count_), cuda::kThreads, 0,
                                    stream_>>>(bags, width, nnz, offsets, idx, weights, dout,
                                               table_rows, dtable, error_flag_);
  } else {
    const int threads = cuda::BagBlockThreads(width);
    cuda::BagBackwardWideKernel<<<cuda::GridFor(bags * threads, sm_count_, threads), threads, 0,
                                  stream_>>>(bags, width, nnz, offsets, idx, weights, dout,
                                             table_rows, dtable, error_flag_);
  }
  CUDA_RETURN_IF_LAUNCH_FAILED("BagBackwardKernel");
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
