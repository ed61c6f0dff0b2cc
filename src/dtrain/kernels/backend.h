// The compute backend behind one narrow interface: a short list of primitives that each
// device implements (CPU now through oneDNN and plain loops; CUDA later). Everything
// else in dtrain is composed from these. Kernels know nothing of autograd: they read
// inputs and write outputs that the caller allocated, and never allocate results.
#pragma once

#include <cstdint>

#include "dtrain/core/rng.h"
#include "dtrain/core/tensor.h"

namespace dtrain::kernels {

// Activations that a matmul can apply to its result in the same pass.
enum class Activation : std::uint8_t { linear, relu, sigmoid, tanh, gelu };

// linear is alpha * x + beta; clip is min(max(x, alpha), beta); the others ignore alpha and beta.
enum class Unary : std::uint8_t { linear, relu, sigmoid, tanh, gelu, exp, log, square, sqrt, abs, clip };
enum class Binary : std::uint8_t { add, sub, mul, div, max, min };
enum class Reduce : std::uint8_t { sum, mean, max };

// The primitive list, for supports() queries.
enum class Primitive : std::uint8_t {
  matmul, unary, unary_backward, binary, reduce, softmax, softmax_backward, convert, fill,
  axpby, sum_squares, softmax_cross_entropy, softmax_cross_entropy_backward, dropout,
  argmax, one_hot, sgd_update, adam_update,
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
  // and its input for gelu, log, square, abs, clip and linear (whose derivative is alpha).
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

  // One fused pass over the parameters: read w, g and the slots once, write them once.
  // Returns whether every weight written is finite (checked in the same pass, for fit's
  // report of a diverging run).
  virtual bool sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const SgdUpdate& p) = 0;
  virtual bool adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& p) = 0;
};

// The backend that runs tensors on `device`. Throws Unsupported for a device this build
// has no backend for.
Backend& backend(Device device = Device{});

const char* primitive_name(Primitive op);

}  // namespace dtrain::kernels
