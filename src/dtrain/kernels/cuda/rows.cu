// Row-wise kernels over the last axis: softmax and log-softmax with their backward passes,
// the fused softmax cross-entropy, layer normalization, and the strided block copy. A block
// takes a row (32 threads for short rows, more for long ones); sums that the CPU backend
// keeps in double are kept in double here too.
#include "dtrain/kernels/cuda/common.cuh"

namespace dtrain::kernels::cuda {
namespace {

unsigned threads_for_row(std::int64_t cols) { return cols <= 256 ? 32u : (cols <= 2048 ? 128u : 256u); }
unsigned blocks_for_rows(std::int64_t rows) { return static_cast<unsigned>(std::min<std::int64_t>(rows, 1 << 30)); }

#define DTRAIN_ROWS(r, rows) for (std::int64_t r = blockIdx.x; r < (rows); r += gridDim.x)

__global__ void softmax_kernel(const float* x, float* y, std::int64_t rows, std::int64_t cols, bool log) {
  __shared__ float shared[32];
  __shared__ double shared_d[32];
  DTRAIN_ROWS(r, rows) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = -INFINITY;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, xr[c]);
    mx = block_max(mx, shared);
    double s = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += static_cast<double>(expf(xr[c] - mx));
    s = block_sum(s, shared_d);
    if (log) {
      const float lse = static_cast<float>(std::log(s));
      for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = xr[c] - mx - lse;
    } else {
      const float inv = static_cast<float>(1.0 / s);
      for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - mx) * inv;
    }
  }
}

// softmax: dx = y ⊙ (dy - Σ dy ⊙ y); log-softmax: dx = dy - exp(y) ⊙ Σ dy.
__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, std::int64_t rows,
                                        std::int64_t cols, bool log) {
  __shared__ double shared[32];
  DTRAIN_ROWS(r, rows) {
    const float* yr = y + r * cols;
    const float* gr = dy + r * cols;
    float* dr = dx + r * cols;
    double s = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      s += log ? static_cast<double>(gr[c]) : static_cast<double>(gr[c]) * yr[c];
    const float total = static_cast<float>(block_sum(s, shared));
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dr[c] = log ? gr[c] - expf(yr[c]) * total : yr[c] * (gr[c] - total);
  }
}

__global__ void softmax_cross_entropy_kernel(const float* logits, const std::int32_t* labels, const float* dist,
                                             float* loss, float* log_probs, std::int64_t rows, std::int64_t cols,
                                             DataFault* fault) {
  __shared__ float shared[32];
  __shared__ double shared_d[32];
  DTRAIN_ROWS(r, rows) {
    const float* xr = logits + r * cols;
    float* lr = log_probs + r * cols;
    float mx = -INFINITY;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, xr[c]);
    mx = block_max(mx, shared);
    double s = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += std::exp(static_cast<double>(xr[c] - mx));
    s = block_sum(s, shared_d);
    const float lse = mx + static_cast<float>(std::log(s));
    double l = 0.0;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = xr[c] - lse;
      lr[c] = v;
      if (dist && dist[r * cols + c] != 0.0f) l -= static_cast<double>(dist[r * cols + c]) * v;
    }
    if (dist) {
      l = block_sum(l, shared_d);
      if (threadIdx.x == 0) loss[r] = static_cast<float>(l);
    } else if (threadIdx.x == 0) {
      const std::int32_t label = labels[r];
      if (label < 0 || label >= cols) {
        if (atomicCAS(&fault->code, kFaultNone, kFaultLabel) == kFaultNone) {
          fault->a = label;
          fault->b = r;
          fault->c = cols;
        }
        loss[r] = NAN;
      } else {
        loss[r] = -(xr[label] - lse);
      }
    }
  }
}

__global__ void softmax_cross_entropy_backward_kernel(const float* log_probs, const std::int32_t* labels,
                                                      const float* dist, const float* dloss, float* dlogits,
                                                      std::int64_t rows, std::int64_t cols) {
  __shared__ float shared[32];
  DTRAIN_ROWS(r, rows) {
    float total = 1.0f;
    if (dist) {
      float s = 0.0f;
      for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += dist[r * cols + c];
      total = block_sum(s, shared);
    }
    const float dl = dloss[r];
    const std::int32_t label = dist ? -1 : labels[r];
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float t = dist ? dist[r * cols + c] : (c == label ? 1.0f : 0.0f);
      dlogits[r * cols + c] = dl * (expf(log_probs[r * cols + c]) * total - t);
    }
  }
}

