// The plain-loop half of the CPU backend: what oneDNN has no primitive for. Loops run on
// the OpenMP pool through parallel_for; hot ones are compiled for several ISAs and picked
// at run time (target_clones), so the default build stays portable.
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "dtrain/core/multiversion.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::kernels {
namespace {

constexpr std::int64_t kGrain = 16384;  // elements per chunk below which a loop stays serial

float apply(Binary op, float a, float b) {
  switch (op) {
    case Binary::add: return a + b;
    case Binary::sub: return a - b;
    case Binary::mul: return a * b;
    case Binary::div: return a / b;
    case Binary::max: return a > b ? a : b;
    case Binary::min: return a < b ? a : b;
  }
  return 0.0f;
}

DTRAIN_MULTIVERSION
void axpby_loop(float alpha, const float* x, float beta, float* y, std::int64_t begin, std::int64_t end) {
  if (beta == 0.0f) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) y[i] = alpha * x[i];
  } else {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) y[i] = alpha * x[i] + beta * y[i];
  }
}

DTRAIN_MULTIVERSION
void linear_from_bytes_loop(const std::uint8_t* x, float alpha, float beta, float* y, std::int64_t begin,
                            std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) y[i] = alpha * static_cast<float>(x[i]) + beta;
}

// Whether x[begin, end) holds a NaN or an infinity: all exponent bits set.
DTRAIN_MULTIVERSION
bool any_non_finite_loop(const float* x, std::int64_t begin, std::int64_t end) {
  std::uint32_t found = 0;
#pragma omp simd reduction(| : found)
  for (std::int64_t i = begin; i < end; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x[i]);
    found |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return found != 0;
}

DTRAIN_MULTIVERSION
double sum_squares_loop(const float* x, std::int64_t begin, std::int64_t end) {
  // Blocks of float partial sums folded into double keep precision and vectorise.
  double total = 0.0;
  constexpr std::int64_t kBlock = 1024;
  for (std::int64_t b = begin; b < end; b += kBlock) {
    const std::int64_t e = std::min(end, b + kBlock);
    float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
    for (std::int64_t i = b; i < e; ++i) partial += x[i] * x[i];
    total += partial;
  }
  return total;
}

DTRAIN_MULTIVERSION
void f32_to_bf16_loop(const float* x, std::uint16_t* y, std::int64_t begin, std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest even
    y[i] = static_cast<std::uint16_t>(nan ? (u >> 16) | 0x40u : rounded);  // a NaN stays a (quiet) NaN
  }
}

DTRAIN_MULTIVERSION
void bf16_to_f32_loop(const std::uint16_t* x, float* y, std::int64_t begin, std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) y[i] = std::bit_cast<float>(static_cast<std::uint32_t>(x[i]) << 16);
}

