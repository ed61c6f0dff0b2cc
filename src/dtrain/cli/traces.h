// `dtrain merge-traces OUT.json IN.json...`: the workers' Chrome traces (fit --profile
// writes one per worker) as one trace, a process per worker.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrain::cli {

struct MergeOptions {
  std::vector<std::string> inputs;
  std::string output;
  // Shift each trace so that the first step every trace has ends at the same moment in
  // all of them: synchronous workers leave each step's all-reduce together. For traces
  // from different hosts, whose steady clocks do not agree; traces of one host's workers
  // line up without it.
  bool align_steps = false;
};

// The merged trace. Each input keeps its process id unless an earlier input has it, in
// which case it gets the next free one. Errors name the file and what is wrong with it.
nlohmann::json merge_traces(const MergeOptions& options);

// merge_traces, written to options.output.
void run_merge_traces(const MergeOptions& options);

}  // namespace dtrain::cli
