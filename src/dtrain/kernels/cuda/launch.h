// dtrain's own CUDA kernels, as host functions that queue them: raw device pointers and
// sizes in, nothing allocated, every launch checked (a failed launch throws DeviceError
// naming the kernel and its sizes). The CUDA backend (cuda_backend.cpp) checks shapes,
// dtypes and devices before calling these; they trust what they are given. Launch shapes
// come from the sizes alone, and no result depends on them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dtrain/core/dtype.h"
#include "dtrain/kernels/element_math.h"

namespace dtrain::kernels {
class KernelTimeline;
}

namespace dtrain::kernels::cuda {

// Where a kernel runs: the device's compute stream and, for messages, its index and the
// multiprocessor count that sizes grid-stride launches; and, while the trace times
// kernels, the timeline that check_launch marks each kernel's end on.
struct Launch {
  cudaStream_t stream = nullptr;
  int device = 0;
  int multiprocessors = 1;
  KernelTimeline* timeline = nullptr;
};

// How a float is stored: the types mixed precision converts between.
enum class Elem : int { f32, bf16, f16 };
inline Elem elem_of(DType t) { return t == DType::bf16 ? Elem::bf16 : t == DType::f16 ? Elem::f16 : Elem::f32; }

// Throws DeviceError naming `kernel` and its sizes when the launch just made failed.
// Defined in cuda_backend.cpp.
void check_launch(const char* kernel, std::int64_t elements, const Launch& l);

// A failure a kernel finds in its data (a label out of range), written to host-mapped
// memory and turned into an InvalidArgument by the backend at its next call.
struct DataFault {
  int code;          // 0: none; else which (below)
  long long a, b, c; // what it names
};
enum : int { kFaultNone = 0, kFaultLabel = 1, kFaultOneHotLabel = 2 };

constexpr int kMaxRank = 8;
// An operand's strides over the output's index space (0 on a broadcast axis).
struct Broadcast {
  int rank = 0;
  long long dims[kMaxRank] = {};
  long long stride_a[kMaxRank] = {};
  long long stride_b[kMaxRank] = {};
};

enum class BinaryOp : std::uint8_t { add, sub, mul, div, max, min };

// ---- attention.cu
// The most depth (of q and k, and of v) a query's warp holds: 8 values a lane.
constexpr std::int64_t kMaxAttentionDepth = 256;
// mask_batch and mask_query: the mask's strides (kernels/backend.h's attention_mask_strides).
void attention(const Launch& l, const float* q, const float* k, const float* v, const float* mask,
               std::int64_t mask_batch, std::int64_t mask_query, std::int64_t batch,
               std::int64_t heads, std::int64_t queries, std::int64_t keys, std::int64_t depth,
               std::int64_t value_depth, float scale, bool causal, float rate, std::uint64_t mixed_seed,
               std::uint64_t counter, float* out, float* lse);
void attention_backward(const Launch& l, const float* q, const float* k, const float* v, const float* mask,
                        std::int64_t mask_batch, std::int64_t mask_query, const float* out, const float* lse, const float* dout, std::int64_t batch, std::int64_t heads,
                        std::int64_t queries, std::int64_t keys, std::int64_t depth, std::int64_t value_depth,
                        float scale, bool causal, float rate, std::uint64_t mixed_seed, std::uint64_t counter,
                        float* dq, float* dk, float* dv);

void gather_rows(const Launch& l, const float* table, const std::int32_t* ids, float* out, std::int64_t n,
                 std::int64_t d);
void scatter_add_rows(const Launch& l, const std::int32_t* ids, const float* rows, float* table, std::int64_t n,
                      std::int64_t d);

// ---- elementwise.cu
void unary(const Launch& l, math::UnaryOp op, const float* x, float* y, std::int64_t n, float alpha, float beta);
void unary_backward(const Launch& l, math::UnaryOp op, const float* saved, const float* dy, float* dx, std::int64_t n,
                    float alpha, float beta);
// c = a op b with a and b of c's shape (same), b a scalar (scalar_b), or broadcast (general).
void binary_same(const Launch& l, BinaryOp op, const float* a, const float* b, float* c, std::int64_t n);
void binary_broadcast(const Launch& l, BinaryOp op, const float* a, const float* b, float* c, std::int64_t n,
                      const Broadcast& shape);
void fill(const Launch& l, float* y, std::int64_t n, float value);
void axpby(const Launch& l, float alpha, const float* x, float beta, float* y, std::int64_t n);
void linear_from_bytes(const Launch& l, const std::uint8_t* x, float alpha, float beta, float* y, std::int64_t n);
// y = x rounded to 16 bits (nearest even; float16 beyond 65504 to infinity), and back exactly.
void narrow(const Launch& l, const float* x, std::uint16_t* y, Elem to, std::int64_t n);
void widen(const Launch& l, const std::uint16_t* x, Elem from, float* y, std::int64_t n);
void dropout(const Launch& l, const float* x, float* y, float* mask, std::int64_t n, float rate,
             std::uint64_t mixed_seed, std::uint64_t counter);
// c[i, col_begin:col_end] = bias ? bias[j - col_begin] : 0 over M rows of c (row stride
// `width`), then the activation: a matmul's empty sum (K = 0).
void bias_rows(const Launch& l, const float* bias, float* c, std::int64_t m, std::int64_t width, std::int64_t col_begin,
               std::int64_t col_end, math::UnaryOp activation);
// The optimizers' fused passes; *non_finite is set to 1 (host-mapped) when a weight written
// is NaN or infinite.
void sgd(const Launch& l, float* w, const float* g, float* velocity, std::int64_t n, float lr, float momentum,
         bool nesterov, float decay, float gradient_scale, int* non_finite);
void adam(const Launch& l, float* w, const float* g, float* m, float* v, std::int64_t n, float beta_1, float beta_2,
          float step_size, float epsilon, float decay, float gradient_scale, int* non_finite);
// Up to kManyTensors variables updated by one launch, passed by value as the kernel's
// parameter: each one's weights, gradient and slots (null where unused), its gradient
// scale, and where it ends in the elements of all of them (ends[count - 1]: the total).
// The updates write nothing where `skip` (device memory; null: never) holds a nonzero
// value: a loss scale's check found a gradient that is not finite.
inline constexpr int kManyTensors = 32;
struct ManyTensors {
  float* w[kManyTensors];
  const float* g[kManyTensors];
  float* slot0[kManyTensors];
  float* slot1[kManyTensors];
  float* slot2[kManyTensors];
  float gradient_scale[kManyTensors];
  std::int64_t ends[kManyTensors];
  int count;
  const int* skip;
};
// *found = 1 (host-mapped) where one of t.g's elements is NaN or infinite; t.w unused.
void find_non_finite_many(const Launch& l, const ManyTensors& t, int* found);
// sgd's and adam's passes over many variables (slot0: velocity or m; slot1: v).
void sgd_many(const Launch& l, const ManyTensors& t, float lr, float momentum, bool nesterov, float decay,
              int* non_finite);
void adam_many(const Launch& l, const ManyTensors& t, float beta_1, float beta_2, float step_size, float epsilon,
               float decay, int* non_finite);
// rmsprop's pass over many variables (slot0: v; slot1: momentum, slot2: average, each may be null).
void rmsprop_many(const Launch& l, const ManyTensors& t, float rho, float square_weight, float momentum_factor,
                  float lr, float epsilon, float decay, int* non_finite);
// RmspropUpdate's formula (RMSprop and Adagrad); momentum and average may be null.
void rmsprop(const Launch& l, float* w, const float* g, float* v, float* momentum, float* average, std::int64_t n,
             float rho, float square_weight, float momentum_factor, float lr, float epsilon, float decay,
             float gradient_scale, int* non_finite);

// ---- reduce.cu
enum class ReduceOp : std::uint8_t { sum, mean, max };
// y[o] = op over the reduced axes of x, for x's dims `dims` (rank <= 8) of which `reduced`
// flags the reduced ones; y holds the kept axes in order.
void reduce(const Launch& l, ReduceOp op, const float* x, float* y, int rank, const long long* dims,
            const bool* reduced);
// Σ x² in double, into *result (device memory, overwritten).
void sum_squares(const Launch& l, const float* x, std::int64_t n, double* result);
// out[r] = first index of the row's largest value in x[rows, cols].
void argmax(const Launch& l, const float* x, std::int32_t* out, std::int64_t rows, std::int64_t cols);
void one_hot(const Launch& l, const std::int32_t* labels, float* out, std::int64_t rows, std::int64_t classes,
             DataFault* fault);
// Over a [rows, c] tensor: sums[j] = Σ a[., j], sums[c + j] = Σ a[., j] * (b[., j] - center[j]),
// accumulated in double. `partials` holds chunks * 2c doubles of device scratch.
void channel_sums(const Launch& l, const float* a, const float* b, const float* center, float* sums, std::int64_t rows,
                  std::int64_t c, double* partials, int chunks);
int channel_sum_chunks(std::int64_t rows);
// Batch normalization's figures per channel (Backend::batch_norm_coefficients): gamma and
// beta may be null; coefficients [5, c].
void batch_norm_coefficients(const Launch& l, const float* mean, const float* variance, double count,
                             const float* gamma, const float* beta, float epsilon, float* coefficients,
                             std::int64_t c);
// gradients [4, c] from sums, total [2, c] and coefficients [5, c].
void batch_norm_gradient_coefficients(const Launch& l, const float* sums, const float* total, double count,
                                      const float* coefficients, float* gradients, std::int64_t c);
void channel_affine(const Launch& l, const float* x, const float* scale, const float* shift, const float* x2,
                    const float* scale2, float* y, std::int64_t rows, std::int64_t c, bool relu);

// ---- rows.cu (row-wise kernels over the last axis)
void softmax(const Launch& l, const float* x, float* y, std::int64_t rows, std::int64_t cols, bool log);
void softmax_backward(const Launch& l, const float* y, const float* dy, float* dx, std::int64_t rows, std::int64_t cols,
                      bool log);
// labels (sparse) or dist (dense) is null.
void softmax_cross_entropy(const Launch& l, const float* logits, const std::int32_t* labels, const float* dist,
                           float* loss, float* log_probs, std::int64_t rows, std::int64_t cols, DataFault* fault);
void softmax_cross_entropy_backward(const Launch& l, const float* log_probs, const std::int32_t* labels,
                                    const float* dist, const float* dloss, float* dlogits, std::int64_t rows,
                                    std::int64_t cols);
void layer_norm(const Launch& l, const float* x, const float* gamma, const float* beta, float epsilon, float* y,
                float* mean, float* inv_std, std::int64_t rows, std::int64_t d);
// dgamma and dbeta may be null; `partials` holds chunks * 2d doubles of scratch when either is not.
void layer_norm_backward(const Launch& l, const float* x, const float* dy, const float* gamma, const float* mean,
                         const float* inv_std, float* dx, float* dgamma, float* dbeta, std::int64_t rows,
                         std::int64_t d, double* partials, int chunks);
int layer_norm_chunks(std::int64_t rows);
// An [outer, rows, width] block of `element` bytes each, between strided places.
void copy_block(const Launch& l, const void* src, long long from_offset, long long from_outer, long long from_row,
                void* dst, long long to_offset, long long to_outer, long long to_row, std::int64_t outer,
                std::int64_t rows, std::int64_t width, int element);

// ---- layout.cu
// dst[j, i] = src[i, j] for src [rows, cols], each float32, bfloat16 or float16 (converted
// on the way): a kernel's Keras layout [KH, KW, C, F] to cuDNN's [F, KH, KW, C] and back.
void transpose(const Launch& l, const void* src, Elem src_type, void* dst, Elem dst_type, std::int64_t rows,
               std::int64_t cols);
// y[r, j] = act(y[r, j] + bias[j]) over y [rows, cols] (bias may be null).
void bias_activation(const Launch& l, float* y, const float* bias, std::int64_t rows, std::int64_t cols,
                     math::UnaryOp activation);

// ---- pool.cu: pooling over channels-last images, the window's taps outside the image left
// out (max ignores them, average divides by the taps inside).
struct PoolShape {
  long long n, h, w, c, oh, ow;
  long long window[2], stride[2], pad[2];  // pad: rows and columns before the image
};
// `argmax` (null: not kept) records each output's input position within its image (h * w + w).
void max_pool(const Launch& l, const float* x, float* y, std::int32_t* argmax, const PoolShape& s);
void max_pool_backward(const Launch& l, const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& s);
void average_pool(const Launch& l, const float* x, float* y, const PoolShape& s);
void average_pool_backward(const Launch& l, const float* dy, float* dx, const PoolShape& s);

}  // namespace dtrain::kernels::cuda
