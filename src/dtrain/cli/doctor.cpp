// `dtrain doctor`: each scale is a `dtrain fit` of the job under `dtrain launch`'s local
// cluster, its chief writing a summary with the step profile of every worker.
#include "dtrain/cli/doctor.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dtrain/cli/config.h"
#include "dtrain/cluster/launcher.h"
#include "dtrain/core/error.h"

namespace dtrain::cli {
namespace {

using nlohmann::json;

// The last lines of a run's output, for an error that says why it failed.
std::string tail_lines(const std::string& text, int lines) {
  std::size_t at = text.size();
  for (int i = 0; i <= lines; ++i) {
    if (at == 0 || (at = text.rfind('\n', at - 1)) == std::string::npos) return text;
  }
  return text.substr(at + 1);
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("dtrain-doctor-" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

json profile_json(const std::vector<profile::WorkerSummary>& workers) {
  json rows = json::array();
  for (const profile::WorkerSummary& w : workers) {
    const profile::Totals& t = w.totals;
    const double steps = std::max<double>(1.0, static_cast<double>(t.steps));
    json phases = json::object();
    for (int p = 0; p < profile::kPhases; ++p)
      phases[profile::phase_name(static_cast<profile::Phase>(p))] = t.phases[static_cast<std::size_t>(p)] / steps;
    rows.push_back({{"steps", t.steps},
                    {"samples_per_second", w.samples_per_second()},
                    {"step_seconds", t.wall / steps},
                    {"step_seconds_p50", w.step_p50},
                    {"step_seconds_p90", w.step_p90},
                    {"phase_seconds_per_step", phases},
                    {"unaccounted_seconds_per_step", t.unaccounted() / steps},
                    {"communication_seconds_per_step", t.communication_total / steps},
                    {"transfer_seconds_per_step", t.transfer / steps},
                    {"bytes_all_reduced_per_step", w.bytes_per_step()},
                    {"bus_bandwidth_bytes_per_second", w.bus_bandwidth(static_cast<int>(workers.size()))}});
  }
  return rows;
}

std::vector<profile::WorkerSummary> profile_from_json(const json& rows) {
  std::vector<profile::WorkerSummary> out;
  for (const json& row : rows) {
    profile::WorkerSummary w;
    profile::Totals& t = w.totals;
    t.steps = row.at("steps").get<std::int64_t>();
    const double steps = static_cast<double>(t.steps);
    t.wall = row.at("step_seconds").get<double>() * steps;
    for (int p = 0; p < profile::kPhases; ++p)
      t.phases[static_cast<std::size_t>(p)] =
          row.at("phase_seconds_per_step").value(profile::phase_name(static_cast<profile::Phase>(p)), 0.0) * steps;
    t.communication_total = row.at("communication_seconds_per_step").get<double>() * steps;
    t.transfer = row.at("transfer_seconds_per_step").get<double>() * steps;
    t.bytes = static_cast<std::uint64_t>(row.at("bytes_all_reduced_per_step").get<double>() * steps + 0.5);
    t.samples = static_cast<std::int64_t>(row.at("samples_per_second").get<double>() * t.wall + 0.5);
    w.step_p50 = row.at("step_seconds_p50").get<double>();
    w.step_p90 = row.at("step_seconds_p90").get<double>();
    out.push_back(w);
  }
  return out;
}

profile::ScaleRun scale_run_from_summary(const std::string& summary_path, int workers, int replicas) {
  std::ifstream in(summary_path);
  if (!in) DTRAIN_THROW(IoError, "doctor: the run wrote no summary at ", summary_path);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("profile") || !j["profile"].is_array())
    DTRAIN_THROW(IoError, "doctor: ", summary_path, " is not a summary with a \"profile\"");
  profile::ScaleRun run;
  run.workers = workers;
  run.replicas = replicas;
  run.global_batch = j.value("batch_size", std::int64_t{0});
  run.samples_per_second = j.value("samples_per_second", 0.0);
  try {
    run.rows = profile_from_json(j["profile"]);
  } catch (const json::exception& e) {
    DTRAIN_THROW(IoError, "doctor: ", summary_path, ": a profile row is not as fit writes it: ", e.what());
  }
  if (run.rows.empty()) DTRAIN_THROW(IoError, "doctor: ", summary_path, " has no profile rows");
  return run;
}

std::vector<profile::Finding> run_doctor(const DoctorOptions& o, std::ostream& out) {
  if (o.steps < 1) DTRAIN_THROW(InvalidArgument, "doctor: --steps must be >= 1, got ", o.steps);
  if (o.replicas.empty() || o.workers.empty())
    DTRAIN_THROW(InvalidArgument, "doctor: --replicas and --workers need at least one value each");
  for (int v : o.replicas)
    if (v < 1) DTRAIN_THROW(InvalidArgument, "doctor: --replicas values must be >= 1, got ", v);
  for (int v : o.workers)
    if (v < 1) DTRAIN_THROW(InvalidArgument, "doctor: --workers values must be >= 1, got ", v);
  const std::int64_t per_replica = o.batch_size > 0 ? o.batch_size : load_config(o.config).batch_size;
  out << "dtrain doctor " << o.config << ": " << o.steps << " steps per epoch, 2 epochs per scale (the first warms "
      << "up), " << per_replica << " rows per replica per step\n" << std::flush;

  TempDir dir;
  std::vector<profile::ScaleRun> runs;
  for (int w : o.workers) {
    for (int r : o.replicas) {
      const std::string summary = (dir.path / ("scale-" + std::to_string(w) + "x" + std::to_string(r) + ".json")).string();
      cluster::LaunchOptions launch;
      launch.workers = w;
      launch.command = {o.self,
                        "fit",
                        o.config,
                        "--strategy",
                        w > 1 ? "multi_worker" : "mirrored",
                        "--replicas",
                        std::to_string(r),
                        "--batch-size",
                        std::to_string(per_replica * w * r),
                        "--epochs",
                        "2",
                        "--steps-per-epoch",
                        std::to_string(o.steps),
                        "--verbose",
                        "0",
                        "--summary",
                        summary};
      std::ostringstream output;
      launch.out = &output;
      launch.err = &output;
      out << "  running " << w << " worker(s) x " << r << " replica(s)...\n" << std::flush;
      const cluster::LaunchResult result = cluster::launch(launch);
      if (result.exit_code != 0)
        DTRAIN_THROW(InvalidArgument, "doctor: the run at ", w, " worker(s) x ", r, " replica(s) failed (",
                     result.failed_task, " ", result.how, "); its last output:\n", tail_lines(output.str(), 8));
      runs.push_back(scale_run_from_summary(summary, w, r));
    }
  }
  out << "\n" << profile::scaling_table(runs) << "\nDiagnosis (at the largest scale):\n";
  std::vector<profile::Finding> findings = profile::diagnose(runs);
  out << profile::format_findings(findings);
  return findings;
}

}  // namespace dtrain::cli
