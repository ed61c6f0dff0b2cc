// Scaled dot-product attention and embedding lookups on plain loops. Attention runs
// flash-attention style: each block of queries meets the keys one block at a time with an
// online softmax (a running maximum and sum per query), so no T × S matrix of scores or
// weights is ever made; backward recomputes each block's weights from the forward's
// log-sum-exp. Operands are [batch, position, head, depth]: one head's rows are
// `heads * depth` apart, so each call first packs them in order. The block products run
// on register tiles of four rows by 64 columns (by 16 on CPUs with AVX2 but not AVX-512,
// whose registers are half as wide and half as many). Forward runs (batch, head, query block)
// tasks in parallel; backward runs (batch, head) pairs, each owning its gradients.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "dtrain/core/multiversion.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::kernels {
namespace {

constexpr std::int64_t kQueryBlock = 32, kKeyBlock = 64;
// Forward's blocks of queries: more rows share each block of keys while it is in cache.
constexpr std::int64_t kForwardQueryBlock = 64;
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

static_assert(kKeyBlock == 64, "a block's 64 scores are one row of the four-row tiles");

// A register tile of four rows of 64 sums: sixteen vectors, named one by one (GCC keeps
// an array of them in memory, each step waiting on a store).
struct Tile4x64 {
  Floats16 a0{}, a1{}, a2{}, a3{}, b0{}, b1{}, b2{}, b3{}, c0{}, c1{}, c2{}, c3{}, d0{}, d1{}, d2{}, d3{};