// 1 when x is NaN or infinite (all exponent bits set). The update loops OR it over the
// weights they write, which costs no memory traffic: the value is already in a register.
inline std::uint32_t not_finite(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

DTRAIN_MULTIVERSION
bool adam_loop(float* w, const float* g, float* m, float* v, std::int64_t begin, std::int64_t end,
               float b1, float b2, float step_size, float eps, float decay, float gscale) {
  const float one_minus_b1 = 1.0f - b1;
  const float one_minus_b2 = 1.0f - b2;
  std::uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (std::int64_t i = begin; i < end; ++i) {
    const float gi = g[i] * gscale;
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float wi = w[i] - decay * w[i];
    const float out = wi - step_size * mi / (std::sqrt(vi) + eps);
    w[i] = out;
    bad |= not_finite(out);
  }
  return bad == 0;
}

// RmspropUpdate's formula; the slots a given optimizer lacks are compiled out. Inlined into
// a multiversioned function for each case below (clang clones no template).
template <bool kMomentum, bool kCentered>
[[gnu::always_inline]] inline bool rmsprop_body(float* w, const float* g, float* v, float* mom, float* avg,
                                                std::int64_t begin, std::int64_t end, const RmspropUpdate& p,
                                                float decay) {
  const float rho = p.rho, square_weight = p.square_weight, momentum = p.momentum, lr = p.learning_rate;
  const float eps = p.epsilon, gscale = p.gradient_scale;
  std::uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (std::int64_t i = begin; i < end; ++i) {
    const float gi = g[i] * gscale;
    const float vi = rho * v[i] + square_weight * gi * gi;
    v[i] = vi;
    float denominator = vi;
    if constexpr (kCentered) {
      const float ai = rho * avg[i] + square_weight * gi;
      avg[i] = ai;
      denominator = vi - ai * ai;
    }
    const float step = lr * gi / std::sqrt(denominator + eps);
    float out = w[i] - decay * w[i];
    if constexpr (kMomentum) {
      const float mi = momentum * mom[i] + step;
      mom[i] = mi;
      out -= mi;
    } else {
      out -= step;
    }
    w[i] = out;
    bad |= not_finite(out);
  }
  return bad == 0;
}

#define DTRAIN_RMSPROP_CASE(name, momentum, centered)                                                              \
  DTRAIN_MULTIVERSION bool name(float* w, const float* g, float* v, float* mom, float* avg, std::int64_t begin,     \
                                std::int64_t end, const RmspropUpdate& p, float decay) {                          \
    return rmsprop_body<momentum, centered>(w, g, v, mom, avg, begin, end, p, decay);                             \
  }
DTRAIN_RMSPROP_CASE(rmsprop_plain, false, false)
DTRAIN_RMSPROP_CASE(rmsprop_centered, false, true)
DTRAIN_RMSPROP_CASE(rmsprop_momentum, true, false)
DTRAIN_RMSPROP_CASE(rmsprop_momentum_centered, true, true)
#undef DTRAIN_RMSPROP_CASE

DTRAIN_MULTIVERSION
bool sgd_loop(float* w, const float* g, float* vel, std::int64_t begin, std::int64_t end, float lr,
              float momentum, bool nesterov, float decay, float gscale) {
  std::uint32_t bad = 0;
  if (vel == nullptr) {
#pragma omp simd reduction(| : bad)
    for (std::int64_t i = begin; i < end; ++i) {
      const float out = w[i] - decay * w[i] - lr * gscale * g[i];
      w[i] = out;
      bad |= not_finite(out);
    }
  } else if (nesterov) {
#pragma omp simd reduction(| : bad)
    for (std::int64_t i = begin; i < end; ++i) {
      const float gi = gscale * g[i];
      const float vi = momentum * vel[i] - lr * gi;
      vel[i] = vi;
      const float out = w[i] - decay * w[i] + momentum * vi - lr * gi;
      w[i] = out;
      bad |= not_finite(out);
    }
  } else {
#pragma omp simd reduction(| : bad)
    for (std::int64_t i = begin; i < end; ++i) {
      const float vi = momentum * vel[i] - lr * gscale * g[i];
      vel[i] = vi;
      const float out = w[i] - decay * w[i] + vi;
      w[i] = out;
      bad |= not_finite(out);
    }
  }
  return bad == 0;
}

DTRAIN_MULTIVERSION
void dropout_loop(const float* x, float* y, float* mask, std::int64_t begin, std::int64_t end, float rate,
                  const Generator& gen) {
  const float keep_scale = 1.0f / (1.0f - rate);
  for (std::int64_t i = begin; i < end; ++i) {
    const float m = gen.uniform_at(static_cast<std::uint64_t>(i)) >= rate ? keep_scale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

// y[j] (op)= x[i, j] over rows i: the rows are reduced, columns stay.
DTRAIN_MULTIVERSION
void reduce_rows_loop(const float* x, float* y, std::int64_t rows, std::int64_t cols, std::int64_t col_begin,
                      std::int64_t col_end, bool max) {
  for (std::int64_t j = col_begin; j < col_end; ++j) y[j] = max ? x[j] : 0.0f;
  for (std::int64_t i = max ? 1 : 0; i < rows; ++i) {
    const float* row = x + i * cols;
    if (max) {
#pragma omp simd
      for (std::int64_t j = col_begin; j < col_end; ++j) y[j] = y[j] > row[j] ? y[j] : row[j];
    } else {
#pragma omp simd
      for (std::int64_t j = col_begin; j < col_end; ++j) y[j] += row[j];
    }
  }
}

// y[i] = (op) over x[i, :] for each row i.
DTRAIN_MULTIVERSION
void reduce_cols_loop(const float* x, float* y, std::int64_t cols, std::int64_t row_begin, std::int64_t row_end,
                      bool max) {
  for (std::int64_t i = row_begin; i < row_end; ++i) {
    const float* row = x + i * cols;
    float acc = max ? row[0] : 0.0f;
    if (max) {
      for (std::int64_t j = 1; j < cols; ++j) acc = acc > row[j] ? acc : row[j];
    } else {
#pragma omp simd reduction(+ : acc)
      for (std::int64_t j = 0; j < cols; ++j) acc += row[j];
    }
    y[i] = acc;
  }
}

}  // namespace

void CpuBackend::convert_loops(const Tensor& x, Tensor& y) {
  const std::int64_t n = x.numel();
  if (x.dtype() == DType::f16 || y.dtype() == DType::f16) {  // F16C where the CPU has it (core/half.h)
    parallel_for(n, kGrain, [&](std::int64_t b, std::int64_t e) {
      const auto count = static_cast<std::size_t>(e - b);
      if (x.dtype() == DType::f32) to_f16(x.data<float>() + b, static_cast<std::uint16_t*>(y.raw_data()) + b, count);
      else from_f16(static_cast<const std::uint16_t*>(x.raw_data()) + b, y.data<float>() + b, count);
    });
  } else if (x.dtype() == DType::f32) {
    const float* px = x.data<float>();
    auto* py = static_cast<std::uint16_t*>(y.raw_data());
    parallel_for(n, kGrain, [&](std::int64_t b, std::int64_t e) { f32_to_bf16_loop(px, py, b, e); });
  } else {
    const auto* px = static_cast<const std::uint16_t*>(x.raw_data());
    float* py = y.data<float>();
    parallel_for(n, kGrain, [&](std::int64_t b, std::int64_t e) { bf16_to_f32_loop(px, py, b, e); });
  }
}

bool CpuBackend::supports(Primitive op, DType dtype) const {
  switch (op) {
    case Primitive::matmul:
    case Primitive::convert: return is_floating(dtype);
    case Primitive::argmax: return dtype == DType::f32;
    default: return dtype == DType::f32;
  }
}

void CpuBackend::binary_loops(Binary op, const Tensor& a, const Tensor& b, Tensor& c) {
  const int rank = c.rank();
  // Strides of a and b over c's index space; 0 where the operand is broadcast.
  std::array<std::int64_t, Shape::kMaxRank> sa{}, sb{}, dims{};
  const auto stra = a.shape().strides();
  const auto strb = b.shape().strides();
  for (int i = 0; i < rank; ++i) {
    dims[i] = c.dim(i);
    const int ia = a.rank() - rank + i;
    const int ib = b.rank() - rank + i;
    sa[i] = (ia >= 0 && a.dim(ia) != 1) ? stra[ia] : 0;
    sb[i] = (ib >= 0 && b.dim(ib) != 1) ? strb[ib] : 0;
  }
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = c.data<float>();
  parallel_for(c.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    std::array<std::int64_t, Shape::kMaxRank> idx{};
    std::int64_t rem = begin, oa = 0, ob = 0;
    for (int i = rank - 1; i >= 0; --i) {
      idx[i] = rem % dims[i];
      rem /= dims[i];
      oa += idx[i] * sa[i];
      ob += idx[i] * sb[i];
    }
    for (std::int64_t k = begin; k < end; ++k) {
      pc[k] = apply(op, pa[oa], pb[ob]);
      for (int i = rank - 1; i >= 0; --i) {  // odometer step
        oa += sa[i];
        ob += sb[i];
        if (++idx[i] < dims[i]) break;
        oa -= sa[i] * dims[i];
        ob -= sb[i] * dims[i];
        idx[i] = 0;
      }
    }
  });
}

bool CpuBackend::reduce_contiguous(Reduce op, const Tensor& x, const std::vector<std::int64_t>& dx,
                                   const std::vector<std::int64_t>& dy, Tensor& y) {
  const int rank = static_cast<int>(dx.size());
  // Split the axes into a reduced prefix and a kept suffix, or a kept prefix and a reduced
  // suffix; anything else is not this fast path.
  int k = 0;
  while (k < rank && dy[k] == 1 && dx[k] != 1) ++k;
  bool leading = k > 0;
  for (int i = k; i < rank && leading; ++i) leading = dy[i] == dx[i];
  int m = rank;
  while (m > 0 && dy[m - 1] == 1 && dx[m - 1] != 1) --m;
  bool trailing = m < rank;
  for (int i = 0; i < m && trailing; ++i) trailing = dy[i] == dx[i];
  if (!leading && !trailing) return false;
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const bool max = op == Reduce::max;
  if (leading) {
    std::int64_t rows = 1, cols = 1;
    for (int i = 0; i < k; ++i) rows *= dx[i];
    for (int i = k; i < rank; ++i) cols *= dx[i];
    parallel_for(cols, std::max<std::int64_t>(64, kGrain / std::max<std::int64_t>(rows, 1)),
                 [&](std::int64_t b, std::int64_t e) { reduce_rows_loop(px, py, rows, cols, b, e, max); });
    if (op == Reduce::mean) axpby(1.0f / static_cast<float>(rows), y, 0.0f, y);
  } else {
    std::int64_t rows = 1, cols = 1;
    for (int i = 0; i < m; ++i) rows *= dx[i];
    for (int i = m; i < rank; ++i) cols *= dx[i];
    parallel_for(rows, std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(cols, 1)),
                 [&](std::int64_t b, std::int64_t e) { reduce_cols_loop(px, py, cols, b, e, max); });
    if (op == Reduce::mean) axpby(1.0f / static_cast<float>(cols), y, 0.0f, y);
  }
  return true;
}

