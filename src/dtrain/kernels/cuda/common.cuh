// What the kernel files share: launch sizes from element counts, and warp and block sums.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "dtrain/kernels/cuda/launch.h"

namespace dtrain::kernels::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the device a few times
// over, never more than the elements need.
inline unsigned blocks_for(std::int64_t n, const Launch& l, int threads = kThreads) {
  const std::int64_t needed = (n + threads - 1) / threads;
  const std::int64_t most = static_cast<std::int64_t>(l.multiprocessors) * 32;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(needed, most)));
}

#define DTRAIN_GRID_STRIDE(i, n)                                                                     \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The larger of two values, NaN where either is (fmaxf would drop it).
__device__ __forceinline__ float max_or_nan(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = max_or_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum over a block of up to 1024 threads; every thread gets it. `shared` holds 32 Ts.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace dtrain::kernels::cuda
