// Scaled dot-product attention and embedding lookups on plain loops. Attention runs
// flash-attention style: each block of queries meets the keys one block at a time with an
// online softmax (a running maximum and sum per query), so no T × S matrix of scores or
// weights is ever made; backward recomputes each block's weights from the forward's
// log-sum-exp. Operands are [batch, position, head,
// depth]: one head's rows are `heads * depth` apart. Forward runs (batch, head, query
// block) tasks in parallel; backward runs (batch, head) pairs, each owning its gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtrain/core/multiversion.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::kernels {
namespace {

constexpr std::int64_t kQueryBlock = 32, kKeyBlock = 64;
constexpr float kNoScore = -std::numeric_limits<float>::infinity();

DTRAIN_MULTIVERSION
float dot(const float* a, const float* b, std::int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

DTRAIN_MULTIVERSION
void add_scaled(float* y, float alpha, const float* x, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Sixteen floats as one value (GCC's vector extension): four of them hold 64 running sums
// in registers on every x86-64 (one zmm each with AVX-512, two ymm with AVX2), which plain
// arrays did not (the compiler kept them in memory, each step waiting on the last store).
typedef float Floats16 __attribute__((vector_size(64)));

// Loads and stores through references: a 64-byte vector passed by value would take
// another calling convention with AVX-512 than without.
inline void load16(Floats16& v, const float* p) { std::memcpy(&v, p, sizeof v); }

inline void store16(float* p, const Floats16& v) { std::memcpy(p, &v, sizeof v); }

// 64 running sums in four Floats16: a row of a key block, kept in registers.
struct Sums64 {
  Floats16 a{}, b{}, c{}, d{};
  void load(const float* p) {
    load16(a, p);
    load16(b, p + 16);
    load16(c, p + 32);
    load16(d, p + 48);
  }
  void store(float* p) const {
    store16(p, a);
    store16(p + 16, b);
    store16(p + 32, c);
    store16(p + 48, d);
  }
  // += x · p[0, 64)
  void add(float x, const float* p) {
    Floats16 r;
    load16(r, p);
    a += x * r;
    load16(r, p + 16);
    b += x * r;
    load16(r, p + 32);
    c += x * r;
    load16(r, p + 48);
    d += x * r;
  }
};

static_assert(kKeyBlock == 64, "row_times_block holds a block's 64 sums in one Sums64");

// out[j] = Σ_d a[d] · bt[d][j] for the 64 columns of a block stored transposed (bt
// [depth, kKeyBlock], zeros past its keys).
DTRAIN_MULTIVERSION
void row_times_block(const float* a, const float* bt, std::int64_t depth, float* out) {
  Sums64 sums;
  for (std::int64_t d = 0; d < depth; ++d) sums.add(a[d], bt + d * kKeyBlock);
  sums.store(out);
}

// acc[0, width) += Σ_j w[j] · x[j * stride + c] over the n rows of a block: 64 columns at a
// time held in registers across the rows.
DTRAIN_MULTIVERSION
void add_weighted_rows(const float* w, std::int64_t n, const float* x, std::int64_t stride, std::int64_t width,
                       float* acc) {
  std::int64_t c0 = 0;
  for (; c0 + 64 <= width; c0 += 64) {
    Sums64 sums;
    sums.load(acc + c0);
    for (std::int64_t j = 0; j < n; ++j) sums.add(w[j], x + j * stride + c0);
    sums.store(acc + c0);
  }
  if (c0 < width)
    for (std::int64_t j = 0; j < n; ++j)
      if (w[j] != 0.0f) add_scaled(acc + c0, w[j], x + j * stride + c0, width - c0);
}

// e^x for x <= 0 (scores less their maximum), written so that loops over it vectorise:
// 2^n · e^r with n = round(x / ln 2), r = x − n · ln 2 (in two parts, exact), e^r by
// Cephes's degree-6 polynomial (relative error below 2e-7); 0 below −87 and for −inf.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  const bool zero = !(x >= -87.0f);
  const float c = zero ? -87.0f : x;
  const float n = std::floor(c * 1.44269504088896341f + 0.5f);
  const float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  float e = 1.9875691500e-4f;
  e = e * r + 1.3981999507e-3f;
  e = e * r + 8.3334519073e-3f;
  e = e * r + 4.1665795894e-2f;
  e = e * r + 1.6666665459e-1f;
  e = e * r + 5.0000001201e-1f;
  e = e * r * r + r + 1.0f;
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return zero ? 0.0f : e * scale;
}

// w[j] = e^(x[j] − shift) for j < n, their sum returned; −inf scores give 0.
DTRAIN_MULTIVERSION
float exp_row(const float* x, float shift, std::int64_t n, float* w) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < n; ++j) {
    w[j] = exp_nonpositive(x[j] - shift);
    sum += w[j];
  }
  return sum;
}

// Sizes and pointers of one call, and the rules every loop shares.
struct Problem {
  std::int64_t batch, heads, queries, keys, depth, value_depth;
  const float *q, *k, *v, *mask;
  const AttentionOptions* o;
  MaskStrides mask_strides;
  float keep_scale;

