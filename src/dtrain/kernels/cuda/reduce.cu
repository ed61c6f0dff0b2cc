// Reductions: over any axes (a thread per output where each sums few values and reads
// across the outputs in step, a block per output where each sums many), the sum of squares
// in double, argmax, one-hot, and batch normalization's per-channel sums, figures and affine
// pass.
#include "dtrain/kernels/cuda/common.cuh"
#include "dtrain/kernels/element_math.h"

namespace dtrain::kernels::cuda {
namespace {

// The reduction's index spaces: output o walks the kept axes, inner index r the reduced
// ones; each has its dims and x's strides (innermost last).
struct ReduceShape {
  int kept_rank = 0, reduced_rank = 0;
  long long kept_dims[kMaxRank] = {}, kept_strides[kMaxRank] = {};
  long long reduced_dims[kMaxRank] = {}, reduced_strides[kMaxRank] = {};
  long long outputs = 1, count = 1;  // kept and reduced element counts
};

__device__ __forceinline__ long long offset_of(long long index, int rank, const long long* dims,
                                               const long long* strides) {
  long long offset = 0;
  for (int d = rank - 1; d >= 0; --d) {
    offset += (index % dims[d]) * strides[d];
    index /= dims[d];
  }
  return offset;
}

__device__ __forceinline__ float combine(ReduceOp op, float acc, float v) {
  // As the CPU's loops: max keeps the accumulator unless v is larger (a NaN never is).
  return op == ReduceOp::max ? (acc > v ? acc : v) : acc + v;
}

__global__ void reduce_per_thread_kernel(ReduceOp op, const float* x, float* y, ReduceShape s) {
  DTRAIN_GRID_STRIDE(o, s.outputs) {
    const long long base = offset_of(o, s.kept_rank, s.kept_dims, s.kept_strides);
    float acc = op == ReduceOp::max ? x[base] : 0.0f;
    for (long long r = op == ReduceOp::max ? 1 : 0; r < s.count; ++r)
      acc = combine(op, acc, x[base + offset_of(r, s.reduced_rank, s.reduced_dims, s.reduced_strides)]);
    y[o] = op == ReduceOp::mean ? acc / static_cast<float>(s.count) : acc;
  }
}

__global__ void reduce_per_block_kernel(ReduceOp op, const float* x, float* y, ReduceShape s) {
  __shared__ float shared[32];
  for (long long o = blockIdx.x; o < s.outputs; o += gridDim.x) {
    const long long base = offset_of(o, s.kept_rank, s.kept_dims, s.kept_strides);
    float acc = op == ReduceOp::max ? -INFINITY : 0.0f;
    for (long long r = threadIdx.x; r < s.count; r += blockDim.x)
      acc = combine(op, acc, x[base + offset_of(r, s.reduced_rank, s.reduced_dims, s.reduced_strides)]);
    acc = op == ReduceOp::max ? block_max(acc, shared) : block_sum(acc, shared);
    if (threadIdx.x == 0) y[o] = op == ReduceOp::mean ? acc / static_cast<float>(s.count) : acc;
  }
}

__global__ void sum_squares_kernel(const float* x, std::int64_t n, double* result) {
  __shared__ double shared[32];
  double acc = 0.0;
  DTRAIN_GRID_STRIDE(i, n) acc += static_cast<double>(x[i]) * x[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) atomicAdd(result, acc);
}

__global__ void argmax_kernel(const float* x, std::int32_t* out, std::int64_t rows, std::int64_t cols) {
  DTRAIN_GRID_STRIDE(r, rows) {
    const float* row = x + r * cols;
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < cols; ++c)
      if (row[c] > row[best]) best = c;
    out[r] = static_cast<std::int32_t>(best);
  }
}

__global__ void one_hot_kernel(const std::int32_t* labels, float* out, std::int64_t rows, std::int64_t classes,
                               DataFault* fault) {
  DTRAIN_GRID_STRIDE(k, rows * classes) {
    const std::int64_t r = k / classes, c = k % classes;
    const std::int32_t label = labels[r];
    if (c == 0 && (label < 0 || label >= classes) && atomicCAS(&fault->code, kFaultNone, kFaultOneHotLabel) == kFaultNone) {
      fault->a = label;
      fault->b = r;
      fault->c = classes;
    }
    out[k] = c == label ? 1.0f : 0.0f;
  }
}

// Block (x: a group of 32 channels; y: a chunk of rows) sums its rows of 32 channels into
// partials[chunk][2c]; rows are read 32 channels wide, coalesced.
__global__ void channel_sums_kernel(const float* a, const float* b, const float* center, std::int64_t rows,
                                    std::int64_t c, double* partials) {
  __shared__ double s0[8][33], s1[8][33];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t per_chunk = (rows + gridDim.y - 1) / gridDim.y;
  const std::int64_t r0 = per_chunk * blockIdx.y, r1 = min(rows, r0 + per_chunk);
  double q0 = 0.0, q1 = 0.0;
  if (j < c) {
    const float m = center[j];
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const float av = a[r * c + j];
      q0 += av;
      q1 += static_cast<double>(av) * (b[r * c + j] - m);
    }
  }
  s0[threadIdx.y][threadIdx.x] = q0;
  s1[threadIdx.y][threadIdx.x] = q1;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    for (int k = 1; k < blockDim.y; ++k) {
      q0 += s0[k][threadIdx.x];
      q1 += s1[k][threadIdx.x];
    }
    partials[static_cast<std::int64_t>(blockIdx.y) * 2 * c + j] = q0;
    partials[static_cast<std::int64_t>(blockIdx.y) * 2 * c + c + j] = q1;
  }
}

