// Element-wise arithmetic with NumPy broadcasting. Backward sums each gradient back
// down to its input's shape over the broadcast axes.
#include "dtrain/autograd/op_util.h"

namespace dtrain {
namespace {

Tensor binary_forward(kernels::Binary op, const Tensor& a, const Tensor& b, const char* name) {
  detail::check_float(a, name);
  detail::check_float(b, name);
  Tensor c = detail::empty_on(a, broadcast_shapes(a.shape(), b.shape(), name));
  detail::backend_of(a).binary(op, a, b, c);
  return c;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor c = binary_forward(kernels::Binary::add, a, b, "add");
  detail::record(c, [&] {
    return [sa = a.shape(), sb = b.shape()](const Tensor& dc, BackwardContext& ctx) {
      if (ctx.needs(0)) ctx.add(0, detail::sum_to_shape(dc, sa));
      if (ctx.needs(1)) ctx.add(1, detail::sum_to_shape(dc, sb));
    };
  }, a, b);
  return c;
}

Tensor add_n(std::span<const Tensor> xs) {
  if (xs.empty()) DTRAIN_THROW(InvalidArgument, "add_n: needs at least one tensor");
  for (std::size_t i = 1; i < xs.size(); ++i)
    if (!(xs[i].shape() == xs[0].shape()))
      DTRAIN_THROW(InvalidArgument, "add_n: tensor ", i, " is ", xs[i].shape().to_string(), ", tensor 0 ",
                   xs[0].shape().to_string(), "; add_n adds tensors of one shape");
  Tensor total = xs[0];
  for (std::size_t i = 1; i < xs.size(); ++i) total = add(total, xs[i]);
  return total;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor c = binary_forward(kernels::Binary::sub, a, b, "sub");
  detail::record(c, [&] {
    return [sa = a.shape(), sb = b.shape()](const Tensor& dc, BackwardContext& ctx) {
      if (ctx.needs(0)) ctx.add(0, detail::sum_to_shape(dc, sa));
      if (ctx.needs(1)) {
        Tensor neg = detail::empty_on(dc, dc.shape());
        detail::backend_of(dc).axpby(-1.0f, dc, 0.0f, neg);
        ctx.add(1, detail::sum_to_shape(neg, sb));
      }
    };
  }, a, b);
  return c;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor c = binary_forward(kernels::Binary::mul, a, b, "mul");
  detail::record(c, [&] {
    return [a, b](const Tensor& dc, BackwardContext& ctx) {
      auto& be = detail::backend_of(dc);
      if (ctx.needs(0)) {  // da = dc * b
        Tensor t = detail::empty_on(dc, dc.shape());
        be.binary(kernels::Binary::mul, dc, b, t);
        ctx.add(0, detail::sum_to_shape(t, a.shape()));
      }
      if (ctx.needs(1)) {  // db = dc * a
        Tensor t = detail::empty_on(dc, dc.shape());
        be.binary(kernels::Binary::mul, dc, a, t);
        ctx.add(1, detail::sum_to_shape(t, b.shape()));
      }
    };
  }, a, b);
  return c;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor c = binary_forward(kernels::Binary::div, a, b, "div");
  detail::record(c, [&] {
    return [a, b, c](const Tensor& dc, BackwardContext& ctx) {
      auto& be = detail::backend_of(dc);
      Tensor t = detail::empty_on(dc, dc.shape());
      be.binary(kernels::Binary::div, dc, b, t);  // dc / b
      if (ctx.needs(0)) ctx.add(0, detail::sum_to_shape(t, a.shape()));
      if (ctx.needs(1)) {  // db = -(dc / b) * c, since c = a / b
        Tensor u = detail::empty_on(dc, dc.shape());
        be.binary(kernels::Binary::mul, t, c, u);
        be.axpby(-1.0f, u, 0.0f, u);
        ctx.add(1, detail::sum_to_shape(u, b.shape()));
      }
    };
  }, a, b);
  return c;
}

Tensor affine(const Tensor& x, float alpha, float beta) {
  detail::check_float(x, "affine");
  Tensor y = detail::empty_on(x, x.shape());
  detail::backend_of(x).unary(kernels::Unary::linear, x, y, alpha, beta);
  detail::record(y, [&] {
    return [alpha](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, dy.shape());
      detail::backend_of(dy).axpby(alpha, dy, 0.0f, dx);
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

Tensor rescale(const Tensor& x, float scale, float offset) {
  x.check_defined("rescale");
  if (x.dtype() != DType::u8) return affine(x, scale, offset);
  Tensor y = detail::empty_on(x, x.shape());
  detail::backend_of(x).unary(kernels::Unary::linear, x, y, scale, offset);
  return y;
}

Tensor stop_gradient(const Tensor& x) {
  x.check_defined("stop_gradient");
  return x.reshape(x.shape());  // a new identity over the same values, never recorded
}

}  // namespace dtrain
