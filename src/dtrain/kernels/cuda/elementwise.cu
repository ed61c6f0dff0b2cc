// Element-wise kernels: activations and their derivatives, binary ops with broadcasting,
// fills and conversions, dropout's mask, and the optimizers' fused updates. One grid-stride
// loop each over the elements; the arithmetic is element_math.h's, shared with the host.
#include <cuda_fp16.h>

#include "dtrain/kernels/cuda/common.cuh"

namespace dtrain::kernels::cuda {
namespace {

__global__ void unary_kernel(math::UnaryOp op, const float* __restrict__ x, float* __restrict__ y, std::int64_t n,
                             float alpha, float beta) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = math::unary(op, x[i], alpha, beta);
}

// x and y may be one buffer (in place): no __restrict__.
__global__ void unary_inplace_kernel(math::UnaryOp op, const float* x, float* y, std::int64_t n, float alpha,
                                     float beta) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = math::unary(op, x[i], alpha, beta);
}

__global__ void unary_backward_kernel(math::UnaryOp op, const float* saved, const float* dy, float* dx,
                                      std::int64_t n, float alpha, float beta) {
  DTRAIN_GRID_STRIDE(i, n) dx[i] = math::unary_backward(op, saved[i], dy[i], alpha, beta);
}

__device__ __forceinline__ float apply(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::max: return a > b ? a : b;
    case BinaryOp::min: return a < b ? a : b;
  }
  return 0.0f;
}

__global__ void binary_same_kernel(BinaryOp op, const float* a, const float* b, float* c, std::int64_t n) {
  DTRAIN_GRID_STRIDE(i, n) c[i] = apply(op, a[i], b[i]);
}

__global__ void binary_broadcast_kernel(BinaryOp op, const float* a, const float* b, float* c, std::int64_t n,
                                        Broadcast s) {
  DTRAIN_GRID_STRIDE(i, n) {
    long long rest = i, oa = 0, ob = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const long long k = rest % s.dims[d];
      rest /= s.dims[d];
      oa += k * s.stride_a[d];
      ob += k * s.stride_b[d];
    }
    c[i] = apply(op, a[oa], b[ob]);
  }
}

__global__ void fill_kernel(float* y, std::int64_t n, float value) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = value;
}

// beta == 0 ignores y's old values, even NaN (backend.h's contract).
__global__ void axpby_kernel(float alpha, const float* x, float beta, float* y, std::int64_t n) {
  if (beta == 0.0f) {
    DTRAIN_GRID_STRIDE(i, n) y[i] = alpha * x[i];
  } else {
    DTRAIN_GRID_STRIDE(i, n) y[i] = alpha * x[i] + beta * y[i];
  }
}

__global__ void linear_from_bytes_kernel(const std::uint8_t* __restrict__ x, float alpha, float beta,
                                         float* __restrict__ y, std::int64_t n) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = alpha * static_cast<float>(x[i]) + beta;
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, std::uint16_t* __restrict__ y, std::int64_t n) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = math::to_bf16(x[i]);
}

__global__ void bf16_to_f32_kernel(const std::uint16_t* __restrict__ x, float* __restrict__ y, std::int64_t n) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = math::from_bf16(x[i]);
}

__global__ void f32_to_f16_kernel(const float* __restrict__ x, std::uint16_t* __restrict__ y, std::int64_t n) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = __half_as_ushort(__float2half_rn(x[i]));
}

__global__ void f16_to_f32_kernel(const std::uint16_t* __restrict__ x, float* __restrict__ y, std::int64_t n) {
  DTRAIN_GRID_STRIDE(i, n) y[i] = __half2float(__ushort_as_half(x[i]));
}

