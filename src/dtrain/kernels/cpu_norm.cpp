// Normalization and block copies on plain loops: batch normalization's per-channel sums and
// affine passes (kept apart so that a synchronized batch norm can sum its statistics over
// replicas between them), layer normalization, and the block copy behind concatenation
// and padding. Channels-last tensors are [rows, C] here, C the last axis.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtrain/core/multiversion.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cpu_backend.h"
#include "dtrain/kernels/element_math.h"

namespace dtrain::kernels {
namespace {

constexpr std::int64_t kRowGrain = 256;  // rows per chunk below which a loop stays serial

DTRAIN_MULTIVERSION
void channel_sums_rows(const float* a, const float* b, const float* center, std::int64_t c, std::int64_t begin,
                       std::int64_t end, double* s0, double* s1, float* q0, float* q1) {
  // Blocks of rows summed in float (q0, q1: c floats each), then folded into double:
  // vectorised, and as precise as the double sums for any batch a layer sees.
  constexpr std::int64_t kBlock = 64;
  for (std::int64_t r0 = begin; r0 < end; r0 += kBlock) {
    std::fill(q0, q0 + c, 0.0f);
    std::fill(q1, q1 + c, 0.0f);
    const std::int64_t r1 = std::min(end, r0 + kBlock);
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* ar = a + r * c;
      const float* br = b + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) {
        q0[j] += ar[j];
        q1[j] += ar[j] * (br[j] - center[j]);
      }
    }
    for (std::int64_t j = 0; j < c; ++j) {
      s0[j] += q0[j];
      s1[j] += q1[j];
    }
  }
}

DTRAIN_MULTIVERSION
void channel_affine_rows(const float* x, const float* scale, const float* shift, const float* x2, const float* scale2,
                         float* y, std::int64_t c, std::int64_t begin, std::int64_t end, bool relu) {
  const float floor = relu ? 0.0f : -std::numeric_limits<float>::infinity();
  for (std::int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    if (x2) {
      const float* zr = x2 + r * c;
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) yr[j] = std::max(xr[j] * scale[j] + shift[j] + zr[j] * scale2[j], floor);
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < c; ++j) yr[j] = std::max(xr[j] * scale[j] + shift[j], floor);
    }
  }
}

}  // namespace

void CpuBackend::channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, Tensor& sums) {
  check_devices("channel_sums", device(), {&a, &b, &center, &sums});
  check_channel_sums(a, b, center, sums);
  const std::int64_t c = channels_of(a), rows = rows_of(a);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const float* pc = center.data<float>();
  // Each thread sums its rows into its own partials; they are added in thread order.
  const int threads = kParallelLoops ? std::max(1, std::min<int>(omp_get_max_threads(),
                                                                 static_cast<int>(rows / kRowGrain)))
                                     : 1;
  // Per thread: 2c double sums and 2c float block sums, from the caching allocator.
  const std::size_t per_thread = static_cast<std::size_t>(2 * c) * (sizeof(double) + sizeof(float));
  const std::size_t bytes = per_thread * static_cast<std::size_t>(threads);
  char* scratch = static_cast<char*>(cpu_allocator().allocate(bytes));
  std::fill(scratch, scratch + bytes, 0);
  auto partial = [&](int t) { return reinterpret_cast<double*>(scratch + per_thread * static_cast<std::size_t>(t)); };
  auto body = [&](int t, int nt) {
    const std::int64_t begin = rows * t / nt, end = rows * (t + 1) / nt;
    double* s = partial(t);
    float* q = reinterpret_cast<float*>(s + 2 * c);
    if (begin < end) channel_sums_rows(pa, pb, pc, c, begin, end, s, s + c, q, q + c);
  };
  if (threads <= 1 || omp_in_parallel()) {
    body(0, 1);
  } else {
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num(), omp_get_num_threads());
  }
  float* out = sums.data<float>();
  for (std::int64_t j = 0; j < 2 * c; ++j) {
    double total = 0.0;
    for (int t = 0; t < threads; ++t) total += partial(t)[j];
    out[j] = static_cast<float>(total);
  }
  cpu_allocator().deallocate(scratch, bytes);
}

