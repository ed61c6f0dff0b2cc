// The partitioners' rules and the dealing of shards to parameter servers.
#include "dtrain/ps/partitioner.h"

#include <algorithm>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

std::int64_t rows_of(const Shape& shape) { return shape.rank() == 0 ? 1 : shape[0]; }

std::int64_t bytes_of(const Shape& shape, DType dtype) {
  return shape.numel() * static_cast<std::int64_t>(dtype_size(dtype));
}

void check_positive(const char* partitioner, const char* argument, std::int64_t value) {
  if (value <= 0) DTRAIN_THROW(InvalidArgument, partitioner, ": ", argument, " must be positive, got ", value);
}

}  // namespace

std::int64_t Partitioner::num_shards(const Shape& shape, DType dtype) const {
  const std::int64_t rows = rows_of(shape);
  if (!rule_ || shape.rank() == 0 || rows <= 1) return 1;
  return std::clamp<std::int64_t>(rule_(shape, dtype), 1, rows);
}

Partitioner FixedShardsPartitioner(std::int64_t num_shards) {
  check_positive("FixedShardsPartitioner", "num_shards", num_shards);
  return {"FixedShardsPartitioner(num_shards=" + std::to_string(num_shards) + ")",
          [num_shards](const Shape&, DType) { return num_shards; }};
}

Partitioner MinSizePartitioner(std::int64_t min_shard_bytes, std::int64_t max_shards) {
  check_positive("MinSizePartitioner", "min_shard_bytes", min_shard_bytes);
  check_positive("MinSizePartitioner", "max_shards", max_shards);
  return {"MinSizePartitioner(min_shard_bytes=" + std::to_string(min_shard_bytes) +
              ", max_shards=" + std::to_string(max_shards) + ")",
          [min_shard_bytes, max_shards](const Shape& shape, DType dtype) {
            const std::int64_t wanted = (bytes_of(shape, dtype) + min_shard_bytes - 1) / min_shard_bytes;
            return std::min(wanted, max_shards);
          }};
}

Partitioner MaxSizePartitioner(std::int64_t max_shard_bytes, std::int64_t max_shards) {
  check_positive("MaxSizePartitioner", "max_shard_bytes", max_shard_bytes);
  if (max_shards < 0) DTRAIN_THROW(InvalidArgument, "MaxSizePartitioner: max_shards must be 0 (no limit) or positive, got ", max_shards);
  std::string description = "MaxSizePartitioner(max_shard_bytes=" + std::to_string(max_shard_bytes);
  if (max_shards > 0) description += ", max_shards=" + std::to_string(max_shards);
  return {description + ")", [max_shard_bytes, max_shards](const Shape& shape, DType dtype) {
            const std::int64_t rows = rows_of(shape);
            const std::int64_t row_bytes = bytes_of(shape, dtype) / rows;
            const std::int64_t rows_per_shard = row_bytes == 0 ? rows : std::max<std::int64_t>(1, max_shard_bytes / row_bytes);
            const std::int64_t shards = (rows + rows_per_shard - 1) / rows_per_shard;
            return max_shards > 0 ? std::min(shards, max_shards) : shards;
          }};
}

std::vector<std::int64_t> shard_rows(std::int64_t rows, std::int64_t num_shards) {
  if (num_shards < 1 || num_shards > std::max<std::int64_t>(rows, 1))
    DTRAIN_THROW(InvalidArgument, "cannot split ", rows, " rows into ", num_shards, " shards of at least one row each");
  std::vector<std::int64_t> out(static_cast<std::size_t>(num_shards), rows / num_shards);
  for (std::int64_t i = 0; i < rows % num_shards; ++i) ++out[static_cast<std::size_t>(i)];
  return out;
}

std::vector<ShardPlacement> place_shards(const std::vector<VariableSpec>& variables, const Partitioner& partitioner,
                                         int num_ps) {
  if (num_ps < 1)
    DTRAIN_THROW(InvalidArgument, "ParameterServerStrategy needs at least one ps task to hold its variables; the cluster has ",
                 num_ps);
  std::vector<ShardPlacement> out;
  int next = 0;
  for (std::size_t i = 0; i < variables.size(); ++i) {
    const VariableSpec& v = variables[i];
    const std::int64_t n = partitioner.num_shards(v.shape, v.dtype);
    std::int64_t begin = 0, shard = 0;
    for (const std::int64_t rows : shard_rows(rows_of(v.shape), n)) {
      out.push_back({v.name, i, shard++, n, begin, begin + rows, next});
      begin += rows;
      next = (next + 1) % num_ps;
    }
  }
  return out;
}

}  // namespace dtrain::distribute
