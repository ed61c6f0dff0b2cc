// The argument checks every backend shares.
#include "dtrain/kernels/checks.h"

#include <cmath>
#include <utility>

namespace dtrain::kernels {

void check_devices(const char* op, Device device, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    if (t != nullptr && t->defined() && !(t->device() == device))
      DTRAIN_THROW(InvalidArgument, op, ": an operand of shape ", t->shape().to_string(), " is on ",
                   t->device().to_string(), ", the others on ", device.to_string(),
                   "; dtrain does not copy between devices by itself: move it first (Tensor::to, or create the "
                   "model under one device placement)");
}

MatmulDims check_matmul(const Tensor& a, const Tensor& b, const Tensor& c, const MatmulOptions& o) {
  a.check_defined("matmul");
  b.check_defined("matmul");
  c.check_dtype(DType::f32, "matmul (output)");
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2)
    DTRAIN_THROW(InvalidArgument, "matmul: expects 2-D operands, got a ", a.shape().to_string(), ", b ",
                 b.shape().to_string(), ", c ", c.shape().to_string());
  if (a.dtype() != b.dtype() || !is_floating(a.dtype()))
    DTRAIN_THROW(InvalidArgument, "matmul: operands must both be float32, both bfloat16 or both float16, got ",
                 dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  MatmulDims d;
  d.m = o.transpose_a ? a.dim(1) : a.dim(0);
  d.k = o.transpose_a ? a.dim(0) : a.dim(1);
  const std::int64_t kb = o.transpose_b ? b.dim(1) : b.dim(0);
  d.width = o.transpose_b ? b.dim(0) : b.dim(1);
  const bool block = o.column_begin != 0 || o.column_end != -1;
  d.column_begin = o.column_begin;
  d.column_end = o.column_end == -1 ? d.width : o.column_end;
  if (block && (o.transpose_b || o.bias || o.activation != Activation::linear || d.column_begin < 0 ||
                d.column_end < d.column_begin || d.column_end > d.width))
    DTRAIN_THROW(InvalidArgument, "matmul: columns [", d.column_begin, ", ", d.column_end, ") of b ",
                 b.shape().to_string(), o.transpose_b ? "ᵀ" : "", o.bias ? " with a bias" : "",
                 ": a column block needs b untransposed, no bias or activation, and 0 <= begin <= end <= ", d.width);
  d.n = d.column_end - d.column_begin;
  if (d.k != kb || c.dim(0) != d.m || c.dim(1) != d.width)
    DTRAIN_THROW(InvalidArgument, "matmul: shapes do not agree: a ", a.shape().to_string(),
                 o.transpose_a ? "ᵀ" : "", " · b ", b.shape().to_string(), o.transpose_b ? "ᵀ" : "",
                 " -> c ", c.shape().to_string());
  if (o.bias) {
    o.bias->check_dtype(DType::f32, "matmul (bias)");
    if (o.bias->numel() != d.n)
      DTRAIN_THROW(InvalidArgument, "matmul: bias has shape ", o.bias->shape().to_string(),
                   ", expected [", d.n, "]");
  }
  if (o.accumulate && (o.activation != Activation::linear || o.bias))
    DTRAIN_THROW(InvalidArgument, "matmul: accumulate cannot be combined with a bias or activation");
  return d;
}

void check_unary(Unary op, const Tensor& x, const Tensor& y) {
  if (op == Unary::linear && x.dtype() == DType::u8) {
    y.check_dtype(DType::f32, "unary (output)");
    check_same_shape(x, y, "unary");
    return;
  }
  x.check_dtype(DType::f32, "unary");
  y.check_dtype(DType::f32, "unary (output)");
  check_same_shape(x, y, "unary");
}

void check_unary_backward(const Tensor& saved, const Tensor& dy, const Tensor& dx) {
  saved.check_dtype(DType::f32, "unary_backward");
  dy.check_dtype(DType::f32, "unary_backward (dy)");
  dx.check_dtype(DType::f32, "unary_backward (dx)");
  check_same_shape(saved, dy, "unary_backward");
  check_same_shape(dy, dx, "unary_backward");
}

void check_binary(const Tensor& a, const Tensor& b, const Tensor& c) {
  a.check_dtype(DType::f32, "binary");
  b.check_dtype(DType::f32, "binary");
  c.check_dtype(DType::f32, "binary (output)");
  const Shape out = broadcast_shapes(a.shape(), b.shape(), "binary");
  if (!(out == c.shape()))
    DTRAIN_THROW(InvalidArgument, "binary: output shape ", c.shape().to_string(), " is not the broadcast of ",
                 a.shape().to_string(), " and ", b.shape().to_string(), " (", out.to_string(), ")");
}

ReduceDims check_reduce(const Tensor& x, const Tensor& y) {
  x.check_dtype(DType::f32, "reduce");
  y.check_dtype(DType::f32, "reduce (output)");
  const int rank = std::max(1, x.rank());
  if (y.rank() > x.rank())
    DTRAIN_THROW(InvalidArgument, "reduce: output shape ", y.shape().to_string(), " has a higher rank than input ",
                 x.shape().to_string());
  ReduceDims d;
  d.x = x.rank() == 0 ? std::vector<std::int64_t>{1} : x.shape().to_vector();
  d.y.assign(static_cast<std::size_t>(rank), 1);
  for (int i = 0; i < y.rank(); ++i) d.y[static_cast<std::size_t>(rank - y.rank() + i)] = y.dim(i);
  for (int i = 0; i < rank; ++i)
    if (d.y[i] != d.x[i] && d.y[i] != 1)
      DTRAIN_THROW(InvalidArgument, "reduce: cannot reduce shape ", x.shape().to_string(), " to ",
                   y.shape().to_string(), " (axis ", i, ")");
  return d;
}

void check_softmax(const Tensor& x, const Tensor& y, const char* op) {
  x.check_dtype(DType::f32, op);
  y.check_dtype(DType::f32, op);
  check_same_shape(x, y, op);
  if (x.rank() == 0) DTRAIN_THROW(InvalidArgument, op, ": needs at least one axis, got a scalar");
}

void check_same_f32(const Tensor& a, const Tensor& b, const char* op) {
  a.check_dtype(DType::f32, op);
  b.check_dtype(DType::f32, op);
  check_same_shape(a, b, op);
}

bool check_softmax_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                                 const Tensor& log_probs) {
  logits.check_dtype(DType::f32, "softmax_cross_entropy");
  if (logits.rank() != 2)
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy: logits must be [batch, classes], got ",
                 logits.shape().to_string());
  const std::int64_t B = logits.dim(0);
  const bool sparse = target.dtype() == DType::i32;
  if (sparse ? !(target.shape() == Shape{B}) : !(target.shape() == logits.shape()))
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy: targets of shape ", target.shape().to_string(), " (",
                 dtype_name(target.dtype()), ") do not match logits ", logits.shape().to_string(),
                 sparse ? ": integer labels must be [batch]" : ": distributions must be [batch, classes]");
  if (!sparse) target.check_dtype(DType::f32, "softmax_cross_entropy (targets)");
  if (!(loss.shape() == Shape{B})) DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy: loss must be [", B, "]");
  loss.check_dtype(DType::f32, "softmax_cross_entropy (loss)");
  check_same_f32(logits, log_probs, "softmax_cross_entropy (log_probs)");
  return sparse;
}

