// `dtrain doctor CONFIG`: the job run briefly at each scale (workers x replicas), a
// scaling table from the runs' step profiles, and a diagnosis in words.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/profile/diagnosis.h"

namespace dtrain::cli {

struct DoctorOptions {
  std::string self;    // this dtrain binary, which runs each scale
  std::string config;  // the job
  std::vector<int> replicas{1, 2};  // per worker
  std::vector<int> workers{1};
  int steps = 20;                 // per epoch; two epochs per scale, the first a warm-up
  std::int64_t batch_size = 0;    // per replica; 0: the config's batch_size
};

// fit's step profile as `dtrain fit --summary` writes it under "profile": a row per
// worker with seconds per step in each phase and the end-of-training table's figures;
// and back, for the doctor, which reads the runs' summaries.
nlohmann::json profile_json(const std::vector<profile::WorkerSummary>& workers);
std::vector<profile::WorkerSummary> profile_from_json(const nlohmann::json& rows);

// The runs' figures, as their chief's --summary file gives them (its "profile" rows).
profile::ScaleRun scale_run_from_summary(const std::string& summary_path, int workers, int replicas);

// Runs every scale, prints the table and the findings to `out`; returns them too.
std::vector<profile::Finding> run_doctor(const DoctorOptions& options, std::ostream& out);

}  // namespace dtrain::cli
