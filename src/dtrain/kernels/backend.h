// The compute backend behind one narrow interface: a short list of primitives that each
// device implements (the CPU through oneDNN and plain loops; CUDA GPUs through cuBLASLt,
// cuDNN and dtrain's own kernels). Everything else in dtrain is composed from these.
// Kernels know nothing of autograd: they read inputs and write outputs that the caller
// allocated (on the backend's device: operands on another are an error naming both), and
// never allocate results. A GPU backend queues its work in order on its device's stream
// and returns before it has run; reading a result on the host waits for it.
#pragma once

#include <cstdint>
#include <span>

#include "dtrain/core/rng.h"
#include "dtrain/core/tensor.h"
#include "dtrain/kernels/kernel_timeline.h"

namespace dtrain::kernels {

// Activations that a matmul can apply to its result in the same pass.
enum class Activation : std::uint8_t { linear, relu, sigmoid, tanh, gelu };

// linear is alpha * x + beta; clip is min(max(x, alpha), beta); the others ignore alpha and beta.
// gelu_tanh is GELU's tanh approximation (tf.nn.gelu(approximate=True)); gelu the exact one.
enum class Unary : std::uint8_t { linear, relu, sigmoid, tanh, gelu, exp, log, square, sqrt, abs, clip, gelu_tanh };
enum class Binary : std::uint8_t { add, sub, mul, div, max, min };
enum class Reduce : std::uint8_t { sum, mean, max };

// The primitive list, for supports() queries.
enum class Primitive : std::uint8_t {
  matmul, unary, unary_backward, binary, reduce, softmax, softmax_backward, convert, fill,
  axpby, sum_squares, all_finite, softmax_cross_entropy, softmax_cross_entropy_backward, dropout,
  argmax, one_hot, sgd_update, adam_update, rmsprop_update, sgd_update_many, adam_update_many, rmsprop_update_many, conv2d, conv2d_backward_data, conv2d_backward_weights,
  pool2d, pool2d_backward, channel_sums, channel_affine, batch_norm_coefficients, batch_norm_gradient_coefficients,
  layer_norm, layer_norm_backward, copy_block,
  attention, attention_backward, gather_rows, scatter_add_rows,
};

struct MatmulOptions {
  bool transpose_a = false;       // a is stored [K, M] and used as its transpose
  bool transpose_b = false;       // b is stored [N, K] and used as its transpose
  const Tensor* bias = nullptr;   // [N], added to every row before the activation
  Activation activation = Activation::linear;
  bool accumulate = false;        // c += result instead of c = result (linear only)
  // Only columns [column_begin, column_end) of b and c take part: c[:, cols] = op(a) ·
  // b[:, cols], the rest of c untouched (b not transposed, no bias or activation; b and c
  // the same width). column_end -1: every column. Replicas write their blocks of one
  // gradient so.
  std::int64_t column_begin = 0;
  std::int64_t column_end = -1;
};

// A 2-D convolution over channels-last images: x [N, H, W, C], kernel [KH, KW, C / groups, F]
// (Keras's layout; the F filters are groups blocks of F / groups, block g reading channels
// [g * C / groups, (g + 1) * C / groups)), y [N, OH, OW, F] with
// OH = (H + pad_begin[0] + pad_end[0] - dilation[0] * (KH - 1) - 1) / stride[0] + 1, and
// the same along W.
struct Conv2dOptions {
  std::int64_t stride[2] = {1, 1};
  std::int64_t dilation[2] = {1, 1};   // 1: adjacent taps (Keras's dilation_rate)
  std::int64_t pad_begin[2] = {0, 0};  // zeros above and left of the image
  std::int64_t pad_end[2] = {0, 0};    // zeros below and right of it
  std::int64_t groups = 1;
  const Tensor* bias = nullptr;        // [F], added before the activation (forward only)
  Activation activation = Activation::linear;  // forward only
};

enum class Pool : std::uint8_t { max, average };

// Pooling over channels-last images, x [N, H, W, C] -> y [N, OH, OW, C] (sizes as for a
// convolution with a window of `window` and no dilation). Average pooling divides by the
// taps inside the image, not the padding (Keras's "same" padding).
struct Pool2dOptions {
  Pool kind = Pool::max;
  std::int64_t window[2] = {2, 2};
  std::int64_t stride[2] = {2, 2};
  std::int64_t pad_begin[2] = {0, 0};
  std::int64_t pad_end[2] = {0, 0};
};

// Where a block of a tensor's elements lies: element (i, j, k) of an
// [outer, rows, width] block is element offset + i * outer_stride + j * row_stride + k.
struct Block {
  std::int64_t offset = 0;
  std::int64_t outer_stride = 0;
  std::int64_t row_stride = 0;
};

// Hyper-parameters of one fused optimizer pass, already resolved for this step.
struct SgdUpdate {
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;       // decoupled: w -= lr * wd * w
  float gradient_scale = 1.0f;     // multiplies g first (clipping, averaging)
};

struct AdamUpdate {
  float learning_rate = 0.001f;
  float beta_1 = 0.9f;
  float beta_2 = 0.999f;
  float epsilon = 1e-7f;
  std::int64_t step = 1;           // 1-based, for bias correction
  float weight_decay = 0.0f;       // decoupled (AdamW): w -= lr * wd * w
  float gradient_scale = 1.0f;
};

// RMSprop and Adagrad, one form: v = rho * v + square_weight * g² (RMSprop: 1 - rho;
// Adagrad: rho 1 and weight 1, v its accumulator); centered RMSprop also keeps
// a = rho * a + square_weight * g and uses v - a²; the step is lr * g / sqrt(v + epsilon),
// epsilon inside the root as Keras 3 and tf.keras 2.11+ take it; with momentum
// m = momentum * m + step and w -= m, else w -= step.
struct RmspropUpdate {
  float learning_rate = 0.001f;
  float rho = 0.9f;
  float square_weight = 0.1f;
  float momentum = 0.0f;           // used where a momentum slot is given
  float epsilon = 1e-7f;
  float weight_decay = 0.0f;       // decoupled: w -= lr * wd * w
  float gradient_scale = 1.0f;
};

// Scaled dot-product attention over q [B, T, H, D], k [B, S, H, D] and v [B, S, H, Dv]
// (batch, position, head, depth: the layout of a dense projection's output split into
// heads, so no transpose is needed): out[b, t, h] = Σ_s P[t, s] · v[b, s, h], P each
// query's softmax over the keys it may see of scale · q[b, t, h] · k[b, s, h]. A key is
// hidden from a query where the mask is 0, or (causal) where s > t. A query that may see no
// key gets zeros and no gradient. Kernels make each query's scores one block of keys at a
// time (an online softmax), never all T × S of them: memory grows with the sequence, not
// with its square.
struct AttentionOptions {
  float scale = 1.0f;
  bool causal = false;
  // float32 [B, T, S], nonzero where the query may see the key; a mask of one row for every
  // batch entry ([1, T, S]) or one for every query ([B, 1, S]: which keys are padding) is read
  // for all of them (attention_mask_strides).
  const Tensor* mask = nullptr;
  // Dropout of the weights P: weight (b, h, t, s) is kept where
  // dropout_generator.uniform_at(((b * H + h) * T + t) * S + s) >= rate, and scaled by
  // 1 / (1 - rate); backward draws the same.
  float dropout_rate = 0.0f;
  Generator dropout_generator{0};
};

// Where mask value (b, t, s) lies: b * batch + t * query + s (0 strides for a broadcast axis).
struct MaskStrides {
  std::int64_t batch = 0, query = 0;
};
inline MaskStrides attention_mask_strides(const Tensor* mask) {
  if (!mask) return {};
  const std::int64_t s = mask->dim(2), t = mask->dim(1);
  return {mask->dim(0) == 1 ? 0 : t * s, t == 1 ? 0 : s};
}

// One of many variables in an update over all of them: its weights, its gradient, its
// slots (null where the optimizer keeps fewer: SGD's velocity is slot0, Adam's m and v are
// slot0 and slot1, RMSprop's v, momentum and average slot0, slot1 and slot2) and its own
// gradient scale (clipping by each variable's norm, a loss scale).
struct UpdateItem {
  Tensor* w = nullptr;
  const Tensor* g = nullptr;
  Tensor* slot0 = nullptr;
  Tensor* slot1 = nullptr;
  float gradient_scale = 1.0f;
  Tensor* slot2 = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual bool supports(Primitive op, DType dtype) const = 0;

