// Rescaling layer: one pass converting and scaling, differentiable for float inputs.
#include "dtrain/nn/rescaling.h"

#include <cmath>

#include "dtrain/autograd/ops.h"

namespace dtrain::nn {

Rescaling::Rescaling(float scale, float offset, std::string name)
    : Layer(std::move(name)), scale_(scale), offset_(offset) {
  if (!std::isfinite(scale) || !std::isfinite(offset))
    fail("scale and offset must be finite, got " + std::to_string(scale) + " and " + std::to_string(offset));
}

Tensor Rescaling::call(const Tensor& x, bool /*training*/) {
  if (x.dtype() != DType::f32 && x.dtype() != DType::u8)
    fail("expects float32 or uint8 inputs, got " + std::string(dtype_name(x.dtype())));
  return rescale(x, scale_, offset_);
}

}  // namespace dtrain::nn