void CpuBackend::fill(Tensor& y, float value) {
  check_devices("fill", device(), {&y});
  y.check_dtype(DType::f32, "fill");
  float* p = y.data<float>();
  parallel_for(y.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) p[i] = value;
  });
}

void CpuBackend::axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  check_devices("axpby", device(), {&x, &y});
  check_same_f32(x, y, "axpby");
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(x.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    axpby_loop(alpha, px, beta, py, begin, end);
  });
}

void CpuBackend::linear_from_bytes(const Tensor& x, float alpha, float beta, Tensor& y) {
  y.check_dtype(DType::f32, "unary (output)");
  check_same_shape(x, y, "unary");
  const std::uint8_t* px = x.data<std::uint8_t>();
  float* py = y.data<float>();
  parallel_for(x.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    linear_from_bytes_loop(px, alpha, beta, py, begin, end);
  });
}

double CpuBackend::sum_squares(const Tensor& x) {
  check_devices("sum_squares", device(), {&x});
  x.check_dtype(DType::f32, "sum_squares");
  const float* p = x.data<float>();
  const std::int64_t n = x.numel();
  double total = 0.0;
  const bool flush = flush_denormals();
  if (!kParallelLoops || n < 4 * kGrain || omp_in_parallel()) {
    FlushDenormals mode(flush);
    return sum_squares_loop(p, 0, n);
  }
#pragma omp parallel reduction(+ : total)
  {
    FlushDenormals mode(flush);
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    total += sum_squares_loop(p, n * t / nt, n * (t + 1) / nt);
  }
  return total;
}