__global__ void layer_norm_kernel(const float* x, const float* gamma, const float* beta, float epsilon, float* y,
                                  float* mean, float* inv_std, std::int64_t rows, std::int64_t d) {
  __shared__ double shared[32];
  DTRAIN_ROWS(r, rows) {
    const float* xr = x + r * d;
    double s = 0.0;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
    const double mu = d ? block_sum(s, shared) / static_cast<double>(d) : 0.0;
    double v = 0.0;  // two passes: no cancellation
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) v += (xr[j] - mu) * (xr[j] - mu);
    const double var = d ? block_sum(v, shared) / static_cast<double>(d) : 0.0;
    const float m = static_cast<float>(mu);
    const float is = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(epsilon)));
    if (threadIdx.x == 0) {
      mean[r] = m;
      inv_std[r] = is;
    }
    float* yr = y + r * d;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x)
      yr[j] = (xr[j] - m) * is * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
  }
}

// dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, row by row.
__global__ void layer_norm_backward_kernel(const float* x, const float* dy, const float* gamma, const float* mean,
                                           const float* inv_std, float* dx, std::int64_t rows, std::int64_t d) {
  __shared__ double shared[32];
  DTRAIN_ROWS(r, rows) {
    const float* xr = x + r * d;
    const float* gr = dy + r * d;
    const float m = mean[r], s = inv_std[r];
    double sg = 0.0, sgh = 0.0;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float g = gr[j] * (gamma ? gamma[j] : 1.0f);
      sg += g;
      sgh += g * (xr[j] - m) * s;
    }
    sg = block_sum(sg, shared);
    sgh = block_sum(sgh, shared);
    const float mg = d ? static_cast<float>(sg / static_cast<double>(d)) : 0.0f;
    const float mgh = d ? static_cast<float>(sgh / static_cast<double>(d)) : 0.0f;
    float* dr = dx + r * d;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float g = gr[j] * (gamma ? gamma[j] : 1.0f);
      dr[j] = s * (g - mg - (xr[j] - m) * s * mgh);
    }
  }
}

// Column sums for dgamma (Σ dy ⊙ xhat) and dbeta (Σ dy) over a chunk of rows each.
__global__ void layer_norm_columns_kernel(const float* x, const float* dy, const float* mean, const float* inv_std,
                                          std::int64_t rows, std::int64_t d, double* partials) {
  const std::int64_t per_chunk = (rows + gridDim.y - 1) / gridDim.y;
  const std::int64_t r0 = per_chunk * blockIdx.y, r1 = min(rows, r0 + per_chunk);
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double g0 = 0.0, g1 = 0.0;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float g = dy[r * d + j];
      g0 += g * (x[r * d + j] - mean[r]) * inv_std[r];
      g1 += g;
    }
    partials[static_cast<std::int64_t>(blockIdx.y) * 2 * d + j] = g0;
    partials[static_cast<std::int64_t>(blockIdx.y) * 2 * d + d + j] = g1;
  }
}

__global__ void layer_norm_columns_total_kernel(const double* partials, float* dgamma, float* dbeta, std::int64_t d,
                                                int chunks) {
  DTRAIN_GRID_STRIDE(j, d) {
    double g0 = 0.0, g1 = 0.0;
    for (int k = 0; k < chunks; ++k) {
      g0 += partials[static_cast<std::int64_t>(k) * 2 * d + j];
      g1 += partials[static_cast<std::int64_t>(k) * 2 * d + d + j];
    }
    if (dgamma) dgamma[j] = static_cast<float>(g0);
    if (dbeta) dbeta[j] = static_cast<float>(g1);
  }
}

template <typename T>
__global__ void copy_block_kernel(const T* src, long long from_offset, long long from_outer, long long from_row,
                                  T* dst, long long to_offset, long long to_outer, long long to_row, std::int64_t rows,
                                  std::int64_t width, std::int64_t n) {
  DTRAIN_GRID_STRIDE(k, n) {
    const std::int64_t w = k % width, rest = k / width, j = rest % rows, i = rest / rows;
    dst[to_offset + i * to_outer + j * to_row + w] = src[from_offset + i * from_outer + j * from_row + w];
  }
}

}  // namespace

void softmax(const Launch& l, const float* x, float* y, std::int64_t rows, std::int64_t cols, bool log) {
  if (rows * cols == 0) return;
  softmax_kernel<<<blocks_for_rows(rows), threads_for_row(cols), 0, l.stream>>>(x, y, rows, cols, log);
  check_launch(log ? "log_softmax" : "softmax", rows * cols, l);
}

