// dense: y = act(x · W + b) in one oneDNN pass (bias and activation as post-ops).
// x[R, In] (leading axes folded into R), W[In, Out], b[Out] -> y[R, Out].
// Backward keeps x, W and y (or the pre-activation z for gelu, whose derivative needs it):
//   dz = dy ⊙ act'(.),  dW = xᵀ · dz,  db = Σ_rows dz,  dx = dz · Wᵀ (only when x needs it,
//   which the first layer's input never does).
#include "dtrain/autograd/dense_together.h"
#include "dtrain/autograd/op_util.h"

namespace dtrain {
namespace {

thread_local DenseGradientsTogether* together_ = nullptr;

}  // namespace

DenseGradientsTogether* dense_gradients_together() { return together_; }

ScopedDenseGradientsTogether::ScopedDenseGradientsTogether(DenseGradientsTogether* together)
    : ScopedAssign(together_, together) {}

Tensor dense(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation activation, DType compute) {
  detail::check_float(x, "dense");
  detail::check_float(kernel, "dense (kernel)");
  if (kernel.rank() != 2 || x.rank() < 1 || x.dim(-1) != kernel.dim(0))
    DTRAIN_THROW(InvalidArgument, "dense: input ", x.shape().to_string(), " does not match kernel ",
                 kernel.shape().to_string(), " (the input's last axis must equal the kernel's first)");
  const std::int64_t in = kernel.dim(0), out = kernel.dim(1);
  if (bias.defined() && !(bias.shape() == Shape{out}))
    DTRAIN_THROW(InvalidArgument, "dense: bias ", bias.shape().to_string(), " does not match kernel ",
                 kernel.shape().to_string(), " (expected [", out, "])");
  const std::int64_t rows = in == 0 ? x.numel() : x.numel() / in;
  const Tensor x2 = x.reshape({rows, in});
  Shape out_shape = x.shape();
  out_shape.set(-1, out);

  if (!is_floating(compute))
    DTRAIN_THROW(InvalidArgument, "dense: compute dtype must be float32, bfloat16 or float16, got ", dtype_name(compute));

  auto& be = detail::backend_of(x);
  // Mixed precision: the matmuls read 16-bit copies of x and the kernel (and, backward,
  // of dz) and accumulate in float32; outputs, gradients and the variables stay float32.
  const Tensor xc = detail::converted(x2, compute), kc = detail::converted(kernel, compute);
  // gelu's derivative needs its input, so it runs as a second pass over z.
  const bool fused = activation != Activation::gelu;
  Tensor z = detail::empty_on(x, {rows, out});
  be.matmul(xc, kc, z, {.bias = bias.defined() ? &bias : nullptr, .activation = fused ? activation : Activation::linear});
  Tensor y2 = z;
  if (!fused) {
    y2 = detail::empty_on(x, {rows, out});
    be.unary(kernels::Unary::gelu, z, y2);
  }
  Tensor y = y2.reshape(out_shape);

  detail::record(y, [&] {
    // For fused activations z *is* the output, which is what their derivatives read.
    return [xc, kc, z, activation, x_shape = x.shape()](const Tensor& dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(dy);
      const Tensor dy2 = dy.reshape(z.shape());
      Tensor dz = dy2;
      if (activation != Activation::linear) {
        dz = detail::empty_on(dy, z.shape());
        b.unary_backward(detail::unary_of(activation), z, dy2, dz);
      }
      // Under a strategy whose replicas share the weights, the weight gradients of every
      // replica's rows at once (dense_together.h).
      DenseGradientsTogether* together = together_;
      const bool with_others = ctx.needs(1) && together != nullptr && together->takes(kc);
      Tensor dw_all, db_all;
      if (with_others) {
        together->gradients(kc, xc, dz, dw_all, db_all);
        ctx.add(1, dw_all);
      }
      if (ctx.needs(2)) {
        if (!db_all.defined()) {
          db_all = detail::empty_on(dy, {kc.dim(1)});
          b.reduce(kernels::Reduce::sum, dz, db_all);
        }
        ctx.add(2, db_all);
      }
      const bool own_dw = ctx.needs(1) && !with_others;
      const Tensor dzc = ctx.needs(0) || own_dw ? detail::converted(dz, kc.dtype()) : Tensor();
      if (own_dw) {
        Tensor dw = detail::empty_on(dy, kc.shape());
        b.matmul(xc, dzc, dw, {.transpose_a = true});
        ctx.add(1, dw);
      }
      if (ctx.needs(0)) {
        Tensor dx = detail::empty_on(dy, xc.shape());
        b.matmul(dzc, kc, dx, {.transpose_b = true});
        ctx.add(0, dx.reshape(x_shape));
      }
    };
  }, x, kernel, bias);
  return y;
}

}  // namespace dtrain