__global__ void channel_sums_total_kernel(const double* partials, float* sums, std::int64_t c, int chunks) {
  DTRAIN_GRID_STRIDE(j, 2 * c) {
    double total = 0.0;
    for (int k = 0; k < chunks; ++k) total += partials[static_cast<std::int64_t>(k) * 2 * c + j];
    sums[j] = static_cast<float>(total);
  }
}

__global__ void channel_affine_kernel(const float* x, const float* scale, const float* shift, const float* x2,
                                      const float* scale2, float* y, std::int64_t n, std::int64_t c, bool relu) {
  DTRAIN_GRID_STRIDE(i, n) {
    const std::int64_t j = i % c;
    float v = x[i] * scale[j] + shift[j];
    if (x2) v += x2[i] * scale2[j];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void batch_norm_coefficients_kernel(const float* s, const float* q, double count, const float* gamma,
                                               const float* beta, float epsilon, float* out, std::int64_t c) {
  DTRAIN_GRID_STRIDE(j, c) {
    math::store_batch_norm_channel(
        math::batch_norm_channel(s[j], q[j], count, gamma ? gamma[j] : 1.0f, beta ? beta[j] : 0.0f, epsilon), out, c, j);
  }
}

__global__ void batch_norm_gradient_coefficients_kernel(const float* s, const float* t, double count,
                                                        const float* f, float* out, std::int64_t c) {
  DTRAIN_GRID_STRIDE(j, c) math::batch_norm_gradient_at(s, t, count, f, out, c, j);
}

}  // namespace

void reduce(const Launch& l, ReduceOp op, const float* x, float* y, int rank, const long long* dims,
            const bool* reduced) {
  ReduceShape s;
  long long stride = 1;
  long long strides[kMaxRank];
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= dims[d];
  }
  for (int d = 0; d < rank; ++d) {
    if (reduced[d]) {
      s.reduced_dims[s.reduced_rank] = dims[d];
      s.reduced_strides[s.reduced_rank++] = strides[d];
      s.count *= dims[d];
    } else {
      s.kept_dims[s.kept_rank] = dims[d];
      s.kept_strides[s.kept_rank++] = strides[d];
      s.outputs *= dims[d];
    }
  }
  if (s.outputs == 0) return;
  // Few values per output: a thread each, neighbouring threads reading neighbouring values
  // where the kept axes are innermost (a bias gradient's column sums).
  if (s.count <= 1024) {
    reduce_per_thread_kernel<<<blocks_for(s.outputs, l), kThreads, 0, l.stream>>>(op, x, y, s);
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<long long>(s.outputs, 65535));
    reduce_per_block_kernel<<<blocks, kThreads, 0, l.stream>>>(op, x, y, s);
  }
  check_launch("reduce", s.outputs * s.count, l);
}

void sum_squares(const Launch& l, const float* x, std::int64_t n, double* result) {
  cudaMemsetAsync(result, 0, sizeof(double), l.stream);  // an error here is CUDA's last error, checked next
  check_launch("sum_squares (zero)", n, l);
  if (n == 0) return;
  sum_squares_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, n, result);
  check_launch("sum_squares", n, l);
}

void argmax(const Launch& l, const float* x, std::int32_t* out, std::int64_t rows, std::int64_t cols) {
  if (rows == 0) return;
  argmax_kernel<<<blocks_for(rows, l), kThreads, 0, l.stream>>>(x, out, rows, cols);
  check_launch("argmax", rows * cols, l);
}

void one_hot(const Launch& l, const std::int32_t* labels, float* out, std::int64_t rows, std::int64_t classes,
             DataFault* fault) {
  if (rows * classes == 0) return;
  one_hot_kernel<<<blocks_for(rows * classes, l), kThreads, 0, l.stream>>>(labels, out, rows, classes, fault);
  check_launch("one_hot", rows * classes, l);
}

int channel_sum_chunks(std::int64_t rows) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(256, rows / 256)));
}

void channel_sums(const Launch& l, const float* a, const float* b, const float* center, float* sums, std::int64_t rows,
                  std::int64_t c, double* partials, int chunks) {
  if (c == 0) return;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(chunks));
  channel_sums_kernel<<<grid, block, 0, l.stream>>>(a, b, center, rows, c, partials);
  check_launch("channel_sums", rows * c, l);
  channel_sums_total_kernel<<<blocks_for(2 * c, l), kThreads, 0, l.stream>>>(partials, sums, c, chunks);
  check_launch("channel_sums (total)", 2 * c, l);
}

void batch_norm_coefficients(const Launch& l, const float* mean, const float* variance, double count,
                             const float* gamma, const float* beta, float epsilon, float* coefficients,
                             std::int64_t c) {
  if (c == 0) return;
  batch_norm_coefficients_kernel<<<blocks_for(c, l), kThreads, 0, l.stream>>>(mean, variance, count, gamma, beta,
                                                                                epsilon, coefficients, c);
  check_launch("batch_norm_coefficients", c, l);
}

void batch_norm_gradient_coefficients(const Launch& l, const float* sums, const float* total, double count,
                                      const float* coefficients, float* gradients, std::int64_t c) {
  if (c == 0) return;
  batch_norm_gradient_coefficients_kernel<<<blocks_for(c, l), kThreads, 0, l.stream>>>(sums, total, count,
                                                                                         coefficients, gradients, c);
  check_launch("batch_norm_gradient_coefficients", c, l);
}

void channel_affine(const Launch& l, const float* x, const float* scale, const float* shift, const float* x2,
                    const float* scale2, float* y, std::int64_t rows, std::int64_t c, bool relu) {
  const std::int64_t n = rows * c;
  if (n == 0) return;
  channel_affine_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, scale, shift, x2, scale2, y, n, c, relu);
  check_launch("channel_affine", n, l);
}

}  // namespace dtrain::kernels::cuda