bool CpuBackend::all_finite(std::span<const Tensor* const> tensors) {
  for (const Tensor* t : tensors) {
    check_devices("all_finite", device(), {t});
    t->check_dtype(DType::f32, "all_finite");
  }
  for (const Tensor* t : tensors) {
    const float* p = t->data<float>();
    std::atomic<bool> found{false};
    parallel_for(t->numel(), 4 * kGrain, [&](std::int64_t b, std::int64_t e) {
      if (!found.load(std::memory_order_relaxed) && any_non_finite_loop(p, b, e))
        found.store(true, std::memory_order_relaxed);
    });
    if (found.load()) return false;
  }
  return true;
}

void CpuBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& target, Tensor& loss,
                                       Tensor& log_probs) {
  check_devices("softmax_cross_entropy", device(), {&logits, &target, &loss, &log_probs});
  const bool sparse = check_softmax_cross_entropy(logits, target, loss, log_probs);
  const std::int64_t B = logits.dim(0), C = logits.dim(1);
  if (sparse) {  // validate before the parallel loop: nothing may throw inside it
    const std::int32_t* labels = target.data<std::int32_t>();
    for (std::int64_t b = 0; b < B; ++b)
      if (labels[b] < 0 || labels[b] >= C)
        DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy: label ", labels[b], " at row ", b,
                     " is outside [0, ", C, ")");
  }
  const float* x = logits.data<float>();
  float* lp = log_probs.data<float>();
  float* out = loss.data<float>();
  const std::int32_t* labels = sparse ? target.data<std::int32_t>() : nullptr;
  const float* dist = sparse ? nullptr : target.data<float>();
  parallel_for(B, std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(C, 1)),
               [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const float* row = x + b * C;
      float* lrow = lp + b * C;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::int64_t c = 0; c < C; ++c) mx = std::max(mx, row[c]);
      double s = 0.0;
      for (std::int64_t c = 0; c < C; ++c) s += std::exp(static_cast<double>(row[c] - mx));
      const float lse = mx + static_cast<float>(std::log(s));
      for (std::int64_t c = 0; c < C; ++c) lrow[c] = row[c] - lse;
      if (sparse) {
        out[b] = -lrow[labels[b]];
      } else {
        double l = 0.0;
        for (std::int64_t c = 0; c < C; ++c)
          if (dist[b * C + c] != 0.0f) l -= static_cast<double>(dist[b * C + c]) * lrow[c];
        out[b] = static_cast<float>(l);
      }
    }
  });
}

