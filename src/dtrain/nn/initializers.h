// Weight initializers with Keras's names and formulas. fan_in/fan_out are a kernel's
// first and second extents.
#pragma once

#include <string>

#include "dtrain/core/rng.h"
#include "dtrain/core/tensor.h"

namespace dtrain::nn {

// "glorot_uniform" (Keras's Dense default), "glorot_normal", "he_uniform", "he_normal",
// "zeros", "ones", and "random_normal", "random_uniform", "truncated_normal" with Keras's
// defaults (stddev 0.05, limits ±0.05). An unknown name is an InvalidArgument listing these.
Tensor initialize(const std::string& initializer, const Shape& shape, Generator& generator);
void check_initializer_name(const std::string& initializer);

}  // namespace dtrain::nn