  // Row i += x_i · (v0 v1 v2 v3), for the four rows at once: sixteen independent
  // multiply-adds sharing the four loads.
  [[gnu::always_inline]] void add(float x0, float x1, float x2, float x3, const Floats16& v0, const Floats16& v1,
                                  const Floats16& v2, const Floats16& v3) {
    a0 += x0 * v0, a1 += x0 * v1, a2 += x0 * v2, a3 += x0 * v3;
    b0 += x1 * v0, b1 += x1 * v1, b2 += x1 * v2, b3 += x1 * v3;
    c0 += x2 * v0, c1 += x2 * v1, c2 += x2 * v2, c3 += x2 * v3;
    d0 += x3 * v0, d1 += x3 * v1, d2 += x3 * v2, d3 += x3 * v3;
  }
  [[gnu::always_inline]] static void load4(const float* p, Floats16& v0, Floats16& v1, Floats16& v2, Floats16& v3) {
    load16(v0, p), load16(v1, p + 16), load16(v2, p + 32), load16(v3, p + 48);
  }
  [[gnu::always_inline]] static void store4(float* p, const Floats16& v0, const Floats16& v1, const Floats16& v2,
                                            const Floats16& v3) {
    store16(p, v0), store16(p + 16, v1), store16(p + 32, v2), store16(p + 48, v3);
  }
  [[gnu::always_inline]] void load(float* const rows[4], std::int64_t offset) {
    load4(rows[0] + offset, a0, a1, a2, a3);
    load4(rows[1] + offset, b0, b1, b2, b3);
    load4(rows[2] + offset, c0, c1, c2, c3);
    load4(rows[3] + offset, d0, d1, d2, d3);
  }
  [[gnu::always_inline]] void store(float* const rows[4], std::int64_t offset) const {
    store4(rows[0] + offset, a0, a1, a2, a3);
    store4(rows[1] + offset, b0, b1, b2, b3);
    store4(rows[2] + offset, c0, c1, c2, c3);
    store4(rows[3] + offset, d0, d1, d2, d3);
  }
};

// Four rows at once: out_i[j] = Σ_d a_i[d] · bt[d * kKeyBlock + j] for the 64 columns of
// a block stored transposed.
DTRAIN_MULTIVERSION
void rows4_times_block_wide(const float* const a[4], const float* bt, std::int64_t depth, float* const out[4]) {
  Tile4x64 t;
  for (std::int64_t d = 0; d < depth; ++d) {
    Floats16 v0, v1, v2, v3;
    Tile4x64::load4(bt + d * kKeyBlock, v0, v1, v2, v3);
    t.add(a[0][d], a[1][d], a[2][d], a[3][d], v0, v1, v2, v3);
  }
  t.store(out, 0);
}

// Four rows at once: acc_i[c0, c0 + 64) += Σ_j w_i[j * w_stride] · x[j * stride + c] over
// the n rows of a block, for the 64-column chunks of [0, width) (the rest is the caller's:
// add_columns).
DTRAIN_MULTIVERSION
void rows4_add_weighted_wide(const float* const w[4], std::int64_t w_stride, std::int64_t n, const float* x,
                             std::int64_t stride, std::int64_t width, float* const acc[4]) {
  for (std::int64_t c0 = 0; c0 + 64 <= width; c0 += 64) {
    Tile4x64 t;
    t.load(acc, c0);
    for (std::int64_t j = 0; j < n; ++j) {
      Floats16 v0, v1, v2, v3;
      Tile4x64::load4(x + j * stride + c0, v0, v1, v2, v3);
      const std::int64_t wj = j * w_stride;
      t.add(w[0][wj], w[1][wj], w[2][wj], w[3][wj], v0, v1, v2, v3);
    }
    t.store(acc, c0);
  }
}

// AVX2 has sixteen 256-bit registers, where a tile of four rows by 64 sums needs 32 (and
// GCC, splitting each 64-byte vector in two, also broadcast every weight through memory:
// these products ran 15 times slower than oneDNN's on an AVX2 machine). Its tiles are four
// rows by sixteen sums, eight registers, taken over the 64 columns in turn.
typedef float Floats8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline void load8(Floats8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
[[gnu::always_inline]] inline void store8(float* p, const Floats8& v) { std::memcpy(p, &v, sizeof v); }

struct Tile4x16 {
  Floats8 a0{}, a1{}, b0{}, b1{}, c0{}, c1{}, d0{}, d1{};

  [[gnu::always_inline]] void add(float x0, float x1, float x2, float x3, const float* v) {
    Floats8 v0, v1;
    load8(v0, v), load8(v1, v + 8);
    a0 += x0 * v0, a1 += x0 * v1, b0 += x1 * v0, b1 += x1 * v1;
    c0 += x2 * v0, c1 += x2 * v1, d0 += x3 * v0, d1 += x3 * v1;
  }
  [[gnu::always_inline]] void load(float* const rows[4], std::int64_t offset) {
    load8(a0, rows[0] + offset), load8(a1, rows[0] + offset + 8), load8(b0, rows[1] + offset),
        load8(b1, rows[1] + offset + 8), load8(c0, rows[2] + offset), load8(c1, rows[2] + offset + 8),
        load8(d0, rows[3] + offset), load8(d1, rows[3] + offset + 8);
  }
  [[gnu::always_inline]] void store(float* const rows[4], std::int64_t offset) const {
    store8(rows[0] + offset, a0), store8(rows[0] + offset + 8, a1), store8(rows[1] + offset, b0),
        store8(rows[1] + offset + 8, b1), store8(rows[2] + offset, c0), store8(rows[2] + offset + 8, c1),
        store8(rows[3] + offset, d0), store8(rows[3] + offset + 8, d1);
  }
};

[[gnu::target("avx2,fma")]]
void rows4_times_block_avx2(const float* const a[4], const float* bt, std::int64_t depth, float* const out[4]) {
  for (std::int64_t c = 0; c < kKeyBlock; c += 16) {
    Tile4x16 t;
    for (std::int64_t d = 0; d < depth; ++d) t.add(a[0][d], a[1][d], a[2][d], a[3][d], bt + d * kKeyBlock + c);
    t.store(out, c);
  }
}

[[gnu::target("avx2,fma")]]
void rows4_add_weighted_avx2(const float* const w[4], std::int64_t w_stride, std::int64_t n, const float* x,
                             std::int64_t stride, std::int64_t width, float* const acc[4]) {
  for (std::int64_t c64 = 0; c64 + 64 <= width; c64 += 64)  // the 64-column chunks, as the wide tiles take them
    for (std::int64_t c0 = c64; c0 < c64 + 64; c0 += 16) {
      Tile4x16 t;
      t.load(acc, c0);
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t wj = j * w_stride;
        t.add(w[0][wj], w[1][wj], w[2][wj], w[3][wj], x + j * stride + c0);
      }
      t.store(acc, c0);
    }
}

bool narrow_tiles_run_here() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The narrow tiles where the CPU has AVX2 and FMA but not AVX-512, unless
// set_attention_tiles said otherwise.
bool narrow_by_default() { return narrow_tiles_run_here() && !__builtin_cpu_supports("avx512f"); }
std::atomic<bool> g_narrow_tiles{narrow_by_default()};

bool narrow_tiles() { return g_narrow_tiles.load(std::memory_order_relaxed); }

void rows4_times_block(const float* const a[4], const float* bt, std::int64_t depth, float* const out[4]) {
  if (narrow_tiles()) rows4_times_block_avx2(a, bt, depth, out);
  else rows4_times_block_wide(a, bt, depth, out);
}

void rows4_add_weighted(const float* const w[4], std::int64_t w_stride, std::int64_t n, const float* x,
                        std::int64_t stride, std::int64_t width, float* const acc[4]) {
  if (narrow_tiles()) rows4_add_weighted_avx2(w, w_stride, n, x, stride, width, acc);
  else rows4_add_weighted_wide(w, w_stride, n, x, stride, width, acc);
}

}  // namespace

bool set_attention_tiles(AttentionTiles tiles) {
  if (tiles == AttentionTiles::narrow && !narrow_tiles_run_here()) return false;
  g_narrow_tiles.store(tiles == AttentionTiles::narrow || (tiles == AttentionTiles::automatic && narrow_by_default()),
                       std::memory_order_relaxed);
  return true;
}

