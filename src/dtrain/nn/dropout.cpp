// Dropout layer.
#include "dtrain/nn/dropout.h"

namespace dtrain::nn {

Dropout::Dropout(float rate, std::optional<std::uint64_t> seed, std::string name)
    : Layer(std::move(name)), rate_(rate), seed_(seed), generator_(seed ? *seed : next_seed()) {
  if (!(rate >= 0.0f && rate < 1.0f)) fail("rate must be in [0, 1), got " + std::to_string(rate));
}

Tensor Dropout::call(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0f) return x;
  Tensor y = dropout(x, rate_, generator_);
  generator_.advance(static_cast<std::uint64_t>(x.numel()));  // fresh mask next call
  return y;
}

}  // namespace dtrain::nn
