// Dropout layer.
#include "dtrain/nn/dropout.h"

#include "dtrain/core/device.h"
#include "dtrain/core/error.h"
#include "dtrain/core/replica.h"

namespace dtrain::nn {

Dropout::Dropout(float rate, std::optional<std::uint64_t> seed, std::string name)
    : Layer(std::move(name)), rate_(rate), seed_(seed), generator_(seed ? *seed : next_seed()) {
  if (!(rate >= 0.0f && rate < 1.0f)) fail("rate must be in [0, 1), got " + std::to_string(rate));
}

Generator Dropout::draw(std::uint64_t n) {
  // Before the draw: a step whose capture is refused runs again, kernel by kernel, from
  // the same generator.
  if (capturing_a_graph())
    DTRAIN_THROW(NotCapturable, "its random numbers' seed is drawn on the host at each call, and a CUDA graph "
                 "would replay the first draw");
  const ReplicaContext& replica = replica_context();
  Generator* g = &generator_;
  std::unique_lock lock(replica_mutex_, std::defer_lock);
  if (replica.num_replicas_in_sync > 1) {
    lock.lock();
    // Streams are numbered by the replica's place among all processes' replicas, so every
    // replica of a multi-worker job draws its own masks.
    const auto id = static_cast<std::size_t>(replica.replica_id);
    const auto first = static_cast<std::size_t>(replica.replica_id_in_sync_group - replica.replica_id);
    while (replica_generators_.size() <= id)
      replica_generators_.push_back(generator_.fork(first + replica_generators_.size()));
    g = &replica_generators_[id];
  }
  const Generator now = *g;
  g->advance(n);  // a fresh mask next call
  return now;
}

Tensor Dropout::call(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0f) return x;
  return dropout(x, rate_, draw(static_cast<std::uint64_t>(x.numel())));
}

std::vector<std::uint64_t> Dropout::rng_state() const {
  std::lock_guard lock(replica_mutex_);
  std::vector<std::uint64_t> out{generator_.seed(), generator_.counter(), replica_generators_.size()};
  for (const Generator& g : replica_generators_) out.insert(out.end(), {g.seed(), g.counter()});
  return out;
}

void Dropout::set_rng_state(std::span<const std::uint64_t> state) {
  if (state.size() < 3 || state.size() != 3 + 2 * state[2])
    fail("a saved random-stream state has " + std::to_string(state.size()) + " values, not 3 + 2 per replica stream");
  std::lock_guard lock(replica_mutex_);
  generator_ = Generator(state[0], state[1]);
  replica_generators_.clear();
  for (std::size_t i = 0; i < state[2]; ++i) replica_generators_.emplace_back(state[3 + 2 * i], state[4 + 2 * i]);
}

}  // namespace dtrain::nn