void check_softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target, const Tensor& dloss,
                                          const Tensor& dlogits) {
  check_same_f32(log_probs, dlogits, "softmax_cross_entropy_backward");
  dloss.check_dtype(DType::f32, "softmax_cross_entropy_backward (dloss)");
  if (log_probs.rank() != 2)
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy_backward: log_probs must be [batch, classes], got ",
                 log_probs.shape().to_string());
  const std::int64_t B = log_probs.dim(0);
  const bool sparse = target.dtype() == DType::i32;
  if (!sparse) target.check_dtype(DType::f32, "softmax_cross_entropy_backward (targets)");
  if (sparse ? !(target.shape() == Shape{B}) : !(target.shape() == log_probs.shape()))
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy_backward: targets of shape ", target.shape().to_string(),
                 " do not match log_probs ", log_probs.shape().to_string());
  if (!(dloss.shape() == Shape{B}))
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy_backward: dloss is ", dloss.shape().to_string(),
                 ", expected [", B, "]");
}

void check_convert(const Tensor& x, const Tensor& y) {
  x.check_defined("convert");
  y.check_defined("convert");
  check_same_shape(x, y, "convert");
  if (!is_floating(x.dtype()) || !is_floating(y.dtype()) || (is_half(x.dtype()) && is_half(y.dtype()) && x.dtype() != y.dtype()))
    DTRAIN_THROW(InvalidArgument, "convert: supports float32 <-> bfloat16 and float32 <-> float16, got ", dtype_name(x.dtype()), " -> ",
                 dtype_name(y.dtype()));
}

