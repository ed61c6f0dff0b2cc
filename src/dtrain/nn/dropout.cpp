// Dropout layer.
#include "dtrain/nn/dropout.h"

#include "dtrain/core/replica.h"

namespace dtrain::nn {

Dropout::Dropout(float rate, std::optional<std::uint64_t> seed, std::string name)
    : Layer(std::move(name)), rate_(rate), seed_(seed), generator_(seed ? *seed : next_seed()) {
  if (!(rate >= 0.0f && rate < 1.0f)) fail("rate must be in [0, 1), got " + std::to_string(rate));
}

Tensor Dropout::call(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0f) return x;
  const ReplicaContext& replica = replica_context();
  Generator* g = &generator_;
  if (replica.num_replicas > 1) {
    std::lock_guard lock(replica_mutex_);
    const auto id = static_cast<std::size_t>(replica.replica_id);
    while (replica_generators_.size() <= id)
      replica_generators_.push_back(generator_.fork(replica_generators_.size()));
    g = &replica_generators_[id];
  }
  Tensor y = dropout(x, rate_, *g);
  g->advance(static_cast<std::uint64_t>(x.numel()));  // fresh mask next call
  return y;
}

}  // namespace dtrain::nn
