// Shape ops. reshape: a view with a new identity; backward reshapes the gradient back.
// concatenate and zero_pad2d: block copies forward, the same blocks copied back out of
// the gradient backward.
#include <vector>

#include "dtrain/autograd/op_util.h"

namespace dtrain {

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = x.reshape(shape);
  detail::record(y, [&] {
    return [x_shape = x.shape()](const Tensor& dy, BackwardContext& ctx) { ctx.add(0, dy.reshape(x_shape)); };
  }, x);
  return y;
}

Tensor concatenate(std::span<const Tensor> xs, int axis) {
  if (xs.empty()) DTRAIN_THROW(InvalidArgument, "concatenate: needs at least one tensor");
  // A recorded op takes at most kMaxInputs inputs: more are joined in groups of that many,
  // then the groups (the same values and gradients, one copy more).
  constexpr auto kAtOnce = static_cast<std::size_t>(GradientTape::kMaxInputs);
  if (xs.size() > kAtOnce) {
    std::vector<Tensor> groups;
    for (std::size_t i = 0; i < xs.size(); i += kAtOnce)
      groups.push_back(i + 1 == xs.size() ? xs[i] : concatenate(xs.subspan(i, std::min(kAtOnce, xs.size() - i)), axis));
    return concatenate(groups, axis);
  }
  const Tensor& first = xs[0];
  first.check_defined("concatenate");
  const int rank = first.rank();
  const int a = axis < 0 ? axis + rank : axis;
  if (rank == 0 || a < 0 || a >= rank)
    DTRAIN_THROW(InvalidArgument, "concatenate: axis ", axis, " is outside tensors of rank ", rank);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    x.check_defined("concatenate");
    if (!(x.device() == first.device()))
      DTRAIN_THROW(InvalidArgument, "concatenate: tensor ", i, " is on ", x.device().to_string(), ", tensor 0 on ",
                   first.device().to_string());
    bool fits = x.rank() == rank && x.dtype() == first.dtype();
    for (int d = 0; fits && d < rank; ++d) fits = d == a || x.dim(d) == first.dim(d);
    if (!fits)
      DTRAIN_THROW(InvalidArgument, "concatenate: tensor ", i, " is ", dtype_name(x.dtype()), " ",
                   x.shape().to_string(), ", tensor 0 ", dtype_name(first.dtype()), " ", first.shape().to_string(),
                   "; all axes but ", a, " must agree");
    total += x.dim(a);
  }
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= first.dim(d);
  for (int d = a + 1; d < rank; ++d) inner *= first.dim(d);
  Tensor y = detail::empty_on(first, first.shape().with_dim(a, total), first.dtype());
  auto& be = detail::backend_of(first);
  std::vector<std::int64_t> begins;
  std::int64_t at = 0;
  for (const Tensor& x : xs) {
    begins.push_back(at);
    const std::int64_t width = x.dim(a) * inner;
    be.copy_block(x, {0, width, 0}, y, {at * inner, total * inner, 0}, outer, 1, width);
    at += x.dim(a);
  }
  std::vector<const Tensor*> inputs;
  for (const Tensor& x : xs) inputs.push_back(&x);
  if (GradientTape::should_record(inputs)) {
    std::vector<Shape> shapes;
    for (const Tensor& x : xs) shapes.push_back(x.shape());
    GradientTape::record(inputs, y, [shapes, begins, a, outer, inner, total](const Tensor& dy, BackwardContext& ctx) {
      auto& b = detail::backend_of(dy);
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        if (!ctx.needs(static_cast<int>(i))) continue;
        Tensor dx = detail::empty_on(dy, shapes[i], dy.dtype());
        const std::int64_t width = shapes[i][a] * inner;
        b.copy_block(dy, {begins[i] * inner, total * inner, 0}, dx, {0, width, 0}, outer, 1, width);
        ctx.add(static_cast<int>(i), dx);
      }
    });
  }
  return y;
}

Tensor zero_pad2d(const Tensor& x, std::int64_t top, std::int64_t bottom, std::int64_t left, std::int64_t right) {
  x.check_defined("zero_pad2d");
  if (x.rank() != 4)
    DTRAIN_THROW(InvalidArgument, "zero_pad2d: expects images [N, H, W, C], got ", x.shape().to_string());
  if (top < 0 || bottom < 0 || left < 0 || right < 0)
    DTRAIN_THROW(InvalidArgument, "zero_pad2d: padding must be >= 0, got (", top, ", ", bottom, ", ", left, ", ",
                 right, ")");
  const std::int64_t n = x.dim(0), h = x.dim(1), w = x.dim(2), c = x.dim(3);
  const std::int64_t ph = h + top + bottom, pw = w + left + right;
  Tensor y = Tensor::zeros({n, ph, pw, c}, x.dtype(), x.device());
  const kernels::Block image{0, h * w * c, w * c};
  const kernels::Block padded{(top * pw + left) * c, ph * pw * c, pw * c};
  detail::backend_of(x).copy_block(x, image, y, padded, n, h, w * c);
  detail::record(y, [&] {
    return [shape = x.shape(), image, padded, n, h, w, c](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = detail::empty_on(dy, shape, dy.dtype());
      detail::backend_of(dy).copy_block(dy, padded, dx, image, n, h, w * c);
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

}  // namespace dtrain
