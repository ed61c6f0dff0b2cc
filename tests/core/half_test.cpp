#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtrain/core/half.h"
#include "dtrain/core/rng.h"

namespace dtrain {
namespace {

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The half nearest to a finite float, ties to the even pattern, found by bisection over
// the ordered positive halves and compared in double: an independent reference.
std::uint16_t nearest_half(float f) {
  const double x = std::fabs(static_cast<double>(f));
  const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  if (x >= 65520.0) return sign | 0x7c00u;
  std::uint32_t lo = 0, hi = 0x7bffu;  // from_f16(lo) <= x
  if (x >= 65504.0) return sign | 0x7bffu;
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (static_cast<double>(from_f16(static_cast<std::uint16_t>(mid))) <= x) lo = mid;
    else hi = mid;
  }
  const double below = from_f16(static_cast<std::uint16_t>(lo)), above = from_f16(static_cast<std::uint16_t>(hi));
  std::uint32_t pick = x - below < above - x ? lo : above - x < x - below ? hi : (lo % 2 == 0 ? lo : hi);
  if (below == x) pick = lo;
  return static_cast<std::uint16_t>(sign | pick);
}

TEST(Half, EveryHalfComesBackThroughFloat) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto pattern = static_cast<std::uint16_t>(h);
    const float f = from_f16(pattern);
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    ASSERT_EQ(std::isnan(f), nan) << std::hex << h;
    // A NaN comes back quiet, its sign and upper payload kept.
    ASSERT_EQ(to_f16(f), nan ? (pattern | 0x200u) : pattern) << std::hex << h;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(to_f16(1.0f), 0x3c00u);
  EXPECT_EQ(to_f16(-2.0f), 0xc000u);
  EXPECT_EQ(to_f16(-0.0f), 0x8000u);
  EXPECT_EQ(to_f16(65504.0f), 0x7bffu);
  EXPECT_EQ(to_f16(65519.99f), 0x7bffu);
  EXPECT_EQ(to_f16(65520.0f), 0x7c00u);  // the tie past the largest half goes to infinity
  EXPECT_EQ(to_f16(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_EQ(to_f16(0x1p-24f), 0x0001u);
  EXPECT_EQ(to_f16(0x1p-25f), 0x0000u);  // a tie between zero and the smallest subnormal
  EXPECT_EQ(to_f16(0x1.000002p-25f), 0x0001u);
  EXPECT_EQ(to_f16(0x1.8p-24f), 0x0002u);  // 1.5 subnormal steps: the tie goes to the even 2
  EXPECT_EQ(to_f16(0x1.ff8p-15f), 0x03ffu);  // the largest subnormal
  EXPECT_EQ(to_f16(0x1.ffcp-15f), 0x0400u);  // a tie past it: up to the smallest normal
  EXPECT_EQ(to_f16(1.0f + 0x1p-11f), 0x3c00u);        // a tie: stays at even 1.0
  EXPECT_EQ(to_f16(1.0f + 3 * 0x1p-11f), 0x3c02u);    // a tie: goes up to even
  EXPECT_EQ(to_f16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_TRUE(std::isnan(from_f16(to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(from_f16(0x0001u), 0x1p-24f);
  EXPECT_EQ(from_f16(0x7bffu), 65504.0f);
}

TEST(Half, RoundsToTheNearestHalfTiesToEven) {
  Generator g(5);
  for (int i = 0; i < 300000; ++i) {
    // Magnitudes over the whole range a half covers and somewhat past it.
    const auto bits = static_cast<std::uint32_t>(g.next_u64());
    const std::uint32_t exponent = 98u + static_cast<std::uint32_t>(g.next_u64() % 48u);  // 2^-29 .. 2^17
    const float f = float_of((bits & 0x807fffffu) | (exponent << 23));
    ASSERT_EQ(to_f16(f), nearest_half(f)) << f;
  }
}

TEST(Half, ArraysAgreeWithTheScalarConversions) {
  // Any bit patterns (NaNs, infinities, subnormals of both), a length that leaves a tail.
  Generator g(9);
  const std::size_t n = 100003;
  std::vector<float> x(n);
  std::vector<std::uint16_t> h(n), acc(n), in(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = float_of(static_cast<std::uint32_t>(g.next_u64()));
    if (i % 3 == 0) x[i] = static_cast<float>(g.normal() * 1000.0);
    acc[i] = static_cast<std::uint16_t>(g.next_u64());
    in[i] = static_cast<std::uint16_t>(g.next_u64());
  }
  to_f16(x.data(), h.data(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], to_f16(x[i])) << "element " << i << " of " << x[i];
  std::vector<float> back(n);
  from_f16(h.data(), back.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const float want = from_f16(h[i]);
    ASSERT_TRUE(std::memcmp(&back[i], &want, sizeof want) == 0) << "element " << i;
  }
  auto sums = acc;
  add_f16(sums.data(), in.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t want = to_f16(from_f16(acc[i]) + from_f16(in[i]));
    if (std::isnan(from_f16(want))) ASSERT_TRUE(std::isnan(from_f16(sums[i]))) << "element " << i;  // either payload
    else ASSERT_EQ(sums[i], want) << "element " << i;
  }
  if (!f16c_in_use()) GTEST_SKIP() << "this CPU has no F16C: the arrays took the scalar path";
}

}  // namespace
}  // namespace dtrain
