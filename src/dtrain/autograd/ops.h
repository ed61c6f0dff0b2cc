// Differentiable operations on tensors. Each records its backward function on the live
// GradientTapes that watch one of its inputs; with no tape watching, an op only computes.
// Forward and backward of each op sit side by side in one op_*.cpp file.
#pragma once

#include <initializer_list>
#include <string_view>
#include <vector>

#include "dtrain/autograd/tape.h"
#include "dtrain/core/rng.h"
#include "dtrain/kernels/backend.h"

namespace dtrain {

using kernels::Activation;

// --- matmul and the fused dense layer (op_matmul.cpp, op_dense.cpp)
// op(a)[M,K] · op(b)[K,N] -> [M,N]; op transposes when asked.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// act(x · kernel + bias) in one pass: x[..., In], kernel[In, Out], bias[Out] or undefined.
// compute bf16 runs the matmuls (forward and backward) on bfloat16 copies of their inputs,
// accumulating in float32 (mixed precision); every output and gradient is float32.
Tensor dense(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation activation,
             DType compute = DType::f32);

// --- element-wise with NumPy broadcasting (op_elementwise.cpp)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// alpha * x + beta
Tensor affine(const Tensor& x, float alpha, float beta = 0.0f);
// float32 x * scale + offset, from float32 or uint8 x (Keras's Rescaling: images kept as
// bytes are scaled inside the step). uint8 inputs are data: they carry no gradient.
Tensor rescale(const Tensor& x, float scale, float offset = 0.0f);
inline Tensor scale(const Tensor& x, float alpha) { return affine(x, alpha); }
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return affine(x, -1.0f); }
inline Tensor operator*(const Tensor& x, float s) { return affine(x, s); }
inline Tensor operator*(float s, const Tensor& x) { return affine(x, s); }
inline Tensor operator+(const Tensor& x, float s) { return affine(x, 1.0f, s); }
inline Tensor operator-(const Tensor& x, float s) { return affine(x, 1.0f, -s); }

// --- activations and other unary functions (op_activation.cpp)
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form, Keras's default
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor square(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor clip_by_value(const Tensor& x, float lo, float hi);
Tensor softmax(const Tensor& x);      // over the last axis
Tensor log_softmax(const Tensor& x);  // over the last axis
// Keras activation names: "linear" (or ""), "relu", "sigmoid", "tanh", "softmax", "gelu".
Tensor activation(const Tensor& x, std::string_view name);
// Throws InvalidArgument listing the known names.
void check_activation_name(std::string_view name);

// --- reductions (op_reduce.cpp); negative axes count from the end
Tensor reduce_sum(const Tensor& x);  // all values -> scalar
Tensor reduce_mean(const Tensor& x);
Tensor reduce_sum(const Tensor& x, std::vector<int> axes, bool keepdims = false);
Tensor reduce_mean(const Tensor& x, std::vector<int> axes, bool keepdims = false);

// --- shapes (op_shape.cpp)
Tensor reshape(const Tensor& x, const Shape& shape);  // -1 is not inferred: give the full shape

// --- losses from logits and helpers (op_loss.cpp)
// Per-example -sum(target * log_softmax(logits)): target is i32 labels [B] or f32
// distributions [B, C]; logits [B, C]. Returns [B].
Tensor softmax_cross_entropy_with_logits(const Tensor& target, const Tensor& logits);
// f32 [B, C] one-hot rows from i32 labels [B] (not differentiable).
Tensor one_hot(const Tensor& labels, std::int64_t classes);

// --- dropout (op_dropout.cpp): inverted dropout with a seeded, thread-count-independent mask.
Tensor dropout(const Tensor& x, float rate, const Generator& generator);

// Values that stop the gradient: the same values, never watched.
Tensor stop_gradient(const Tensor& x);

}  // namespace dtrain
