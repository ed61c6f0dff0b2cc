// conv2d: y = act(conv(x, K) + b) in one oneDNN pass (bias and activation fused).
// Backward keeps x, K and y (the activations fused here have derivatives that read y):
//   dz = dy ⊙ act'(y),  dK and db from conv2d_backward_weights(x, dz),  dx from
//   conv2d_backward_data(dz, K) (only when x needs it, which an image input never does).
// pool2d: max pooling keeps oneDNN's record of where each maximum was; average pooling
// needs nothing but the shapes.
#include "dtrain/autograd/op_util.h"

namespace dtrain {
namespace {

Shape conv_output_shape(const Tensor& x, const Tensor& kernel, const Conv2dOptions& o) {
  if (x.rank() != 4 || kernel.rank() != 4)
    DTRAIN_THROW(InvalidArgument, "conv2d: expects images [N, H, W, C] and a kernel [KH, KW, C / groups, F], got ",
                 x.shape().to_string(), " and ", kernel.shape().to_string());
  std::int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const std::int64_t span = o.dilation[i] * (kernel.dim(i) - 1) + 1;
    const std::int64_t padded = x.dim(1 + i) + o.pad_begin[i] + o.pad_end[i];
    if (o.stride[i] < 1 || o.dilation[i] < 1 || kernel.dim(i) < 1)
      DTRAIN_THROW(InvalidArgument, "conv2d: strides, dilation and the kernel window must be >= 1");
    if (padded < span)
      DTRAIN_THROW(InvalidArgument, "conv2d: the kernel ", kernel.shape().to_string(), " (dilation ", o.dilation[i],
                   ") spans ", span, " pixels along ", i == 0 ? "H" : "W", ", more than the padded input's ", padded,
                   " (input ", x.shape().to_string(), ")");
    out[i] = (padded - span) / o.stride[i] + 1;
  }
  return {x.dim(0), out[0], out[1], kernel.dim(3)};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Conv2dOptions& options, DType compute) {
  detail::check_float(x, "conv2d");
  detail::check_float(kernel, "conv2d (kernel)");
  if (!is_floating(compute))
    DTRAIN_THROW(InvalidArgument, "conv2d: compute dtype must be float32, bfloat16 or float16, got ", dtype_name(compute));
  const Shape out_shape = conv_output_shape(x, kernel, options);
  Conv2dOptions o = options;
  o.bias = bias.defined() ? &bias : nullptr;
  // gelu's derivative needs its input, so it runs as a second pass over z.
  const bool fused = o.activation != Activation::gelu;
  const Activation activation = o.activation;
  if (!fused) o.activation = Activation::linear;
  auto& be = detail::backend_of(x);
  const Tensor xc = detail::converted(x, compute), kc = detail::converted(kernel, compute);
  Tensor z = detail::empty_on(x, out_shape);
  be.conv2d(xc, kc, z, o);
  Tensor y = z;
  if (!fused) {
    y = detail::empty_on(x, out_shape);
    be.unary(kernels::Unary::gelu, z, y);
  }
  o.bias = nullptr;
  o.activation = Activation::linear;
  detail::record(y, [&] {
    return [xc, kc, z, activation, o](const Tensor& dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(dy);
      Tensor dz = dy;
      if (activation != Activation::linear) {
        dz = detail::empty_on(dy, z.shape());
        b.unary_backward(detail::unary_of(activation), z, dy, dz);
      }
      const Tensor dzc = detail::converted(dz, kc.dtype());
      if (ctx.needs(1) || ctx.needs(2)) {
        Tensor dk = detail::empty_on(dy, kc.shape());
        Tensor db = ctx.needs(2) ? detail::empty_on(dy, {kc.dim(3)}) : Tensor();
        b.conv2d_backward_weights(xc, dzc, dk, ctx.needs(2) ? &db : nullptr, o);
        if (ctx.needs(1)) ctx.add(1, dk);
        if (ctx.needs(2)) ctx.add(2, db);
      }
      if (ctx.needs(0)) {
        Tensor dx = detail::empty_on(dy, xc.shape());
        b.conv2d_backward_data(dzc, kc, dx, o);
        ctx.add(0, dx);
      }
    };
  }, x, kernel, bias);
  return y;
}

Tensor pool2d(const Tensor& x, const Pool2dOptions& o) {
  detail::check_float(x, "pool2d");
  if (x.rank() != 4) DTRAIN_THROW(InvalidArgument, "pool2d: expects images [N, H, W, C], got ", x.shape().to_string());
  std::int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const std::int64_t padded = x.dim(1 + i) + o.pad_begin[i] + o.pad_end[i];
    if (o.window[i] < 1 || o.stride[i] < 1)
      DTRAIN_THROW(InvalidArgument, "pool2d: the window and strides must be >= 1");
    if (padded < o.window[i])
      DTRAIN_THROW(InvalidArgument, "pool2d: the window (", o.window[0], ", ", o.window[1],
                   ") is larger than the padded input ", x.shape().to_string());
    out[i] = (padded - o.window[i]) / o.stride[i] + 1;
  }
  auto& be = detail::backend_of(x);
  Tensor y = detail::empty_on(x, {x.dim(0), out[0], out[1], x.dim(3)});
  const std::array<const Tensor*, 1> inputs{&x};
  const bool recording = GradientTape::should_record(inputs);
  Tensor workspace;
  if (recording && o.kind == kernels::Pool::max)
    workspace = detail::empty_on(x, {static_cast<std::int64_t>(be.pool2d_workspace_bytes(x.shape(), o))}, DType::u8);
  be.pool2d(x, y, workspace.defined() ? &workspace : nullptr, o);
  if (recording) {
    GradientTape::record(inputs, y, [workspace, o, shape = x.shape()](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, shape);
      detail::backend_of(dy).pool2d_backward(dy, workspace.defined() ? &workspace : nullptr, dx, o);
      ctx.add(0, dx);
    });
  }
  return y;
}

}  // namespace dtrain
