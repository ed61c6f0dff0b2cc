#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/core/rng.h"

namespace dtrain {

TEST(Generator, SameSeedSameStream) {
  Generator a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const auto x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differs |= x != c.next_u64();
  }
  EXPECT_TRUE(differs);
}

TEST(Generator, IndexedDrawsMatchSequentialOnes) {
  Generator a(3);
  const Generator frozen = a;
  for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(frozen.bits_at(i), a.next_u64());
}

TEST(Generator, UniformAndNormalMoments) {
  Generator g(11);
  double s = 0, s2 = 0, n1 = 0, n2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = g.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    s += u;
    s2 += u * u;
    const float z = g.normal();
    n1 += z;
    n2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.5, 0.01);
  EXPECT_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.005);
  EXPECT_NEAR(n1 / n, 0.0, 0.01);
  EXPECT_NEAR(n2 / n, 1.0, 0.02);
}

TEST(Generator, SeedSequenceRestarts) {
  set_random_seed(42);
  const auto a = next_seed(), b = next_seed();
  set_random_seed(42);
  EXPECT_EQ(next_seed(), a);
  EXPECT_EQ(next_seed(), b);
  EXPECT_NE(a, b);
}

}  // namespace dtrain
