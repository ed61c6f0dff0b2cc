// `dtrain doctor CONFIG`: the job run briefly at each scale (workers x replicas), a
// scaling table from the runs' step profiles, and a diagnosis in words.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/profile/diagnosis.h"
#include "dtrain/profile/strategies.h"
#include "dtrain/profile/whatif.h"

namespace dtrain::cli {

struct DoctorOptions {
  std::string self;    // this dtrain binary, which runs each scale
  std::string config;  // the job
  std::vector<int> replicas{1, 2};  // per worker
  std::vector<int> workers{1};
  int steps = 20;                 // per epoch; a warm-up epoch, then `rounds` measured
  int rounds = 3;                 // epochs measured at each scale, for the spread
  std::int64_t batch_size = 0;    // per replica; 0: the config's batch_size
  // Threads of each worker at every scale; 0: the cores divided by the most workers
  // tried (so that 1 worker and N workers compute alike), or OMP_NUM_THREADS when set.
  int threads_per_worker = 0;
  // Summaries (`dtrain fit --summary`, each from a run's chief) to diagnose instead of
  // running the config: runs made elsewhere, on real hosts.
  std::vector<std::string> runs;
  std::string what_if;  // "workers=16,link=10Gbit,latency=50us,burst=64KB", each part optional
  std::string report;   // an HTML page to write
  std::string fault_slow;  // testing: every run's fit --fault-slow (cli/fault.h)
  // Run both and compare: each of mirrored, multi_worker and parameter_server[:MODE] (a
  // consistency mode: async, ssp:K, sync[:B]) trains the job for `epochs` whole epochs at
  // the most workers asked (at least 2); empty: the scaling study instead.
  std::vector<std::string> strategies;
  int epochs = 3;
  double target_loss = 0;  // 0: the loss every strategy reached
  int ps = 1;               // parameter servers of each parameter_server run
  std::string partitioner;  // their fit --partitioner (empty: each variable whole)
};

// fit's step profile as `dtrain fit --summary` writes it under "profile": a row per
// worker with seconds per step in each phase and the end-of-training table's figures;
// and back, for the doctor, which reads the runs' summaries.
nlohmann::json profile_json(const std::vector<profile::WorkerSummary>& workers);
std::vector<profile::WorkerSummary> profile_from_json(const nlohmann::json& rows);

// The run's figures, as its chief's --summary file gives them (its "profile" rows).
profile::ScaleRun scale_run_from_summary(const std::string& summary_path);

// `dtrain probe-link`, one process per worker (TF_CONFIG): measures the link between the
// workers as the gradient all-reduce sees it; the chief prints it and writes it as JSON
// to `output` (when not empty). With a GPU `device`, each worker's replica is on it, and
// the path fit's gradient sums take between the GPU workers is measured too, with the
// copies between the GPU and pinned host memory (the what-if's `staged=`).
profile::Link run_probe_link(const std::string& output, const std::string& device, std::ostream& out);

// A strategy's run of the job from its chief's summary: `kind` is mirrored, multi_worker
// or parameter_server, `label` what the table calls it.
profile::StrategyRun strategy_run_from_summary(const std::string& summary_path, const std::string& kind,
                                               const std::string& label);

// Runs every scale, prints the table and the findings to `out`; returns them too.
std::vector<profile::Finding> run_doctor(const DoctorOptions& options, std::ostream& out);

}  // namespace dtrain::cli