namespace {

// acc[c] += Σ_j w[j * w_stride] · x[j * stride + c] for c in [c0, c1): the columns past the
// 64-column chunks, one row at a time.
DTRAIN_MULTIVERSION
void add_columns(const float* w, std::int64_t w_stride, std::int64_t n, const float* x, std::int64_t stride,
                 std::int64_t c0, std::int64_t c1, float* acc) {
  for (std::int64_t j = 0; j < n; ++j) {
    const float f = w[j * w_stride];
    if (f == 0.0f) continue;
    const float* r = x + j * stride;
#pragma omp simd
    for (std::int64_t c = c0; c < c1; ++c) acc[c] += f * r[c];
  }
}

typedef std::int32_t Ints16 __attribute__((vector_size(64)));
typedef std::int32_t Ints8 __attribute__((vector_size(32)));

// e^x for x <= 0 (scores less their maximum), in place, on one float or on sixteen
// (Floats16), written with no branch and no memory temporary so that loops over it
// vectorise: 2^n · e^r with n = x / ln 2 rounded to the nearest integer (adding and taking
// away 1.5 · 2^23), r = x − n · ln 2 (in two parts, exact), e^r by Cephes's degree-6
// polynomial (relative error below 2e-7); 0 below −87 and for −inf. (In place: a 64-byte
// vector passed or returned by value would take another calling convention with AVX-512
// than without.)
template <typename F>
[[gnu::always_inline]] inline void exp_nonpositive_in_place(F& x) {
  const F low = F{} - 87.0f;
  const F c = x > low ? x : low;
  const F n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const F r = c - n * 0.693359375f + n * 2.12194440e-4f;
  F e = r * 1.9875691500e-4f + 1.3981999507e-3f;
  e = e * r + 8.3334519073e-3f;
  e = e * r + 4.1665795894e-2f;
  e = e * r + 1.6666665459e-1f;
  e = e * r + 5.0000001201e-1f;
  e = e * r * r + r + 1.0f;
  F scale;
  if constexpr (std::is_same_v<F, float>) {
    scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  } else {
    using Ints = std::conditional_t<sizeof(F) == sizeof(Floats16), Ints16, Ints8>;
    const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
    std::memcpy(&scale, &bits, sizeof scale);
  }
  x = x >= low ? e * scale : F{};
}

[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  exp_nonpositive_in_place(x);
  return x;
}

// The largest of sixteen, on vectors (GCC's own vectorisation left the reductions' ends as
// chains of scalar operations).
[[gnu::always_inline]] inline float largest16(const Floats16& x) {
  Floats16 v = x, w = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v = v > w ? v : w;
  w = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15);
  v = v > w ? v : w;
  w = __builtin_shufflevector(v, v, 2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  v = v > w ? v : w;
  w = __builtin_shufflevector(v, v, 1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  v = v > w ? v : w;
  return v[0];
}

[[gnu::always_inline]] inline float largest8(const Floats8& x) {
  Floats8 v = x, w = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v = v > w ? v : w;
  w = __builtin_shufflevector(v, v, 2, 3, 0, 1, 4, 5, 6, 7);
  v = v > w ? v : w;
  w = __builtin_shufflevector(v, v, 1, 0, 2, 3, 4, 5, 6, 7);
  v = v > w ? v : w;
  return v[0];
}

// Load and store for either vector.
[[gnu::always_inline]] inline void load_vector(Floats16& v, const float* p) { load16(v, p); }
[[gnu::always_inline]] inline void load_vector(Floats8& v, const float* p) { load8(v, p); }
[[gnu::always_inline]] inline void store_vector(float* p, const Floats16& v) { store16(p, v); }
[[gnu::always_inline]] inline void store_vector(float* p, const Floats8& v) { store8(p, v); }

// The row helpers below are inlined into multiversioned loops over many rows (a call per
// row of 64 scores cost as much as its work).

// w[j] = e^(x[j] − shift) for j < n, their sum returned; −inf scores give 0.
[[gnu::always_inline]] inline float exp_row(const float* x, float shift, std::int64_t n, float* w) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < n; ++j) {
    w[j] = exp_nonpositive(x[j] - shift);
    sum += w[j];
  }
  return sum;
}

// y[j] = x[j] * factor for j < n (y may be x).
[[gnu::always_inline]] inline void scaled_copy(const float* x, float factor, std::int64_t n, float* y) {
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) y[j] = x[j] * factor;
}

// The n rows of x (`stride` apart, `width` wide) written transposed into out [width,
// kKeyBlock], zeros past n: each output row in order (the rows' values read across them).
DTRAIN_MULTIVERSION
void transpose_rows(const float* x, std::int64_t stride, std::int64_t n, std::int64_t width, float* out) {
  for (std::int64_t d = 0; d < width; ++d) {
    float* o = out + d * kKeyBlock;
#pragma omp simd
    for (std::int64_t s = 0; s < n; ++s) o[s] = x[s * stride + d];
    for (std::int64_t s = n; s < kKeyBlock; ++s) o[s] = 0.0f;
  }
}