void check_dropout(const Tensor& x, float rate, const Tensor& y, const Tensor& mask) {
  check_same_f32(x, y, "dropout");
  check_same_f32(x, mask, "dropout (mask)");
  if (!(rate >= 0.0f && rate < 1.0f))
    DTRAIN_THROW(InvalidArgument, "dropout: rate ", rate, " must be in [0, 1)");
}

void check_argmax(const Tensor& x, const Tensor& out) {
  x.check_dtype(DType::f32, "argmax");
  out.check_dtype(DType::i32, "argmax (output)");
  if (x.rank() != 2 || !(out.shape() == Shape{x.dim(0)}))
    DTRAIN_THROW(InvalidArgument, "argmax: expects x [batch, classes] and out [batch], got ",
                 x.shape().to_string(), " and ", out.shape().to_string());
}

void check_one_hot(const Tensor& labels, const Tensor& out) {
  labels.check_dtype(DType::i32, "one_hot");
  out.check_dtype(DType::f32, "one_hot (output)");
  if (labels.rank() != 1 || out.rank() != 2 || out.dim(0) != labels.dim(0))
    DTRAIN_THROW(InvalidArgument, "one_hot: expects labels [batch] and out [batch, classes], got ",
                 labels.shape().to_string(), " and ", out.shape().to_string());
}

void check_sgd_update(const Tensor& w, const Tensor& g, const Tensor* velocity) {
  check_same_f32(w, g, "sgd_update");
  if (velocity) check_same_f32(w, *velocity, "sgd_update (velocity)");
}

void check_adam_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamUpdate& p) {
  check_same_f32(w, g, "adam_update");
  check_same_f32(w, m, "adam_update (m)");
  check_same_f32(w, v, "adam_update (v)");
  if (p.step < 1) DTRAIN_THROW(InvalidArgument, "adam_update: step must be >= 1, got ", p.step);
}

void check_rmsprop_update(const Tensor& w, const Tensor& g, const Tensor& v, const Tensor* momentum,
                          const Tensor* average) {
  check_same_f32(w, g, "rmsprop_update");
  check_same_f32(w, v, "rmsprop_update (velocity)");
  if (momentum) check_same_f32(w, *momentum, "rmsprop_update (momentum)");
  if (average) check_same_f32(w, *average, "rmsprop_update (average_gradient)");
}

float adam_step_size(const AdamUpdate& p) {
  const double t = static_cast<double>(p.step);
  return static_cast<float>(p.learning_rate * std::sqrt(1.0 - std::pow(p.beta_2, t)) / (1.0 - std::pow(p.beta_1, t)));
}

std::int64_t channels_of(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(-1); }

std::int64_t rows_of(const Tensor& t) {
  const std::int64_t c = channels_of(t);
  return c == 0 ? 0 : t.numel() / c;
}

namespace {

void check_channel_vector(const Tensor* v, std::int64_t c, const char* op, const char* what) {
  if (v == nullptr || !v->defined()) return;
  v->check_dtype(DType::f32, op);
  if (!(v->shape() == Shape{c}))
    DTRAIN_THROW(InvalidArgument, op, ": ", what, " is ", v->shape().to_string(), ", expected [", c, "]");
}

}  // namespace

void check_channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, const Tensor& sums) {
  a.check_dtype(DType::f32, "channel_sums");
  b.check_dtype(DType::f32, "channel_sums");
  check_same_shape(a, b, "channel_sums");
  sums.check_dtype(DType::f32, "channel_sums (output)");
  const std::int64_t c = channels_of(a);
  check_channel_vector(&center, c, "channel_sums", "center");
  if (!(sums.shape() == Shape{2, c}))
    DTRAIN_THROW(InvalidArgument, "channel_sums: sums is ", sums.shape().to_string(), ", expected [2, ", c, "]");
}

