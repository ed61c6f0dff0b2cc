// The batch sources' out-of-line parts.
#include "dtrain/model/batch_sources.h"

#include <sstream>

namespace dtrain::detail {

void split_element(const data::Element& e, std::size_t inputs, std::size_t outputs, TensorData& batch, const char* who) {
  if (e.size() != inputs + outputs) {
    if (inputs + outputs == 2)
      DTRAIN_THROW(InvalidArgument, who, ": dataset elements must be (x, y) pairs, got ", e.size(), " components");
    DTRAIN_THROW(InvalidArgument, who, ": the model takes ", inputs, " input(s) and has ", outputs,
                 " output(s), so dataset elements must hold ", inputs + outputs,
                 " components (the inputs, then a target for each output), got ", e.size());
  }
  for (std::size_t i = 0; i < e.size(); ++i)
    if (e[i].rank() < 1 || e[i].dim(0) != e[0].dim(0)) {
      if (e.size() == 2)
        DTRAIN_THROW(InvalidArgument, who, ": dataset elements must be batches (x [batch, ...], y [batch, ...]), got x ",
                     e[0].shape().to_string(), " and y ", e[1].shape().to_string(), "; add .batch(n) to the pipeline");
      DTRAIN_THROW(InvalidArgument, who, ": dataset elements must be batches with the same rows in every component, ",
                   "got component 0 ", e[0].shape().to_string(), " and component ", i, " ", e[i].shape().to_string(),
                   "; add .batch(n) to the pipeline");
    }
  for (std::size_t i = 0; i < e.size(); ++i)
    if (e[i].dtype() == DType::string)
      DTRAIN_THROW(InvalidArgument, who, ": component ", i, " of the dataset's elements (", i < inputs ? "an input" : "a target",
                   ") holds strings ", e[i].shape().to_string(), "; a model takes numbers: map the text to token ids ",
                   "in the pipeline first (dataset.map with a TextVectorization or a tokenizer)");
  batch.x.assign(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(inputs));
  batch.y.assign(e.begin() + static_cast<std::ptrdiff_t>(inputs), e.end());
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