  Problem(const Tensor& tq, const Tensor& tk, const Tensor& tv, const AttentionOptions& options)
      : batch(tq.dim(0)), heads(tq.dim(2)), queries(tq.dim(1)), keys(tk.dim(1)), depth(tq.dim(3)),
        value_depth(tv.dim(3)), q(tq.data<float>()), k(tk.data<float>()), v(tv.data<float>()),
        mask(options.mask ? options.mask->data<float>() : nullptr), o(&options),
        mask_strides(attention_mask_strides(options.mask)),
        keep_scale(1.0f / (1.0f - options.dropout_rate)) {}

  // Row (b, position, h) of a [batch, length, heads, width] tensor.
  std::int64_t row(std::int64_t b, std::int64_t length, std::int64_t position, std::int64_t h) const {
    return (b * length + position) * heads + h;
  }
  // Keys (or values) [s0, s1) of (b, h), `width` wide, copied transposed into out
  // [width, kKeyBlock], zeros past s1.
  void transpose_block(const float* x, std::int64_t width, std::int64_t b, std::int64_t h, std::int64_t s0,
                       std::int64_t s1, float* out) const {
    for (std::int64_t s = s0; s < s1; ++s) {
      const float* r = x + row(b, keys, s, h) * width;
      for (std::int64_t d = 0; d < width; ++d) out[d * kKeyBlock + (s - s0)] = r[d];
    }
    if (s1 - s0 < kKeyBlock)
      for (std::int64_t d = 0; d < width; ++d) std::fill(out + d * kKeyBlock + (s1 - s0), out + (d + 1) * kKeyBlock, 0.0f);
  }
  // The keys a block of queries ending before `query_end` may see: causal hides the rest.
  std::int64_t key_end(std::int64_t query_end) const { return o->causal ? std::min(keys, query_end) : keys; }
  bool visible(std::int64_t b, std::int64_t t, std::int64_t s) const {
    return (!o->causal || s <= t) && (!mask || mask[b * mask_strides.batch + t * mask_strides.query + s] != 0.0f);
  }
  // Dropout's factor for weight (b, h, t, s): 0 or 1 / (1 - rate).
  float kept(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t s) const {
    if (o->dropout_rate == 0.0f) return 1.0f;
    const auto i = static_cast<std::uint64_t>(((b * heads + h) * queries + t) * keys + s);
    return o->dropout_generator.uniform_at(i) >= o->dropout_rate ? keep_scale : 0.0f;
  }
};

// A backward row's weights for keys [s0, s1): e^(scale · score − lse) where the key is
// visible to t, else 0; one vector loop where the whole block is visible.
DTRAIN_MULTIVERSION
void weights_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t s0, std::int64_t s1,
                 float scale, float lse, const float* scores, float* w) {
  (void)h;
  const std::int64_t n = s1 - s0;
  if (!p.mask && (!p.o->causal || s1 - 1 <= t)) {
#pragma omp simd
    for (std::int64_t j = 0; j < n; ++j) w[j] = exp_nonpositive(scale * scores[j] - lse);
    return;
  }
  for (std::int64_t s = s0; s < s1; ++s)
    w[s - s0] = p.visible(b, t, s) ? exp_nonpositive(scale * scores[s - s0] - lse) : 0.0f;
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, Tensor& out,
                           Tensor& lse) {
  check_devices("attention", device(), {&q, &k, &v, &out, &lse, o.mask});
  check_attention(q, k, v, o, out, lse);
  const Problem p(q, k, v, o);
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  const std::int64_t blocks = (p.queries + kQueryBlock - 1) / kQueryBlock;
  const std::int64_t d = p.depth, dv = p.value_depth;
  parallel_for(p.batch * p.heads * blocks, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> scores(kQueryBlock * kKeyBlock), m(kQueryBlock), l(kQueryBlock),
        acc(static_cast<std::size_t>(kQueryBlock * dv)), kt(static_cast<std::size_t>(d * kKeyBlock));
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t bh = task / blocks, b = bh / p.heads, h = bh % p.heads;
      const std::int64_t t0 = (task % blocks) * kQueryBlock, t1 = std::min(p.queries, t0 + kQueryBlock);
      std::fill(m.begin(), m.end(), kNoScore);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      const std::int64_t s_end = p.key_end(t1);
      for (std::int64_t s0 = 0; s0 < s_end; s0 += kKeyBlock) {
        const std::int64_t s1 = std::min(s_end, s0 + kKeyBlock);
        p.transpose_block(p.k, d, b, h, s0, s1, kt.data());
        for (std::int64_t t = t0; t < t1; ++t) {
          const auto r = static_cast<std::size_t>(t - t0);
          const float* qt = p.q + p.row(b, p.queries, t, h) * d;
          float* sr = scores.data() + r * kKeyBlock;
          row_times_block(qt, kt.data(), d, sr);
          const std::int64_t n = s1 - s0;
          float block_max = kNoScore;
          if (!p.mask && (!o.causal || s1 - 1 <= t)) {  // every key of the block is visible to t
#pragma omp simd reduction(max : block_max)
            for (std::int64_t j = 0; j < n; ++j) {
              sr[j] *= o.scale;
              block_max = std::max(block_max, sr[j]);
            }
          } else {
            for (std::int64_t s = s0; s < s1; ++s) {
              const float x = p.visible(b, t, s) ? o.scale * sr[s - s0] : kNoScore;
              sr[s - s0] = x;
              block_max = std::max(block_max, x);
            }
          }
          if (block_max == kNoScore) continue;  // this block hides every key from t
          const float m_new = std::max(m[r], block_max);
          const float rescale = m[r] == kNoScore ? 0.0f : std::exp(m[r] - m_new);
          float* ar = acc.data() + r * static_cast<std::size_t>(dv);
          if (rescale != 1.0f) {
            l[r] *= rescale;
            for (std::int64_t j = 0; j < dv; ++j) ar[j] *= rescale;
          }
          // The softmax's sum counts every visible weight, dropped or not.
          l[r] += exp_row(sr, m_new, n, sr);
          if (o.dropout_rate > 0.0f)
            for (std::int64_t s = s0; s < s1; ++s) sr[s - s0] *= p.kept(b, h, t, s);
          add_weighted_rows(sr, n, p.v + p.row(b, p.keys, s0, h) * dv, p.heads * dv, dv, ar);
          m[r] = m_new;
        }
      }
      for (std::int64_t t = t0; t < t1; ++t) {
        const auto r = static_cast<std::size_t>(t - t0);
        const std::int64_t row = p.row(b, p.queries, t, h);
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        const float* ar = acc.data() + r * static_cast<std::size_t>(dv);
        for (std::int64_t j = 0; j < dv; ++j) po[row * dv + j] = ar[j] * inv;
        pl[row] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNoScore;
      }
    }
  });
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, const Tensor& dout, const AttentionOptions& o, Tensor& dq,
                                    Tensor& dk, Tensor& dv) {
  check_devices("attention_backward", device(), {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, o.mask});
  check_attention_backward(q, k, v, out, lse, dout, o, dq, dk, dv);
  const Problem p(q, k, v, o);
  const float* po = out.data<float>();
  const float* pl = lse.data<float>();
  const float* pdo = dout.data<float>();
  float* pdq = dq.data<float>();
  float* pdk = dk.data<float>();
  float* pdv = dv.data<float>();
  const std::int64_t d = p.depth, vd = p.value_depth;
  // dS = P ⊙ (dP − rowsum(dO ⊙ O)), dP = dO · Vᵀ (times dropout's factor), with P
  // recomputed from lse; dV = P'ᵀ dO (P' the dropped weights), dQ = scale · dS K, dK = scale · dSᵀ Q.
  parallel_for(p.batch * p.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> row_dot(static_cast<std::size_t>(p.queries)), kt(static_cast<std::size_t>(d * kKeyBlock)),
        vt(static_cast<std::size_t>(vd * kKeyBlock)), scores(kKeyBlock), dp(kKeyBlock), ds(kKeyBlock), w(kKeyBlock),
        f(kKeyBlock), weights_t(kKeyBlock * kQueryBlock), ds_t(kKeyBlock * kQueryBlock);
    for (std::int64_t bh = begin; bh < end; ++bh) {
      const std::int64_t b = bh / p.heads, h = bh % p.heads;
      for (std::int64_t t = 0; t < p.queries; ++t) {
        const std::int64_t row = p.row(b, p.queries, t, h);
        row_dot[static_cast<std::size_t>(t)] = dot(pdo + row * vd, po + row * vd, vd);
        std::fill(pdq + row * d, pdq + (row + 1) * d, 0.0f);
      }
      for (std::int64_t s = 0; s < p.keys; ++s) {
        const std::int64_t row = p.row(b, p.keys, s, h);
        std::fill(pdk + row * d, pdk + (row + 1) * d, 0.0f);
        std::fill(pdv + row * vd, pdv + (row + 1) * vd, 0.0f);
      }
      for (std::int64_t t0 = 0; t0 < p.queries; t0 += kQueryBlock) {
        const std::int64_t t1 = std::min(p.queries, t0 + kQueryBlock), s_end = p.key_end(t1);
        for (std::int64_t s0 = 0; s0 < s_end; s0 += kKeyBlock) {
          const std::int64_t s1 = std::min(s_end, s0 + kKeyBlock);
          p.transpose_block(p.k, d, b, h, s0, s1, kt.data());
          p.transpose_block(p.v, vd, b, h, s0, s1, vt.data());
          // Each key's share of dv and dk sums over the block's queries: kept per key
          // (transposed: [key][query]) and added once the block's queries are done.
          std::fill(weights_t.begin(), weights_t.end(), 0.0f);
          std::fill(ds_t.begin(), ds_t.end(), 0.0f);
          const std::int64_t n = s1 - s0;
          for (std::int64_t t = t0; t < t1; ++t) {
            const std::int64_t qrow = p.row(b, p.queries, t, h);
            if (pl[qrow] == kNoScore) continue;  // t saw no key: no gradient
            const auto r = static_cast<std::size_t>(t - t0);
            const float* qt = p.q + qrow * d;
            const float* dot_t = pdo + qrow * vd;
            row_times_block(qt, kt.data(), d, scores.data());
            row_times_block(dot_t, vt.data(), vd, dp.data());
            // The weights (each recomputed from the forward's log-sum-exp; 0 where hidden),
            // each times dropout's factor, and the scores' gradients.
            weights_row(p, b, h, t, s0, s1, o.scale, pl[qrow], scores.data(), w.data());
            for (std::int64_t s = s0; s < s1; ++s) f[static_cast<std::size_t>(s - s0)] = p.kept(b, h, t, s);
            const float rd = row_dot[static_cast<std::size_t>(t)];
#pragma omp simd
            for (std::int64_t j = 0; j < n; ++j) ds[j] = o.scale * w[j] * (dp[j] * f[j] - rd);
            for (std::int64_t j = 0; j < n; ++j) {
              weights_t[static_cast<std::size_t>(j) * kQueryBlock + r] = w[j] * f[j];
              ds_t[static_cast<std::size_t>(j) * kQueryBlock + r] = ds[j];
            }
            add_weighted_rows(ds.data(), n, p.k + p.row(b, p.keys, s0, h) * d, p.heads * d, d, pdq + qrow * d);
          }
          const std::int64_t nq = t1 - t0;
          const std::int64_t first_query = p.row(b, p.queries, t0, h);
          for (std::int64_t s = s0; s < s1; ++s) {
            const std::int64_t krow = p.row(b, p.keys, s, h);
            const auto j = static_cast<std::size_t>(s - s0) * kQueryBlock;
            add_weighted_rows(weights_t.data() + j, nq, pdo + first_query * vd, p.heads * vd, vd, pdv + krow * vd);
            add_weighted_rows(ds_t.data() + j, nq, p.q + first_query * d, p.heads * d, d, pdk + krow * d);
          }
        }
      }
    }
  });
}

