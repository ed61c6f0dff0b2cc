// `dtrain doctor --report FILE.html`: one self-contained HTML page (inline SVG charts and
// styles, no scripts, nothing fetched) with the scaling study, the findings, the model
// check and the what-if predictions.
#pragma once

#include <string>
#include <vector>

#include "dtrain/profile/diagnosis.h"
#include "dtrain/profile/strategies.h"
#include "dtrain/profile/whatif.h"

namespace dtrain::profile {

struct Report {
  std::string title;                // "dtrain doctor examples/configs/seed_large.json"
  std::vector<ScaleRun> runs;       // as measured, in order
  std::vector<Finding> findings;
  std::vector<Check> checks;        // the model against the runs at several workers
  std::string link;                 // the link the model used, in words
  std::vector<Prediction> curve;    // predicted at 1, 2, 4, ... workers (what-if)
  std::string what_if;              // what_if_report's text
  double noise_scale = 0;           // the job's gradient noise scale (0: not measured)
  // --strategies: each strategy's run, and the loss they were timed to.
  std::vector<StrategyRun> strategies;
  double target_loss = 0;
};

std::string html_report(const Report& report);

}  // namespace dtrain::profile