void check_batch_norm_coefficients(const Tensor& mean, const Tensor& variance, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& coefficients) {
  constexpr const char* op = "batch_norm_coefficients";
  if (!mean.defined() || !variance.defined())
    DTRAIN_THROW(InvalidArgument, op, ": needs the mean and the variance (or the sums)");
  mean.check_dtype(DType::f32, op);
  if (mean.rank() != 1) DTRAIN_THROW(InvalidArgument, op, ": the mean is ", mean.shape().to_string(), ", expected [C]");
  const std::int64_t c = mean.dim(0);
  check_channel_vector(&variance, c, op, "the variance");
  check_channel_vector(&gamma, c, op, "gamma");
  check_channel_vector(&beta, c, op, "beta");
  coefficients.check_dtype(DType::f32, op);
  if (!(coefficients.shape() == Shape{5, c}))
    DTRAIN_THROW(InvalidArgument, op, ": coefficients is ", coefficients.shape().to_string(), ", expected [5, ", c, "]");
}

void check_batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                            const Tensor& coefficients, const Tensor& gradients) {
  constexpr const char* op = "batch_norm_gradient_coefficients";
  sums.check_dtype(DType::f32, op);
  total.check_dtype(DType::f32, op);
  coefficients.check_dtype(DType::f32, op);
  gradients.check_dtype(DType::f32, op);
  const std::int64_t c = coefficients.rank() == 2 ? coefficients.dim(1) : -1;
  if (!(coefficients.rank() == 2 && coefficients.dim(0) == 5))
    DTRAIN_THROW(InvalidArgument, op, ": coefficients is ", coefficients.shape().to_string(), ", expected [5, C]");
  for (const auto& [t, what] : {std::pair{&sums, "sums"}, std::pair{&total, "total"}})
    if (!(t->shape() == Shape{2, c}))
      DTRAIN_THROW(InvalidArgument, op, ": ", what, " is ", t->shape().to_string(), ", expected [2, ", c, "]");
  if (!(gradients.shape() == Shape{4, c}))
    DTRAIN_THROW(InvalidArgument, op, ": gradients is ", gradients.shape().to_string(), ", expected [4, ", c, "]");
  if (!(count > 0.0)) DTRAIN_THROW(InvalidArgument, op, ": needs a positive row count, got ", count);
}

void check_channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& y, const Tensor* x2,
                          const Tensor* scale2) {
  x.check_dtype(DType::f32, "channel_affine");
  y.check_dtype(DType::f32, "channel_affine (output)");
  check_same_shape(x, y, "channel_affine");
  const std::int64_t c = channels_of(x);
  if (!scale.defined() || !shift.defined())
    DTRAIN_THROW(InvalidArgument, "channel_affine: needs a scale and a shift");
  check_channel_vector(&scale, c, "channel_affine", "scale");
  check_channel_vector(&shift, c, "channel_affine", "shift");
  if ((x2 == nullptr) != (scale2 == nullptr))
    DTRAIN_THROW(InvalidArgument, "channel_affine: a second input needs its own scale, and only then");
  if (x2) {
    x2->check_dtype(DType::f32, "channel_affine");
    check_same_shape(x, *x2, "channel_affine");
    check_channel_vector(scale2, c, "channel_affine", "second scale");
  }
}

void check_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& mean,
                      const Tensor& inv_std) {
  x.check_dtype(DType::f32, "layer_norm");
  y.check_dtype(DType::f32, "layer_norm (output)");
  check_same_shape(x, y, "layer_norm");
  const std::int64_t d = channels_of(x), rows = rows_of(x);
  check_channel_vector(&gamma, d, "layer_norm", "gamma");
  check_channel_vector(&beta, d, "layer_norm", "beta");
  if (!(mean.shape() == Shape{rows}) || !(inv_std.shape() == Shape{rows}))
    DTRAIN_THROW(InvalidArgument, "layer_norm: mean and inv_std must be [", rows, "], got ",
                 mean.shape().to_string(), " and ", inv_std.shape().to_string());
}

