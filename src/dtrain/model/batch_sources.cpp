// The batch sources' out-of-line parts.
#include "dtrain/model/batch_sources.h"

#include <sstream>

namespace dtrain::detail {

// Elements must be (x, y) batches; x's shape after the batch axis builds the model.
void split_element(const data::Element& e, Tensor& x, Tensor& y, const char* who) {
  if (e.size() != 2)
    DTRAIN_THROW(InvalidArgument, who, ": dataset elements must be (x, y) pairs, got ", e.size(), " components");
  if (e[0].rank() < 1 || e[1].rank() < 1 || e[0].dim(0) != e[1].dim(0))
    DTRAIN_THROW(InvalidArgument, who, ": dataset elements must be batches (x [batch, ...], y [batch, ...]), got x ",
                 e[0].shape().to_string(), " and y ", e[1].shape().to_string(), "; add .batch(n) to the pipeline");
  x = e[0];
  y = e[1];
}

std::string shard_plan(const StrategyBackend& strategy, const std::string& input_plan, std::int64_t first_batch) {
  std::ostringstream o;
  o << strategy.name() << ": worker " << strategy.worker_index() << " of " << strategy.num_workers() << ", "
    << strategy.num_replicas() << " replica(s) here, " << strategy.num_replicas_in_sync() << " in sync; input: "
    << input_plan << "; the first global batch had " << first_batch << " rows; gradients between workers: "
    << strategy.transport();
  return o.str();
}

data::WorkerShard worker_shard(const StrategyBackend* strategy, const data::Dataset& dataset) {
  return strategy ? data::auto_shard(dataset, strategy->num_workers(), strategy->worker_index())
                  : data::auto_shard(dataset, 1, 0);
}

}  // namespace dtrain::detail
