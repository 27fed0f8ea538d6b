// CudaBackend: top-k by magnitude. A 4-pass radix select (8 bits a pass, most significant
// first) finds the k-th largest key |x| on the device; a tiled, scanned compaction then writes
// the selected indices in ascending order, taking the lowest-index ties, so the result equals
// the CPU backend's exactly. No host synchronisation in between.
#include <cstddef>

#include "common/half_bits.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/radix_select.h"

namespace pscluster::kernels {
namespace cuda {
namespace {

constexpr int kItemsPerThread = 16;
constexpr int kTile = kThreads * kItemsPerThread;
// Shared tiles skip one word every 32, so the 32 threads of a warp reading their consecutive
// 16-element runs hit 32 different banks.
constexpr int kPaddedTile = kTile + kTile / 32;
__device__ inline int Padded(int i) { return i + i / 32; }

using radix::TopKState;

__global__ void TopKInitKernel(TopKState* state, uint32_t k) {
  state->prefix = 0;
  state->mask = 0;
  state->remaining = k;
}

__global__ void RadixHistogramKernel(int64_t n, const float* x, int shift, TopKState* state) {
  __shared__ uint32_t hist[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const uint32_t prefix = state->prefix, mask = state->mask;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t key = AbsKey(x[i]);
    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&state->hist[i], hist[i]);
  }
}

// One block of kRadixDigits threads: picks the digit holding the remaining-th largest key. The
// phases live in radix_select.h, where a host emulation tests them in every thread order.
__global__ void RadixSelectDigitKernel(int shift, TopKState* state) {
  __shared__ uint32_t suffix[radix::kRadixDigits];  // suffix[t] = keys whose digit is >= t.
  const int t = threadIdx.x;
  radix::DigitThread r;
  radix::DigitLoad(t, *state, suffix, &r);  // Before any barrier: the decider rewrites state.
  __syncthreads();
  for (int step = 1; step < radix::kRadixDigits; step <<= 1) {
    radix::DigitScanRead(t, step, suffix, &r);
    __syncthreads();
    radix::DigitScanAdd(t, suffix, r);
    __syncthreads();
  }
  radix::DigitDecide(t, shift, suffix, r, state);
}

// Exclusive scan of one value per thread across a block of kThreads; *total gets the sum.
__device__ uint32_t BlockExclusiveScan(uint32_t v, uint32_t* total) {
  __shared__ uint32_t warp_sums[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += o;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    uint32_t s = lane < kThreads / 32 ? warp_sums[lane] : 0u;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const uint32_t o = __shfl_up_sync(0xffffffffu, s, offset);
      if (lane >= offset) s += o;
    }
    if (lane < kThreads / 32) warp_sums[lane] = s;  // Inclusive sums of warp totals.
  }
  __syncthreads();
  const uint32_t warp_prefix = warp == 0 ? 0u : warp_sums[warp - 1];
  *total = warp_sums[kThreads / 32 - 1];
  __syncthreads();  // warp_sums may be reused by the next call.
  return warp_prefix + inclusive - v;
}

// Loads one tile into shared memory (coalesced) and counts, per thread, the keys above and
// equal to the threshold among its kItemsPerThread consecutive elements.
__device__ void CountTile(int64_t n, const float* x, uint32_t threshold, float* tile,
                          uint32_t* gt, uint32_t* eq) {
  const int64_t base = blockIdx.x * int64_t{kTile};
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    tile[Padded(i)] = base + i < n ? x[base + i] : 0.0f;
  }
  __syncthreads();
  *gt = 0;
  *eq = 0;
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int local = threadIdx.x * kItemsPerThread + j;
    if (base + local >= n) break;
    const uint32_t key = AbsKey(tile[Padded(local)]);
    *gt += key > threshold;
    *eq += key == threshold;
  }
}

__global__ void TopKCountKernel(int64_t n, const float* x, const TopKState* state,
                                uint32_t* block_gt, uint32_t* block_eq) {
  __shared__ float tile[kPaddedTile];
  uint32_t gt, eq, total;
  CountTile(n, x, state->prefix, tile, &gt, &eq);
  BlockExclusiveScan(gt, &total);
  if (threadIdx.x == 0) block_gt[blockIdx.x] = total;
  BlockExclusiveScan(eq, &total);
  if (threadIdx.x == 0) block_eq[blockIdx.x] = total;
}

