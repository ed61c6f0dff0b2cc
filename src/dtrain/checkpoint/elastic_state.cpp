// ElasticState: a Checkpoint's snapshot kept in memory.
#include "dtrain/checkpoint/elastic_state.h"

#include <string>

#include "dtrain/core/error.h"

namespace dtrain::train {

void ElasticState::commit(std::int64_t step) {
  if (step < 0) DTRAIN_THROW(InvalidArgument, "ElasticState::commit: the step must be >= 0, got ", step);
  step_ = -1;  // a commit that fails part way is no commit
  checkpoint_.snapshot(snapshot_, /*copy=*/true);
  step_ = step;
}

std::int64_t ElasticState::restore() {
  if (!committed()) DTRAIN_THROW(InvalidArgument, "ElasticState::restore: nothing was committed");
  checkpoint_.restore(snapshot_, "the commit of step " + std::to_string(step_));
  return step_;
}

std::size_t ElasticState::bytes() const {
  std::size_t total = 0;
  for (const auto& [name, t] : snapshot_.data.tensors) total += t.nbytes();
  return total;
}

}  // namespace dtrain::train
