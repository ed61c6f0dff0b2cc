// What every backend checks before it runs a primitive, written once so that a bad call
// gets the same message on every device: dtypes, shapes, and that every operand is on the
// backend's device (dtrain never copies between devices implicitly). Each returns the
// sizes the primitive then works with. Internal to the kernels layer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "dtrain/kernels/backend.h"

namespace dtrain::kernels {

// Every defined operand of `op` on `device`, else an InvalidArgument naming both devices.
void check_devices(const char* op, Device device, std::initializer_list<const Tensor*> operands);

struct MatmulDims {
  std::int64_t m = 0, k = 0, n = 0;  // op(a)[m, k] · op(b)[k, n] over the block's n columns
  std::int64_t width = 0;            // b's and c's columns
  std::int64_t column_begin = 0, column_end = 0;
};
MatmulDims check_matmul(const Tensor& a, const Tensor& b, const Tensor& c, const MatmulOptions& o);

// x and y for unary (x float32, or uint8 for linear).
void check_unary(Unary op, const Tensor& x, const Tensor& y);
void check_unary_backward(const Tensor& saved, const Tensor& dy, const Tensor& dx);
void check_binary(const Tensor& a, const Tensor& b, const Tensor& c);

// The reduction's dims: x's (a scalar as [1]) and y's padded to x's rank.
struct ReduceDims {
  std::vector<std::int64_t> x, y;
};
ReduceDims check_reduce(const Tensor& x, const Tensor& y);

void check_softmax(const Tensor& x, const Tensor& y, const char* op);
// Whether the targets are sparse (int32 labels) rather than distributions.
bool check_softmax_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                                 const Tensor& log_probs);
void check_softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target, const Tensor& dloss,
                                          const Tensor& dlogits);
void check_convert(const Tensor& x, const Tensor& y);
void check_same_f32(const Tensor& a, const Tensor& b, const char* op);
void check_dropout(const Tensor& x, float rate, const Tensor& y, const Tensor& mask);
void check_argmax(const Tensor& x, const Tensor& out);
void check_one_hot(const Tensor& labels, const Tensor& out);
void check_sgd_update(const Tensor& w, const Tensor& g, const Tensor* velocity);
void check_adam_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamUpdate& p);
// Keras's Adam step size: the bias corrections folded into the learning rate.
float adam_step_size(const AdamUpdate& p);
void check_rmsprop_update(const Tensor& w, const Tensor& g, const Tensor& v, const Tensor* momentum,
                          const Tensor* average);

// The channel count of a channels-last tensor (its last axis) and its rows (every other).
std::int64_t channels_of(const Tensor& t);
std::int64_t rows_of(const Tensor& t);
void check_channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, const Tensor& sums);
void check_channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& y, const Tensor* x2,
                          const Tensor* scale2);
void check_batch_norm_coefficients(const Tensor& mean, const Tensor& variance, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& coefficients);
void check_batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                            const Tensor& coefficients, const Tensor& gradients);
void check_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& mean,
                      const Tensor& inv_std);
void check_layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                               const Tensor& inv_std, const Tensor& dx, const Tensor* dgamma, const Tensor* dbeta);
// A convolution's sizes: x [n, h, w, c], kernel [kh, kw, c / groups, f], y [n, oh, ow, f].
struct ConvDims {
  std::int64_t n, h, w, c, kh, kw, f, oh, ow, groups;
};
// x, kernel and y's shapes against each other and the options (`op` names the caller).
ConvDims check_conv2d_shapes(const Shape& x, const Shape& kernel, const Shape& y, const Conv2dOptions& o, const char* op);
// Each convolution primitive's operands: dtypes that agree, float32 outputs, a bias [f].
ConvDims check_conv2d(const Tensor& x, const Tensor& kernel, const Tensor& y, const Conv2dOptions& o);
ConvDims check_conv2d_backward_data(const Tensor& dy, const Tensor& kernel, const Tensor& dx, const Conv2dOptions& o);
ConvDims check_conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dkernel, const Tensor* dbias,
                                       const Conv2dOptions& o);
// The output extent of a window of `k` taps `dilation` apart over `in` padded values.
std::int64_t conv_out(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dilation, std::int64_t pad_b,
                      std::int64_t pad_e);

// Pooling's sizes: x [n, h, w, c], y [n, oh, ow, c].
struct PoolDims {
  std::int64_t n, h, w, c, oh, ow;
};
// x (and y when given) against the options.
PoolDims check_pool2d_shapes(const Shape& x, const Shape* y, const Pool2dOptions& o, const char* op);

// Whether there is anything to copy.
// gather_rows' and scatter_add_rows' shapes: table [V, D], ids [N] int32, rows [N, D].
void check_rows_by_id(const Tensor& table, const Tensor& ids, const Tensor& rows, const char* op);

// Attention's operands, outputs and (backward) gradients: shapes, dtypes and the mask.
void check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Tensor& out,
                     const Tensor& lse);
void check_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionOptions& o, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv);

bool check_copy_block(const Tensor& src, const Block& from, const Tensor& dst, const Block& to, std::int64_t outer,
                      std::int64_t rows, std::int64_t width);

}  // namespace dtrain::kernels