// Each thread's scratch floats for `tasks` parallel tasks, from one tensor made before the
// threads start: from the allocator's cache (a step allocates nothing), and running out of
// memory is an error here, not inside the parallel region. A thread claims its share once
// and carves it into pieces in order.
class ThreadScratch {
 public:
  ThreadScratch(std::int64_t tasks, std::int64_t per_thread)
      : per_thread_(per_thread),
        all_(Tensor::empty(Shape{std::min<std::int64_t>(tasks, num_threads()) * per_thread})) {}
  class Share {
   public:
    explicit Share(float* next) : next_(next) {}
    float* carve(std::int64_t n) { return std::exchange(next_, next_ + n); }

   private:
    float* next_;
  };
  Share claim() { return Share(all_.data<float>() + claimed_.fetch_add(1) * per_thread_); }

 private:
  std::int64_t per_thread_;
  Tensor all_;
  std::atomic<std::int64_t> claimed_{0};
};

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
    transpose_rows(x + row(b, keys, s0, h) * width, heads * width, s1 - s0, width, out);
  }
  // The keys and values packed once a call, so that a block's loops read memory in order
  // (rows of a [batch, length, heads, width] tensor lie heads * width apart, a stride that
  // maps a block's rows onto few cache sets): each (batch, head)'s keys block by block,
  // each block transposed ([depth, kKeyBlock], zeros past the last key), then its values
  // [keys, value_depth] one after the other.
  std::int64_t key_blocks() const { return (keys + kKeyBlock - 1) / kKeyBlock; }
  struct Packed {
    Tensor keys_t, values;  // from the allocator's cache: no fresh pages each call
  };
  Packed packed() const {
    const std::int64_t blocks = key_blocks();
    Packed out{Tensor::empty(Shape{batch * heads * blocks * depth * kKeyBlock}),
               Tensor::empty(Shape{batch * heads * keys * value_depth})};
    parallel_for(batch * heads, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t bh = begin; bh < end; ++bh) {
        const std::int64_t b = bh / heads, h = bh % heads;
        for (std::int64_t block = 0; block < blocks; ++block) {
          const std::int64_t s0 = block * kKeyBlock, s1 = std::min(keys, s0 + kKeyBlock);
          transpose_block(k, depth, b, h, s0, s1, out.keys_t.data<float>() + (bh * blocks + block) * depth * kKeyBlock);
        }
        float* vb = out.values.data<float>() + bh * keys * value_depth;
        for (std::int64_t s = 0; s < keys; ++s)
          std::memcpy(vb + s * value_depth, v + row(b, keys, s, h) * value_depth,
                      static_cast<std::size_t>(value_depth) * sizeof(float));
      }
    });
    return out;
  }
  // The keys a block of queries ending before `query_end` may see: causal hides the rest.
  std::int64_t key_end(std::int64_t query_end) const { return o->causal ? std::min(keys, query_end) : keys; }
  // Whether t sees every key of [s0, s1): the usual case, which runs on whole vectors (a
  // padding mask hides only the blocks that hold padding).
  bool sees_all(std::int64_t b, std::int64_t t, std::int64_t s0, std::int64_t s1) const {
    if (o->causal && s1 - 1 > t) return false;
    if (!mask) return true;
    const float* row = mask + b * mask_strides.batch + t * mask_strides.query;
    for (std::int64_t s = s0; s < s1; ++s)
      if (row[s] == 0.0f) return false;
    return true;
  }
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

// Backward's block of queries [t0, t1) and keys [s0, s1): each weight recomputed from its
// score (rows of kKeyBlock in `w`) and the forward's log-sum-exp (e^(scale · score − lse)
// where the key is visible, else 0), times dropout's factor, replaces the score in `w`;
// ds = scale · weight · (dp · factor − row_dot). A query that saw no key (lse −inf) gets
// zeros; so do the columns past the block's keys.
// V: the vectors a row of scores is taken in (Floats16 for the wide clones; Floats8 for
// AVX2, whose 16-wide vectors GCC assembles through memory, scalars broadcast one lane at
// a time).
template <typename V>
[[gnu::always_inline]] inline void gradient_block_body(const Problem& p, std::int64_t b, std::int64_t h,
                                                       std::int64_t t0, std::int64_t t1, std::int64_t s0,
                                                       std::int64_t s1, const float* lse, const float* row_dot,
                                                       float* w, const float* dp, float* ds) {
  const AttentionOptions& o = *p.o;
  const std::int64_t n = s1 - s0;
  for (std::int64_t t = t0; t < t1; ++t) {
    const std::int64_t r = t - t0;
    float* wr = w + r * kKeyBlock;
    float* dsr = ds + r * kKeyBlock;
    const float* dpr = dp + r * kKeyBlock;
    const float l = lse[p.row(b, p.queries, t, h)], rd = row_dot[t];
    if (l == kNoScore) {  // t saw no key: no gradient
      std::fill(wr, wr + kKeyBlock, 0.0f);
      std::fill(dsr, dsr + kKeyBlock, 0.0f);
      continue;
    }
    if (n == kKeyBlock && o.dropout_rate == 0.0f && p.sees_all(b, t, s0, s1)) {
      constexpr int kLanes = sizeof(V) / sizeof(float);
#pragma GCC unroll 8
      for (int c = 0; c < kKeyBlock / kLanes; ++c) {
        V x, g;
        load_vector(x, wr + kLanes * c);
        x = x * o.scale - l;
        exp_nonpositive_in_place(x);
        store_vector(wr + kLanes * c, x);
        load_vector(g, dpr + kLanes * c);
        store_vector(dsr + kLanes * c, o.scale * x * (g - rd));
      }
      continue;
    }
    for (std::int64_t s = s0; s < s1; ++s) {
      const std::int64_t j = s - s0;
      const float weight = p.visible(b, t, s) ? exp_nonpositive(o.scale * wr[j] - l) : 0.0f;
      const float f = p.kept(b, h, t, s);
      wr[j] = weight * f;
      dsr[j] = o.scale * weight * (dpr[j] * f - rd);
    }
    std::fill(wr + n, wr + kKeyBlock, 0.0f);
    std::fill(dsr + n, dsr + kKeyBlock, 0.0f);
  }
}

