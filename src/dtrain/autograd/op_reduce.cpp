// Sums and means over all values or chosen axes. Backward broadcasts the gradient back
// to the input's shape (scaled by 1/count for the mean).
#include <algorithm>

#include "dtrain/autograd/op_util.h"

namespace dtrain {
namespace {

// The input's shape with reduced axes set to 1 (what the kernel writes).
Shape kept_shape(const Shape& in, const std::vector<int>& axes) {
  Shape s = in;
  for (int a : axes) s.set(a, 1);
  return s;
}

std::vector<int> normalized_axes(const Shape& in, std::vector<int> axes, const char* op) {
  for (int& a : axes) {
    try {
      a = in.normalize_axis(a);
    } catch (const InvalidArgument& e) {
      DTRAIN_THROW(InvalidArgument, op, ": ", e.what());
    }
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    DTRAIN_THROW(InvalidArgument, op, ": an axis is repeated in the reduction axes");
  return axes;
}

Tensor reduce_op(const Tensor& x, std::vector<int> axes, bool keepdims, bool mean, const char* op) {
  detail::check_float(x, op);
  axes = normalized_axes(x.shape(), std::move(axes), op);
  const Shape kept = kept_shape(x.shape(), axes);
  Shape out_shape = kept;
  if (!keepdims) {
    std::vector<std::int64_t> dims;
    for (int i = 0; i < x.rank(); ++i)
      if (!std::binary_search(axes.begin(), axes.end(), i)) dims.push_back(x.dim(i));
    out_shape = Shape(dims);
  }
  Tensor y = detail::empty_on(x, kept);
  detail::backend_of(x).reduce(mean ? kernels::Reduce::mean : kernels::Reduce::sum, x, y);
  y = y.reshape(out_shape);
  const std::int64_t count = kept.numel() == 0 ? 0 : x.numel() / kept.numel();

  detail::record(y, [&] {
    return [x_shape = x.shape(), kept, mean, count](const Tensor& dy, BackwardContext& ctx) {
      auto& be = detail::backend_of(dy);
      Tensor g = dy.reshape(kept);
      if (mean) {
        Tensor scaled = detail::empty_on(dy, kept);
        be.axpby(count ? 1.0f / static_cast<float>(count) : 0.0f, g, 0.0f, scaled);
        g = scaled;
      }
      Tensor dx = detail::empty_on(dy, x_shape);
      be.fill(dx, 0.0f);
      be.binary(kernels::Binary::add, dx, g, dx);  // broadcast g over the reduced axes
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

std::vector<int> all_axes(const Tensor& x) {
  std::vector<int> axes(static_cast<size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i) axes[i] = i;
  return axes;
}

}  // namespace

Tensor reduce_sum(const Tensor& x) { return reduce_op(x, all_axes(x), false, false, "reduce_sum"); }
Tensor reduce_mean(const Tensor& x) { return reduce_op(x, all_axes(x), false, true, "reduce_mean"); }
Tensor reduce_sum(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce_op(x, std::move(axes), keepdims, false, "reduce_sum");
}
Tensor reduce_mean(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce_op(x, std::move(axes), keepdims, true, "reduce_mean");
}

}  // namespace dtrain
