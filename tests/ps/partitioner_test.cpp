// The partitioners give the shard counts TensorFlow's rules give (worked by hand from
// them below), and shards are dealt to the ps tasks in turn.
#include "dtrain/ps/partitioner.h"

#include <gtest/gtest.h>

#include "common/error_message.h"
#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

using dtrain::testing::message_of;

TEST(Partitioners, FixedShardsSplitsIntoAtMostOneShardPerRow) {
  const Partitioner p = FixedShardsPartitioner(3);
  EXPECT_EQ(p.num_shards(Shape{10, 4}, DType::f32), 3);
  EXPECT_EQ(p.num_shards(Shape{2, 4}, DType::f32), 2);  // fewer rows than shards
  EXPECT_EQ(p.num_shards(Shape{}, DType::f32), 1);      // a scalar stays whole
  EXPECT_EQ(p.description(), "FixedShardsPartitioner(num_shards=3)");
}

TEST(Partitioners, MinSizeRoundsTheShardCountUpAndCapsIt) {
  const Partitioner p = MinSizePartitioner(256 << 10, 4);
  // 400 000 bytes / 262 144 = 1.53, rounded up: 2.
  EXPECT_EQ(p.num_shards(Shape{1000, 100}, DType::f32), 2);
  // 4 000 000 bytes would make 16 shards; max_shards holds it to 4.
  EXPECT_EQ(p.num_shards(Shape{100000, 10}, DType::f32), 4);
  // 1.2 MB in 3 rows: 5 wanted, 4 allowed, 3 rows.
  EXPECT_EQ(p.num_shards(Shape{3, 100000}, DType::f32), 3);
  // bf16 halves the bytes: 200 000 bytes, one shard.
  EXPECT_EQ(p.num_shards(Shape{1000, 100}, DType::bf16), 1);
  // The default, as TensorFlow's: max_shards 1.
  EXPECT_EQ(MinSizePartitioner().num_shards(Shape{100000, 10}, DType::f32), 1);
}

TEST(Partitioners, MaxSizeKeepsShardsWithinTheLimitWhereARowFits) {
  // Rows of 400 bytes, two to a 1000-byte shard: 5 shards.
  EXPECT_EQ(MaxSizePartitioner(1000).num_shards(Shape{10, 100}, DType::f32), 5);
  EXPECT_EQ(MaxSizePartitioner(1000, 3).num_shards(Shape{10, 100}, DType::f32), 3);
  // A row of 4000 bytes cannot fit: one row per shard.
  EXPECT_EQ(MaxSizePartitioner(1000).num_shards(Shape{4, 1000}, DType::f32), 4);
  // Everything fits in one.
  EXPECT_EQ(MaxSizePartitioner(1 << 20).num_shards(Shape{10, 100}, DType::f32), 1);
}

TEST(Partitioners, BadArgumentsNameThePartitionerAndTheArgument) {
  EXPECT_NE(message_of<InvalidArgument>([] { FixedShardsPartitioner(0); }).find("FixedShardsPartitioner: num_shards"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([] { MinSizePartitioner(0); }).find("MinSizePartitioner: min_shard_bytes"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([] { MinSizePartitioner(1024, 0); }).find("MinSizePartitioner: max_shards"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([] { MaxSizePartitioner(-1); }).find("MaxSizePartitioner: max_shard_bytes"),
            std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([] { MaxSizePartitioner(10, -2); }).find("MaxSizePartitioner: max_shards"),
            std::string::npos);
}

TEST(Partitioners, TheFirstShardsTakeTheRemainderRows) {
  EXPECT_EQ(shard_rows(10, 3), (std::vector<std::int64_t>{4, 3, 3}));
  EXPECT_EQ(shard_rows(9, 3), (std::vector<std::int64_t>{3, 3, 3}));
  EXPECT_EQ(shard_rows(3, 3), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_THROW(shard_rows(2, 3), InvalidArgument);
}

TEST(ShardPlacement, ShardsAreDealtToThePsTasksInTurnAcrossVariables) {
  const std::vector<VariableSpec> vars = {{"a", Shape{10, 4}}, {"b", Shape{3}}, {"c", Shape{}}};
  const std::vector<ShardPlacement> p = place_shards(vars, FixedShardsPartitioner(2), 3);
  ASSERT_EQ(p.size(), 5u);
  auto expect = [&](std::size_t i, const char* name, std::int64_t shard, std::int64_t begin, std::int64_t end, int ps) {
    SCOPED_TRACE(i);
    EXPECT_EQ(p[i].variable, name);
    EXPECT_EQ(p[i].index, static_cast<std::size_t>(name[0] - 'a'));  // its place in `vars`
    EXPECT_EQ(p[i].shard, shard);
    EXPECT_EQ(p[i].row_begin, begin);
    EXPECT_EQ(p[i].row_end, end);
    EXPECT_EQ(p[i].ps, ps);
  };
  expect(0, "a", 0, 0, 5, 0);
  expect(1, "a", 1, 5, 10, 1);
  expect(2, "b", 0, 0, 2, 2);
  expect(3, "b", 1, 2, 3, 0);
  expect(4, "c", 0, 0, 1, 1);
  EXPECT_EQ(p[0].num_shards, 2);
  EXPECT_EQ(p[4].num_shards, 1);
  // Without a partitioner every variable is one shard.
  const std::vector<ShardPlacement> whole = place_shards(vars, Partitioner(), 2);
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(whole[0].row_end, 10);
  EXPECT_EQ(whole[2].ps, 0);
}

TEST(ShardPlacement, NoPsTaskIsAnErrorSayingSo) {
  const std::string msg =
      message_of<InvalidArgument>([] { place_shards({{"a", Shape{4}}}, Partitioner(), 0); });
  EXPECT_NE(msg.find("at least one ps task"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dtrain::distribute
