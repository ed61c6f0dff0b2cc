// fit's options for the tests that compare runs: `batch`-row batches, in order (no
// shuffling), `epochs` epochs, nothing printed.
#pragma once

#include "dtrain/model/model.h"

namespace dtrain::testing {

inline FitOptions quiet(std::int64_t batch, int epochs = 1) {
  FitOptions o;
  o.batch_size = batch;
  o.epochs = epochs;
  o.shuffle = false;
  o.verbose = 0;
  return o;
}

}  // namespace dtrain::testing