// One block: exclusive scans of the per-tile counts, in place.
__global__ void TopKScanBlocksKernel(int64_t blocks, uint32_t* block_gt, uint32_t* block_eq) {
  uint32_t carry_gt = 0, carry_eq = 0;
  for (int64_t start = 0; start < blocks; start += kThreads) {
    const int64_t i = start + threadIdx.x;
    const uint32_t gt = i < blocks ? block_gt[i] : 0u;
    const uint32_t eq = i < blocks ? block_eq[i] : 0u;
    uint32_t total_gt, total_eq;
    const uint32_t pre_gt = BlockExclusiveScan(gt, &total_gt);
    const uint32_t pre_eq = BlockExclusiveScan(eq, &total_eq);
    if (i < blocks) {
      block_gt[i] = carry_gt + pre_gt;
      block_eq[i] = carry_eq + pre_eq;
    }
    carry_gt += total_gt;
    carry_eq += total_eq;
  }
}

__global__ void TopKWriteKernel(int64_t n, const float* x, const TopKState* state,
                                const uint32_t* block_gt, const uint32_t* block_eq,
                                int32_t* out_idx, float* out_val) {
  __shared__ float tile[kPaddedTile];
  const uint32_t threshold = state->prefix;
  const uint32_t need_eq = state->remaining;
  uint32_t gt, eq, total;
  CountTile(n, x, threshold, tile, &gt, &eq);
  uint32_t gt_rank = block_gt[blockIdx.x] + BlockExclusiveScan(gt, &total);
  uint32_t eq_rank = block_eq[blockIdx.x] + BlockExclusiveScan(eq, &total);
  const int64_t base = blockIdx.x * int64_t{kTile};
  for (int j = 0; j < kItemsPerThread; ++j) {
    const int local = threadIdx.x * kItemsPerThread + j;
    if (base + local >= n) break;
    const float v = tile[Padded(local)];
    const uint32_t key = AbsKey(v);
    if (key > threshold) {
      const uint32_t pos = gt_rank + min(eq_rank, need_eq);
      out_idx[pos] = static_cast<int32_t>(base + local);
      if (out_val != nullptr) out_val[pos] = v;
      ++gt_rank;
    } else if (key == threshold) {
      if (eq_rank < need_eq) {
        const uint32_t pos = gt_rank + eq_rank;
        out_idx[pos] = static_cast<int32_t>(base + local);
        if (out_val != nullptr) out_val[pos] = v;
      }
      ++eq_rank;
    }
  }
}

}  // namespace
}  // namespace cuda

absl::Status CudaBackend::DoTopKAbs(int64_t n, const float* x, int64_t k, int32_t* out_idx,
                                    float* out_val) {
  KERNELS_CUDA_ACTIVATE();
  const int64_t blocks = (n + cuda::kTile - 1) / cuda::kTile;
  const size_t bytes = sizeof(radix::TopKState) + 2 * sizeof(uint32_t) * blocks;
  KERNELS_ASSIGN_OR_RETURN(void* scratch, Scratch(bytes));
  auto* state = static_cast<radix::TopKState*>(scratch);
  auto* block_gt = reinterpret_cast<uint32_t*>(state + 1);
  uint32_t* block_eq = block_gt + blocks;
  cuda::TopKInitKernel<<<1, 1, 0, stream_>>>(state, static_cast<uint32_t>(k));
  CUDA_RETURN_IF_LAUNCH_FAILED("TopKInitKernel");
  const unsigned grid = cuda::GridFor(n, sm_count_);
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(reinterpret_cast<char*>(state) +
                                             offsetof(radix::TopKState, hist),
                                         0, sizeof(radix::TopKState::hist), stream_));
    cuda::RadixHistogramKernel<<<grid, cuda::kThreads, 0, stream_>>>(n, x, shift, state);
    CUDA_RETURN_IF_LAUNCH_FAILED("RadixHistogramKernel");
    cuda::RadixSelectDigitKernel<<<1, radix::kRadixDigits, 0, stream_>>>(shift, state);
    CUDA_RETURN_IF_LAUNCH_FAILED("RadixSelectDigitKernel");
  }
  cuda::TopKCountKernel<<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream_>>>(
      n, x, state, block_gt, block_eq);
  CUDA_RETURN_IF_LAUNCH_FAILED("TopKCountKernel");
  cuda::TopKScanBlocksKernel<<<1, cuda::kThreads, 0, stream_>>>(blocks, block_gt, block_eq);
  CUDA_RETURN_IF_LAUNCH_FAILED("TopKScanBlocksKernel");
  cuda::TopKWriteKernel<<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream_>>>(
      n, x, state, block_gt, block_eq, out_idx, out_val);
  CUDA_RETURN_IF_LAUNCH_FAILED("TopKWriteKernel");
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