__global__ void dropout_kernel(const float* x, float* y, float* mask, std::int64_t n, float rate, float keep_scale,
                               std::uint64_t mixed_seed, std::uint64_t counter) {
  DTRAIN_GRID_STRIDE(i, n) {
    const float m = math::uniform_at(mixed_seed, counter, static_cast<std::uint64_t>(i)) >= rate ? keep_scale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void bias_rows_kernel(const float* bias, float* c, std::int64_t m, std::int64_t width,
                                 std::int64_t col_begin, std::int64_t cols, math::UnaryOp activation) {
  DTRAIN_GRID_STRIDE(k, m * cols) {
    const std::int64_t i = k / cols, j = k % cols;
    const float v = bias ? bias[j] : 0.0f;
    c[i * width + col_begin + j] = math::unary(activation, v, 1.0f, 0.0f);
  }
}

__global__ void sgd_kernel(float* w, const float* g, float* velocity, std::int64_t n, float lr, float momentum,
                           bool nesterov, float decay, float gradient_scale, int* non_finite) {
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, n) {
    const float out = math::sgd(w[i], g[i], velocity ? velocity + i : nullptr, lr, momentum, nesterov, decay,
                                gradient_scale);
    w[i] = out;
    bad |= math::not_finite(out);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *non_finite = 1;
}

__global__ void rmsprop_kernel(float* w, const float* g, float* v, float* momentum, float* average, std::int64_t n,
                               float rho, float square_weight, float momentum_factor, float lr, float epsilon,
                               float decay, float gradient_scale, int* non_finite) {
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, n) {
    float vi = v[i];
    const float out = math::rmsprop(w[i], g[i], vi, momentum ? momentum + i : nullptr, average ? average + i : nullptr,
                                    rho, square_weight, momentum_factor, lr, epsilon, decay, gradient_scale);
    v[i] = vi;
    w[i] = out;
    bad |= math::not_finite(out);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *non_finite = 1;
}

__global__ void adam_kernel(float* w, const float* g, float* m, float* v, std::int64_t n, float b1,
                            float one_minus_b1, float b2, float one_minus_b2, float step_size, float epsilon,
                            float decay, float gradient_scale, int* non_finite) {
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, n) {
    float mi = m[i], vi = v[i];
    const float out = math::adam(w[i], g[i], mi, vi, b1, one_minus_b1, b2, one_minus_b2, step_size, epsilon, decay,
                                 gradient_scale);
    m[i] = mi;
    v[i] = vi;
    w[i] = out;
    bad |= math::not_finite(out);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *non_finite = 1;
}

// The variable element i of all of them is in: the first whose end is past i (an empty one
// ends where the one before it does, so it is never chosen).
__device__ __forceinline__ int variable_of(const ManyTensors& t, std::int64_t i) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (i < t.ends[mid]) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

__global__ void find_non_finite_many_kernel(const ManyTensors t, int* found) {
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, t.ends[t.count - 1]) {
    const int k = variable_of(t, i);
    bad |= math::not_finite(t.g[k][i - (k > 0 ? t.ends[k - 1] : 0)]);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *found = 1;
}

__global__ void sgd_many_kernel(const ManyTensors t, float lr, float momentum, bool nesterov, float decay,
                                int* non_finite) {
  if (t.skip != nullptr && *t.skip != 0) return;  // the loss scale's check failed
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, t.ends[t.count - 1]) {
    const int k = variable_of(t, i);
    const std::int64_t j = i - (k > 0 ? t.ends[k - 1] : 0);
    const float out = math::sgd(t.w[k][j], t.g[k][j], t.slot0[k] ? t.slot0[k] + j : nullptr, lr, momentum, nesterov,
                                decay, t.gradient_scale[k]);
    t.w[k][j] = out;
    bad |= math::not_finite(out);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *non_finite = 1;
}

__global__ void adam_many_kernel(const ManyTensors t, float b1, float one_minus_b1, float b2, float one_minus_b2,
                                 float step_size, float epsilon, float decay, int* non_finite) {
  if (t.skip != nullptr && *t.skip != 0) return;  // the loss scale's check failed
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, t.ends[t.count - 1]) {
    const int k = variable_of(t, i);
    const std::int64_t j = i - (k > 0 ? t.ends[k - 1] : 0);
    float mi = t.slot0[k][j], vi = t.slot1[k][j];
    const float out = math::adam(t.w[k][j], t.g[k][j], mi, vi, b1, one_minus_b1, b2, one_minus_b2, step_size, epsilon,
                                 decay, t.gradient_scale[k]);
    t.slot0[k][j] = mi;
    t.slot1[k][j] = vi;
    t.w[k][j] = out;
    bad |= math::not_finite(out);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *non_finite = 1;
}

__global__ void rmsprop_many_kernel(const ManyTensors t, float rho, float square_weight, float momentum_factor,
                                    float lr, float epsilon, float decay, int* non_finite) {
  if (t.skip != nullptr && *t.skip != 0) return;  // the loss scale's check failed
  bool bad = false;
  DTRAIN_GRID_STRIDE(i, t.ends[t.count - 1]) {
    const int k = variable_of(t, i);
    const std::int64_t j = i - (k > 0 ? t.ends[k - 1] : 0);
    float vi = t.slot0[k][j];
    const float out = math::rmsprop(t.w[k][j], t.g[k][j], vi, t.slot1[k] ? t.slot1[k] + j : nullptr,
                                    t.slot2[k] ? t.slot2[k] + j : nullptr, rho, square_weight, momentum_factor, lr,
                                    epsilon, decay, t.gradient_scale[k]);
    t.slot0[k][j] = vi;
    t.w[k][j] = out;
    bad |= math::not_finite(out);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *non_finite = 1;
}

}  // namespace

void unary(const Launch& l, math::UnaryOp op, const float* x, float* y, std::int64_t n, float alpha, float beta) {
  if (n == 0) return;
  if (x == y) unary_inplace_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(op, x, y, n, alpha, beta);
  else unary_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(op, x, y, n, alpha, beta);
  check_launch("unary", n, l);
}

void unary_backward(const Launch& l, math::UnaryOp op, const float* saved, const float* dy, float* dx, std::int64_t n,
                    float alpha, float beta) {
  if (n == 0) return;
  unary_backward_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(op, saved, dy, dx, n, alpha, beta);
  check_launch("unary_backward", n, l);
}

void binary_same(const Launch& l, BinaryOp op, const float* a, const float* b, float* c, std::int64_t n) {
  if (n == 0) return;
  binary_same_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(op, a, b, c, n);
  check_launch("binary", n, l);
}

void binary_broadcast(const Launch& l, BinaryOp op, const float* a, const float* b, float* c, std::int64_t n,
                      const Broadcast& shape) {
  if (n == 0) return;
  binary_broadcast_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(op, a, b, c, n, shape);
  check_launch("binary (broadcast)", n, l);
}

void fill(const Launch& l, float* y, std::int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(y, n, value);
  check_launch("fill", n, l);
}

void axpby(const Launch& l, float alpha, const float* x, float beta, float* y, std::int64_t n) {
  if (n == 0) return;
  axpby_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(alpha, x, beta, y, n);
  check_launch("axpby", n, l);
}

void linear_from_bytes(const Launch& l, const std::uint8_t* x, float alpha, float beta, float* y, std::int64_t n) {
  if (n == 0) return;
  linear_from_bytes_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, alpha, beta, y, n);
  check_launch("unary (linear from uint8)", n, l);
}

void narrow(const Launch& l, const float* x, std::uint16_t* y, Elem to, std::int64_t n) {
  if (n == 0) return;
  if (to == Elem::f16) {
    f32_to_f16_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, n);
    check_launch("convert (float32 to float16)", n, l);
  } else {
    f32_to_bf16_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, n);
    check_launch("convert (float32 to bfloat16)", n, l);
  }
}

