// Helpers shared by the op_*.cpp files (private to autograd).
#pragma once

#include <array>

#include "dtrain/autograd/ops.h"

namespace dtrain::detail {

inline kernels::Backend& backend_of(const Tensor& t) { return kernels::backend(t.device()); }

// A new tensor of `shape` (float32 unless given) on `like`'s device: an op's outputs live
// where its inputs do.
inline Tensor empty_on(const Tensor& like, const Shape& shape, DType dtype = DType::f32) {
  return Tensor::empty(shape, dtype, like.device());
}

// Records `backward` for `output` if a live tape watches one of `inputs`. The backward
// function is only built (capturing tensors) when something records.
template <typename MakeBackward, typename... Inputs>
void record(const Tensor& output, MakeBackward&& make_backward, const Inputs&... inputs) {
  const std::array<const Tensor*, sizeof...(Inputs)> ins{(inputs.defined() ? &inputs : nullptr)...};
  if (!GradientTape::should_record(ins)) return;
  GradientTape::record(ins, output, make_backward());
}

// Sums a broadcast gradient back down to `shape` (the identity when shapes agree).
inline Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  Tensor out = empty_on(grad, shape);
  backend_of(grad).reduce(kernels::Reduce::sum, grad, out);
  return out;
}

inline void check_float(const Tensor& x, const char* op) { x.check_dtype(DType::f32, op); }

// The element-wise function of a fused activation (its derivative, backward).
inline kernels::Unary unary_of(Activation a) {
  switch (a) {
    case Activation::relu: return kernels::Unary::relu;
    case Activation::sigmoid: return kernels::Unary::sigmoid;
    case Activation::tanh: return kernels::Unary::tanh;
    case Activation::gelu: return kernels::Unary::gelu;
    case Activation::linear: break;
  }
  return kernels::Unary::linear;
}

// t in `dtype` through the backend's conversion (t itself when it already has that dtype).
inline Tensor converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty_on(t, t.shape(), dtype);
  backend_of(t).convert(t, out);
  return out;
}

}  // namespace dtrain::detail
