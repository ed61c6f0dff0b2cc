// Layout kernels for the convolutions: a 2-D transpose through shared-memory tiles (each
// side read and written along rows), and a bias with an activation over channels-last rows.
#include <cuda_fp16.h>

#include "dtrain/kernels/cuda/common.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kTile = 32;

__device__ __forceinline__ float load(const void* p, Elem type, std::int64_t i) {
  switch (type) {
    case Elem::bf16: return math::from_bf16(static_cast<const std::uint16_t*>(p)[i]);
    case Elem::f16: return __half2float(__ushort_as_half(static_cast<const std::uint16_t*>(p)[i]));
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store(void* p, Elem type, std::int64_t i, float v) {
  switch (type) {
    case Elem::bf16: static_cast<std::uint16_t*>(p)[i] = math::to_bf16(v); break;
    case Elem::f16: static_cast<std::uint16_t*>(p)[i] = __half_as_ushort(__float2half_rn(v)); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// Block (32 x 8 threads) moves 32 x 32 tiles, grid-striding over both grid axes (their
// limits are 2^31 - 1 and 65535 blocks); the +1 column avoids bank conflicts.
__global__ void transpose_kernel(const void* src, Elem src_type, void* dst, Elem dst_type, std::int64_t rows,
                                 std::int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const std::int64_t tiles_x = (cols + kTile - 1) / kTile, tiles_y = (rows + kTile - 1) / kTile;
  for (std::int64_t ty = blockIdx.y; ty < tiles_y; ty += gridDim.y)
    for (std::int64_t tx = blockIdx.x; tx < tiles_x; tx += gridDim.x) {
      const std::int64_t col0 = tx * kTile, row0 = ty * kTile;
      __syncthreads();  // the previous tile is written out
      for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
        const std::int64_t r = row0 + k, c = col0 + threadIdx.x;
        if (r < rows && c < cols) tile[k][threadIdx.x] = load(src, src_type, r * cols + c);
      }
      __syncthreads();
      for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
        const std::int64_t c = col0 + k, r = row0 + threadIdx.x;  // dst is [cols, rows]
        if (r < rows && c < cols) store(dst, dst_type, c * rows + r, tile[threadIdx.x][k]);
      }
    }
}

__global__ void bias_activation_kernel(float* y, const float* bias, std::int64_t n, std::int64_t cols,
                                       math::UnaryOp activation) {
  DTRAIN_GRID_STRIDE(i, n) {
    const float v = y[i] + (bias ? bias[i % cols] : 0.0f);
    y[i] = math::unary(activation, v, 1.0f, 0.0f);
  }
}

}  // namespace

void transpose(const Launch& l, const void* src, Elem src_type, void* dst, Elem dst_type, std::int64_t rows,
               std::int64_t cols) {
  if (rows * cols == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((cols + kTile - 1) / kTile, 1 << 20)),
                  static_cast<unsigned>(std::min<std::int64_t>((rows + kTile - 1) / kTile, 65535)));
  transpose_kernel<<<grid, dim3(kTile, 8), 0, l.stream>>>(src, src_type, dst, dst_type, rows, cols);
  check_launch("transpose", rows * cols, l);
}

void bias_activation(const Launch& l, float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                     math::UnaryOp activation) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  bias_activation_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(y, bias, n, cols, activation);
  check_launch("bias and activation", n, l);
}

}  // namespace dtrain::kernels::cuda