  // c[M,N] = act(op(a)[M,K] · op(b)[K,N] + bias). a and b f32 or bf16 (the same); c f32.
  virtual void matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& options) = 0;
  // y = f(x), element by element; x and y the same shape (they may be the same tensor).
  // y is float32; so is x, except that linear also takes uint8 x (bytes scaled to floats).
  virtual void unary(Unary op, const Tensor& x, Tensor& y, float alpha = 1.0f, float beta = 0.0f) = 0;
  // dx = dy * f'(.). `saved` is the forward's output for relu, sigmoid, tanh, exp and sqrt,
  // and its input for gelu, gelu_tanh, log, square, abs, clip and linear (whose derivative
  // is alpha).
  virtual void unary_backward(Unary op, const Tensor& saved, const Tensor& dy, Tensor& dx,
                              float alpha = 1.0f, float beta = 0.0f) = 0;
  // c = a op b with NumPy broadcasting of a and b to c's shape.
  virtual void binary(Binary op, const Tensor& a, const Tensor& b, Tensor& c) = 0;
  // y = reduction of x over the axes where y has extent 1 (y's shape, padded with leading
  // ones to x's rank, must match x or be 1 on each axis).
  virtual void reduce(Reduce op, const Tensor& x, Tensor& y) = 0;
  // Softmax (or log-softmax) over the last axis.
  virtual void softmax(const Tensor& x, Tensor& y, bool log) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) = 0;
  // y = x converted to y's dtype (f32 <-> bf16).
  virtual void convert(const Tensor& x, Tensor& y) = 0;
  virtual void fill(Tensor& y, float value) = 0;
  // y = alpha * x + beta * y (beta = 0 ignores y's old values, even NaN).
  virtual void axpby(float alpha, const Tensor& x, float beta, Tensor& y) = 0;
  // Sum of squares of all values, accumulated in double.
  virtual double sum_squares(const Tensor& x) = 0;
  // Whether every element of every tensor (float32, all on this device) is finite: a loss
  // scale's check of a step's gradients before they are applied. One pass over them, and
  // on a GPU one wait for its answer.
  virtual bool all_finite(std::span<const Tensor* const> tensors) = 0;
  // all_finite's check without the host's wait for it (a GPU's): queues the pass over
  // `tensors`, and the many-variable updates queued after it (sgd_, adam_ and
  // rmsprop_update_many) write nothing where it finds a NaN or an infinity, until
  // finite_check_passed() gives its answer (waiting for it, where the device has not
  // passed it yet) and ends the skipping. One check at a time. Returns false, doing
  // nothing, where the backend has no such check (the CPU's all_finite answers at once).
  virtual bool begin_finite_check(std::span<const Tensor* const> /*tensors*/) { return false; }
  virtual bool finite_check_passed() { return true; }

  // Fused, numerically stable cross-entropy from logits over the last axis.
  // target: i32 class indices [B] (sparse) or f32 distributions [B, C].
  // loss[B] = -sum_c target * log_softmax(logits); log_probs[B, C] is kept for backward.
  virtual void softmax_cross_entropy(const Tensor& logits, const Tensor& target, Tensor& loss,
                                     Tensor& log_probs) = 0;
  // dlogits = dloss[b] * (softmax * sum_c target - target).
  virtual void softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target,
                                              const Tensor& dloss, Tensor& dlogits) = 0;
  // Inverted dropout: mask = keep ? 1/(1-rate) : 0, y = x * mask. The draw for element i
  // is generator.uniform_at(i), so it does not depend on the thread count.
  virtual void dropout(const Tensor& x, float rate, const Generator& generator, Tensor& y,
                       Tensor& mask) = 0;
  // out[i] = index of the largest value in row i of x[B, C] (first on ties); out is i32.
  virtual void argmax(const Tensor& x, Tensor& out) = 0;
  // out[b, c] = (labels[b] == c); labels i32 [B] inside [0, C), out f32 [B, C].
  virtual void one_hot(const Tensor& labels, Tensor& out) = 0;

  // y = conv(x, kernel) + bias, then the activation (Conv2dOptions). x and kernel float32 or
  // both bfloat16 (accumulated in float32); y float32. The CUDA backend rounds a bfloat16
  // convolution's result (and its two gradients below) to bfloat16 before widening it, as
  // TensorFlow's and PyTorch's mixed precision do on GPUs; the CPU's stays float32.
  virtual void conv2d(const Tensor& x, const Tensor& kernel, Tensor& y, const Conv2dOptions& options) = 0;
  // dx = the gradient of conv's input for the gradient dy of its output (bias and activation
  // ignored: dy is taken after them). dy and kernel alike in dtype; dx float32.
  virtual void conv2d_backward_data(const Tensor& dy, const Tensor& kernel, Tensor& dx,
                                    const Conv2dOptions& options) = 0;
  // dkernel (and dbias [F] when not null) for dy; x and dy alike in dtype; outputs float32.
  virtual void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dkernel, Tensor* dbias,
                                       const Conv2dOptions& options) = 0;
  // Bytes of the record max pooling keeps for its backward (where each maximum was);
  // average pooling keeps none (0).
  virtual std::size_t pool2d_workspace_bytes(const Shape& x, const Pool2dOptions& options) = 0;
  // y = pooling of x; `workspace` (uint8, pool2d_workspace_bytes long) receives max
  // pooling's record and may be null for average pooling or where no backward follows.
  virtual void pool2d(const Tensor& x, Tensor& y, Tensor* workspace, const Pool2dOptions& options) = 0;
  virtual void pool2d_backward(const Tensor& dy, const Tensor* workspace, Tensor& dx, const Pool2dOptions& options) = 0;
  // Sums over every axis but the last (channels) of a [..., C], accumulated in double:
  // sums[0, c] = Σ a[., c] and sums[1, c] = Σ a[., c] * (b[., c] - center[c]); b like a,
  // center [C], sums [2, C]. (a = b = x and center 0: a batch's moments; a = dy, b = x and
  // center the mean: batch normalization's backward.)
  virtual void channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, Tensor& sums) = 0;
  // y[., c] = x[., c] * scale[c] + shift[c], plus x2[., c] * scale2[c] when x2 is given
  // (x2 like x), then max(y, 0) when `relu`: batch normalization's forward (with a relu
  // after it fused) and backward, one pass each.
  virtual void channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, Tensor& y,
                              const Tensor* x2 = nullptr, const Tensor* scale2 = nullptr, bool relu = false) = 0;
  // Batch normalization's per-channel figures, computed where the tensors are (on a GPU,
  // without a wait for it): coefficients [5, C] = the mean, the variance, inv_std =
  // 1 / sqrt(variance + epsilon), scale = gamma * inv_std and shift = beta - mean * scale
  // (math::batch_norm_channel). With count > 0, `mean` and `variance` [C] hold the sums Σx and
  // Σx² of count rows instead (channel_sums's two rows); with count 0, the statistics
  // themselves. An undefined gamma is ones, an undefined beta zeros.
  virtual void batch_norm_coefficients(const Tensor& mean, const Tensor& variance, double count, const Tensor& gamma,
                                       const Tensor& beta, float epsilon, Tensor& coefficients) = 0;
  // Its backward's, from channel_sums(dy, x, mean)'s [2, C]: `sums` the replica's own,
  // `total` summed over the replicas (the same tensor where there is one), `count` the rows
  // of all, `coefficients` the forward's. gradients [4, C] = dgamma, dbeta, and the x
  // coefficient bx and the shift k of dx = dy * scale + x * bx + k (one channel_affine pass;
  // math::batch_norm_gradient_channel).
  virtual void batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                                const Tensor& coefficients, Tensor& gradients) = 0;
  // Normalizes each row of x [R, D] over its D values: y = (x - mean) * inv_std * gamma + beta
  // with inv_std = 1 / sqrt(var + epsilon); mean and inv_std [R] are kept for backward. An
  // undefined gamma is ones, an undefined beta zeros.
  virtual void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y,
                          Tensor& mean, Tensor& inv_std) = 0;
  // dx for dy, and (when not null) dgamma and dbeta [D].
  virtual void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                   const Tensor& inv_std, Tensor& dx, Tensor* dgamma, Tensor* dbeta) = 0;
  // out [B, T, H, Dv] and lse [B, T, H], each query's log-sum-exp of its visible scores
  // (-inf where it sees none), which backward reads instead of the weights.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                         Tensor& out, Tensor& lse) = 0;
  // dq, dk and dv for dout, from the forward's operands, out and lse.
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionOptions& options, Tensor& dq,
                                  Tensor& dk, Tensor& dv) = 0;
  // out[i] = table[ids[i]] for table [V, D], ids [N] int32 (each in [0, V): the caller checks),
  // out [N, D]: an embedding lookup.
  virtual void gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // table[ids[i]] += rows[i] for every i (ids repeated add up): an embedding's gradient.
  virtual void scatter_add_rows(const Tensor& ids, const Tensor& rows, Tensor& table) = 0;
  // Copies an [outer, rows, width] block of src's elements into dst (same dtype): the
  // moves behind concatenation, padding and cropping.
  virtual void copy_block(const Tensor& src, const Block& from, Tensor& dst, const Block& to, std::int64_t outer,
                          std::int64_t rows, std::int64_t width) = 0;

  // One fused pass over the parameters: read w, g and the slots once, write them once.
  // Returns whether every weight written is finite (checked in the same pass, for fit's
  // report of a diverging run).
  // A backend whose kernels run after the call returns (a GPU's) returns true and reports
  // through take_deferred_non_finite() instead.
  virtual bool sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const SgdUpdate& p) = 0;
  virtual bool adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& p) = 0;
  // `momentum` and `average` (centered) may be null.
  virtual bool rmsprop_update(Tensor& w, const Tensor& g, Tensor& v, Tensor* momentum, Tensor* average,
                              const RmspropUpdate& p) = 0;
  // The updates of many variables at once, each item's as sgd_update's or adam_update's
  // with the item's gradient scale (p.gradient_scale is not used). A GPU runs up to 32
  // variables in one launch, where each would cost a launch of its own; the CPU runs them
  // in turn. Returns as those do.
  virtual bool sgd_update_many(std::span<const UpdateItem> items, const SgdUpdate& p);
  virtual bool adam_update_many(std::span<const UpdateItem> items, const AdamUpdate& p);
  virtual bool rmsprop_update_many(std::span<const UpdateItem> items, const RmspropUpdate& p);
  // Whether an update since the last call wrote a NaN or an infinity that its return value
  // could not report; waits for the updates queued so far, and clears the record.
  virtual bool take_deferred_non_finite() { return false; }
  // Waits for the work queued on the backend's device (nothing to wait for on the CPU).
  virtual void synchronize() {}
  // For the trace: while on, a GPU backend times each kernel it queues (KernelTimeline);
  // off, it forgets what it timed and not taken. take_kernel_spans() gives the kernels
  // queued since its last call, timed from `since` (a DeviceRuntime::record_timed event);
  // kernel_marks() counts the marks made since then. The CPU has none. Kernels queued on
  // the device by another thread meanwhile are timed with them.
  virtual void trace_kernels(bool /*on*/) {}
  virtual void take_kernel_spans(const DeviceEvent& /*since*/, std::vector<KernelSpan>& out) { out.clear(); }
  virtual std::size_t kernel_marks() { return 0; }
};

// The backend that runs tensors on `device`. Throws InvalidArgument naming what was found
// for a device that is not here, Unsupported for one this build has no backend for.
Backend& backend(Device device = Device{});
// Replaces the backend of `device` until called again with null (the tests' stand-in GPU);
// not thread-safe against kernels running.
void set_backend(Device device, Backend* backend);

// TensorFlow's tf.config.experimental.enable_tensor_float_32_execution: float32 matrix
// products on a GPU's tensor cores with 10-bit mantissas (TF32), ~8x the float32 rate at
// about 1e-3 relative error. Off by default: float32 products are exact float32. A
// process-wide setting, as TensorFlow's is.
void set_tensor_float_32_execution(bool enabled);
bool tensor_float_32_execution();

const char* primitive_name(Primitive op);

}  // namespace dtrain::kernels