void CpuBackend::softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target,
                                                const Tensor& dloss, Tensor& dlogits) {
  check_devices("softmax_cross_entropy_backward", device(), {&log_probs, &target, &dloss, &dlogits});
  check_softmax_cross_entropy_backward(log_probs, target, dloss, dlogits);
  const std::int64_t B = log_probs.dim(0), C = log_probs.dim(1);
  const bool sparse = target.dtype() == DType::i32;
  const float* lp = log_probs.data<float>();
  const float* dl = dloss.data<float>();
  float* dx = dlogits.data<float>();
  const std::int32_t* labels = sparse ? target.data<std::int32_t>() : nullptr;
  const float* dist = sparse ? nullptr : target.data<float>();
  parallel_for(B, std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(C, 1)),
               [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      float total = 1.0f;
      if (!sparse) {
        total = 0.0f;
        for (std::int64_t c = 0; c < C; ++c) total += dist[b * C + c];
      }
      for (std::int64_t c = 0; c < C; ++c) {
        const float t = sparse ? (c == labels[b] ? 1.0f : 0.0f) : dist[b * C + c];
        dx[b * C + c] = dl[b] * (std::exp(lp[b * C + c]) * total - t);
      }
    }
  });
}

void CpuBackend::dropout(const Tensor& x, float rate, const Generator& generator, Tensor& y, Tensor& mask) {
  check_devices("dropout", device(), {&x, &y, &mask});
  check_dropout(x, rate, y, mask);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  float* pm = mask.data<float>();
  parallel_for(x.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    dropout_loop(px, py, pm, begin, end, rate, generator);
  });
}