// Each query of [t0, t1)'s softmax so far, after the block of keys [s0, s1): its scores
// (rows of kKeyBlock in `scores`) become its weights (times dropout's factor), and where
// the block raises its maximum m, its sums l (sixteen partial sums a row, added up at the
// end) and its weighted values acc (rows of value_depth) shrink by e^(old − new). A row
// the block hides every key from gets zero weights.
template <typename V>
[[gnu::always_inline]] inline void softmax_block_body(const Problem& p, std::int64_t b, std::int64_t h,
                                                      std::int64_t t0, std::int64_t t1, std::int64_t s0,
                                                      std::int64_t s1, float* scores, float* m, float* l,
                                                      float* acc) {
  const AttentionOptions& o = *p.o;
  const std::int64_t n = s1 - s0, dv = p.value_depth;
  for (std::int64_t t = t0; t < t1; ++t) {
    const std::int64_t r = t - t0;
    float* sr = scores + r * kKeyBlock;
    float* lr = l + r * 16;
    // A whole block every key of which t sees (the usual case): on vectors throughout.
    if (n == kKeyBlock && p.sees_all(b, t, s0, s1)) {
      if constexpr (std::is_same_v<V, Floats8>) {
        // Eight vectors of eight; the sixteen partial sums as two of them.
        constexpr int kVectors = kKeyBlock / 8;
        Floats8 x[kVectors];
#pragma GCC unroll 8
        for (int c = 0; c < kVectors; ++c) {
          load8(x[c], sr + 8 * c);
          x[c] *= o.scale;
        }
        Floats8 top = x[0];
#pragma GCC unroll 8
        for (int c = 1; c < kVectors; ++c) top = top > x[c] ? top : x[c];
        const float m_new = std::max(m[r], largest8(top));
        Floats8 sums[2];
        load8(sums[0], lr), load8(sums[1], lr + 8);
        if (m_new > m[r]) {  // a new maximum: the sums so far shrink by e^(old − new)
          const float rescale = m[r] == kNoScore ? 0.0f : std::exp(m[r] - m_new);
          sums[0] *= rescale, sums[1] *= rescale;
          scaled_copy(acc + r * dv, rescale, dv, acc + r * dv);
        }
#pragma GCC unroll 8
        for (int c = 0; c < kVectors; ++c) {
          x[c] -= m_new;
          exp_nonpositive_in_place(x[c]);
          sums[c % 2] += x[c];
          store8(sr + 8 * c, x[c]);
        }
        store8(lr, sums[0]), store8(lr + 8, sums[1]);
        m[r] = m_new;
      } else {
        Floats16 x0, x1, x2, x3;
        Tile4x64::load4(sr, x0, x1, x2, x3);
        x0 *= o.scale, x1 *= o.scale, x2 *= o.scale, x3 *= o.scale;
        const Floats16 top01 = x0 > x1 ? x0 : x1, top23 = x2 > x3 ? x2 : x3;
        const float m_new = std::max(m[r], largest16(top01 > top23 ? top01 : top23));
        Floats16 sums;
        load16(sums, lr);
        if (m_new > m[r]) {  // a new maximum: the sums so far shrink by e^(old − new)
          const float rescale = m[r] == kNoScore ? 0.0f : std::exp(m[r] - m_new);
          sums *= rescale;
          scaled_copy(acc + r * dv, rescale, dv, acc + r * dv);
        }
        x0 -= m_new, x1 -= m_new, x2 -= m_new, x3 -= m_new;
        exp_nonpositive_in_place(x0), exp_nonpositive_in_place(x1), exp_nonpositive_in_place(x2),
            exp_nonpositive_in_place(x3);
        sums += (x0 + x1) + (x2 + x3);
        store16(lr, sums);
        Tile4x64::store4(sr, x0, x1, x2, x3);
        m[r] = m_new;
      }
    } else {
      float block_max = kNoScore;
      for (std::int64_t s = s0; s < s1; ++s) {
        const float x = p.visible(b, t, s) ? o.scale * sr[s - s0] : kNoScore;
        sr[s - s0] = x;
        block_max = std::max(block_max, x);
      }
      if (block_max == kNoScore) {  // this block hides every key from t: it adds nothing
        std::fill(sr, sr + n, 0.0f);
        continue;
      }
      const float m_new = std::max(m[r], block_max);
      if (m_new > m[r]) {
        const float rescale = m[r] == kNoScore ? 0.0f : std::exp(m[r] - m_new);
        scaled_copy(lr, rescale, 16, lr);
        scaled_copy(acc + r * dv, rescale, dv, acc + r * dv);
      }
      lr[0] += exp_row(sr, m_new, n, sr);
      m[r] = m_new;
    }
    // The softmax's sum counts every visible weight, dropped or not.
    if (o.dropout_rate > 0.0f)
      for (std::int64_t s = s0; s < s1; ++s) sr[s - s0] *= p.kept(b, h, t, s);
  }
}

