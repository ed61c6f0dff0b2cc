// How ParameterServerStrategy splits a variable into shards along its first axis and which
// parameter server holds each shard. The three partitioners follow TensorFlow's
// tf.distribute.experimental.partitioners rules, so a model sharded there is sharded the
// same way here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/dtype.h"
#include "dtrain/core/shape.h"

namespace dtrain::distribute {

// A rule giving the number of shards of a variable along axis 0: at least 1, and at most
// the variable's rows (a shard holds at least one row). A default-constructed partitioner
// leaves every variable whole, as a strategy without `variable_partitioner` does.
class Partitioner {
 public:
  Partitioner() = default;
  std::int64_t num_shards(const Shape& shape, DType dtype) const;
  const std::string& description() const { return description_; }

 private:
  using Rule = std::function<std::int64_t(const Shape&, DType)>;
  Partitioner(std::string description, Rule rule) : description_(std::move(description)), rule_(std::move(rule)) {}
  friend Partitioner FixedShardsPartitioner(std::int64_t num_shards);
  friend Partitioner MinSizePartitioner(std::int64_t min_shard_bytes, std::int64_t max_shards);
  friend Partitioner MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards);

  std::string description_ = "no partitioning";
  Rule rule_;
};

// `num_shards` shards, or one per row when the variable has fewer rows.
Partitioner FixedShardsPartitioner(std::int64_t num_shards);
// As many shards as make each at least `min_shard_bytes` (the variable's bytes divided by
// it, rounded up, as TensorFlow rounds), at most `max_shards`.
Partitioner MinSizePartitioner(std::int64_t min_shard_bytes = 256 << 10, std::int64_t max_shards = 1);
// Few enough rows per shard that each stays within `max_shard_bytes` where one row fits,
// one row per shard where it does not; at most `max_shards` when that is above 0.
Partitioner MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards = 0);

// The rows of each of `num_shards` shards of `rows` rows, in order: the first
// rows % num_shards shards hold one row more than the others, as in TensorFlow's
// ShardedVariable.
std::vector<std::int64_t> shard_rows(std::int64_t rows, std::int64_t num_shards);

// One shard of one variable, and the parameter server that holds it.
struct ShardPlacement {
  std::string variable;
  std::size_t index = 0;                      // the variable's place in place_shards' list
  std::int64_t shard = 0;                     // 0-based, of num_shards
  std::int64_t num_shards = 1;
  std::int64_t row_begin = 0, row_end = 0;    // along axis 0; a scalar is rows [0, 1)
  int ps = 0;                                 // the ps task's index
};

struct VariableSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
};

// Splits each variable with `partitioner` and deals the shards to `num_ps` parameter
// servers in turn, in the variables' order, continuing across variables so that the ps
// tasks hold near-equal numbers of shards.
std::vector<ShardPlacement> place_shards(const std::vector<VariableSpec>& variables, const Partitioner& partitioner,
                                         int num_ps);

}  // namespace dtrain::distribute
