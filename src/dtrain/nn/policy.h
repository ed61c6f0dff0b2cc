// Dtype policies, as keras.mixed_precision: a policy names the dtype a layer computes in
// and the dtype its variables are stored in. "mixed_bfloat16" and "mixed_float16" keep
// variables, outputs and gradients in float32 and run the matmuls and convolutions on
// 16-bit copies of their inputs (accumulating in float32): CPUs with AVX512-BF16 or AMX
// run bfloat16 about twice as fast, and a GPU's tensor cores run both. float16 keeps 10
// mantissa bits but only 5 exponent bits: a gradient under 2^-24 becomes 0 in it, so
// compile() trains "mixed_float16" with dynamic loss scaling (optim::LossScale).
#pragma once

#include <string>
#include <string_view>

#include "dtrain/core/dtype.h"

namespace dtrain::nn {

struct DTypePolicy {
  std::string name = "float32";
  DType compute_dtype = DType::f32;
  DType variable_dtype = DType::f32;
};

// "float32", "mixed_bfloat16" or "mixed_float16"; anything else is InvalidArgument naming it.
DTypePolicy dtype_policy(std::string_view name);
// The policy layers take when they are created (keras.mixed_precision.set_global_policy).
void set_global_policy(std::string_view name);
DTypePolicy global_policy();

// Sets the global policy for a scope and puts the previous one back when it ends.
class ScopedGlobalPolicy {
 public:
  explicit ScopedGlobalPolicy(std::string_view name) : previous_(global_policy().name) { set_global_policy(name); }
  ~ScopedGlobalPolicy() { set_global_policy(previous_); }
  ScopedGlobalPolicy(const ScopedGlobalPolicy&) = delete;
  ScopedGlobalPolicy& operator=(const ScopedGlobalPolicy&) = delete;

 private:
  std::string previous_;
};

}  // namespace dtrain::nn
