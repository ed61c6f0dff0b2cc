// Scaled dot-product attention over [batch, position, head, depth] operands: one warp per
// (query, head), which meets the keys one at a time with
// an online softmax (a running maximum and sum), so no T × S matrix of scores is made; the
// lanes split the depth of the dot products and of the value rows. Backward recomputes each
// weight from the forward's log-sum-exp; a query's warp adds its share of dk and dv with
// atomics (their sums' order, and so their last bits, vary from run to run). Embedding
// lookups (gather_rows) and their gradients (scatter_add_rows, with atomics) live here too.
#include "dtrain/kernels/cuda/common.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kPerLane = kMaxAttentionDepth / kWarp;

struct Sizes {
  long long batch, heads, queries, keys, depth, value_depth;
  long long mask_batch, mask_query;  // the mask's strides (0 along an axis it is broadcast over)
};

__device__ __forceinline__ float row_dot(const float* a, const float* b, long long n, int lane) {
  float part = 0.0f;
  for (long long i = lane; i < n; i += kWarp) part += a[i] * b[i];
  return warp_sum(part);
}

__device__ __forceinline__ bool visible(const Sizes& z, const float* mask, int causal, long long b, long long t,
                                        long long s) {
  return (!causal || s <= t) && (!mask || mask[b * z.mask_batch + t * z.mask_query + s] != 0.0f);
}

__device__ __forceinline__ float kept(float rate, unsigned long long mixed, unsigned long long counter,
                                      unsigned long long index) {
  if (rate == 0.0f) return 1.0f;
  return math::uniform_at(mixed, counter, index) >= rate ? 1.0f / (1.0f - rate) : 0.0f;
}

__global__ void attention_kernel(const float* q, const float* k, const float* v, const float* mask, Sizes z,
                                 float scale, int causal, float rate, unsigned long long mixed,
                                 unsigned long long counter, float* out, float* lse) {
  const int lane = threadIdx.x % kWarp;
  const long long rows = z.batch * z.heads * z.queries;
  const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / kWarp;
  for (long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; row < rows;
       row += warps) {
    const long long h = row % z.heads, t = (row / z.heads) % z.queries, b = row / (z.heads * z.queries);
    const float* qt = q + row * z.depth;
    const long long key_stride = z.heads * z.depth, value_stride = z.heads * z.value_depth;
    const float* kb = k + (b * z.keys * z.heads + h) * z.depth;          // key s at kb + s * key_stride
    const float* vb = v + (b * z.keys * z.heads + h) * z.value_depth;    // value s at vb + s * value_stride
    const unsigned long long drop_row = static_cast<unsigned long long>(((b * z.heads + h) * z.queries + t) * z.keys);
    float acc[kPerLane] = {};
    float m = -INFINITY, l = 0.0f;
    const long long s_end = causal ? min(z.keys, t + 1) : z.keys;
    for (long long s = 0; s < s_end; ++s) {
      if (!visible(z, mask, causal, b, t, s)) continue;
      const float x = scale * row_dot(qt, kb + s * key_stride, z.depth, lane);
      const float m_new = fmaxf(m, x);
      const float rescale = m == -INFINITY ? 0.0f : expf(m - m_new);
      const float w = expf(x - m_new);
      l = l * rescale + w;
      const float f = w * kept(rate, mixed, counter, drop_row + static_cast<unsigned long long>(s));
      for (int c = 0; c < kPerLane; ++c) {
        const long long j = lane + static_cast<long long>(c) * kWarp;
        if (j < z.value_depth) acc[c] = acc[c] * rescale + f * vb[s * value_stride + j];
      }
      m = m_new;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int c = 0; c < kPerLane; ++c) {
      const long long j = lane + static_cast<long long>(c) * kWarp;
      if (j < z.value_depth) out[row * z.value_depth + j] = acc[c] * inv;
    }
    if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
}

__global__ void attention_backward_kernel(const float* q, const float* k, const float* v, const float* mask,
                                          const float* out, const float* lse, const float* dout, Sizes z, float scale,
                                          int causal, float rate, unsigned long long mixed, unsigned long long counter,
                                          float* dq, float* dk, float* dv) {
  const int lane = threadIdx.x % kWarp;
  const long long rows = z.batch * z.heads * z.queries;
  const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / kWarp;
  for (long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; row < rows;
       row += warps) {
    if (lse[row] == -INFINITY) continue;  // the query saw no key: no gradient
    const long long h = row % z.heads, t = (row / z.heads) % z.queries, b = row / (z.heads * z.queries);
    const float* qt = q + row * z.depth;
    const float* dot_t = dout + row * z.value_depth;
    const long long key_stride = z.heads * z.depth, value_stride = z.heads * z.value_depth;
    const long long first_key = b * z.keys * z.heads + h;
    const float* kb = k + first_key * z.depth;
    const float* vb = v + first_key * z.value_depth;
    float* dkb = dk + first_key * z.depth;
    float* dvb = dv + first_key * z.value_depth;
    const unsigned long long drop_row = static_cast<unsigned long long>(((b * z.heads + h) * z.queries + t) * z.keys);
    const float d_row = row_dot(dot_t, out + row * z.value_depth, z.value_depth, lane);
    float dq_acc[kPerLane] = {};
    const long long s_end = causal ? min(z.keys, t + 1) : z.keys;
    for (long long s = 0; s < s_end; ++s) {
      if (!visible(z, mask, causal, b, t, s)) continue;
      const float w = expf(scale * row_dot(qt, kb + s * key_stride, z.depth, lane) - lse[row]);
      const float f = kept(rate, mixed, counter, drop_row + static_cast<unsigned long long>(s));
      const float ds = w * (row_dot(dot_t, vb + s * value_stride, z.value_depth, lane) * f - d_row);
      for (long long j = lane; j < z.value_depth; j += kWarp) atomicAdd(dvb + s * value_stride + j, w * f * dot_t[j]);
      for (int c = 0; c < kPerLane; ++c) {
        const long long j = lane + static_cast<long long>(c) * kWarp;
        if (j < z.depth) {
          dq_acc[c] += scale * ds * kb[s * key_stride + j];
          atomicAdd(dkb + s * key_stride + j, scale * ds * qt[j]);
        }
      }
    }
    for (int c = 0; c < kPerLane; ++c) {
      const long long j = lane + static_cast<long long>(c) * kWarp;
      if (j < z.depth) dq[row * z.depth + j] = dq_acc[c];
    }
  }
}

__global__ void gather_rows_kernel(const float* table, const std::int32_t* ids, float* out, long long n, long long d) {
  DTRAIN_GRID_STRIDE(i, n * d) out[i] = table[static_cast<long long>(ids[i / d]) * d + i % d];
}

__global__ void scatter_add_rows_kernel(const std::int32_t* ids, const float* rows, float* table, long long n,
                                        long long d) {
  DTRAIN_GRID_STRIDE(i, n * d) atomicAdd(table + static_cast<long long>(ids[i / d]) * d + i % d, rows[i]);
}

unsigned warp_blocks(long long rows, const Launch& l) {
  return blocks_for(rows * kWarp, l);
}

}  // namespace