// Each compiled for every CPU (the wide tiles' machines and the baseline) and, with FMA,
// for AVX2 (its multiversioned clone has no FMA), the latter where narrow_tiles() says so.
DTRAIN_MULTIVERSION
void gradient_block_wide(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t t1,
                         std::int64_t s0, std::int64_t s1, const float* lse, const float* row_dot, float* w,
                         const float* dp, float* ds) {
  gradient_block_body<Floats16>(p, b, h, t0, t1, s0, s1, lse, row_dot, w, dp, ds);
}
[[gnu::target("avx2,fma")]]
void gradient_block_avx2(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t t1,
                         std::int64_t s0, std::int64_t s1, const float* lse, const float* row_dot, float* w,
                         const float* dp, float* ds) {
  gradient_block_body<Floats8>(p, b, h, t0, t1, s0, s1, lse, row_dot, w, dp, ds);
}
void gradient_block(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t t1,
                    std::int64_t s0, std::int64_t s1, const float* lse, const float* row_dot, float* w,
                    const float* dp, float* ds) {
  if (narrow_tiles()) gradient_block_avx2(p, b, h, t0, t1, s0, s1, lse, row_dot, w, dp, ds);
  else gradient_block_wide(p, b, h, t0, t1, s0, s1, lse, row_dot, w, dp, ds);
}

