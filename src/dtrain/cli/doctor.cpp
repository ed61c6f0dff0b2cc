// `dtrain doctor`: each scale is a `dtrain fit` of the job under `dtrain launch`'s local
// cluster, its chief writing a summary with the step profile of every worker.
#include "dtrain/cli/doctor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dtrain/cli/config.h"
#include "dtrain/cli/fault.h"
#include "dtrain/cli/strategy_flags.h"
#include "dtrain/cluster/launcher.h"
#include "dtrain/core/error.h"
#include "dtrain/core/files.h"
#include "dtrain/core/percentile.h"
#include "dtrain/core/threads.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/profile/format.h"
#include "dtrain/profile/machine.h"
#include "dtrain/profile/report.h"

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

// The metric a summary's run ended at: on the test data where it was tested, else the last
// epoch's; the first of the accuracies the run has. {name, value, test rows}; value -1:
// none.
struct FinalMetric {
  std::string name;
  double value = -1;
  std::int64_t rows = 0;
};
FinalMetric final_metric(const json& j) {
  const json test = j.value("test", json::object()), h = j.value("history", json::object());
  for (const char* m : {"accuracy", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy"}) {
    if (test.contains(m)) return {m, test[m].get<double>(), j.value("test_samples", std::int64_t{0})};
    if (h.contains(m) && !h[m].empty()) return {m, h[m].back().get<double>(), 0};
  }
  return {};
}

// The loss a run is timed by: validation's where there was one.
std::string loss_name(const json& history) { return history.contains("val_loss") ? "val_loss" : "loss"; }

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
    if (!w.step_work.empty()) rows.back()["step_work_seconds"] = w.step_work;
    if (t.gpu_seconds() > 0) {
      json gpu = json::object();
      for (int p = 0; p < profile::kPhases; ++p)
        if (const double g = t.gpu[static_cast<std::size_t>(p)]; g > 0)
          gpu[profile::phase_name(static_cast<profile::Phase>(p))] = g / steps;
      rows.back()["gpu_seconds_per_step"] = gpu;
    }
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
    if (row.contains("step_work_seconds")) w.step_work = row["step_work_seconds"].get<std::vector<double>>();
    if (row.contains("gpu_seconds_per_step"))
      for (int p = 0; p < profile::kPhases; ++p)
        t.gpu[static_cast<std::size_t>(p)] =
            row["gpu_seconds_per_step"].value(profile::phase_name(static_cast<profile::Phase>(p)), 0.0) * steps;
    out.push_back(w);
  }
  return out;
}

profile::ScaleRun scale_run_from_summary(const std::string& summary_path) {
  const json j = read_json_file(summary_path, "doctor: no summary at " + summary_path);
  if (j.is_discarded() || !j.contains("profile") || !j["profile"].is_array())
    DTRAIN_THROW(IoError, "doctor: ", summary_path, " is not a summary with a \"profile\" (dtrain fit --summary)");
  profile::ScaleRun run;
  try {
    run.workers = std::max(1, j.value("workers", 1));
    run.replicas = std::max(1, j.value("replicas", 1) / run.workers);
    run.gpus = std::max(1, j.value("gpus", 1));
    run.global_batch = j.value("batch_size", std::int64_t{0});
    run.samples_per_second = j.value("samples_per_second", 0.0);
    run.gradient_bytes = j.value("gradient_bytes_per_step", 0.0);
    run.table_bytes = j.value("embedding_table_bytes", 0.0);
    run.table_rows_bytes = j.value("embedding_rows_bytes_per_step", 0.0);
    run.buckets = std::max(1, j.value("gradient_buckets", 1));
    run.overlap = j.value("overlap", true);
    run.spare_core = j.value("spare_core", true);
    run.compressed = j.value("compression", std::string("none")) != "none";
    run.shared_memory = j.value("shared_memory", false);
    run.host_threads = j.value("host_threads", 0);
    run.host_cores = j.value("host_cores", 0);
    run.hosts = std::max(1, j.value("hosts", 1));
    run.ps = j.value("ps", 0);
    run.consistency = j.value("consistency", std::string());
    if (run.ps > 0) {
      // Spread over the steps (a closure of fit runs steps_per_execution of them).
      const json phases = j.value("ps_phases", json::object());
      if (const double steps = phases.value("steps", 0.0); steps > 0)
        run.dispatch = phases.value("dispatch_seconds", 0.0) / steps;
    }
    if (j.contains("fault_slow")) run.straggler_factor = std::max(1.0, j["fault_slow"].value("factor", 1.0));
    // The rounds: each epoch after the first (which warms up).
    if (j.contains("epoch_samples_per_second") && j["epoch_samples_per_second"].size() > 1)
      run.rounds.assign(j["epoch_samples_per_second"].begin() + 1, j["epoch_samples_per_second"].end());
    run.rows = profile_from_json(j["profile"]);
    // Training progress (validation's loss where there was one).
    const json h = j.value("history", json::object());
    if (h.contains(loss_name(h))) run.loss = h[loss_name(h)].get<std::vector<double>>();
    run.epoch_seconds = j.value("epoch_seconds", std::vector<double>{});
    run.steps_trained = j.value("steps_trained", std::int64_t{0});
    run.final_accuracy = final_metric(j).value;
    if (j.contains("gradient_noise")) {
      run.noise_scale = j["gradient_noise"].value("noise_scale", 0.0);
      for (const json& e : j["gradient_noise"].value("per_epoch", json::array()))
        run.noise_per_epoch.push_back(e.value("noise_scale", 0.0));
    }
  } catch (const json::exception& e) {
    DTRAIN_THROW(IoError, "doctor: ", summary_path, ": a field is not as fit writes it: ", e.what());
  }
  if (run.rows.empty()) DTRAIN_THROW(IoError, "doctor: ", summary_path, " has no profile rows");
  return run;
}

