// A counter-based random generator: value i of a stream is a pure function of
// (seed, counter + i), so parallel loops draw the same numbers whatever the thread count,
// and the whole state is two integers that a checkpoint can save.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace dtrain {

// SplitMix64 finaliser: a bijective mix with good avalanche, used as the counter hash.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a of a string: a hash that is the same on every host and build (unlike
// std::hash), for comparing what several processes hold.
constexpr std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0, std::uint64_t counter = 0)
      : seed_(seed), counter_(counter) {}

  std::uint64_t seed() const { return seed_; }
  std::uint64_t counter() const { return counter_; }

  // The i-th 64 random bits after the current position, without advancing.
  std::uint64_t bits_at(std::uint64_t i) const { return mix64(mix64(seed_) ^ (counter_ + i)); }
  // Uniform in [0, 1) with 24 bits, from bits_at(i).
  float uniform_at(std::uint64_t i) const {
    return static_cast<float>(bits_at(i) >> 40) * (1.0f / 16777216.0f);
  }
  void advance(std::uint64_t n) { counter_ += n; }

  std::uint64_t next_u64() {
    const std::uint64_t v = bits_at(0);
    ++counter_;
    return v;
  }
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal by Box-Muller (one of the pair is used; simplicity over speed).
  float normal(float mean = 0.0f, float stddev = 1.0f);
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next_u64() % n; }

  // An independent generator for a named sub-stream (a layer, a replica).
  Generator fork(std::uint64_t stream) const { return Generator(mix64(seed_ ^ mix64(stream + 1))); }

 private:
  std::uint64_t seed_;
  std::uint64_t counter_;
};

// Keras's tf.keras.utils.set_random_seed: layers built without an explicit seed draw
// theirs from this sequence, so a program that sets it builds the same weights every run.
void set_random_seed(std::uint64_t seed);
// The next seed of that sequence (thread-safe).
std::uint64_t next_seed();
// Where that sequence stands: the seed it was set to and how many seeds were drawn since.
// MultiWorkerMirroredStrategy gives every worker the chief's position without drawing
// from it, so the chief's weights are those one process would build from the same seed.
struct SeedSequence {
  std::uint64_t seed = 0;
  std::uint64_t drawn = 0;
};
SeedSequence seed_sequence();
void set_seed_sequence(SeedSequence position);

}  // namespace dtrain
