#include <gtest/gtest.h>

#include "dtrain/core/error.h"
#include "dtrain/core/shape.h"

namespace dtrain {

TEST(Shape, RankNumelAndStrides) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  auto st = s.strides();
  EXPECT_EQ(st[0], 12);
  EXPECT_EQ(st[1], 4);
  EXPECT_EQ(st[2], 1);
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar holds one value
  EXPECT_EQ(s.to_string(), "[2, 3, 4]");
}

TEST(Shape, TrailingOneIsNotSqueezed) {
  EXPECT_FALSE(Shape({3, 1}) == Shape({3}));
  EXPECT_TRUE(Shape({3, 1}) == Shape({3, 1}));
}

TEST(Shape, BadAxisNamesAxisAndRank) {
  Shape s{2, 3};
  EXPECT_EQ(s[-1], 3);
  try {
    (void)s[2];
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("axis 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)s[-3], InvalidArgument);
  EXPECT_THROW(Shape({2, -1}), InvalidArgument);
}

TEST(Shape, ElementCountOverflowIsAnError) {
  EXPECT_THROW(Shape({std::int64_t{1} << 40, std::int64_t{1} << 40}), InvalidArgument);
  Shape s{2, 2};
  EXPECT_THROW(s.set(0, std::int64_t{1} << 62), InvalidArgument);
  // No elements, but strides that would overflow.
  EXPECT_THROW(Shape({0, std::int64_t{1} << 40, std::int64_t{1} << 40}), InvalidArgument);
  Shape empty{0, 4, 2};
  EXPECT_THROW(empty.set(1, std::int64_t{1} << 62), InvalidArgument);
  EXPECT_NO_THROW(Shape({0, std::int64_t{1} << 40}));
}

TEST(Shape, Broadcast) {
  EXPECT_EQ(broadcast_shapes({4, 3}, {3}, "add"), Shape({4, 3}));
  EXPECT_EQ(broadcast_shapes({4, 1}, {1, 5}, "add"), Shape({4, 5}));
  EXPECT_EQ(broadcast_shapes({}, {2, 2}, "add"), Shape({2, 2}));
  try {
    broadcast_shapes({4, 3}, {4}, "mul");
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mul"), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  }
}

}  // namespace dtrain