void check_layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                               const Tensor& inv_std, const Tensor& dx, const Tensor* dgamma, const Tensor* dbeta) {
  x.check_dtype(DType::f32, "layer_norm_backward");
  dy.check_dtype(DType::f32, "layer_norm_backward");
  check_same_shape(x, dy, "layer_norm_backward");
  check_same_shape(x, dx, "layer_norm_backward");
  const std::int64_t d = channels_of(x), rows = rows_of(x);
  check_channel_vector(&gamma, d, "layer_norm_backward", "gamma");
  check_channel_vector(dgamma, d, "layer_norm_backward", "dgamma");
  check_channel_vector(dbeta, d, "layer_norm_backward", "dbeta");
  if (!(mean.shape() == Shape{rows}) || !(inv_std.shape() == Shape{rows}))
    DTRAIN_THROW(InvalidArgument, "layer_norm_backward: mean and inv_std must be [", rows, "]");
}

void check_rows_by_id(const Tensor& table, const Tensor& ids, const Tensor& rows, const char* op) {
  table.check_dtype(DType::f32, op);
  rows.check_dtype(DType::f32, op);
  ids.check_dtype(DType::i32, op);
  if (table.rank() != 2 || ids.rank() != 1 || rows.rank() != 2 || rows.dim(0) != ids.dim(0) || rows.dim(1) != table.dim(1))
    DTRAIN_THROW(InvalidArgument, op, ": expects a table [V, D], ids [N] and rows [N, D], got ", table.shape().to_string(),
                 ", ", ids.shape().to_string(), " and ", rows.shape().to_string());
}

void check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const Tensor& out,
                     const Tensor& lse) {
  for (const Tensor* t : {&q, &k, &v, &out, &lse}) t->check_dtype(DType::f32, "attention");
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    DTRAIN_THROW(InvalidArgument, "attention: q, k and v must be [batch, length, heads, depth], got ", q.shape().to_string(),
                 ", ", k.shape().to_string(), " and ", v.shape().to_string());
  const std::int64_t b = q.dim(0), t = q.dim(1), h = q.dim(2), s = k.dim(1);
  if (k.dim(0) != b || v.dim(0) != b || k.dim(2) != h || v.dim(2) != h || k.dim(3) != q.dim(3) || v.dim(1) != s)
    DTRAIN_THROW(InvalidArgument, "attention: q ", q.shape().to_string(), ", k ", k.shape().to_string(), " and v ",
                 v.shape().to_string(), " do not match (k [batch, keys, heads, q's depth], v [batch, keys, heads, any])");
  if (!(out.shape() == Shape{b, t, h, v.dim(3)}) || !(lse.shape() == Shape{b, t, h}))
    DTRAIN_THROW(InvalidArgument, "attention: out must be ", Shape{b, t, h, v.dim(3)}.to_string(), " and lse ",
                 Shape{b, t, h}.to_string(), ", got ", out.shape().to_string(), " and ", lse.shape().to_string());
  if (o.mask) {
    o.mask->check_dtype(DType::f32, "attention (mask)");
    const Shape& m = o.mask->shape();
    if (m.rank() != 3 || (m[0] != b && m[0] != 1) || (m[1] != t && m[1] != 1) || m[2] != s)
      DTRAIN_THROW(InvalidArgument, "attention: the mask must be ", Shape{b, t, s}.to_string(),
                   " ([batch, queries, keys]; 1 for an axis it is the same along), got ", m.to_string());
  }
  if (!(o.dropout_rate >= 0.0f && o.dropout_rate < 1.0f))
    DTRAIN_THROW(InvalidArgument, "attention: dropout rate must be in [0, 1), got ", o.dropout_rate);
}

void check_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionOptions& o, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv) {
  check_attention(q, k, v, o, out, lse);
  dout.check_dtype(DType::f32, "attention_backward");
  check_same_shape(out, dout, "attention_backward");
  check_same_shape(q, dq, "attention_backward");
  check_same_shape(k, dk, "attention_backward");
  check_same_shape(v, dv, "attention_backward");
}

std::int64_t conv_out(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dilation, std::int64_t pad_b,
                      std::int64_t pad_e) {
  const std::int64_t span = dilation * (k - 1) + 1;
  const std::int64_t padded = in + pad_b + pad_e;
  return padded < span ? 0 : (padded - span) / stride + 1;
}