DTRAIN_MULTIVERSION
void softmax_block_wide(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t t1,
                        std::int64_t s0, std::int64_t s1, float* scores, float* m, float* l, float* acc) {
  softmax_block_body<Floats16>(p, b, h, t0, t1, s0, s1, scores, m, l, acc);
}
[[gnu::target("avx2,fma")]]
void softmax_block_avx2(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t t1,
                        std::int64_t s0, std::int64_t s1, float* scores, float* m, float* l, float* acc) {
  softmax_block_body<Floats8>(p, b, h, t0, t1, s0, s1, scores, m, l, acc);
}
void softmax_block(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t t0, std::int64_t t1,
                   std::int64_t s0, std::int64_t s1, float* scores, float* m, float* l, float* acc) {
  if (narrow_tiles()) softmax_block_avx2(p, b, h, t0, t1, s0, s1, scores, m, l, acc);
  else softmax_block_wide(p, b, h, t0, t1, s0, s1, scores, m, l, acc);
}

}  // namespace

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, Tensor& out,
                           Tensor& lse) {
  check_devices("attention", device(), {&q, &k, &v, &out, &lse, o.mask});
  check_attention(q, k, v, o, out, lse);
  const Problem p(q, k, v, o);
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  const std::int64_t blocks = (p.queries + kForwardQueryBlock - 1) / kForwardQueryBlock;
  const std::int64_t d = p.depth, dv = p.value_depth, dv64 = dv / 64 * 64, key_blocks = p.key_blocks();
  const Problem::Packed packed = p.packed();
  // Tasks taken as threads come free: the longest first (under a causal mask, the last
  // blocks of queries see the most keys).
  const std::int64_t tasks = p.batch * p.heads * blocks;
  const std::int64_t spare_floats = std::max(d, kKeyBlock), discard_floats = std::max(dv, kKeyBlock);
  ThreadScratch scratch(tasks, kForwardQueryBlock * (kKeyBlock + 1 + 16 + dv) + spare_floats + discard_floats);
  parallel_tasks(tasks, [&](auto&& take) {
    ThreadScratch::Share share = scratch.claim();
    float *scores = share.carve(kForwardQueryBlock * kKeyBlock), *m = share.carve(kForwardQueryBlock),
          *l = share.carve(kForwardQueryBlock * 16), *acc = share.carve(kForwardQueryBlock * dv),
          *spare = share.carve(spare_floats), *discard = share.carve(discard_floats);
    std::fill(spare, spare + spare_floats, 0.0f);  // a short tile's rows read zeros
    for (std::int64_t task; (task = take()) < tasks;) {
      const std::int64_t bh = task % (p.batch * p.heads), b = bh / p.heads, h = bh % p.heads;
      const std::int64_t t0 = (blocks - 1 - task / (p.batch * p.heads)) * kForwardQueryBlock;
      const std::int64_t t1 = std::min(p.queries, t0 + kForwardQueryBlock), nq = t1 - t0;
      std::fill(m, m + kForwardQueryBlock, kNoScore);
      std::fill(l, l + kForwardQueryBlock * 16, 0.0f);
      std::fill(acc, acc + kForwardQueryBlock * dv, 0.0f);
      const std::int64_t s_end = p.key_end(t1);
      for (std::int64_t s0 = 0; s0 < s_end; s0 += kKeyBlock) {
        const std::int64_t s1 = std::min(s_end, s0 + kKeyBlock), n = s1 - s0;
        const float* kt = packed.keys_t.data<float>() + (bh * key_blocks + s0 / kKeyBlock) * d * kKeyBlock;
        // The block's scores, four queries at a time (a short last tile reads a spare row
        // of zeros and writes a row it discards).
        for (std::int64_t r0 = 0; r0 < nq; r0 += 4) {
          const float* rows[4];
          float* tile[4];
          for (int i = 0; i < 4; ++i) {
            const bool real = r0 + i < nq;
            rows[i] = real ? p.q + p.row(b, p.queries, t0 + r0 + i, h) * d : spare;
            tile[i] = real ? scores + (r0 + i) * kKeyBlock : discard;
          }
          rows4_times_block(rows, kt, d, tile);
        }
        softmax_block(p, b, h, t0, t1, s0, s1, scores, m, l, acc);
        // The weighted values, four queries at a time over 64-column chunks, then the rest.
        const float* vb = packed.values.data<float>() + (bh * p.keys + s0) * dv;
        for (std::int64_t r0 = 0; r0 < nq && dv64 > 0; r0 += 4) {
          const float* w[4];
          float* tile[4];
          for (int i = 0; i < 4; ++i) {  // a short tile adds zero weights into a spare row
            const bool real = r0 + i < nq;
            w[i] = real ? scores + (r0 + i) * kKeyBlock : spare;
            tile[i] = real ? acc + (r0 + i) * dv : discard;
          }
          rows4_add_weighted(w, 1, n, vb, dv, dv64, tile);
        }
        if (dv64 < dv)  // rows the block hid have zero weights, which add_columns passes over
          for (std::int64_t r = 0; r < nq; ++r) add_columns(scores + r * kKeyBlock, 1, n, vb, dv, dv64, dv, acc + r * dv);
      }
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t r = t - t0, row = p.row(b, p.queries, t, h);
        float sum = 0.0f;
        for (std::int64_t i = 0; i < 16; ++i) sum += l[r * 16 + i];
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        scaled_copy(acc + r * dv, inv, dv, po + row * dv);
        pl[row] = sum > 0.0f ? m[r] + std::log(sum) : kNoScore;
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
  const std::int64_t d = p.depth, vd = p.value_depth, key_blocks = p.key_blocks();
  const std::int64_t T = p.queries, S = p.keys, tile_rows = kQueryBlock * kKeyBlock;
  // dS = P ⊙ (dP − rowsum(dO ⊙ O)), dP = dO · Vᵀ (times dropout's factor), with P
  // recomputed from lse; dV = P'ᵀ dO (P' the dropped weights), dQ = scale · dS K, dK = scale · dSᵀ Q.
  // Each (batch, head) is a task owning its gradients: its operands packed in order first
  // (q, dO and k by rows; k and v by blocks transposed), its gradients summed in buffers
  // of the same layout, and all products run on the four-row tiles.
  const std::int64_t spare = std::max({d, vd, kKeyBlock});
  ThreadScratch scratch(p.batch * p.heads, T * (2 * d + vd + 1) + S * (2 * d + vd) +
                                               key_blocks * kKeyBlock * (d + vd) + 3 * tile_rows + 2 * spare);
  parallel_tasks(p.batch * p.heads, [&](auto&& take) {
    ThreadScratch::Share share = scratch.claim();
    float *qp = share.carve(T * d), *dop = share.carve(T * vd), *kp = share.carve(S * d),
          *kt = share.carve(key_blocks * kKeyBlock * d), *vt = share.carve(key_blocks * kKeyBlock * vd),
          *gq = share.carve(T * d), *gk = share.carve(S * d), *gv = share.carve(S * vd), *row_dot = share.carve(T),
          *w = share.carve(tile_rows), *ds = share.carve(tile_rows), *dp = share.carve(tile_rows),
          *zeros = share.carve(spare), *discard = share.carve(spare);
    std::fill(zeros, zeros + spare, 0.0f);  // what a short tile's missing rows read
    for (std::int64_t bh; (bh = take()) < p.batch * p.heads;) {
      const std::int64_t b = bh / p.heads, h = bh % p.heads;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t row = p.row(b, T, t, h);
        std::memcpy(qp + t * d, p.q + row * d, static_cast<std::size_t>(d) * sizeof(float));
        std::memcpy(dop + t * vd, pdo + row * vd, static_cast<std::size_t>(vd) * sizeof(float));
        row_dot[t] = dot(pdo + row * vd, po + row * vd, vd);
      }
      for (std::int64_t s = 0; s < S; ++s)
        std::memcpy(kp + s * d, p.k + p.row(b, S, s, h) * d, static_cast<std::size_t>(d) * sizeof(float));
      for (std::int64_t block = 0; block < key_blocks; ++block) {
        const std::int64_t s0 = block * kKeyBlock, s1 = std::min(S, s0 + kKeyBlock);
        p.transpose_block(p.k, d, b, h, s0, s1, kt + block * kKeyBlock * d);
        p.transpose_block(p.v, vd, b, h, s0, s1, vt + block * kKeyBlock * vd);
      }
      std::fill(gq, gq + T * d, 0.0f);
      std::fill(gk, gk + S * d, 0.0f);
      std::fill(gv, gv + S * vd, 0.0f);
      for (std::int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
        const std::int64_t t1 = std::min(T, t0 + kQueryBlock), nq = t1 - t0, s_end = p.key_end(t1);
        for (std::int64_t s0 = 0; s0 < s_end; s0 += kKeyBlock) {
          const std::int64_t s1 = std::min(s_end, s0 + kKeyBlock), n = s1 - s0, block = s0 / kKeyBlock;
          // The block's scores and dP, four queries at a time.
          for (std::int64_t r0 = 0; r0 < nq; r0 += 4) {
            const float *qs[4], *dos[4];
            float *sc[4], *dps[4];
            for (int i = 0; i < 4; ++i) {
              const bool real = r0 + i < nq;
              qs[i] = real ? qp + (t0 + r0 + i) * d : zeros;
              dos[i] = real ? dop + (t0 + r0 + i) * vd : zeros;
              sc[i] = real ? w + (r0 + i) * kKeyBlock : discard;
              dps[i] = real ? dp + (r0 + i) * kKeyBlock : discard;
            }
            rows4_times_block(qs, kt + block * kKeyBlock * d, d, sc);
            rows4_times_block(dos, vt + block * kKeyBlock * vd, vd, dps);
          }
          // The weights (recomputed from the forward's log-sum-exp; 0 where hidden) times
          // dropout's factor, and the scores' gradients; zeros past the block's keys.
          gradient_block(p, b, h, t0, t1, s0, s1, pl, row_dot, w, dp, ds);
          // dQ += dS · K, four queries at a time, then the columns past the 64-wide chunks.
          const std::int64_t d64 = d / 64 * 64, vd64 = vd / 64 * 64;
          for (std::int64_t r0 = 0; r0 < nq && d64 > 0; r0 += 4) {
            const float* ws[4];
            float* acc[4];
            for (int i = 0; i < 4; ++i) {
              const bool real = r0 + i < nq;
              ws[i] = real ? ds + (r0 + i) * kKeyBlock : ds + r0 * kKeyBlock;
              acc[i] = real ? gq + (t0 + r0 + i) * d : discard;
            }
            rows4_add_weighted(ws, 1, n, kp + s0 * d, d, d64, acc);
          }
          if (d64 < d)
            for (std::int64_t r = 0; r < nq; ++r) add_columns(ds + r * kKeyBlock, 1, n, kp + s0 * d, d, d64, d, gq + (t0 + r) * d);
          // dV += P'ᵀ · dO and dK += dSᵀ · Q, four keys at a time (a key's weights are a
          // column of the tiles: kKeyBlock apart).
          for (std::int64_t j0 = 0; j0 < n; j0 += 4) {
            const float *pw[4], *sw[4];
            float *av[4], *ak[4];
            for (int i = 0; i < 4; ++i) {
              const bool real = j0 + i < n;
              pw[i] = w + (real ? j0 + i : j0);
              sw[i] = ds + (real ? j0 + i : j0);
              av[i] = real ? gv + (s0 + j0 + i) * vd : discard;
              ak[i] = real ? gk + (s0 + j0 + i) * d : discard;
            }
            if (vd64 > 0) rows4_add_weighted(pw, kKeyBlock, nq, dop + t0 * vd, vd, vd64, av);
            if (d64 > 0) rows4_add_weighted(sw, kKeyBlock, nq, qp + t0 * d, d, d64, ak);
          }
          for (std::int64_t j = 0; j < n && (vd64 < vd || d64 < d); ++j) {
            if (vd64 < vd) add_columns(w + j, kKeyBlock, nq, dop + t0 * vd, vd, vd64, vd, gv + (s0 + j) * vd);
            if (d64 < d) add_columns(ds + j, kKeyBlock, nq, qp + t0 * d, d, d64, d, gk + (s0 + j) * d);
          }
        }
      }
      for (std::int64_t t = 0; t < T; ++t)
        std::memcpy(pdq + p.row(b, T, t, h) * d, gq + t * d, static_cast<std::size_t>(d) * sizeof(float));
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t row = p.row(b, S, s, h);
        std::memcpy(pdk + row * d, gk + s * d, static_cast<std::size_t>(d) * sizeof(float));
        std::memcpy(pdv + row * vd, gv + s * vd, static_cast<std::size_t>(vd) * sizeof(float));
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
