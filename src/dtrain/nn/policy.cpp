#include "dtrain/nn/policy.h"

#include <atomic>

#include "dtrain/core/error.h"

namespace dtrain::nn {
namespace {

// The global policy's compute dtype (its variables are float32 under every policy).
std::atomic<DType> g_compute{DType::f32};

}  // namespace

DTypePolicy dtype_policy(std::string_view name) {
  if (name == "float32") return {};
  if (name == "mixed_bfloat16") return {"mixed_bfloat16", DType::bf16, DType::f32};
  if (name == "mixed_float16") return {"mixed_float16", DType::f16, DType::f32};
  DTRAIN_THROW(InvalidArgument, "dtype policy '", name,
               "' is not supported (expected \"float32\", \"mixed_bfloat16\" or \"mixed_float16\")");
}

void set_global_policy(std::string_view name) {
  g_compute.store(dtype_policy(name).compute_dtype, std::memory_order_relaxed);
}

DTypePolicy global_policy() {
  switch (g_compute.load(std::memory_order_relaxed)) {
    case DType::bf16: return dtype_policy("mixed_bfloat16");
    case DType::f16: return dtype_policy("mixed_float16");
    default: return {};
  }
}

}  // namespace dtrain::nn
