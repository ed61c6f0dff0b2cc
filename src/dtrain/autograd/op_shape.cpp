// reshape: a view with a new identity; backward reshapes the gradient back.
#include "dtrain/autograd/op_util.h"

namespace dtrain {

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = x.reshape(shape);
  detail::record(y, [&] {
    return [x_shape = x.shape()](const Tensor& dy, BackwardContext& ctx) { ctx.add(0, dy.reshape(x_shape)); };
  }, x);
  return y;
}

}  // namespace dtrain