void attention(const Launch& l, const float* q, const float* k, const float* v, const float* mask,
               std::int64_t mask_batch, std::int64_t mask_query, std::int64_t batch,
               std::int64_t heads, std::int64_t queries, std::int64_t keys, std::int64_t depth,
               std::int64_t value_depth, float scale, bool causal, float rate, std::uint64_t mixed_seed,
               std::uint64_t counter, float* out, float* lse) {
  const long long rows = batch * queries * heads;
  if (rows == 0) return;
  attention_kernel<<<warp_blocks(rows, l), kThreads, 0, l.stream>>>(
      q, k, v, mask, Sizes{batch, heads, queries, keys, depth, value_depth, mask_batch, mask_query}, scale, causal ? 1 : 0, rate,
      mixed_seed, counter, out, lse);
  check_launch("attention", rows * keys, l);
}

void attention_backward(const Launch& l, const float* q, const float* k, const float* v, const float* mask,
                        std::int64_t mask_batch, std::int64_t mask_query, const float* out, const float* lse, const float* dout, std::int64_t batch, std::int64_t heads,
                        std::int64_t queries, std::int64_t keys, std::int64_t depth, std::int64_t value_depth,
                        float scale, bool causal, float rate, std::uint64_t mixed_seed, std::uint64_t counter,
                        float* dq, float* dk, float* dv) {
  fill(l, dq, batch * heads * queries * depth, 0.0f);
  fill(l, dk, batch * heads * keys * depth, 0.0f);
  fill(l, dv, batch * heads * keys * value_depth, 0.0f);
  const long long rows = batch * heads * queries;
  if (rows == 0) return;
  attention_backward_kernel<<<warp_blocks(rows, l), kThreads, 0, l.stream>>>(
      q, k, v, mask, out, lse, dout, Sizes{batch, heads, queries, keys, depth, value_depth, mask_batch, mask_query}, scale,
      causal ? 1 : 0, rate, mixed_seed, counter, dq, dk, dv);
  check_launch("attention_backward", rows * keys, l);
}

void gather_rows(const Launch& l, const float* table, const std::int32_t* ids, float* out, std::int64_t n,
                 std::int64_t d) {
  if (n * d == 0) return;
  gather_rows_kernel<<<blocks_for(n * d, l), kThreads, 0, l.stream>>>(table, ids, out, n, d);
  check_launch("gather_rows", n * d, l);
}

void scatter_add_rows(const Launch& l, const std::int32_t* ids, const float* rows, float* table, std::int64_t n,
                      std::int64_t d) {
  if (n * d == 0) return;
  scatter_add_rows_kernel<<<blocks_for(n * d, l), kThreads, 0, l.stream>>>(ids, rows, table, n, d);
  check_launch("scatter_add_rows", n * d, l);
}

}  // namespace dtrain::kernels::cuda