void widen(const Launch& l, const std::uint16_t* x, Elem from, float* y, std::int64_t n) {
  if (n == 0) return;
  if (from == Elem::f16) {
    f16_to_f32_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, n);
    check_launch("convert (float16 to float32)", n, l);
  } else {
    bf16_to_f32_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, n);
    check_launch("convert (bfloat16 to float32)", n, l);
  }
}

void dropout(const Launch& l, const float* x, float* y, float* mask, std::int64_t n, float rate,
             std::uint64_t mixed_seed, std::uint64_t counter) {
  if (n == 0) return;
  dropout_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, mask, n, rate, 1.0f / (1.0f - rate), mixed_seed,
                                                              counter);
  check_launch("dropout", n, l);
}

void bias_rows(const Launch& l, const float* bias, float* c, std::int64_t m, std::int64_t width, std::int64_t col_begin,
               std::int64_t col_end, math::UnaryOp activation) {
  const std::int64_t n = m * (col_end - col_begin);
  if (n == 0) return;
  bias_rows_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(bias, c, m, width, col_begin, col_end - col_begin,
                                                                activation);
  check_launch("matmul (empty sum)", n, l);
}

void sgd(const Launch& l, float* w, const float* g, float* velocity, std::int64_t n, float lr, float momentum,
         bool nesterov, float decay, float gradient_scale, int* non_finite) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(w, g, velocity, n, lr, momentum, nesterov, decay,
                                                          gradient_scale, non_finite);
  check_launch("sgd_update", n, l);
}