namespace {

std::string describe(const Conv2dOptions& o) {
  return detail::concat("strides (", o.stride[0], ", ", o.stride[1], "), dilation (", o.dilation[0], ", ",
                        o.dilation[1], "), padding (", o.pad_begin[0], ", ", o.pad_end[0], ", ", o.pad_begin[1], ", ",
                        o.pad_end[1], "), groups ", o.groups);
}

}  // namespace

ConvDims check_conv2d_shapes(const Shape& x, const Shape& k, const Shape& y, const Conv2dOptions& o, const char* op) {
  auto fail = [&](const std::string& why) {
    DTRAIN_THROW(InvalidArgument, op, ": ", why, " (input ", x.to_string(), ", kernel ", k.to_string(), ", output ",
                 y.to_string(), ", ", describe(o), ")");
  };
  if (x.rank() != 4 || k.rank() != 4 || y.rank() != 4)
    fail("expects 4-D input [N, H, W, C], kernel [KH, KW, C / groups, F] and output [N, OH, OW, F]");
  for (int i = 0; i < 2; ++i)
    if (o.stride[i] < 1 || o.dilation[i] < 1 || o.pad_begin[i] < 0 || o.pad_end[i] < 0)
      fail("strides and dilation must be >= 1 and padding >= 0");
  const std::int64_t g = o.groups, n = x[0], c = x[3], f = k[3];
  if (g < 1 || c % g != 0 || f % g != 0) fail("groups must divide the input channels and the filters");
  if (k[2] * g != c) fail("the kernel's third axis must be the input channels / groups");
  if (k[0] < 1 || k[1] < 1) fail("the kernel window must be at least 1x1");
  const std::int64_t oh = conv_out(x[1], k[0], o.stride[0], o.dilation[0], o.pad_begin[0], o.pad_end[0]);
  const std::int64_t ow = conv_out(x[2], k[1], o.stride[1], o.dilation[1], o.pad_begin[1], o.pad_end[1]);
  if (!(y == Shape{n, oh, ow, f})) fail(detail::concat("the output must be [", n, ", ", oh, ", ", ow, ", ", f, "]"));
  return {n, x[1], x[2], c, k[0], k[1], f, oh, ow, g};
}

ConvDims check_conv2d(const Tensor& x, const Tensor& kernel, const Tensor& y, const Conv2dOptions& o) {
  x.check_defined("conv2d");
  kernel.check_defined("conv2d");
  y.check_dtype(DType::f32, "conv2d (output)");
  const ConvDims d = check_conv2d_shapes(x.shape(), kernel.shape(), y.shape(), o, "conv2d");
  if (x.dtype() != kernel.dtype() || !is_floating(x.dtype()))
    DTRAIN_THROW(InvalidArgument, "conv2d: input and kernel must both be float32, both bfloat16 or both float16, got ",
                 dtype_name(x.dtype()), " and ", dtype_name(kernel.dtype()));
  if (o.bias) {
    o.bias->check_dtype(DType::f32, "conv2d (bias)");
    if (!(o.bias->shape() == Shape{kernel.dim(3)}))
      DTRAIN_THROW(InvalidArgument, "conv2d: bias ", o.bias->shape().to_string(), " does not match the kernel's ",
                   kernel.dim(3), " filters");
  }
  return d;
}

ConvDims check_conv2d_backward_data(const Tensor& dy, const Tensor& kernel, const Tensor& dx, const Conv2dOptions& o) {
  dy.check_defined("conv2d_backward_data");
  kernel.check_defined("conv2d_backward_data");
  dx.check_dtype(DType::f32, "conv2d_backward_data (output)");
  const ConvDims d = check_conv2d_shapes(dx.shape(), kernel.shape(), dy.shape(), o, "conv2d_backward_data");
  if (dy.dtype() != kernel.dtype() || !is_floating(dy.dtype()))
    DTRAIN_THROW(InvalidArgument, "conv2d_backward_data: gradient and kernel must be of one floating-point type, got ",
                 dtype_name(dy.dtype()), " and ", dtype_name(kernel.dtype()));
  return d;
}

