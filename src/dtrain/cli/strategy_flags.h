// The parameter-server flags of `dtrain fit` and `dtrain doctor`, read from their text.
#pragma once

#include <string>

#include "dtrain/ps/cluster_coordinator.h"

namespace dtrain::cli {

// --consistency (and a --strategies parameter_server mode): async, ssp:K (K >= 0) or
// sync[:B] (B backup workers); an error names the text.
distribute::Consistency parse_consistency(const std::string& text);
// --partitioner: fixed:N, min_size:BYTES[:MAX_SHARDS] or max_size:BYTES[:MAX_SHARDS]
// (BYTES may end in k or m), TensorFlow's three partitioners; empty: none (each variable
// whole on one ps, dealt in turn). An error names the text.
distribute::Partitioner parse_partitioner(const std::string& text);

}  // namespace dtrain::cli