profile::StrategyRun strategy_run_from_summary(const std::string& summary_path, const std::string& kind,
                                               const std::string& label) {
  const json j = read_json_file(summary_path, "doctor: no summary at " + summary_path);
  if (j.is_discarded() || !j.contains("history") || !j.contains("epoch_seconds"))
    DTRAIN_THROW(IoError, "doctor: ", summary_path, " is not a summary of dtrain fit (no history or epoch_seconds)");
  profile::StrategyRun run;
  run.label = label;
  run.kind = kind;
  try {
    run.workers = std::max(1, j.value("workers", 1));
    run.epoch_seconds = j["epoch_seconds"].get<std::vector<double>>();
    const json& h = j["history"];
    run.loss_name = loss_name(h);
    run.loss = h.at(run.loss_name).get<std::vector<double>>();
    run.samples_per_second = j.value("samples_per_second", 0.0);
    const FinalMetric m = final_metric(j);
    run.metric = m.name;
    run.final_metric = m.value;
    run.test_samples = m.rows;
    // Each worker's shares of its step; the most any worker waited.
    for (const profile::WorkerSummary& w : profile_from_json(j.value("profile", json::array()))) {
      const profile::Totals& t = w.totals;
      if (t.wall <= 0) continue;
      auto share = [&](profile::Phase p) { return t.phases[static_cast<std::size_t>(p)] / t.wall; };
      const double waiting = kind == "parameter_server" ? share(profile::Phase::pull) + share(profile::Phase::push)
                                                        : share(profile::Phase::communication) +
                                                              share(profile::Phase::straggler_wait);
      run.wait_share = std::max(run.wait_share, waiting);
      run.straggler_share = std::max(run.straggler_share, share(profile::Phase::straggler_wait));
    }
    if (kind == "parameter_server") {
      const json& ps = j.at("ps_phases");
      const double steps = ps.value("steps", 0.0);
      if (steps > 0) run.bytes_per_worker_step = (ps.value("shared_memory_bytes", 0.0) + ps.value("message_bytes", 0.0)) / steps;
      for (const json& p : ps.value("per_ps", json::array()))
        run.ps.push_back({p.value("apply_seconds", 0.0),
                          p.value("shared_memory_bytes", 0.0) + p.value("message_bytes", 0.0)});
    } else if (kind == "multi_worker" && run.workers > 1 && !j["profile"].empty()) {
      // A ring all-reduce: each worker sends 2(n-1)/n of the bytes and receives as many.
      const double n = run.workers;
      run.bytes_per_worker_step = 4 * (n - 1) / n * j["profile"][0].value("bytes_all_reduced_per_step", 0.0);
    }
  } catch (const json::exception& e) {
    DTRAIN_THROW(IoError, "doctor: ", summary_path, ": a field is not as fit writes it: ", e.what());
  }
  if (run.loss.empty()) DTRAIN_THROW(IoError, "doctor: ", summary_path, " has no epoch in its history");
  return run;
}