ConvDims check_conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dkernel, const Tensor* dbias,
                                       const Conv2dOptions& o) {
  x.check_defined("conv2d_backward_weights");
  dy.check_defined("conv2d_backward_weights");
  dkernel.check_dtype(DType::f32, "conv2d_backward_weights (kernel gradient)");
  const ConvDims d = check_conv2d_shapes(x.shape(), dkernel.shape(), dy.shape(), o, "conv2d_backward_weights");
  if (x.dtype() != dy.dtype() || !is_floating(x.dtype()))
    DTRAIN_THROW(InvalidArgument, "conv2d_backward_weights: input and gradient must be of one floating-point type, got ",
                 dtype_name(x.dtype()), " and ", dtype_name(dy.dtype()));
  if (dbias) {
    dbias->check_dtype(DType::f32, "conv2d_backward_weights (bias gradient)");
    if (!(dbias->shape() == Shape{dkernel.dim(3)}))
      DTRAIN_THROW(InvalidArgument, "conv2d_backward_weights: bias gradient ", dbias->shape().to_string(),
                   " does not match the kernel's ", dkernel.dim(3), " filters");
  }
  return d;
}

PoolDims check_pool2d_shapes(const Shape& x, const Shape* y, const Pool2dOptions& o, const char* op) {
  auto where = [&] {
    return detail::concat(" (input ", x.to_string(), y ? ", output " + y->to_string() : std::string(), ", window (",
                          o.window[0], ", ", o.window[1], "), strides (", o.stride[0], ", ", o.stride[1],
                          "), padding (", o.pad_begin[0], ", ", o.pad_end[0], ", ", o.pad_begin[1], ", ", o.pad_end[1],
                          "))");
  };
  if (x.rank() != 4) DTRAIN_THROW(InvalidArgument, op, ": expects a 4-D input [N, H, W, C]", where());
  for (int i = 0; i < 2; ++i)
    if (o.window[i] < 1 || o.stride[i] < 1 || o.pad_begin[i] < 0 || o.pad_end[i] < 0 || o.pad_begin[i] >= o.window[i] ||
        o.pad_end[i] >= o.window[i])
      DTRAIN_THROW(InvalidArgument, op, ": the window and strides must be >= 1 and the padding smaller than the window",
                   where());
  const std::int64_t oh = conv_out(x[1], o.window[0], o.stride[0], 1, o.pad_begin[0], o.pad_end[0]);
  const std::int64_t ow = conv_out(x[2], o.window[1], o.stride[1], 1, o.pad_begin[1], o.pad_end[1]);
  if (oh < 1 || ow < 1) DTRAIN_THROW(InvalidArgument, op, ": the window is larger than the padded image", where());
  if (y && !(*y == Shape{x[0], oh, ow, x[3]}))
    DTRAIN_THROW(InvalidArgument, op, ": the output must be [", x[0], ", ", oh, ", ", ow, ", ", x[3], "]", where());
  return {x[0], x[1], x[2], x[3], oh, ow};
}

bool check_copy_block(const Tensor& src, const Block& from, const Tensor& dst, const Block& to, std::int64_t outer,
                      std::int64_t rows, std::int64_t width) {
  src.check_defined("copy_block");
  dst.check_defined("copy_block");
  if (src.dtype() != dst.dtype())
    DTRAIN_THROW(InvalidArgument, "copy_block: source and destination differ in dtype (", dtype_name(src.dtype()),
                 " and ", dtype_name(dst.dtype()), ")");
  if (outer < 0 || rows < 0 || width < 0)
    DTRAIN_THROW(InvalidArgument, "copy_block: a block of [", outer, ", ", rows, ", ", width, "] elements");
  if (outer == 0 || rows == 0 || width == 0) return false;
  auto check = [&](const Tensor& t, const Block& b, const char* which) {
    const std::int64_t last = b.offset + (outer - 1) * b.outer_stride + (rows - 1) * b.row_stride + width;
    if (b.offset < 0 || b.outer_stride < 0 || b.row_stride < 0 || last > t.numel())
      DTRAIN_THROW(InvalidArgument, "copy_block: a [", outer, ", ", rows, ", ", width, "] block at offset ", b.offset,
                   " (strides ", b.outer_stride, ", ", b.row_stride, ") does not fit the ", which, " ",
                   t.shape().to_string());
  };
  check(src, from, "source");
  check(dst, to, "destination");
  return true;
}

}  // namespace dtrain::kernels