void CpuBackend::argmax(const Tensor& x, Tensor& out) {
  check_devices("argmax", device(), {&x, &out});
  check_argmax(x, out);
  const std::int64_t B = x.dim(0), C = x.dim(1);
  const float* p = x.data<float>();
  std::int32_t* o = out.data<std::int32_t>();
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < C; ++c)
      if (p[b * C + c] > p[b * C + best]) best = c;
    o[b] = static_cast<std::int32_t>(best);
  }
}

void CpuBackend::one_hot(const Tensor& labels, Tensor& out) {
  check_devices("one_hot", device(), {&labels, &out});
  check_one_hot(labels, out);
  const std::int64_t B = out.dim(0), C = out.dim(1);
  const std::int32_t* l = labels.data<std::int32_t>();
  float* o = out.data<float>();
  for (std::int64_t b = 0; b < B; ++b) {
    if (l[b] < 0 || l[b] >= C)
      DTRAIN_THROW(InvalidArgument, "one_hot: label ", l[b], " at row ", b, " is outside [0, ", C, ")");
    for (std::int64_t c = 0; c < C; ++c) o[b * C + c] = c == l[b] ? 1.0f : 0.0f;
  }
}

bool CpuBackend::sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const SgdUpdate& p) {
  check_devices("sgd_update", device(), {&w, &g, velocity});
  check_sgd_update(w, g, velocity);
  float* pw = w.data<float>();
  const float* pg = g.data<float>();
  float* pv = velocity ? velocity->data<float>() : nullptr;
  const float decay = p.learning_rate * p.weight_decay;
  std::atomic<bool> finite{true};
  parallel_for(w.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    if (!sgd_loop(pw, pg, pv, begin, end, p.learning_rate, p.momentum, p.nesterov, decay, p.gradient_scale))
      finite.store(false, std::memory_order_relaxed);
  });
  return finite.load(std::memory_order_relaxed);
}

bool CpuBackend::adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& p) {
  check_devices("adam_update", device(), {&w, &g, &m, &v});
  check_adam_update(w, g, m, v, p);
  const float step_size = adam_step_size(p);
  float* pw = w.data<float>();
  const float* pg = g.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const float decay = p.learning_rate * p.weight_decay;
  std::atomic<bool> finite{true};
  parallel_for(w.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    if (!adam_loop(pw, pg, pm, pv, begin, end, p.beta_1, p.beta_2, step_size, p.epsilon, decay, p.gradient_scale))
      finite.store(false, std::memory_order_relaxed);
  });
  return finite.load(std::memory_order_relaxed);
}

bool CpuBackend::rmsprop_update(Tensor& w, const Tensor& g, Tensor& v, Tensor* momentum, Tensor* average,
                                const RmspropUpdate& p) {
  check_devices("rmsprop_update", device(), {&w, &g, &v, momentum, average});
  check_rmsprop_update(w, g, v, momentum, average);
  float* pw = w.data<float>();
  const float* pg = g.data<float>();
  float* pv = v.data<float>();
  float* pm = momentum ? momentum->data<float>() : nullptr;
  float* pa = average ? average->data<float>() : nullptr;
  const float decay = p.learning_rate * p.weight_decay;
  auto loop = [&](std::int64_t begin, std::int64_t end) {
    if (pm) {
      return pa ? rmsprop_momentum_centered(pw, pg, pv, pm, pa, begin, end, p, decay)
                : rmsprop_momentum(pw, pg, pv, pm, pa, begin, end, p, decay);
    }
    return pa ? rmsprop_centered(pw, pg, pv, pm, pa, begin, end, p, decay)
              : rmsprop_plain(pw, pg, pv, pm, pa, begin, end, p, decay);
  };
  std::atomic<bool> finite{true};
  parallel_for(w.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
    if (!loop(begin, end)) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load(std::memory_order_relaxed);
}

}  // namespace dtrain::kernels