profile::Link run_probe_link(const std::string& output, const std::string& device, std::ostream& out) {
  const cluster::TfConfig config = cluster::tf_config_from_environment();
  const std::size_t workers = config.cluster.training_tasks().size();
  if (!std::getenv("TF_CONFIG") || workers < 2)
    DTRAIN_THROW(InvalidArgument, "probe-link: the link is between workers, so TF_CONFIG must list at least 2 (it lists ",
                 std::getenv("TF_CONFIG") ? workers : 0, "); run one per worker, or: dtrain launch --workers 2 probe-link");
  // With a GPU, each worker's replica is on it, and the GPU path is measured after the link.
  const Device gpu = resolve_device(device.empty() ? "cpu" : device);
  distribute::MultiWorkerMirroredStrategy strategy(
      config, {}, {gpu.is_cpu() ? std::string("/cpu:0") : "/gpu:" + std::to_string(gpu.index)});
  const distribute::MultiWorkerMirroredStrategy::LinkMeasurement m = strategy.measure_link();
  const profile::Link link{m.bytes_per_second, m.latency_seconds, m.burst_bytes};
  std::optional<distribute::MultiWorkerMirroredStrategy::GpuPathMeasurement> path;
  if (!gpu.is_cpu()) path = strategy.measure_gpu_path();
  if (!strategy.is_chief()) return link;
  out << "link between " << strategy.num_workers() << " workers: " << profile::format_rate(link.bytes_per_second)
      << " per direction, " << std::fixed << std::setprecision(1) << link.latency_seconds * 1e6
      << " us per message, " << link.burst_bytes / 1e3 << " KB at once after a rest\n  all-reduce medians:";
  for (const auto& s : m.samples) out << " " << s.bytes << " B in " << std::setprecision(3) << s.seconds * 1e3 << " ms;";
  if (m.rest_seconds > 0)
    out << " after " << std::setprecision(0) << m.rest_seconds * 1e3 << " ms of rest: " << m.rested.bytes << " B in "
        << std::setprecision(3) << m.rested.seconds * 1e3 << " ms";
  else
    out << " (summed through shared memory: no burst to look for)";
  if (path) {
    out << "\nthe GPU path between " << strategy.num_workers() << " workers (" << path->path
        << "), as fit's gradient sum takes it: " << profile::format_rate(path->link.bytes_per_second)
        << " per direction, " << std::setprecision(1) << path->link.latency_seconds * 1e6
        << " us per ring step\n  all-reduce medians:";
    for (const auto& s : path->link.samples)
      out << " " << s.bytes << " B in " << std::setprecision(3) << s.seconds * 1e3 << " ms;";
    out << "\n  copies between " << gpu.to_string() << " and pinned host memory: "
        << profile::format_rate(path->copy_bytes_per_second) << " each way";
  }
  out << "\n  for the doctor: --what-if link=" << std::setprecision(3) << link.bytes_per_second * 8 / 1e6
      << "Mbit,latency=" << std::setprecision(1) << link.latency_seconds * 1e6 << "us";
  if (link.burst_bytes > 0) out << ",burst=" << std::setprecision(1) << link.burst_bytes / 1e3 << "KB";
  if (path) out << ",staged=" << std::setprecision(3) << path->copy_bytes_per_second / 1e9 << "GB/s";
  out << "\n";
  if (!output.empty()) {
    json samples = json::array();
    for (const auto& s : m.samples) samples.push_back({{"bytes", s.bytes}, {"seconds", s.seconds}});
    json j{{"workers", strategy.num_workers()},
           {"bytes_per_second", link.bytes_per_second},
           {"latency_seconds", link.latency_seconds},
           {"burst_bytes", link.burst_bytes},
           {"samples", samples}};
    if (m.rest_seconds > 0)
      j["rested"] = {{"rest_seconds", m.rest_seconds}, {"bytes", m.rested.bytes}, {"seconds", m.rested.seconds}};
    if (path) {
      json gpu_samples = json::array();
      for (const auto& s : path->link.samples) gpu_samples.push_back({{"bytes", s.bytes}, {"seconds", s.seconds}});
      j["gpu_path"] = {{"device", gpu.to_string()},
                       {"path", path->path},
                       {"bytes_per_second", path->link.bytes_per_second},
                       {"latency_seconds", path->link.latency_seconds},
                       {"copy_bytes_per_second", path->copy_bytes_per_second},
                       {"samples", gpu_samples}};
    }
    write_file_replacing(output, j.dump(2) + "\n", "probe-link: the measurement");
  }
  return link;
}

