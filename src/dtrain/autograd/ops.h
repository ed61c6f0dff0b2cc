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
// The sum of one or more tensors of one shape (tf.add_n); each one's gradient is the sum's.
Tensor add_n(std::span<const Tensor> xs);
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
// With approximate, the tanh form: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
Tensor gelu(const Tensor& x, bool approximate);
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

// --- selection (op_select.cpp): what custom loops index and pick with. where, gather and
// the max/min reductions run on the CPU (a GPU tensor is an error naming the op).
// tf.where(condition, x, y): x where condition (int32, uint8 or float32) is nonzero, else
// y; x and y have condition's shape, or one of them is a scalar. Each gets the gradient
// where it was chosen.
Tensor where(const Tensor& condition, const Tensor& x, const Tensor& y);
// size elements from begin along `axis` (tf.split's pieces, tf.slice along one axis); the
// gradient goes back to those positions.
Tensor slice_axis(const Tensor& x, int axis, std::int64_t begin, std::int64_t size);
// tf.gather(params, indices, axis, batch_dims): params' slices along `axis` at `indices`
// (int32, any shape), giving params.shape[:axis] + indices.shape[batch_dims:] +
// params.shape[axis+1:]; the first batch_dims dimensions (negative: from indices' rank) are
// shared, each batch of indices reading its own batch of params. An index outside [0, dim)
// is an error naming it. The gradient adds into the slices gathered.
Tensor gather(const Tensor& params, const Tensor& indices, int axis = 0, int batch_dims = 0);
// tf.reduce_max / reduce_min over `axes` (empty: all of them); the gradient goes to the
// elements equal to the result, shared equally among ties, as TensorFlow's does.
Tensor reduce_max(const Tensor& x, std::vector<int> axes, bool keepdims = false);
Tensor reduce_min(const Tensor& x, std::vector<int> axes, bool keepdims = false);
// tf.reduce_prod over `axes` (empty: all of them; an empty group's product is 1); each
// element's gradient is the product of the others in its group, zeros included.
Tensor reduce_prod(const Tensor& x, std::vector<int> axes, bool keepdims = false);

// --- shapes (op_shape.cpp)
Tensor reshape(const Tensor& x, const Shape& shape);  // -1 is not inferred: give the full shape
// The tensors joined along `axis` (negative counts from the end); every other axis must agree.
Tensor concatenate(std::span<const Tensor> xs, int axis = -1);
inline Tensor concatenate(std::initializer_list<Tensor> xs, int axis = -1) {
  return concatenate(std::span<const Tensor>(xs.begin(), xs.size()), axis);
}
// Zeros around channels-last images x [N, H, W, C]: `top` rows above, `bottom` below,
// `left` and `right` columns beside.
Tensor zero_pad2d(const Tensor& x, std::int64_t top, std::int64_t bottom, std::int64_t left, std::int64_t right);

// --- convolution and pooling over channels-last images (op_conv.cpp)
using kernels::Conv2dOptions;
using kernels::Pool2dOptions;
// act(conv(x, kernel) + bias): x [N, H, W, C], kernel [KH, KW, C / groups, F], bias [F] or
// undefined (options.bias is ignored: the bias is this argument). relu, sigmoid and tanh are
// fused into the convolution. compute bf16 runs the convolutions (forward and backward) on
// bfloat16 copies of their inputs, accumulating in float32.
Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Conv2dOptions& options,
              DType compute = DType::f32);
Tensor pool2d(const Tensor& x, const Pool2dOptions& options);

// --- normalization (op_norm.cpp)
// Batch normalization in training over every axis but the last (channels): each channel
// normalized by the batch's mean and (biased) variance, then y = xhat * gamma + beta (an
// undefined gamma is ones, beta zeros). Inside a strategy's run() with `synchronized` and
// several replicas in sync, the statistics (and, backward, the sums the input gradient
// needs) are those of the global batch, summed over every replica of every worker.
// `batch_mean` and `batch_variance` receive the statistics used, [C], for moving averages.
// With `relu`, max(y, 0) in the same pass (a relu that follows the batch norm, fused).
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, bool synchronized,
                  Tensor* batch_mean = nullptr, Tensor* batch_variance = nullptr, bool relu = false);
// Batch normalization with given statistics (inference): y = (x - mean) / sqrt(variance +
// epsilon) * gamma + beta; no gradient flows to mean and variance.
Tensor batch_norm_inference(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma,
                            const Tensor& beta, float epsilon, bool relu = false);
// Layer normalization over the last axis (Keras's LayerNormalization(axis=-1)).
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon);

// --- losses from logits and helpers (op_loss.cpp)
// Per-example -sum(target * log_softmax(logits)): target is i32 labels [B] or f32
// distributions [B, C]; logits [B, C]. Returns [B].
Tensor softmax_cross_entropy_with_logits(const Tensor& target, const Tensor& logits);
// f32 [B, C] one-hot rows from i32 labels [B] (not differentiable).
Tensor one_hot(const Tensor& labels, std::int64_t classes);

// --- attention (op_attention.cpp): scaled dot-product attention over heads, fused.
struct AttentionCall {
  float scale = 1.0f;            // multiplies q · k (Keras: 1 / sqrt(key_dim))
  bool causal = false;           // a query sees no key after it
  // [batch, queries, keys], nonzero where the query may see the key (undefined: all); or
  // [queries, keys] / [1, queries, keys] for every batch entry, [batch, 1, keys] for every query.
  Tensor mask;
  float dropout_rate = 0.0f;     // of the attention weights
  Generator dropout_generator{0};  // draws the weights dropped (kernels/backend.h's AttentionOptions)
};
// q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv] -> [B, T, H, Dv]: each head's softmax over
// the keys a query may see of scale · q · k, applied to v. A query that may see no key
// gets zeros. Memory grows with T and S, not with T × S (the weights are never stored).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& call = {});
// An AttentionCall's mask as the kernels read it: float32 [batch or 1, queries or 1, keys]
// on `where` (a [queries, keys] one as [1, queries, keys]; ints or bytes converted on the
// host). Any other shape is InvalidArgument naming both.
Tensor attention_mask_as_read(const Tensor& mask, std::int64_t batch, std::int64_t queries, std::int64_t keys,
                              Device where);

// Rows of table [V, D] picked by ids (any shape; int32, or float32 holding whole numbers)
// -> ids' shape + [D]; an id outside [0, V) is an InvalidArgument naming it and `who`.
// Gradients flow to the table only (repeated ids add up).
Tensor embedding_lookup(const Tensor& table, const Tensor& ids, const char* who = "embedding");
// The ids a lookup in a table of `vocabulary` rows takes, as int32 on the host in ids'
// shape; an id outside [0, vocabulary), or not whole, is an InvalidArgument naming it and `who`.
Tensor lookup_ids(const Tensor& ids, std::int64_t vocabulary, const char* who = "embedding");
// embedding_lookup for ids lookup_ids has checked against this table (not checked again).
Tensor lookup_rows(const Tensor& table, const Tensor& ids);

// --- dropout (op_dropout.cpp): inverted dropout with a seeded, thread-count-independent mask.
Tensor dropout(const Tensor& x, float rate, const Generator& generator);

// Values that stop the gradient: the same values, never watched.
Tensor stop_gradient(const Tensor& x);

}  // namespace dtrain