void CpuBackend::channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, Tensor& y, const Tensor* x2,
                                const Tensor* scale2, bool relu) {
  check_devices("channel_affine", device(), {&x, &scale, &shift, &y, x2, scale2});
  check_channel_affine(x, scale, shift, y, x2, scale2);
  const std::int64_t c = channels_of(x), rows = rows_of(x);
  const float* px = x.data<float>();
  const float* ps = scale.data<float>();
  const float* pt = shift.data<float>();
  const float* pz = x2 ? x2->data<float>() : nullptr;
  const float* pz_scale = scale2 ? scale2->data<float>() : nullptr;
  float* py = y.data<float>();
  parallel_for(rows, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(c, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 channel_affine_rows(px, ps, pt, pz, pz_scale, py, c, begin, end, relu);
               });
}

void CpuBackend::batch_norm_coefficients(const Tensor& mean, const Tensor& variance, double count,
                                         const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& coefficients) {
  check_devices("batch_norm_coefficients", device(), {&mean, &variance, &gamma, &beta, &coefficients});
  check_batch_norm_coefficients(mean, variance, gamma, beta, coefficients);
  const std::int64_t c = mean.dim(0);
  const float* s = mean.data<float>();
  const float* q = variance.data<float>();
  const float* g = gamma.defined() ? gamma.data<float>() : nullptr;
  const float* b = beta.defined() ? beta.data<float>() : nullptr;
  float* out = coefficients.data<float>();
  for (std::int64_t j = 0; j < c; ++j)
    math::store_batch_norm_channel(
        math::batch_norm_channel(s[j], q[j], count, g ? g[j] : 1.0f, b ? b[j] : 0.0f, epsilon), out, c, j);
}

void CpuBackend::batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                                  const Tensor& coefficients, Tensor& gradients) {
  check_devices("batch_norm_gradient_coefficients", device(), {&sums, &total, &coefficients, &gradients});
  check_batch_norm_gradient_coefficients(sums, total, count, coefficients, gradients);
  const std::int64_t c = coefficients.dim(1);
  const float* s = sums.data<float>();
  const float* t = total.data<float>();
  const float* f = coefficients.data<float>();
  float* out = gradients.data<float>();
  for (std::int64_t j = 0; j < c; ++j) math::batch_norm_gradient_at(s, t, count, f, out, c, j);
}

void CpuBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y,
                            Tensor& mean, Tensor& inv_std) {
  check_devices("layer_norm", device(), {&x, &gamma, &beta, &y, &mean, &inv_std});
  check_layer_norm(x, gamma, beta, y, mean, inv_std);
  const std::int64_t d = channels_of(x), rows = rows_of(x);
  const float* px = x.data<float>();
  const float* pg = gamma.defined() ? gamma.data<float>() : nullptr;
  const float* pb = beta.defined() ? beta.data<float>() : nullptr;
  float* py = y.data<float>();
  float* pm = mean.data<float>();
  float* ps = inv_std.data<float>();
  parallel_for(rows, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(d, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t r = begin; r < end; ++r) {
                   const float* xr = px + r * d;
                   double sum = 0.0;
                   for (std::int64_t j = 0; j < d; ++j) sum += xr[j];
                   const double mu = d ? sum / static_cast<double>(d) : 0.0;
                   double var = 0.0;  // two passes: no cancellation
                   for (std::int64_t j = 0; j < d; ++j) var += (xr[j] - mu) * (xr[j] - mu);
                   var = d ? var / static_cast<double>(d) : 0.0;
                   const float m = static_cast<float>(mu);
                   const float s = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(epsilon)));
                   pm[r] = m;
                   ps[r] = s;
                   float* yr = py + r * d;
                   for (std::int64_t j = 0; j < d; ++j) {
                     const float h = (xr[j] - m) * s;
                     yr[j] = h * (pg ? pg[j] : 1.0f) + (pb ? pb[j] : 0.0f);
                   }
                 }
               });
}

