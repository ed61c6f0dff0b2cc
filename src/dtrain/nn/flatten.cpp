// Flatten layer: a reshape that keeps the batch axis.
#include "dtrain/nn/flatten.h"

namespace dtrain::nn {

Shape Flatten::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() < 1) fail("expects inputs with a batch axis, got a scalar");
  std::int64_t rest = 1;
  for (int i = 1; i < input_shape.rank(); ++i) rest *= input_shape[i];
  return Shape{input_shape[0], rest};
}

Tensor Flatten::call(const Tensor& x, bool /*training*/) { return reshape(x, compute_output_shape(x.shape())); }

}  // namespace dtrain::nn
