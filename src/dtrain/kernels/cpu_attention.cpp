// Scaled dot-product attention and embedding lookups on plain loops. Attention runs
// flash-attention style: each block of queries meets the keys one block at a time with an
// online softmax (a running maximum and sum per query), so no T × S matrix of scores or
// weights is ever made; backward recomputes each block's weights from the forward's
// log-sum-exp. Operands are [batch, position, head,
// depth]: one head's rows are `heads * depth` apart. Forward runs (batch, head, query
// block) tasks in parallel; backward runs (batch, head) pairs, each owning its gradients.
#include <algorithm>
#include <cmath>
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

// Sizes and pointers of one call, and the rules every loop shares.
struct Problem {
  std::int64_t batch, heads, queries, keys, depth, value_depth;
  const float *q, *k, *v, *mask;
  const AttentionOptions* o;
  float keep_scale;

  Problem(const Tensor& tq, const Tensor& tk, const Tensor& tv, const AttentionOptions& options)
      : batch(tq.dim(0)), heads(tq.dim(2)), queries(tq.dim(1)), keys(tk.dim(1)), depth(tq.dim(3)),
        value_depth(tv.dim(3)), q(tq.data<float>()), k(tk.data<float>()), v(tv.data<float>()),
        mask(options.mask ? options.mask->data<float>() : nullptr), o(&options),
        keep_scale(1.0f / (1.0f - options.dropout_rate)) {}

  // Row (b, position, h) of a [batch, length, heads, width] tensor.
  std::int64_t row(std::int64_t b, std::int64_t length, std::int64_t position, std::int64_t h) const {
    return (b * length + position) * heads + h;
  }
  // The keys a block of queries ending before `query_end` may see: causal hides the rest.
  std::int64_t key_end(std::int64_t query_end) const { return o->causal ? std::min(keys, query_end) : keys; }
  bool visible(std::int64_t b, std::int64_t t, std::int64_t s) const {
    return (!o->causal || s <= t) && (!mask || mask[(b * queries + t) * keys + s] != 0.0f);
  }
  // Dropout's factor for weight (b, h, t, s): 0 or 1 / (1 - rate).
  float kept(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t s) const {
    if (o->dropout_rate == 0.0f) return 1.0f;
    const auto i = static_cast<std::uint64_t>(((b * heads + h) * queries + t) * keys + s);
    return o->dropout_generator.uniform_at(i) >= o->dropout_rate ? keep_scale : 0.0f;
  }
};

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
        acc(static_cast<std::size_t>(kQueryBlock * dv));
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t bh = task / blocks, b = bh / p.heads, h = bh % p.heads;
      const std::int64_t t0 = (task % blocks) * kQueryBlock, t1 = std::min(p.queries, t0 + kQueryBlock);
      std::fill(m.begin(), m.end(), kNoScore);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      const std::int64_t s_end = p.key_end(t1);
      for (std::int64_t s0 = 0; s0 < s_end; s0 += kKeyBlock) {
        const std::int64_t s1 = std::min(s_end, s0 + kKeyBlock);
        for (std::int64_t t = t0; t < t1; ++t) {
          const auto r = static_cast<std::size_t>(t - t0);
          const float* qt = p.q + p.row(b, p.queries, t, h) * d;
          float* sr = scores.data() + r * kKeyBlock;
          float block_max = kNoScore;
          for (std::int64_t s = s0; s < s1; ++s) {
            const float x = p.visible(b, t, s) ? o.scale * dot(qt, p.k + p.row(b, p.keys, s, h) * d, d) : kNoScore;
            sr[s - s0] = x;
            block_max = std::max(block_max, x);
          }
          if (block_max == kNoScore) continue;  // this block hides every key from t
          const float m_new = std::max(m[r], block_max);
          const float rescale = m[r] == kNoScore ? 0.0f : std::exp(m[r] - m_new);
          float* ar = acc.data() + r * static_cast<std::size_t>(dv);
          if (rescale != 1.0f) {
            l[r] *= rescale;
            for (std::int64_t j = 0; j < dv; ++j) ar[j] *= rescale;
          }
          for (std::int64_t s = s0; s < s1; ++s) {
            if (sr[s - s0] == kNoScore) continue;
            const float w = std::exp(sr[s - s0] - m_new);
            l[r] += w;  // the softmax's sum counts every visible weight, dropped or not
            const float used = w * p.kept(b, h, t, s);
            if (used != 0.0f) add_scaled(ar, used, p.v + p.row(b, p.keys, s, h) * dv, dv);
          }
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
    std::vector<float> row_dot(static_cast<std::size_t>(p.queries));
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
          for (std::int64_t t = t0; t < t1; ++t) {
            const std::int64_t qrow = p.row(b, p.queries, t, h);
            if (pl[qrow] == kNoScore) continue;  // t saw no key: no gradient
            const float* qt = p.q + qrow * d;
            const float* dot_t = pdo + qrow * vd;
            for (std::int64_t s = s0; s < s1; ++s) {
              if (!p.visible(b, t, s)) continue;
              const std::int64_t krow = p.row(b, p.keys, s, h);
              const float w = std::exp(o.scale * dot(qt, p.k + krow * d, d) - pl[qrow]);
              if (w == 0.0f) continue;
              const float factor = p.kept(b, h, t, s);
              if (factor != 0.0f) add_scaled(pdv + krow * vd, w * factor, dot_t, vd);
              const float ds = w * (dot(dot_t, p.v + krow * vd, vd) * factor - row_dot[static_cast<std::size_t>(t)]);
              if (ds == 0.0f) continue;
              add_scaled(pdq + qrow * d, o.scale * ds, p.k + krow * d, d);
              add_scaled(pdk + krow * d, o.scale * ds, qt, d);
            }
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
