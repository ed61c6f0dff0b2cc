// `dtrain doctor --strategies`: the seeds' "run both and compare". Each strategy trains the
// same job for the same epochs; this compares their wall-clock per epoch, the time each
// takes to reach one target loss, their final quality and the bytes they move, and
// recommends one with the reason in words.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/profile/diagnosis.h"

namespace dtrain::profile {

// One parameter server's share of a run (the summary's ps_phases.per_ps).
struct PsLoad {
  double apply_seconds = 0;  // applying updates
  double bytes = 0;          // values pulled from it and gradients pushed to it
};

// One strategy's run of the job, as its chief's summary gives it.
struct StrategyRun {
  std::string label;  // "MultiWorkerMirroredStrategy (2 workers)"
  std::string kind;   // "mirrored", "multi_worker" or "parameter_server"
  int workers = 1;    // processes that train (1 for one process of several replicas)
  std::vector<double> epoch_seconds;  // each epoch's wall-clock, validation included
  std::vector<double> loss;           // each epoch's loss (validation's where there was one)
  std::string loss_name = "loss";     // "loss" or "val_loss"
  std::string metric;                 // "accuracy", or empty when the job has none
  double final_metric = -1;           // on the test data (else the last epoch's); -1: none
  std::int64_t test_samples = 0;      // the rows final_metric was measured on (0: not known)
  double samples_per_second = 0;
  double bytes_per_worker_step = 0;   // sent and received between processes by one worker
  // The machine while it ran (where the doctor ran it), and the compute threads it asked for.
  MachineUse machine;
  int threads = 0;
  // Shares of a worker's step: waiting on the others (exposed communication, straggler
  // wait) for the synchronous strategies; pulling and pushing for the ps.
  double wait_share = 0, straggler_share = 0;
  std::vector<PsLoad> ps;  // parameter_server: each ps's share
  double median_epoch_seconds() const;
};

// What one run shows on its own, most telling first: for a parameter-server run, a ps hot
// spot (one ps moving well over its even share of the bytes while the workers wait on
// pulls and pushes), else the workers' wait on the ps when it is a large share of the step.
std::vector<Finding> strategy_findings(const StrategyRun& run);

// Seconds from the start of training until `loss` first fell to `target`, at the end of
// the epoch where it did (epochs are the resolution); none when it never did.
std::optional<double> time_to_loss(std::span<const double> epoch_seconds, std::span<const double> loss, double target);
std::optional<double> time_to_loss(const StrategyRun& run, double target);

// The loss every run reached: the highest of their lowest losses (0 when none has one).
// Runs: anything with a `loss` vector (StrategyRun, ScaleRun).
template <typename Runs = std::vector<StrategyRun>>
double common_target(const Runs& runs) {
  double target = 0;
  bool any = false;
  for (const auto& r : runs) {
    if (r.loss.empty()) continue;
    const double lowest = *std::min_element(r.loss.begin(), r.loss.end());
    target = any ? std::max(target, lowest) : lowest;
    any = true;
  }
  return target;
}

struct Recommendation {
  std::size_t index = 0;  // into the runs
  std::string reason;     // in words, with the figures of the table
};

// How far below the best final metric a run may end and still be as good: one point
// (0.01), or where the test rows are few, two standard errors of the difference of two
// accuracies measured on them.
double metric_tolerance(const std::vector<StrategyRun>& runs);

// The run that reaches `target` soonest among those whose final metric is within
// metric_tolerance of the best; the reason says by how much, against which, and what held
// the others back (a straggler, waiting on the others, the bytes moved).
Recommendation recommend(const std::vector<StrategyRun>& runs, double target);

// | strategy | workers | wall-clock per epoch s | samples/s | time to loss L s | final metric |
// moved per worker step | waiting on others | of which straggler wait |
std::string strategies_table(const std::vector<StrategyRun>& runs, double target);

}  // namespace dtrain::profile