void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& inv_std, Tensor& dx, Tensor* dgamma, Tensor* dbeta) {
  check_devices("layer_norm_backward", device(), {&x, &dy, &gamma, &mean, &inv_std, &dx, dgamma, dbeta});
  check_layer_norm_backward(x, dy, gamma, mean, inv_std, dx, dgamma, dbeta);
  const std::int64_t d = channels_of(x), rows = rows_of(x);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  const float* pg = gamma.defined() ? gamma.data<float>() : nullptr;
  const float* pm = mean.data<float>();
  const float* ps = inv_std.data<float>();
  float* pdx = dx.data<float>();
  // dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma, row by row.
  parallel_for(rows, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(d, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t r = begin; r < end; ++r) {
                   const float* xr = px + r * d;
                   const float* gr = pdy + r * d;
                   const float m = pm[r], s = ps[r];
                   double sg = 0.0, sgh = 0.0;
                   for (std::int64_t j = 0; j < d; ++j) {
                     const float g = gr[j] * (pg ? pg[j] : 1.0f);
                     sg += g;
                     sgh += g * (xr[j] - m) * s;
                   }
                   const float mg = d ? static_cast<float>(sg / static_cast<double>(d)) : 0.0f;
                   const float mgh = d ? static_cast<float>(sgh / static_cast<double>(d)) : 0.0f;
                   float* dr = pdx + r * d;
                   for (std::int64_t j = 0; j < d; ++j) {
                     const float g = gr[j] * (pg ? pg[j] : 1.0f);
                     dr[j] = s * (g - mg - (xr[j] - m) * s * mgh);
                   }
                 }
               });
  if (dgamma || dbeta) {
    // Column sums over the rows, in double, on the calling thread's order (deterministic).
    std::vector<double> g0(static_cast<std::size_t>(d), 0.0), g1(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * d;
      const float* gr = pdy + r * d;
      const float m = pm[r], s = ps[r];
      for (std::int64_t j = 0; j < d; ++j) {
        g0[static_cast<std::size_t>(j)] += gr[j] * (xr[j] - m) * s;
        g1[static_cast<std::size_t>(j)] += gr[j];
      }
    }
    if (dgamma)
      for (std::int64_t j = 0; j < d; ++j) dgamma->data<float>()[j] = static_cast<float>(g0[static_cast<std::size_t>(j)]);
    if (dbeta)
      for (std::int64_t j = 0; j < d; ++j) dbeta->data<float>()[j] = static_cast<float>(g1[static_cast<std::size_t>(j)]);
  }
}

void CpuBackend::copy_block(const Tensor& src, const Block& from, Tensor& dst, const Block& to, std::int64_t outer,
                            std::int64_t rows, std::int64_t width) {
  check_devices("copy_block", device(), {&src, &dst});
  if (!check_copy_block(src, from, dst, to, outer, rows, width)) return;
  const std::size_t elem = dtype_size(src.dtype());
  const char* ps = static_cast<const char*>(src.raw_data());
  char* pd = static_cast<char*>(dst.raw_data());
  parallel_for(outer * rows, std::max<std::int64_t>(1, 16384 / width), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k) {
      const std::int64_t i = k / rows, j = k % rows;
      std::memcpy(pd + (to.offset + i * to.outer_stride + j * to.row_stride) * static_cast<std::int64_t>(elem),
                  ps + (from.offset + i * from.outer_stride + j * from.row_stride) * static_cast<std::int64_t>(elem),
                  static_cast<std::size_t>(width) * elem);
    }
  });
}

}  // namespace dtrain::kernels