void adam(const Launch& l, float* w, const float* g, float* m, float* v, std::int64_t n, float beta_1, float beta_2,
          float step_size, float epsilon, float decay, float gradient_scale, int* non_finite) {
  if (n == 0) return;
  adam_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(w, g, m, v, n, beta_1, 1.0f - beta_1, beta_2,
                                                           1.0f - beta_2, step_size, epsilon, decay, gradient_scale,
                                                           non_finite);
  check_launch("adam_update", n, l);
}

void find_non_finite_many(const Launch& l, const ManyTensors& t, int* found) {
  const std::int64_t n = t.count > 0 ? t.ends[t.count - 1] : 0;
  if (n == 0) return;
  find_non_finite_many_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(t, found);
  check_launch("all_finite", n, l);
}

void sgd_many(const Launch& l, const ManyTensors& t, float lr, float momentum, bool nesterov, float decay,
              int* non_finite) {
  const std::int64_t n = t.count > 0 ? t.ends[t.count - 1] : 0;
  if (n == 0) return;
  sgd_many_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(t, lr, momentum, nesterov, decay, non_finite);
  check_launch("sgd_update_many", n, l);
}

void adam_many(const Launch& l, const ManyTensors& t, float beta_1, float beta_2, float step_size, float epsilon,
               float decay, int* non_finite) {
  const std::int64_t n = t.count > 0 ? t.ends[t.count - 1] : 0;
  if (n == 0) return;
  adam_many_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(t, beta_1, 1.0f - beta_1, beta_2, 1.0f - beta_2,
                                                                step_size, epsilon, decay, non_finite);
  check_launch("adam_update_many", n, l);
}

void rmsprop_many(const Launch& l, const ManyTensors& t, float rho, float square_weight, float momentum_factor,
                  float lr, float epsilon, float decay, int* non_finite) {
  const std::int64_t n = t.count > 0 ? t.ends[t.count - 1] : 0;
  if (n == 0) return;
  rmsprop_many_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(t, rho, square_weight, momentum_factor, lr, epsilon,
                                                                   decay, non_finite);
  check_launch("rmsprop_update_many", n, l);
}

void rmsprop(const Launch& l, float* w, const float* g, float* v, float* momentum, float* average, std::int64_t n,
             float rho, float square_weight, float momentum_factor, float lr, float epsilon, float decay,
             float gradient_scale, int* non_finite) {
  if (n == 0) return;
  rmsprop_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(w, g, v, momentum, average, n, rho, square_weight,
                                                              momentum_factor, lr, epsilon, decay, gradient_scale,
                                                              non_finite);
  check_launch("rmsprop_update", n, l);
}

}  // namespace dtrain::kernels::cuda
