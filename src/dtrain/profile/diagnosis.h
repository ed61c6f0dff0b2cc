// `dtrain doctor`'s reasoning: runs of one job at several scales, each a row per worker
// of its step profile, turned into a scaling table and findings in plain words, each
// with its evidence and a fix.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "dtrain/profile/summary.h"

namespace dtrain::profile {

// One scale of the job: `workers` processes of `replicas` replicas each.
struct ScaleRun {
  int workers = 1;
  int replicas = 1;  // per worker
  std::int64_t global_batch = 0;
  double samples_per_second = 0;    // global, steady state
  std::vector<WorkerSummary> rows;  // [worker]
  // The gradients each step all-reduces between workers, and in how many buckets.
  double gradient_bytes = 0;
  int buckets = 1;
  bool overlap = true;  // buckets start while backward runs
  bool compressed = false;  // the buckets went between workers as 16-bit values
  bool shared_memory = false;  // the workers summed through shared memory, not over a link
  // The host's compute threads over its cores, at least 1: workers sharing one host's
  // cores beyond what it has compute this much slower.
  double oversubscription = 1;
  // The communication thread had a core no compute thread used; without one, moving the
  // bytes takes its time from backward and hides nothing.
  bool spare_core = true;
  int replicas_in_sync() const { return workers * replicas; }
};

// One worker's seconds per step by phase, setup (a one-off of the first step) left out.
struct StepSeconds {
  double step = 0, input = 0, start = 0, forward = 0, backward = 0, comm = 0, straggler = 0, optimizer = 0;
  double transfer = 0, bytes = 0;
  double compute() const { return forward + backward; }
  // The step less its waits for other workers: what this worker itself took.
  double own() const { return std::max(0.0, step - comm - straggler); }
  // The step's time in its phases, and what is left of the step beyond them (never negative).
  double accounted() const { return input + start + compute() + comm + straggler + optimizer; }
  double other() const { return std::max(0.0, step - accounted()); }
};
StepSeconds step_seconds(const WorkerSummary& worker);

struct Finding {
  std::string cause;     // "input-bound", "straggler", "communication-bound", ...
  std::string evidence;  // the numbers
  std::string fix;       // what to do, with the predicted gain where there is one
};

// | workers | replicas per worker | global batch | samples/s | speedup | phase shares ... |
// (speedup against the first run).
std::string scaling_table(const std::vector<ScaleRun>& runs);

// Findings for the runs, most important first: input-bound (input wait >= 10% of the
// step), straggler (a worker whose own time, its step less its waits for the others, is
// > 20% above the median, named), too little work per replica (compute below
// communication and start-up), communication-bound (exposed communication >= 25%),
// optimizer-bound (optimizer >= 25%). Judged on the run
// with the most replicas in sync; empty when nothing stands out.
std::vector<Finding> diagnose(const std::vector<ScaleRun>& runs);

std::string format_findings(const std::vector<Finding>& findings);

}  // namespace dtrain::profile
