// Dropout: zeroes a `rate` share of values while training and scales the rest by
// 1/(1-rate); the identity at inference (tf.keras.layers.Dropout). Masks come from a
// seeded counter-based stream, so a seed fixes them whatever the thread count. Under a
// strategy each replica draws from its own sub-stream of the layer's generator, so
// replicas get different masks and a seed still fixes them all.
#pragma once

#include <deque>
#include <mutex>
#include <optional>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

class Dropout : public Layer {
 public:
  explicit Dropout(float rate, std::optional<std::uint64_t> seed = std::nullopt, std::string name = "dropout");
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  std::string class_name() const override { return "Dropout"; }
  bool supports_masking() const override { return true; }  // the mask passes through
  float rate() const { return rate_; }
  // The seed given at construction (unset: drawn from set_random_seed's sequence).
  std::optional<std::uint64_t> seed() const { return seed_; }
  // The generator's position: a checkpoint saves it to resume the same masks.
  Generator& generator() { return generator_; }
  // The stream for a mask of `n` values drawn now (this replica's own under a strategy),
  // as it stands before the draw; the stream moves past them. Layers that drop inside
  // their own kernels (attention's weights) draw their masks so.
  Generator draw(std::uint64_t n);
  // [seed, counter] of the layer's generator, the number of replica streams, then each
  // one's [seed, counter].
  std::vector<std::uint64_t> rng_state() const override;
  void set_rng_state(std::span<const std::uint64_t> state) override;

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  float rate_;
  std::optional<std::uint64_t> seed_;
  Generator generator_;
  mutable std::mutex replica_mutex_;  // guards replica_generators_'s growth
  std::deque<Generator> replica_generators_;  // [replica id]; deque: references stay valid as it grows
};

}  // namespace dtrain::nn
