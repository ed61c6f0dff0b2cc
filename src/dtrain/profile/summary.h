// What fit prints from the step profile: a line per epoch and a table at the end of
// training, one row per worker, gathered to every worker as plain numbers.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "dtrain/profile/profiler.h"

namespace dtrain::profile {

// One worker's figures over a run of steps.
struct WorkerSummary {
  Totals totals;
  double step_p50 = 0, step_p90 = 0;  // seconds
  // Each steady step's own work on its critical path (Profiler::steady_work), for the
  // doctor's replay of the run; empty where not kept (under the ps, or an older summary).
  std::vector<double> step_work;

  double samples_per_second() const { return totals.wall > 0 ? static_cast<double>(totals.samples) / totals.wall : 0; }
  double bytes_per_step() const { return totals.steps ? static_cast<double>(totals.bytes) / totals.steps : 0; }
  // The ring all-reduce's bus bandwidth: each of n workers moves 2(n-1)/n of the bytes
  // all-reduced, during the time its communication thread moved them (bytes/s; 0 for one worker).
  double bus_bandwidth(int workers) const;

  // As numbers, so that workers can sum them over the cluster (each into its own slot).
  static constexpr std::size_t kValues = 8 + 2 * kPhases;  // the phases, then the GPU's (Totals::gpu)
  void to_values(std::span<double> out) const;
  static WorkerSummary from_values(std::span<const double> in);
};

// "input wait 0.4%, forward 31.0%, ..., communication 21.3% exposed of 38.0%, ...", and on
// a GPU "; GPU busy 71.2% (forward 20.1%, backward 44.0%, optimizer 7.1%)".
std::string phase_shares(const Totals& totals);
// The end-of-training table: samples/s, step p50/p90, phase shares, bytes per step and
// bus bandwidth, a row per worker (index = worker).
std::string summary_table(const std::vector<WorkerSummary>& workers);

}  // namespace dtrain::profile
