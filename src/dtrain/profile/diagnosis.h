// `dtrain doctor`'s reasoning: runs of one job at several scales, each a row per worker
// of its step profile, turned into a scaling table and findings in plain words, each
// with its evidence and a fix.
#pragma once

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
  int replicas_in_sync() const { return workers * replicas; }
};

struct Finding {
  std::string cause;     // "input-bound", "straggler", "communication-bound", ...
  std::string evidence;  // the numbers
  std::string fix;       // what to do, with the predicted gain where there is one
};

// | workers | replicas per worker | global batch | samples/s | speedup | phase shares ... |
// (speedup against the first run).
std::string scaling_table(const std::vector<ScaleRun>& runs);

// Findings for the runs, most important first: input-bound (input wait >= 10% of the
// step), straggler (a worker computing > 20% slower than the median, named), too little
// work per replica (compute below communication and start-up), communication-bound
// (exposed communication >= 25%), optimizer-bound (optimizer >= 25%). Judged on the run
// with the most replicas in sync; empty when nothing stands out.
std::vector<Finding> diagnose(const std::vector<ScaleRun>& runs);

std::string format_findings(const std::vector<Finding>& findings);

}  // namespace dtrain::profile
