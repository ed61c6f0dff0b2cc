#include "dtrain/nn/policy.h"

#include <atomic>

#include "dtrain/core/error.h"

namespace dtrain::nn {
namespace {

std::atomic<bool> g_mixed_bfloat16{false};

}  // namespace

DTypePolicy dtype_policy(std::string_view name) {
  if (name == "float32") return {};
  if (name == "mixed_bfloat16") return {"mixed_bfloat16", DType::bf16, DType::f32};
  DTRAIN_THROW(InvalidArgument, "dtype policy '", name,
               "' is not supported (expected \"float32\" or \"mixed_bfloat16\"; float16 has no fast path on CPUs)");
}

void set_global_policy(std::string_view name) {
  g_mixed_bfloat16.store(dtype_policy(name).compute_dtype == DType::bf16, std::memory_order_relaxed);
}

DTypePolicy global_policy() {
  return dtype_policy(g_mixed_bfloat16.load(std::memory_order_relaxed) ? "mixed_bfloat16" : "float32");
}

}  // namespace dtrain::nn
