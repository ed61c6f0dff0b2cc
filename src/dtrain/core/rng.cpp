// Normal sampling for the counter-based generator.
#include "dtrain/core/rng.h"

#include <atomic>
#include <numbers>

namespace dtrain {

float Generator::normal(float mean, float stddev) {
  // Avoid log(0): u1 in (0, 1].
  const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return mean + stddev * static_cast<float>(z);
}

namespace {
std::atomic<std::uint64_t> g_seed_base{0x5eedull};
std::atomic<std::uint64_t> g_seed_count{0};
}  // namespace

void set_random_seed(std::uint64_t seed) {
  g_seed_base.store(seed);
  g_seed_count.store(0);
}

std::uint64_t next_seed() { return mix64(g_seed_base.load() ^ mix64(g_seed_count.fetch_add(1) + 1)); }

SeedSequence seed_sequence() { return {g_seed_base.load(), g_seed_count.load()}; }

void set_seed_sequence(SeedSequence position) {
  g_seed_base.store(position.seed);
  g_seed_count.store(position.drawn);
}

}  // namespace dtrain