void CpuBackend::gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  check_devices("gather_rows", device(), {&table, &ids, &out});
  check_rows_by_id(table, ids, out, "gather_rows");
  const std::int64_t n = ids.dim(0), d = table.dim(1);
  const float* pt = table.data<float>();
  const std::int32_t* pi = ids.data<std::int32_t>();
  float* po = out.data<float>();
  parallel_for(n, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(d, 1)), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) std::copy(pt + pi[i] * d, pt + (pi[i] + 1) * d, po + i * d);
  });
}

void CpuBackend::scatter_add_rows(const Tensor& ids, const Tensor& rows, Tensor& table) {
  check_devices("scatter_add_rows", device(), {&ids, &rows, &table});
  check_rows_by_id(table, ids, rows, "scatter_add_rows");
  const std::int64_t n = ids.dim(0), d = table.dim(1);
  const std::int32_t* pi = ids.data<std::int32_t>();
  const float* pr = rows.data<float>();
  float* pt = table.data<float>();
  // Threads take columns, each adding every row in order: no two threads write one
  // element, and the sums' order (so their bits) does not depend on the thread count.
  parallel_for(d, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = 0; i < n; ++i) add_scaled(pt + pi[i] * d + begin, 1.0f, pr + i * d + begin, end - begin);
  });
}

}  // namespace dtrain::kernels