void softmax_backward(const Launch& l, const float* y, const float* dy, float* dx, std::int64_t rows, std::int64_t cols,
                      bool log) {
  if (rows * cols == 0) return;
  softmax_backward_kernel<<<blocks_for_rows(rows), threads_for_row(cols), 0, l.stream>>>(y, dy, dx, rows, cols, log);
  check_launch(log ? "log_softmax_backward" : "softmax_backward", rows * cols, l);
}

void softmax_cross_entropy(const Launch& l, const float* logits, const std::int32_t* labels, const float* dist,
                           float* loss, float* log_probs, std::int64_t rows, std::int64_t cols, DataFault* fault) {
  if (rows == 0) return;
  softmax_cross_entropy_kernel<<<blocks_for_rows(rows), threads_for_row(cols), 0, l.stream>>>(
      logits, labels, dist, loss, log_probs, rows, cols, fault);
  check_launch("softmax_cross_entropy", rows * cols, l);
}

void softmax_cross_entropy_backward(const Launch& l, const float* log_probs, const std::int32_t* labels,
                                    const float* dist, const float* dloss, float* dlogits, std::int64_t rows,
                                    std::int64_t cols) {
  if (rows * cols == 0) return;
  softmax_cross_entropy_backward_kernel<<<blocks_for_rows(rows), threads_for_row(cols), 0, l.stream>>>(
      log_probs, labels, dist, dloss, dlogits, rows, cols);
  check_launch("softmax_cross_entropy_backward", rows * cols, l);
}

void layer_norm(const Launch& l, const float* x, const float* gamma, const float* beta, float epsilon, float* y,
                float* mean, float* inv_std, std::int64_t rows, std::int64_t d) {
  if (rows == 0) return;
  layer_norm_kernel<<<blocks_for_rows(rows), threads_for_row(d), 0, l.stream>>>(x, gamma, beta, epsilon, y, mean,
                                                                                 inv_std, rows, d);
  check_launch("layer_norm", rows * d, l);
}

int layer_norm_chunks(std::int64_t rows) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(256, rows / 64)));
}

void layer_norm_backward(const Launch& l, const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* inv_std, float* dx, float* dgamma, float* dbeta, std::int64_t rows,
                         std::int64_t d, double* partials, int chunks) {
  if (rows * d > 0) {
    layer_norm_backward_kernel<<<blocks_for_rows(rows), threads_for_row(d), 0, l.stream>>>(x, dy, gamma, mean, inv_std,
                                                                                            dx, rows, d);
    check_launch("layer_norm_backward", rows * d, l);
  }
  if ((dgamma || dbeta) && d > 0) {
    const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((d + kThreads - 1) / kThreads, 65535)),
                    static_cast<unsigned>(chunks));
    layer_norm_columns_kernel<<<grid, kThreads, 0, l.stream>>>(x, dy, mean, inv_std, rows, d, partials);
    check_launch("layer_norm_backward (gamma and beta)", rows * d, l);
    layer_norm_columns_total_kernel<<<blocks_for(d, l), kThreads, 0, l.stream>>>(partials, dgamma, dbeta, d, chunks);
    check_launch("layer_norm_backward (gamma and beta total)", d, l);
  }
}

void copy_block(const Launch& l, const void* src, long long from_offset, long long from_outer, long long from_row,
                void* dst, long long to_offset, long long to_outer, long long to_row, std::int64_t outer,
                std::int64_t rows, std::int64_t width, int element) {
  const std::int64_t n = outer * rows * width;
  if (n == 0) return;
  const unsigned blocks = blocks_for(n, l);
  switch (element) {
    case 1:
      copy_block_kernel<<<blocks, kThreads, 0, l.stream>>>(static_cast<const std::uint8_t*>(src), from_offset,
                                                           from_outer, from_row, static_cast<std::uint8_t*>(dst),
                                                           to_offset, to_outer, to_row, rows, width, n);
      break;
    case 2:
      copy_block_kernel<<<blocks, kThreads, 0, l.stream>>>(static_cast<const std::uint16_t*>(src), from_offset,
                                                           from_outer, from_row, static_cast<std::uint16_t*>(dst),
                                                           to_offset, to_outer, to_row, rows, width, n);
      break;
    default:
      copy_block_kernel<<<blocks, kThreads, 0, l.stream>>>(static_cast<const std::uint32_t*>(src), from_offset,
                                                           from_outer, from_row, static_cast<std::uint32_t*>(dst),
                                                           to_offset, to_outer, to_row, rows, width, n);
      break;
  }
  check_launch("copy_block", n, l);
}

}  // namespace dtrain::kernels::cuda