namespace {

profile::Link link_from_file(const std::string& path) {
  const json j = read_json_file(path, "doctor: the link probe wrote nothing at " + path);
  auto positive = [&](const char* key) { return j.contains(key) && j[key].is_number() && j[key].get<double>() >= 0; };
  if (j.is_discarded() || !positive("bytes_per_second") || !positive("latency_seconds") ||
      !(j["bytes_per_second"].get<double>() > 0))
    DTRAIN_THROW(IoError, "doctor: ", path, " is not a link probe's output (bytes_per_second > 0, latency_seconds)");
  const json burst = j.value("burst_bytes", json(0.0));
  if (!burst.is_number() || burst.get<double>() < 0)
    DTRAIN_THROW(IoError, "doctor: ", path, ": burst_bytes is ", burst.dump(), ", not a size in bytes");
  return {j["bytes_per_second"].get<double>(), j["latency_seconds"].get<double>(), burst.get<double>()};
}

// The compute threads of every worker at every scale, as machines of one size would have:
// --threads-per-worker, else OMP_NUM_THREADS, else the cores / the most workers tried.
int threads_per_worker(const DoctorOptions& o) {
  if (o.threads_per_worker > 0) return o.threads_per_worker;
  const char* set = std::getenv("OMP_NUM_THREADS");
  if (set && std::atoi(set) > 0) return std::atoi(set);
  return std::max(1, available_cores() / *std::max_element(o.workers.begin(), o.workers.end()));
}

// Runs a local job (its output kept aside); its failure is an error naming `what`, with
// the job's last lines.
void launch_or_throw(cluster::LaunchOptions launch, const std::string& what) {
  std::ostringstream output;
  launch.out = &output;
  launch.err = &output;
  const cluster::LaunchResult result = cluster::launch(launch);
  if (result.exit_code != 0)
    DTRAIN_THROW(InvalidArgument, "doctor: ", what, " failed (", result.failed_task, " ", result.how,
                 "); its last output:\n", tail_lines(output.str(), 8));
}

// `command` on `workers` local processes of `threads` compute threads each.
void launch_or_throw(int threads, const std::vector<std::string>& command, int workers, const std::string& what) {
  cluster::LaunchOptions launch;
  launch.workers = workers;
  launch.threads_per_task = threads;
  launch.command = command;
  launch_or_throw(std::move(launch), what);
}

// The planted fault of `--fault-slow`, to a run of `workers` workers: a straggler only
// where the run has its worker (fit refuses one it lacks: a run at fewer workers, or of
// replicas in one process, has none to slow), an input delay to every run.
void add_fault_slow(std::vector<std::string>& fit, const std::string& fault_slow, int workers) {
  if (fault_slow.empty() || parse_fault_slow(fault_slow).worker >= workers) return;
  fit.insert(fit.end(), {"--fault-slow", fault_slow});
}

// One scale of the job, a local launch of `dtrain fit`: a warm-up epoch, then `rounds`.
profile::ScaleRun run_scale(const DoctorOptions& o, const TempDir& dir, int w, int r, std::int64_t per_replica) {
  const std::string summary = (dir.path / ("scale-" + std::to_string(w) + "x" + std::to_string(r) + ".json")).string();
  std::vector<std::string> fit{o.self, "fit", o.config, "--strategy", w > 1 ? "multi_worker" : "mirrored",
                               "--replicas", std::to_string(r), "--batch-size", std::to_string(per_replica * w * r),
                               "--epochs", std::to_string(1 + o.rounds), "--steps-per-epoch", std::to_string(o.steps),
                               "--verbose", "0", "--summary", summary};
  add_fault_slow(fit, o.fault_slow, w);
  const profile::MachineSample before = profile::sample_machine();
  launch_or_throw(threads_per_worker(o), fit, w,
                  "the run at " + std::to_string(w) + " worker(s) x " + std::to_string(r) + " replica(s)");
  profile::ScaleRun run = scale_run_from_summary(summary);
  run.machine = profile::machine_use(before, profile::sample_machine());
  return run;
}

// The machine before any run: what else ran on the job's cores for `seconds`, and the
// memory bandwidth a core reads at, in a line.
void describe_machine(double seconds, std::ostream& out) {
  const profile::MachineSample before = profile::sample_machine();
  if (!before.available) {
    out << "  the machine: not read (no /proc/stat here)\n";
    return;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const profile::MachineUse use = profile::machine_use(before, profile::sample_machine());
  const profile::MemoryBandwidth memory = profile::probe_memory_bandwidth();
  out << "  the machine before the runs: " << profile::machine_words(use, false) << "; a core reads memory at "
      << profile::detail::fixed(memory.one_core / 1e9, 1) << " GB/s alone";
  if (memory.cores > 1)
    out << ", " << profile::detail::fixed(memory.each_of_all / 1e9, 1) << " GB/s each with all " << memory.cores
        << " at once";
  out << "\n" << std::flush;
}

// `again` measured a second time: its rounds join the first's, samples/s is the median of
// them all, and the step profile is the later one's.
void merge_rounds(profile::ScaleRun& run, const profile::ScaleRun& again) {
  std::vector<double> rounds = run.rounds;
  rounds.insert(rounds.end(), again.rounds.begin(), again.rounds.end());
  // The busier of the two readings: a load during either run is in the pooled rounds.
  const profile::MachineUse busier =
      run.machine.taken_cores() > again.machine.taken_cores() ? run.machine : again.machine;
  run = again;
  run.machine = busier;
  run.rounds = std::move(rounds);
  if (!run.rounds.empty()) run.samples_per_second = median(run.rounds);
}

// Every scale of the job; a scale whose speedup cannot be trusted (check_trust) is
// measured again, with the first run, once; a doubt that remains stays on the run.
std::vector<profile::ScaleRun> run_scales(const DoctorOptions& o, const TempDir& dir, std::ostream& out) {
  const std::int64_t per_replica = o.batch_size > 0 ? o.batch_size : load_config(o.config).batch_size;
  out << "dtrain doctor " << o.config << ": " << o.steps << " steps per epoch, a warm-up epoch and " << o.rounds
      << " measured per scale, " << per_replica << " rows per replica per step, " << threads_per_worker(o)
      << " thread(s) per worker, " << available_cores() << " core(s) here\n" << std::flush;
  describe_machine(0.5, out);
  std::vector<profile::ScaleRun> runs;
  for (int w : o.workers) {
    for (int r : o.replicas) {
      out << "  running " << w << " worker(s) x " << r << " replica(s)...\n" << std::flush;
      runs.push_back(run_scale(o, dir, w, r, per_replica));
    }
  }
  const std::vector<std::size_t> doubted = profile::check_trust(runs);
  if (doubted.empty()) return runs;
  std::vector<std::size_t> again{0};
  again.insert(again.end(), doubted.begin(), doubted.end());
  for (std::size_t i : again) {
    profile::ScaleRun& run = runs[i];
    out << "  measuring " << run.workers << " worker(s) x " << run.replicas << " replica(s) again"
        << (i == 0 ? " (the first run, against which speedups are taken)" : ": " + run.doubt) << "...\n" << std::flush;
    merge_rounds(run, run_scale(o, dir, run.workers, run.replicas, per_replica));
  }
  for (std::size_t i : profile::check_trust(runs)) runs[i].doubt += " (measured twice)";
  return runs;
}

int most_workers(const std::vector<profile::ScaleRun>& runs) {
  int most = 1;
  for (const profile::ScaleRun& r : runs) most = std::max(most, r.workers);
  return most;
}

// Under the time-to-accuracy table: what its efficiencies come from, and the batch the
// noise scale suggests; or why there are none.
void report_time_to_accuracy(const std::vector<profile::ScaleRun>& runs, double noise_scale, std::ostream& out) {
  if (noise_scale > 0) {
    out << "(statistical efficiency: a sample's share of its best progress, B_noise / (B_noise + global batch), with "
           "the gradient noise scale the largest run with several workers measured; goodput: samples/s times it)\n";
    // How it moved during training: it grows as the loss falls, and the critical batch with it.
    for (const profile::ScaleRun& r : runs) {
      if (r.noise_scale != noise_scale || r.noise_per_epoch.size() < 2) continue;
      out << "gradient noise scale by epoch at " << r.workers << " worker(s) x " << r.replicas << " replica(s):";
      for (double e : r.noise_per_epoch) out << " " << (e > 0 ? std::to_string(std::llround(e)) : std::string("-"));
      out << " samples (the first epoch is the warm-up)\n";
      break;
    }
    out << profile::batch_advice(runs, noise_scale);
  }
  else if (most_workers(runs) > 1)
    out << "(the runs at several workers measured no positive gradient noise scale in so few steps: more --steps "
           "for each global batch's statistical efficiency)\n";
  else
    out << "(no run had several workers, so no gradient noise scale was measured: add --workers 1,2 for each global "
           "batch's statistical efficiency)\n";
}

struct LinkChoice {
  profile::Link link;
  std::string words;  // the link and where it came from
};

// The link the model uses: as given; else measured between local workers; else the bus
// bandwidth the widest run reached; none when there is no way to know it.
std::optional<LinkChoice> choose_link(const DoctorOptions& o, const profile::WhatIf& what_if,
                                      const std::vector<profile::ScaleRun>& runs, const TempDir& dir,
                                      std::ostream& out) {
  const int most = most_workers(runs);
  std::optional<LinkChoice> c;
  if (what_if.link) {
    c = LinkChoice{{*what_if.link, 0.0}, "as given"};
  } else if (o.runs.empty() && most > 1) {
    const std::string probe = (dir.path / "link.json").string();
    out << "\n  measuring the link between " << most << " local workers...\n" << std::flush;
    launch_or_throw(threads_per_worker(o), {o.self, "probe-link", "--output", probe}, most, "the link probe");
    c = LinkChoice{link_from_file(probe), "measured between " + std::to_string(most) + " local workers"};
  } else {
    for (const profile::ScaleRun& r : runs)
      if (r.workers == most && most > 1 && r.rows.front().bus_bandwidth(most) > 0) {
        // Circular for that run's own check, which therefore tests only the overlap model.
        c = LinkChoice{{r.rows.front().bus_bandwidth(most), 0.0},
                       "the bus bandwidth the run at " + std::to_string(most) +
                           " workers reached, latency included, so its check tests the overlap alone"};
        break;
      }
  }
  if (!c) return c;
  if (what_if.latency) c->link.latency_seconds = *what_if.latency;
  if (what_if.burst) c->link.burst_bytes = *what_if.burst;
  c->words = profile::link_words(c->link) + ", " + c->words;
  return c;
}

// `parameter_server:ssp:2` -> ("parameter_server", "ssp:2").
std::pair<std::string, std::string> split_strategy(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  std::pair<std::string, std::string> out{spec.substr(0, colon), colon == std::string::npos ? "" : spec.substr(colon + 1)};
  if (out.first != "mirrored" && out.first != "multi_worker" && out.first != "parameter_server")
    DTRAIN_THROW(InvalidArgument, "doctor: --strategies '", spec,
                 "': expected mirrored, multi_worker or parameter_server[:async|ssp:K|sync[:B]]");
  if (!out.second.empty() && out.first != "parameter_server")
    DTRAIN_THROW(InvalidArgument, "doctor: --strategies '", spec, "': only parameter_server takes a consistency mode");
  if (!out.second.empty()) parse_consistency(out.second);
  return out;
}

// Each strategy trains the job for o.epochs whole epochs at the most workers asked: one
// process of that many replicas (mirrored), that many workers of one replica
// (multi_worker), or that many workers with one ps and a chief (parameter_server). Every
// update is on the same batch (`per_replica` rows times the workers: a ps worker computes
// a whole one a step), so each epoch applies as many updates whatever the strategy, and
// every worker or replica has the same threads.
std::vector<profile::StrategyRun> run_strategies(const DoctorOptions& o, const TempDir& dir, std::ostream& out) {
  const std::int64_t per_replica = o.batch_size > 0 ? o.batch_size : load_config(o.config).batch_size;
  const int n = std::max(2, *std::max_element(o.workers.begin(), o.workers.end()));
  // As for the scales: given, else OMP_NUM_THREADS, else the cores shared by the n workers.
  DoctorOptions shared = o;
  shared.workers = {n};
  const int threads = threads_per_worker(shared);
  out << "dtrain doctor " << o.config << ": " << o.strategies.size() << " strategies, " << o.epochs
      << " epoch(s) each, " << n << " replicas or workers, every update on a batch of " << per_replica * n
      << " rows, " << threads << " thread(s) a worker, " << available_cores() << " core(s) here\n" << std::flush;
  std::vector<profile::StrategyRun> runs;
  for (std::size_t i = 0; i < o.strategies.size(); ++i) {
    const auto [kind, mode] = split_strategy(o.strategies[i]);
    const std::string summary = (dir.path / ("strategy-" + std::to_string(i) + ".json")).string();
    std::vector<std::string> fit{o.self, "fit", o.config, "--epochs", std::to_string(o.epochs), "--verbose", "0",
                                 "--summary", summary, "--strategy", kind};
    cluster::LaunchOptions launch;
    launch.threads_per_task = threads;
    std::string label;
    if (kind == "mirrored") {
      fit.insert(fit.end(), {"--replicas", std::to_string(n), "--batch-size", std::to_string(per_replica * n)});
      launch.workers = 1;
      launch.threads_per_task = threads * n;  // the cores the n workers would have had
      label = "MirroredStrategy (" + std::to_string(n) + " replicas)";
    } else if (kind == "multi_worker") {
      fit.insert(fit.end(), {"--replicas", "1", "--batch-size", std::to_string(per_replica * n)});
      launch.workers = n;
      label = "MultiWorkerMirroredStrategy";
    } else {
      fit.insert(fit.end(), {"--batch-size", std::to_string(per_replica * n)});
      if (!mode.empty()) fit.insert(fit.end(), {"--consistency", mode});
      if (!o.partitioner.empty()) fit.insert(fit.end(), {"--partitioner", o.partitioner});
      launch.workers = n;
      launch.ps = o.ps;
      launch.chief = true;
      label = "ParameterServerStrategy (" + (mode.empty() ? std::string("async") : mode) +
              (o.ps > 1 ? ", " + std::to_string(o.ps) + " ps" : "") +
              (o.partitioner.empty() ? "" : ", " + parse_partitioner(o.partitioner).description()) + ")";
    }
    add_fault_slow(fit, o.fault_slow, launch.workers);
    launch.command = fit;
    out << "  running " << label << "...\n" << std::flush;
    const int threads_wanted = launch.threads_per_task * launch.workers;
    const profile::MachineSample before = profile::sample_machine();
    launch_or_throw(std::move(launch), "the run of " + label);
    runs.push_back(strategy_run_from_summary(summary, kind, label));
    runs.back().machine = profile::machine_use(before, profile::sample_machine());
    runs.back().threads = threads_wanted;
  }
  return runs;
}

void compare_strategies(const DoctorOptions& o, std::ostream& out) {
  if (o.config.empty()) DTRAIN_THROW(InvalidArgument, "doctor: --strategies needs a CONFIG to run");
  if (o.epochs < 1) DTRAIN_THROW(InvalidArgument, "doctor: --epochs must be >= 1, got ", o.epochs);
  for (const std::string& s : o.strategies) split_strategy(s);  // a bad name fails before any run
  parse_partitioner(o.partitioner);
  parse_fault_slow(o.fault_slow);
  TempDir dir;
  const std::vector<profile::StrategyRun> runs = run_strategies(o, dir, out);
  const double target = o.target_loss > 0 ? o.target_loss : profile::common_target(runs);
  out << "\n" << profile::strategies_table(runs, target) << "\n(time to " << runs.front().loss_name << " "
      << profile::detail::fixed(target, 4) << ": "
      << (o.target_loss > 0 ? "as given" : "the loss every strategy reached")
      << ", at the end of the epoch that reached it)\n";
  // A run another load slowed is no fair comparison: said before the recommendation.
  for (const profile::StrategyRun& r : runs)
    if (profile::busy_excess(r.machine, r.threads) > 0) out << profile::busy_words(r.label, r.machine);
  out << "\nRecommendation: "
      << profile::recommend(runs, target).reason << ".\n";
  for (const profile::StrategyRun& r : runs)
    if (const std::vector<profile::Finding> findings = profile::strategy_findings(r); !findings.empty())
      out << "\nFindings for " << r.label << ":\n" << profile::format_findings(findings);
  if (!o.report.empty()) {
    profile::Report report;
    report.title = "dtrain doctor " + o.config + " --strategies";
    report.strategies = runs;
    report.target_loss = target;
    write_file_replacing(o.report, profile::html_report(report), "doctor: the report");
    out << "\nreport written to " << o.report << "\n";
  }
}

}  // namespace

std::vector<profile::Finding> run_doctor(const DoctorOptions& o, std::ostream& out) {
  const bool parameter_server_runs = std::any_of(o.strategies.begin(), o.strategies.end(), [](const std::string& s) {
    return s.rfind("parameter_server", 0) == 0;
  });
  if (!parameter_server_runs && (o.ps != 1 || !o.partitioner.empty()))
    DTRAIN_THROW(InvalidArgument, "doctor: ", o.ps != 1 ? "--ps" : "--partitioner",
                 " is for the parameter_server runs of --strategies, and none is listed");
  if (!o.strategies.empty()) {
    compare_strategies(o, out);
    return {};
  }
  const bool measure = o.runs.empty();
  if (measure) {
    if (o.config.empty()) DTRAIN_THROW(InvalidArgument, "doctor: give a CONFIG to run, or --runs SUMMARY,...");
    if (o.steps < 1) DTRAIN_THROW(InvalidArgument, "doctor: --steps must be >= 1, got ", o.steps);
    if (o.rounds < 1) DTRAIN_THROW(InvalidArgument, "doctor: --rounds must be >= 1, got ", o.rounds);
    if (o.replicas.empty() || o.workers.empty())
      DTRAIN_THROW(InvalidArgument, "doctor: --replicas and --workers need at least one value each");
    for (int v : o.replicas)
      if (v < 1) DTRAIN_THROW(InvalidArgument, "doctor: --replicas values must be >= 1, got ", v);
    for (int v : o.workers)
      if (v < 1) DTRAIN_THROW(InvalidArgument, "doctor: --workers values must be >= 1, got ", v);
  }
  parse_fault_slow(o.fault_slow);  // a malformed one fails before any run
  const profile::WhatIf what_if = o.what_if.empty() ? profile::WhatIf{} : profile::parse_what_if(o.what_if);

  TempDir dir;
  std::vector<profile::ScaleRun> runs;
  if (measure) {
    runs = run_scales(o, dir, out);
  } else {
    for (const std::string& path : o.runs) runs.push_back(scale_run_from_summary(path));
    profile::check_trust(runs);
    out << "dtrain doctor: " << runs.size() << " run(s) from their summaries\n";
  }

  out << "\n" << profile::scaling_table(runs) << "\nDiagnosis (at the largest scale):\n";
  std::vector<profile::Finding> findings = profile::diagnose(runs);
  out << profile::format_findings(findings);
  // Samples/s is not the whole story: how soon each scale reached a loss, and what each
  // global batch's samples are worth.
  const double noise_scale = profile::job_noise_scale(runs);
  const bool progress = std::any_of(runs.begin(), runs.end(), [](const profile::ScaleRun& r) { return !r.loss.empty(); });
  if (progress) {
    out << "\nTime to accuracy: does each scale reach a loss as many times sooner as it has replicas?\n"
        << profile::time_to_accuracy_table(runs, noise_scale);
    report_time_to_accuracy(runs, noise_scale, out);
  }

  const std::optional<LinkChoice> link = choose_link(o, what_if, runs, dir, out);
  const std::string link_words = link ? link->words : std::string();

  profile::Report report;
  report.title = "dtrain doctor " + (measure ? o.config : std::string("(") + std::to_string(runs.size()) + " runs)");
  report.runs = runs;
  report.findings = findings;
  report.link = link_words;
  report.noise_scale = noise_scale;
  // Replicas in one process need no link; runs at several workers are checked only with one.
  report.checks = profile::model_check(runs, link ? link->link : profile::Link{});
  if (!report.checks.empty())
    out << "\nModel check: " << profile::model_check_heading(link_words) << ":\n"
        << profile::model_check_table(report.checks);
  if (what_if.workers || what_if.link) {
    if (!link) DTRAIN_THROW(InvalidArgument, "doctor: --what-if needs link= (no run at several workers measured one)");
    const profile::ScaleRun* one = nullptr;
    for (const profile::ScaleRun& r : runs)
      if (r.workers == 1 && (!one || r.replicas > one->replicas)) one = &r;
    if (!one) DTRAIN_THROW(InvalidArgument, "doctor: --what-if starts from a run at one worker; none was given");
    profile::StepModel model = profile::step_model(*one);
    if (what_if.staged) model.staging = *what_if.staged;
    if (model.gradient_bytes <= 0)
      DTRAIN_THROW(InvalidArgument, "doctor: the run at one worker does not say its gradient bytes (a summary from an "
                   "older dtrain fit?)");
    const int workers = what_if.workers.value_or(std::max(2, most_workers(runs)));
    report.what_if = profile::what_if_report(model, workers, link->link, noise_scale);
    // From a run on a GPU: the paths between GPUs, beside the link's own table.
    if (model.gpu_backward > 0)
      report.what_if += "\n" + profile::gpu_what_if_report(model, workers, link->link, what_if.latency);
    for (int n = 1; n < workers; n *= 2) report.curve.push_back(profile::predict(model, n, link->link));
    report.curve.push_back(profile::predict(model, workers, link->link));
    report.what_if += profile::time_to_loss_what_if(report.curve.front().samples_per_second,
                                                    report.curve.back().samples_per_second, workers,
                                                    static_cast<double>(one->global_batch), noise_scale);
    out << "\n" << report.what_if;
  }
  if (!o.report.empty()) {
    write_file_replacing(o.report, profile::html_report(report), "doctor: the report");
    out << "\nreport written to " << o.report << "\n";
  }
  return findings;
}

}  // namespace dtrain::cli
