// The dtrain command: fit, evaluate and summarize the model a JSON config describes.
// Errors become one readable line on stderr and a non-zero exit code.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <unistd.h>

#include "dtrain/checkpoint/backup_and_restore.h"
#include "dtrain/cli/config.h"
#include "dtrain/cli/doctor.h"
#include "dtrain/cli/fault.h"
#include "dtrain/cli/strategy_flags.h"
#include "dtrain/cli/traces.h"
#include "dtrain/cluster/launcher.h"
#include "dtrain/cluster/resolvers.h"
#include "dtrain/core/allocator.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/files.h"
#include "dtrain/core/percentile.h"
#include "dtrain/core/threads.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/model/tensorboard.h"
#include "dtrain/ps/cluster_coordinator.h"

namespace {

using namespace dtrain;
using nlohmann::json;

// The embedding tables among `model`'s trainable weights, in float32 bytes (as a parameter
// server moves them), and the most bytes of their rows a step of `batch` samples looks up (each table's ids a sample, from the
// input it was built for): what a parameter server's worker moves of them.
std::pair<std::int64_t, std::int64_t> embedding_table_bytes(const Model& model, std::int64_t batch) {
  std::int64_t tables = 0, rows = 0;
  for (const auto& layer : model.layers()) {
    const auto* e = dynamic_cast<const nn::Embedding*>(layer.get());
    if (!e || !e->built() || !e->trainable()) continue;
    const Shape in = *e->input_shape();
    std::int64_t ids = 1;
    for (int a = 1; a < in.rank(); ++a) ids *= in[a];
    tables += e->input_dim() * e->output_dim() * 4;
    rows += std::min(e->input_dim(), batch * ids) * e->output_dim() * 4;
  }
  return {tables, rows};
}

constexpr const char* kExamples = R"(
Examples:
  dtrain fit examples/configs/fashion_mnist.json
  dtrain fit examples/configs/seed_large.json --epochs 2 --threads 1 --summary out.json
  dtrain fit examples/configs/seed_large.json --strategy mirrored --replicas 2 --batch-size 128
  dtrain launch --workers 2 -- dtrain fit examples/configs/seed_large.json --strategy multi_worker
  dtrain fit examples/configs/fashion_mnist.json --save-weights fmnist.safetensors
  dtrain fit examples/configs/seed_large.json --checkpoint-dir ckpt --checkpoint-every 20
  dtrain launch --workers 2 --max-restarts 3 fit examples/configs/seed_large.json --checkpoint-dir ckpt
  dtrain evaluate examples/configs/fashion_mnist.json --weights fmnist.safetensors
  dtrain summary examples/configs/seed_small.json
  dtrain fit examples/configs/seed_large.json --replicas 2 --batch-size 128 --profile trace.json
  dtrain doctor examples/configs/seed_large.json --replicas 1,2 --workers 1,2 --steps 20
  dtrain doctor examples/configs/seed_large.json --workers 1,2 --what-if workers=16,link=10Gbit --report r.html
  dtrain launch --workers 2 probe-link
  dtrain launch --workers 2 fit examples/configs/seed_large.json --profile t.json
  dtrain merge-traces all.json t.json t.worker-1.json
  dtrain launch --workers 2 -- sh -c 'echo $TF_CONFIG'
  dtrain launch --workers 2:3 --max-restarts 2 fit examples/configs/seed_large.json   (elastic)

Config files are JSON: model (Keras-style Sequential JSON), loss, optimizer, metrics,
data (fashion_mnist, synthetic, or csv, idx or records files), epochs, batch_size, seed,
threads, strategy, replicas, gradient_accumulation_steps, checkpoint. See docs/cli.md and
docs/checkpoints.md.)";

struct Overrides {
  int epochs = -1;
  std::int64_t batch_size = -1;
  int threads = -1;
  std::int64_t seed = -1;
  int verbose = -2;
  int replicas = -1;
  int accumulation = -1;
  std::int64_t steps_per_epoch = 0;
  std::string save_weights, summary, weights, dtype_policy, strategy, profile, tensorboard;
  std::string device = "auto";  // cpu, gpu (or a name like /GPU:1) or auto: a GPU where one is present
  std::string cuda_graph = "on";  // on a GPU: the step replayed as CUDA graphs after warm-up
  std::string fault_slow;  // testing: worker:K:Fx (cli/fault.h)
  std::string fault_kill, fault_term, fault_stop;  // testing: worker:K:S (cli/fault.h)
  // Checkpoints (BackupAndRestore): override the config's "checkpoint".
  std::string checkpoint_dir, checkpoint_every;  // every: a number of batches or "epoch"
  bool keep_checkpoints = false;
  // multi_worker only
  std::string compression, communication;
  // parameter_server only
  std::string consistency;  // async, ssp:K, sync, sync:B
  std::string partitioner;  // fixed:N, min_size:BYTES[:MAX], max_size:BYTES[:MAX]
  int steps_per_execution = 1;
  // multi_worker and mirrored
  int gradient_noise_every = 10;  // multi_worker: every this many steps (0: never)
  double collective_timeout = -1;
  bool no_overlap = false;
  // Where the cluster is read from: tf_config (TF_CONFIG), slurm or k8s (cluster/resolvers.h).
  std::string cluster = "tf_config", cluster_jobs, cluster_service;
  int cluster_port = 0;  // 0: the resolver's default (Slurm's port base 8888, a Job's 2222)
};

// --cluster slurm|k8s: this process's TF_CONFIG from the scheduler's variables, set for
// everything after (the strategies read TF_CONFIG).
void resolve_cluster(const Overrides& o) {
  if (o.cluster == "tf_config") return;
  const cluster::Jobs jobs = o.cluster_jobs.empty() ? cluster::Jobs{} : cluster::parse_jobs(o.cluster_jobs, "--cluster-jobs");
  cluster::Resolved r;
  if (o.cluster == "slurm") {
    r = cluster::resolve_slurm({jobs, o.cluster_port > 0 ? o.cluster_port : 8888});
  } else {
    cluster::IndexedJobOptions k{.service = o.cluster_service, .jobs = jobs};
    if (o.cluster_port > 0) k.port = o.cluster_port;
    r = cluster::resolve_k8s_indexed_job(k);
  }
  setenv("TF_CONFIG", cluster::to_tf_config_json(r.config).c_str(), 1);
}

void apply(const Overrides& o, cli::RunConfig& c) {
  if (o.epochs >= 0) c.epochs = o.epochs;
  if (o.batch_size > 0) c.batch_size = o.batch_size;
  if (o.threads >= 0) c.threads = o.threads;
  if (o.seed >= 0) c.seed = static_cast<std::uint64_t>(o.seed);
  if (o.verbose >= -1) c.verbose = o.verbose;
  if (!o.dtype_policy.empty()) c.dtype_policy = o.dtype_policy;
  if (!o.strategy.empty()) c.strategy = o.strategy;
  if (o.replicas >= 0) c.replicas = o.replicas;
  // --replicas alone means mirrored.
  if (o.replicas > 0 && o.strategy.empty()) c.strategy = "mirrored";
  if (o.accumulation > 0) c.gradient_accumulation_steps = o.accumulation;
  cli::check_strategy(c.strategy, c.replicas);
}

// How workers exchange gradients, from the command line.
distribute::CommunicationOptions communication_options(const Overrides& o) {
  distribute::CommunicationOptions comm;
  if (o.collective_timeout > 0) comm.timeout_seconds = o.collective_timeout;
  comm.overlap = !o.no_overlap;
  if (o.compression == "bf16") comm.compression = distribute::Compression::BF16;
  if (o.compression == "fp16") comm.compression = distribute::Compression::FP16;
  if (o.communication == "ring") comm.implementation = distribute::CommunicationImplementation::RING;
  return comm;
}

// The strategy the config asks for; null for the default strategy. A mirrored or
// multi-worker strategy on a GPU (--device cuda:N) puts its replicas on that many logical
// GPUs of it; a mirrored one on `--device gpu` of a machine of several GPUs, on each GPU.
std::unique_ptr<distribute::Strategy> make_strategy(const cli::RunConfig& c, const Overrides& o, Device device) {
  // On a GPU: `replicas` logical GPUs of it (at least one).
  auto gpu_replicas = [&] {
    set_logical_device_configuration(device, std::vector<LogicalDeviceConfiguration>(
                                                 static_cast<std::size_t>(std::max(1, c.replicas))));
    std::vector<std::string> devices;
    const std::vector<LogicalGpu> gpus = logical_gpus();
    for (std::size_t i = 0; i < gpus.size(); ++i)
      if (gpus[i].physical == device) devices.push_back("/gpu:" + std::to_string(i));
    return devices;
  };
  if (c.strategy == "multi_worker") {
    std::vector<std::string> devices;
    if (!device.is_cpu()) devices = gpu_replicas();
    else
      for (int r = 0; r < std::max(1, c.replicas); ++r) devices.push_back("/cpu:" + std::to_string(r));
    if (const std::optional<distribute::ElasticJob> elastic = distribute::elastic_from_environment())
      return std::make_unique<distribute::MultiWorkerMirroredStrategy>(*elastic, communication_options(o), devices);
    return std::make_unique<distribute::MultiWorkerMirroredStrategy>(cluster::tf_config_from_environment(),
                                                                     communication_options(o), devices);
  }
  // `--device gpu` on a machine of several GPUs, replicas unset: a replica on each GPU, as
  // TensorFlow's MirroredStrategy() takes them all.
  if (c.strategy == "mirrored" && o.device == "gpu" && c.replicas == 0 && device_count(DeviceType::cuda) > 1) {
    std::vector<std::string> every;
    for (int i = 0; i < device_count(DeviceType::cuda); ++i) every.push_back("/gpu:" + std::to_string(i));
    return std::make_unique<distribute::MirroredStrategy>(every, communication_options(o));
  }
  if (c.strategy == "mirrored" && !device.is_cpu())
    return std::make_unique<distribute::MirroredStrategy>(gpu_replicas(), communication_options(o));
  if (c.strategy == "mirrored")
    return std::make_unique<distribute::MirroredStrategy>(c.replicas > 0 ? c.replicas : available_cores(),
                                                          communication_options(o));
  if (c.strategy == "one_device") return std::make_unique<distribute::OneDeviceStrategy>();
  return nullptr;
}

// --workers N or MIN:MAX (elastic), each in [0, 256].
void parse_launch_workers(const std::string& text, cluster::LaunchOptions& o) {
  auto count = [&](const std::string& part) {
    std::size_t used = 0;
    int n = -1;
    try {
      n = std::stoi(part, &used);
    } catch (const std::exception&) {
    }
    if (part.empty() || used != part.size() || n < 0 || n > 256 || !std::isdigit(static_cast<unsigned char>(part[0])))
      DTRAIN_THROW(InvalidArgument, "--workers '", text, "': expected N or MIN:MAX, numbers from 0 to 256");
    return n;
  };
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos) {
    o.workers = count(text);
    return;
  }
  o.min_workers = count(text.substr(0, colon));
  o.workers = count(text.substr(colon + 1));
  if (o.min_workers < 1 || o.min_workers > o.workers)
    DTRAIN_THROW(InvalidArgument, "--workers '", text, "': an elastic job needs 1 <= MIN <= MAX");
}

// This binary's path (for the processes it starts).
std::string self_path() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string("/proc/self/exe");
}

void write_json(const std::string& path, const json& j) { write_file_replacing(path, j.dump(2) + "\n", "the summary"); }

// "test: loss 1.34 accuracy 0.61", and for a language model (the text source) the loss in
// bits per byte, the unit its figures are quoted in.
std::string logs_line(const std::string& head, const Logs& logs, const cli::RunConfig& c, double bytes_per_token) {
  std::string line = head;
  for (const auto& [k, v] : logs.items()) line += " " + k + " " + std::to_string(v);
  if (c.data.source == "text" && logs.contains("loss"))
    line += " (" + std::to_string(logs.at("loss") / std::log(2.0) / bytes_per_token) + " bits per byte)";
  return line;
}

json logs_json(const Logs& logs) {
  json j = json::object();
  for (const auto& [k, v] : logs.items()) j[k] = v;
  return j;
}

// Builds (for summary) without loading the data: the input shape comes from the model JSON,
// or else from the data section (a file source reads its first training row, an IDX file
// its header), which the model is then checked against.
void ensure_built(Model& m, const cli::RunConfig& c) {
  if (m.built()) return;
  const Shape row = cli::input_shape(c);
  cli::check_model_fits_data(c, row);
  m.build(row);
}

// The layers' dtype policy: one name when they agree, "per layer" when they do not.
std::string model_policy(const Model& m) {
  std::string name;
  for (const auto& l : m.layers()) {
    if (name.empty()) name = l->dtype_policy().name;
    else if (name != l->dtype_policy().name) return "per layer";
  }
  return name.empty() ? nn::global_policy().name : name;
}

// The config's checkpoint settings with the flags applied. Errors name the flag.
cli::CheckpointConfig checkpoint_config(const cli::RunConfig& c, const Overrides& o) {
  cli::CheckpointConfig k = c.checkpoint;
  if (!o.checkpoint_dir.empty()) k.dir = o.checkpoint_dir;
  if (!o.checkpoint_every.empty()) {
    if (o.checkpoint_every == "epoch") {
      k.every = 0;
    } else {
      const char* text = o.checkpoint_every.c_str();
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(text, &end, 10);
      if (end == text || *end != '\0' || errno == ERANGE || n < 1 || !std::isdigit(static_cast<unsigned char>(text[0])))
        DTRAIN_THROW(InvalidArgument, "--checkpoint-every '", o.checkpoint_every,
                     "': expected a number of training batches (1 or more) or \"epoch\"");
      k.every = n;
    }
  }
  if (o.keep_checkpoints) k.keep = true;
  if (k.dir.empty() && (!o.checkpoint_every.empty() || o.keep_checkpoints))
    DTRAIN_THROW(InvalidArgument, o.checkpoint_every.empty() ? "--keep-checkpoints" : "--checkpoint-every",
                 " needs a folder to save in: --checkpoint-dir DIR or the config's checkpoint.dir");
  return k;
}

// Whether this is the job's first start: `dtrain launch` sets DTRAIN_RESTART_COUNT to k on
// its k-th restart (and 0 first); a process started otherwise has none. The injected kill
// and preemption faults are for the first start only, so that a restarted job can finish.
bool first_start_of_job() {
  const char* count = std::getenv("DTRAIN_RESTART_COUNT");
  return count == nullptr || std::string(count) == "0";
}

// BackupAndRestore's hook under `dtrain launch --max-restarts`: the chief replaces
// DTRAIN_PROGRESS_FILE (write a temporary beside it, rename) with the training batches done
// at each save, which tells the launcher that a restarted job is getting somewhere.
std::function<void(const std::string&, std::int64_t)> report_progress(bool chief) {
  const char* file = std::getenv("DTRAIN_PROGRESS_FILE");
  if (!chief || file == nullptr || *file == '\0') return nullptr;
  return [path = std::string(file)](const std::string& /*backup*/, std::int64_t steps) {
    write_file_replacing(path, std::to_string(steps) + "\n", "the progress file (DTRAIN_PROGRESS_FILE)");
  };
}

void prepare(const cli::RunConfig& c) {
  // Without a thread count, OMP_NUM_THREADS (which `dtrain launch` sets to each process's
  // share of the cores) is kept.
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (c.threads > 0 || !omp || !*omp) set_num_threads(c.threads);
  set_random_seed(c.seed);
}

// The files a run writes at its end, checked before it trains: a folder, a missing folder,
// or the config itself (which the run would write over) is refused naming the flag.
// What the run writes at its end, checked before it starts: not a folder, in a folder
// that exists, and none over another output, the config, the data or the weights it reads
// (a device such as /dev/null is written in place, and may take several).
void check_outputs(const std::string& config, const Overrides& o, const cli::RunConfig& c) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> inputs{{"the config being run", config}};
  for (const std::string& f : c.data.train_files) inputs.emplace_back("a training file of the config", f);
  for (const std::string& f : c.data.test_files) inputs.emplace_back("a test file of the config", f);
  if (!o.weights.empty()) inputs.emplace_back("the --weights being read", o.weights);
  const auto same = [](const std::string& a, const std::string& b) {
    std::error_code ec, ec2;
    if (fs::exists(a, ec) && fs::exists(b, ec2)) return fs::equivalent(a, b, ec);
    return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec2) && !ec && !ec2;
  };
  std::vector<std::pair<const char*, std::string>> written;
  for (const auto& [flag, out] : {std::pair<const char*, const std::string&>{"--summary", o.summary},
                                  {"--save-weights", o.save_weights},
                                  {"--profile", o.profile}}) {
    if (out.empty()) continue;
    std::error_code ec;
    if (fs::is_directory(out, ec)) DTRAIN_THROW(InvalidArgument, flag, " ", out, ": is a folder; give a file's path");
    if (is_special_file(out)) continue;
    for (const auto& [what, in] : inputs)
      if (same(out, in)) DTRAIN_THROW(InvalidArgument, flag, " ", out, ": is ", what, ", which the run would write over");
    for (const auto& [other, path] : written)
      if (same(out, path))
        DTRAIN_THROW(InvalidArgument, flag, " ", out, ": is ", other, "'s file too: one would write over the other");
    written.emplace_back(flag, out);
    const fs::path folder = fs::path(out).parent_path();
    if (!folder.empty() && !fs::is_directory(folder, ec))
      DTRAIN_THROW(InvalidArgument, flag, " ", out, ": its folder ", folder.string(), " does not exist");
  }
}

// Where the run's weights and steps live: --device, with "auto" the first GPU where one is
// present and the run has one device (the strategies' replicas and workers run on CPUs
// unless given a GPU: mirrored replicas then share it, and so do multi_worker workers and
// parameter_server workers, whose chief and ps keep host memory).
Device run_device(const std::string& flag, const cli::RunConfig& c) {
  const bool one_device = c.strategy.empty() || c.strategy == "default" || c.strategy == "one_device";
  if (flag == "auto") return one_device ? resolve_device("auto") : Device::cpu();
  return resolve_device(flag);
}

// "cuda:0 (NVIDIA H200)" for a GPU, "" for the CPU.
std::string device_description(Device d) {
  if (d.is_cpu()) return "";
  return d.to_string() + " (" + device_runtime(d.type)->properties(d.index).name + ")";
}

int run_fit(const std::string& path, const Overrides& o) {
  cli::RunConfig c = cli::load_config(path);
  apply(o, c);
  check_outputs(path, o, c);
  const Device device = run_device(o.device, c);
  const DevicePlacement placed(device);
  const cli::FaultSlow fault = cli::parse_fault_slow(o.fault_slow);
  const cli::FaultSignal kill = cli::parse_fault_signal("--fault-kill", o.fault_kill, SIGKILL, /*allow_ps=*/true);
  const cli::FaultSignal term = cli::parse_fault_signal("--fault-term", o.fault_term, SIGTERM);
  const cli::FaultSignal stop = cli::parse_fault_signal("--fault-stop", o.fault_stop, SIGSTOP);
  const cli::CheckpointConfig checkpoint = checkpoint_config(c, o);
  prepare(c);
  const auto wall_start = Clock::now();
  // A parameter server holds variables and never a batch: of the data it reads the rows'
  // shape alone (an IDX header, a first row), so its host needs no copy of the data set.
  const bool serves_variables =
      c.strategy == "parameter_server" && cluster::tf_config_from_environment().task.type == "ps";
  data::Classification d;
  Shape row;
  if (serves_variables) {
    row = cli::input_shape(c);
    cli::check_model_fits_data(c, row);
  } else {
    d = cli::load_data(c);
    row = Shape(std::vector<std::int64_t>(d.train.x.shape().dims().begin() + 1, d.train.x.shape().dims().end()));
  }
  // A planted input delay needs batches that come through a pipeline.
  if (fault.input_delay_ms > 0 && !c.data.pipeline && !serves_variables) {
    if (c.validation_split > 0)
      DTRAIN_THROW(InvalidArgument, "--fault-slow ", o.fault_slow,
                   ": an input delay feeds fit through a pipeline, which takes no validation_split");
    // As fit would have shuffled the tensors: the whole training set, each epoch.
    c.data.pipeline = cli::PipelineConfig{.shuffle = c.shuffle ? d.train.x.dim(0) : 0};
  }
  if (o.steps_per_epoch > 0 && !c.data.pipeline && !serves_variables) {
    // On tensors, an epoch of N steps trains on the first N global batches.
    // (more steps than the rows' batches: every row, without overflowing the product)
    const std::int64_t rows = o.steps_per_epoch > d.train.x.dim(0) / c.batch_size
                                  ? d.train.x.dim(0)
                                  : std::min(d.train.x.dim(0), o.steps_per_epoch * c.batch_size);
    d.train.x = d.train.x.slice(0, rows);
    d.train.y = d.train.y.slice(0, rows);
  }
  std::unique_ptr<distribute::Strategy> strategy = make_strategy(c, o, device);
  // parameter_server: every task of the job (chief, workers, ps) runs this same command;
  // the chief coordinates, reports and writes files.
  std::unique_ptr<distribute::ParameterServerStrategy> ps;
  if (c.strategy == "parameter_server") {
    distribute::ParameterServerOptions options;
    options.consistency = cli::parse_consistency(o.consistency);
    options.variable_partitioner = cli::parse_partitioner(o.partitioner);
    const cluster::TfConfig config = cluster::tf_config_from_environment();
    if (kill.ps && kill.worker >= config.cluster.num_tasks("ps"))
      DTRAIN_THROW(InvalidArgument, "--fault-kill ", o.fault_kill, ": the job has ", config.cluster.num_tasks("ps"),
                   " ps task(s), numbered from 0");
    if (kill.ps && config.task.type == "ps" && config.task.index == kill.worker && first_start_of_job())
      options.on_update = [n = kill.step](std::int64_t updates) {
        if (updates != n) return;
        std::printf("fault injection: sending SIGKILL to this parameter server after %lld updates\n",
                    static_cast<long long>(n));
        std::fflush(stdout);
        std::raise(SIGKILL);
      };
    ps = std::make_unique<distribute::ParameterServerStrategy>(config, options);
  } else if (!o.consistency.empty() || !o.partitioner.empty() || o.steps_per_execution != 1) {
    DTRAIN_THROW(InvalidArgument,
                 !o.consistency.empty() ? "--consistency" : !o.partitioner.empty() ? "--partitioner" : "--steps-per-execution",
                 " needs --strategy parameter_server");
  } else if (kill.ps) {
    DTRAIN_THROW(InvalidArgument, "--fault-kill ", o.fault_kill, ": a ps task exists only under --strategy parameter_server");
  }
  // How workers send each other gradients: without several workers there is nothing to send.
  if (c.strategy != "multi_worker")
    for (const auto& [flag, given] : {std::pair{"--compression", !o.compression.empty() && o.compression != "none"},
                                      std::pair{"--communication", !o.communication.empty()},
                                      std::pair{"--no-overlap", o.no_overlap}})
      if (given) DTRAIN_THROW(InvalidArgument, flag, " needs --strategy multi_worker (the gradients workers send each other)");
  // Under multi_worker, the chief alone writes files; every worker trains and reports.
  const bool chief = ps ? ps->is_chief() : !strategy || strategy->worker_index() == 0;
  std::unique_ptr<Model> model;
  {
    std::optional<dtrain::detail::ScopedStrategy> scope;
    if (strategy) scope.emplace(strategy->scope());
    if (ps) scope.emplace(ps->scope());
    model = cli::build_model(c);
    model->compile(cli::build_optimizer(c), cli::build_loss(c), c.metrics);
    // A backup is restored into built weights, before the first batch would build them;
    // a parameter-server job's chief places them on the ps before the first batch too.
    // So is an elastic job's, whose workers commit and exchange it from fit's start.
    const bool elastic = strategy && strategy->backend()->elastic();
    if (elastic && !checkpoint.dir.empty())
      DTRAIN_THROW(InvalidArgument, "--checkpoint-dir: an elastic job (dtrain launch --workers MIN:MAX) keeps its ",
                   "state in memory and goes on when a worker is lost; backups to files, whose workers must stay the ",
                   "same, are not offered with it");
    if ((!checkpoint.dir.empty() || ps || elastic) && !model->built()) model->build(row);
  }
  const int worker_index = ps ? (ps->task().type == "worker" ? ps->task().index : -1)
                           : strategy ? strategy->worker_index() : 0;
  // A planted fault on a worker the job does not have would silently plant nothing.
  const int job_workers = ps ? ps->num_workers() : strategy ? strategy->num_workers() : 1;
  const auto check_fault_worker = [&](const char* flag, const std::string& text, int planted) {
    if (planted >= job_workers)
      DTRAIN_THROW(InvalidArgument, flag, " ", text, ": the job has ", job_workers, " worker(s), numbered from 0");
  };
  check_fault_worker("--fault-slow", o.fault_slow, fault.worker);
  if (!kill.ps) check_fault_worker("--fault-kill", o.fault_kill, kill.worker);
  check_fault_worker("--fault-term", o.fault_term, term.worker);
  check_fault_worker("--fault-stop", o.fault_stop, stop.worker);
  const int replicas = strategy ? strategy->num_replicas_in_sync() : 1;
  const int threads_per_replica = strategy ? strategy->threads_per_replica() : num_threads();
  std::string where = device.is_cpu() ? std::to_string(num_threads()) + " threads" : device_description(device);
  if (strategy)
    where = strategy->name() + " " + std::to_string(replicas) + " replica" + (replicas > 1 ? "s" : "") + " x " +
            std::to_string(threads_per_replica) + " thread" + (threads_per_replica > 1 ? "s" : "");
  if (strategy && strategy->num_workers() > 1)
    where += " (" + std::to_string(strategy->num_workers()) + " workers, this is worker " +
             std::to_string(strategy->worker_index()) + ")";
  if (ps)
    where = ps->name() + " (" + std::to_string(ps->num_workers()) + " workers, " + std::to_string(ps->num_ps()) +
            " ps, " + cli::parse_consistency(o.consistency).description() +
            (o.partitioner.empty() ? "" : ", " + cli::parse_partitioner(o.partitioner).description()) + "; this is " +
            ps->task().to_string() + (ps->task().type == "worker" && !device.is_cpu() ? ", on " + device_description(device) : "") + ")";
  const std::string samples = serves_variables ? "the training samples stay with the workers"
                                                : std::to_string(d.train.x.dim(0)) + " training samples";
  std::printf("dtrain fit %s: %s, batch %lld, %d epochs, %s, %s\n", path.c_str(), samples.c_str(),
              static_cast<long long>(c.batch_size), c.epochs, where.c_str(), model_policy(*model).c_str());
  std::fflush(stdout);
  std::vector<double> rss;
  std::int64_t steps_trained = 0;  // by this process, in this run (a resumed one included)
  auto memory = std::make_shared<LambdaCallback>();
  memory->epoch_end = [&](int, const Logs&) { rss.push_back(resident_mb()); };
  memory->batch_end = [&](std::int64_t, const Logs&) { ++steps_trained; };
  // The learning rate's scale as training ended (an elastic job that keeps each worker's
  // batch scales it with the workers; fit sets it back to 1 as it returns).
  float final_learning_rate_scale = 1.0f;
  memory->train_end = [&](const Logs&) { final_learning_rate_scale = model->optimizer().learning_rate_scale(); };
  FitOptions fit_options{.epochs = c.epochs,
                          .batch_size = c.batch_size,
                          .validation_split = c.validation_split,
                          .shuffle = c.shuffle,
                          .seed = c.seed,
                          .gradient_accumulation_steps = c.gradient_accumulation_steps,
                          .steps_per_execution = o.steps_per_execution,
                          .gradient_noise_every = o.gradient_noise_every,
                          .cuda_graph = o.cuda_graph == "on",
                          .callbacks = {memory},
                          .verbose = c.verbose};
  if (c.data.pipeline) fit_options.steps_per_epoch = o.steps_per_epoch;
  if (!o.profile.empty()) fit_options.callbacks.push_back(std::make_shared<ProfilerCallback>(o.profile));
  if (!o.tensorboard.empty())
    fit_options.callbacks.push_back(std::make_shared<TensorBoard>(TensorBoardOptions{.log_dir = o.tensorboard}));
  // A run whose loss or weights stop being finite cannot recover: end it there (the
  // config's "terminate_on_nan": false trains on, as Keras does without the callback).
  std::shared_ptr<TerminateOnNaN> terminate;
  if (c.terminate_on_nan) fit_options.callbacks.push_back(terminate = std::make_shared<TerminateOnNaN>(&std::cout));
  std::shared_ptr<cli::SlowWorker> slow;
  if (worker_index >= 0 && fault.worker == worker_index) fit_options.callbacks.push_back(slow = std::make_shared<cli::SlowWorker>(fault.factor));
  // Testing: this worker kills itself, is preempted or hangs, at one batch of the job's first start.
  std::vector<std::shared_ptr<cli::SignalAtStep>> signals;
  for (const cli::FaultSignal& f : {kill, term, stop})
    if (!f.ps && worker_index >= 0 && f.worker == worker_index) {
      signals.push_back(std::make_shared<cli::SignalAtStep>(f.signal, f.step, first_start_of_job()));
      fit_options.callbacks.push_back(signals.back());
    }
  // Saves to resume from: a run started again with the same folder continues where this one
  // stopped (BackupAndRestore says from where), and SIGTERM saves and stops with Preempted.
  // Under parameter_server the chief alone saves (it gathers the values and the optimizer's
  // slots from the ps), and the launcher starts the whole job again from its latest backup
  // when a ps or the chief fails.
  std::shared_ptr<train::BackupAndRestore> backup;
  if (!checkpoint.dir.empty() && (!ps || chief)) {
    train::BackupAndRestoreOptions options;
    if (checkpoint.every > 0) options.save_freq = checkpoint.every;
    options.delete_checkpoint = !checkpoint.keep;
    options.on_save = report_progress(chief);
    fit_options.callbacks.push_back(backup = std::make_shared<train::BackupAndRestore>(checkpoint.dir, options));
    // From here to the process's exit SIGTERM only asks training to stop, so that a worker
    // that has saved and is on its way out with code 75 is not killed first by the SIGTERM
    // the launcher sends the others once one of them has left.
    static train::PreemptionWatcher until_exit;
  }
  // A launched job's workers all take part from the first closure (each finds the chief
  // when it starts; a later one would only join part-way through).
  if (ps && chief) distribute::ClusterCoordinator(*ps).wait_for_workers(ps->num_workers(), 120);
  std::optional<data::Dataset> pipeline;
  if (serves_variables) {
    pipeline = data::Dataset::range(0);  // served from, never read: the workers draw the batches
    fit_options.validation_split = 0;
  } else if (c.data.pipeline) {
    pipeline = cli::build_pipeline(c, d.train);
  }
  if (fault.input_delay_ms > 0 && pipeline) {
    // The fault itself, at the pipeline's end (after any prefetch), so the step waits for it.
    const auto delay = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(fault.input_delay_ms));
    pipeline = pipeline->map([delay](const data::Element& batch) {
      std::this_thread::sleep_for(delay);
      return batch;
    });
  }
  History h = pipeline ? model->fit(*pipeline, fit_options) : model->fit(d.train.x, d.train.y, fit_options);
  const bool stopped = terminate && terminate->stopped_at();
  Logs test;
  // Under parameter_server the chief alone holds the trained values when fit returns.
  if (d.test.x.defined() && !stopped && (!ps || chief)) {
    test = model->evaluate(d.test.x, d.test.y, {.batch_size = std::max<std::int64_t>(c.batch_size, 256)});
    std::printf("%s\n", logs_line("test:", test, c, d.bytes_per_token).c_str());
  }
  // What the backups took from training: the training thread's time in save() (the
  // snapshot, and any wait for the last write) and the writer's CPU time.
  const train::SaveStatistics saves = backup ? backup->save_statistics() : train::SaveStatistics{};
  if (backup && chief && c.verbose != 0 && saves.saves > 0) {
    double trained = 0;
    for (double e : h.epoch_seconds) trained += e;
    std::printf("checkpoints: %lld saves to %s; %.0f ms on the training thread (%.0f ms waiting for a write), "
                "writer %.0f ms of CPU: %.1f%% of training\n",
                static_cast<long long>(saves.saves), checkpoint.dir.c_str(), saves.seconds_in_save * 1e3,
                saves.seconds_waiting * 1e3, saves.writer_cpu_seconds * 1e3,
                trained > 0 ? 100.0 * (saves.seconds_in_save + saves.writer_cpu_seconds) / trained : 0.0);
  }
  if (!o.save_weights.empty() && chief && !stopped) {
    model->save_weights(o.save_weights);
    std::printf("weights saved to %s\n", o.save_weights.c_str());
  }
  const double wall = seconds_since(wall_start);
  if (!o.summary.empty() && chief) {
    // Steady state: the first epoch (primitive creation, cold caches) is reported apart.
    std::vector<double> sps = h.samples_per_second;
    json j;
    j["config"] = path;
    j["threads"] = num_threads();
    j["device"] = device.to_string();
    if (!device.is_cpu()) {
      j["device_name"] = device_runtime(device.type)->properties(device.index).name;
      j["cuda_graph"] = {{"captures", h.cuda_graph.captures},
                         {"replays", h.cuda_graph.replays},
                         {"not_used", h.cuda_graph.not_used}};
    }
    j["dtype_policy"] = model_policy(*model);
    j["strategy"] = ps ? ps->name() : strategy ? strategy->name() : "default";
    j["replicas"] = replicas;  // in sync, over every worker
    if (strategy && !device.is_cpu()) {  // the GPUs of their own this worker's replicas ran on
      std::set<int> gpus;
      for (const std::string& name : strategy->devices()) gpus.insert(parse_device(name).index);
      j["gpus"] = gpus.size();
    }
    j["workers"] = ps ? ps->num_workers() : strategy ? strategy->num_workers() : 1;
    if (ps) {
      j["ps"] = ps->num_ps();
      j["consistency"] = cli::parse_consistency(o.consistency).description();
      j["partitioner"] = cli::parse_partitioner(o.partitioner).description();
      j["steps_per_execution"] = o.steps_per_execution;
      const distribute::ClusterCoordinator::Statistics s = distribute::ClusterCoordinator(*ps).statistics();
      j["closures"] = s.closures_finished;
      j["closures_rerun"] = s.closures_rerun;
      j["workers_lost"] = s.workers_lost;
      using Ps = distribute::ClusterCoordinator::Statistics::Ps;  // each one's count: ps_phases.per_ps
      j["updates_applied"] = s.updates(&Ps::pushes_applied);
      j["updates_refused"] = s.updates(&Ps::pushes_refused);
      j["updates_dropped"] = s.updates(&Ps::pushes_dropped);
      j["staleness_counts"] = s.staleness_counts;
      j["closures_per_worker"] = s.closures_per_worker;
      // Seconds over the job: on the workers (pull, push, whole closures), the chief's
      // dispatch of them, at the ps.
      j["ps_phases"] = {{"steps", s.steps_finished},     {"pull_seconds", s.pull_seconds},
                        {"push_seconds", s.push_seconds}, {"worker_seconds", s.run_seconds},
                        {"dispatch_seconds", s.dispatch_seconds},
                        {"apply_seconds", s.apply_seconds}, {"queue_seconds", s.queue_seconds},
                        {"shared_memory_bytes", s.shared_memory_bytes}, {"message_bytes", s.message_bytes}};
      json per_ps = json::array();
      for (const auto& p : s.per_ps)
        per_ps.push_back({{"updates_applied", p.pushes_applied}, {"updates_refused", p.pushes_refused},
                          {"updates_dropped", p.pushes_dropped}, {"apply_seconds", p.apply_seconds},
                          {"queue_seconds", p.queue_seconds}, {"staleness_counts", p.staleness_counts},
                          {"shared_memory_bytes", p.shared_memory_bytes}, {"message_bytes", p.message_bytes}});
      j["ps_phases"]["per_ps"] = std::move(per_ps);
    }
    j["threads_per_replica"] = threads_per_replica;
    j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
    j["seed"] = c.seed;
    // Updates applied in all (a resumed run counts the ones before it), and the batches this
    // run trained.
    j["optimizer_iterations"] = model->optimizer().iterations();
    j["steps_trained"] = steps_trained;
    j["final_learning_rate_scale"] = final_learning_rate_scale;
    if (model->optimizer().loss_scale_options()) {
      // mixed_float16's loss scale where the run ended, and the steps it skipped (this run's).
      j["loss_scale"] = model->optimizer().loss_scale();
      j["skipped_updates"] = model->optimizer().skipped_updates();
    }
    if (ps) {
      // Batch callbacks run once a closure; the optimizer's count is the parameter servers',
      // which fit copied here at its end.
      j["steps_trained"] = distribute::ClusterCoordinator(*ps).statistics().steps_finished;
    }
    if (backup) {
      j["checkpoint_dir"] = checkpoint.dir;
      j["resumed_from"] = backup->resumed_from() ? json(*backup->resumed_from()) : json(nullptr);
      j["steps_done"] = backup->steps_done();  // training batches over every run of this fit
      j["checkpoint_saves"] = {{"saves", saves.saves},
                               {"seconds_in_save", saves.seconds_in_save},
                               {"seconds_waiting", saves.seconds_waiting},
                               {"writer_cpu_seconds", saves.writer_cpu_seconds},
                               {"writer_seconds", saves.writer_seconds}};
    }
    j["epochs"] = h.epoch.size();
    j["batch_size"] = c.batch_size;
    j["history"] = h.history;
    j["epoch_seconds"] = h.epoch_seconds;
    j["epoch_samples_per_second"] = sps;
    j["first_epoch_samples_per_second"] = sps.empty() ? 0.0 : sps.front();
    if (sps.size() > 1) sps.erase(sps.begin());
    j["samples_per_second"] = percentile(sps, 0.5);
    j["test"] = logs_json(test);
    if (const GradientNoise& g = h.gradient_noise; g.steps > 0)
      j["gradient_noise"] = {{"steps_sampled", g.steps},     {"small_batch", g.small_batch},
                             {"big_batch", g.big_batch},     {"gradient_sq", g.gradient_sq},
                             {"trace", g.trace},             {"noise_scale", g.noise_scale()},
                             {"efficiency", g.efficiency(g.big_batch)}};
    // Each epoch's own estimate (0 where its sampled steps gave none).
    if (h.gradient_noise.steps > 0) {
      json per_epoch = json::array();
      for (const GradientNoise& e : h.gradient_noise_per_epoch)
        per_epoch.push_back({{"steps_sampled", e.steps},
                             {"gradient_sq", e.gradient_sq},
                             {"trace", e.trace},
                             {"noise_scale", e.noise_scale()}});
      j["gradient_noise"]["per_epoch"] = std::move(per_epoch);
    }
    j["test_samples"] = d.test.x.defined() && !test.empty() ? d.test.x.dim(0) : 0;
    j["wall_seconds"] = wall;
    j["epoch_rss_mb"] = rss;  // resident memory after each epoch
    j["epoch_input_wait_seconds"] = h.input_wait_seconds;
    j["profile"] = cli::profile_json(h.profile_summary);
    // The first step whose loss or weights were not finite (0-based, as in history), and
    // whether TerminateOnNaN ended training there.
    j["non_finite"] = h.non_finite ? json{{"epoch", h.non_finite->epoch},
                                          {"batch", h.non_finite->batch},
                                          {"what", h.non_finite->what},
                                          {"loss", std::isfinite(h.non_finite->loss) ? json(h.non_finite->loss)
                                                                                     : json(std::isnan(h.non_finite->loss) ? "nan"
                                                                                     : h.non_finite->loss > 0 ? "inf"
                                                                                                              : "-inf")},
                                          {"terminated", stopped}}
                                   : json(nullptr);
    // The straggler, in the chief's summary wherever it is; what it did, where it is the chief.
    if (fault.worker >= 0 && fault.worker < j["workers"].get<int>())
      j["fault_slow"] = {{"worker", fault.worker}, {"factor", fault.factor}};
    if (slow) {
      j["fault_slow"]["batches_slowed"] = slow->batches_slowed();
      j["fault_slow"]["seconds_added"] = slow->seconds_added();
    }
    if (fault.input_delay_ms > 0) j["fault_slow"] = {{"input_delay_ms", fault.input_delay_ms}};
    for (const auto& f : signals)
      j[f->summary_key()] = {
          {"worker", worker_index}, {"step", f->step()}, {"armed", f->armed()}, {"fired", f->fired()}};
    // What the doctor's what-if model needs to know of the gradients that cross the wire.
    std::vector<std::int64_t> numels;
    for (const Variable* v : model->trainable_variables()) numels.push_back(v->numel());
    const std::int64_t parameters = std::accumulate(numels.begin(), numels.end(), std::int64_t{0});
    j["trainable_parameters"] = parameters;
    // Compression applies to the buckets sent between workers only.
    const distribute::CommunicationOptions comm = communication_options(o);
    const bool compressed = c.strategy == "multi_worker" && comm.compression != distribute::Compression::NONE;
    j["compression"] = compressed ? o.compression : "none";
    j["gradient_bytes_per_step"] = parameters * (compressed ? 2 : 4);
    // A parameter server's worker takes the whole batch each step; all-reduce splits it.
    const std::int64_t worker_batch = ps ? c.batch_size : c.batch_size / std::max(1, j["workers"].get<int>());
    const auto [table_bytes, rows_bytes] = embedding_table_bytes(*model, worker_batch);
    j["embedding_table_bytes"] = table_bytes;
    j["embedding_rows_bytes_per_step"] = rows_bytes;
    j["gradient_buckets"] = numels.empty() ? 0 : distribute::gradient_buckets(numels, comm.bytes_per_pack).front() + 1;
    j["overlap"] = comm.overlap;
    j["transport"] = strategy ? strategy->backend()->transport() : "";
    j["shared_memory"] = strategy && strategy->backend()->shares_memory();
    // Whether the communication thread has a core that no compute thread of this host's
    // workers uses: without one, moving bytes takes its time from backward.
    int on_this_host = 1;
    if (strategy && strategy->num_workers() > 1) {
      const cluster::TfConfig tf = cluster::tf_config_from_environment();
      const std::string& host = tf.cluster.address(tf.task).host;
      on_this_host = 0;
      for (const cluster::TaskId& t : tf.cluster.training_tasks()) on_this_host += tf.cluster.address(t).host == host;
    }
    const int local_replicas = strategy ? strategy->num_local_replicas() : 1;
    const int host_threads = threads_per_replica * local_replicas * on_this_host;
    j["host_threads"] = host_threads;  // compute threads of this host's workers
    j["host_cores"] = available_cores();
    // The hosts the workers ran on, taking every host to hold as many as this one.
    j["hosts"] = strategy ? (strategy->num_workers() + on_this_host - 1) / on_this_host : 1;
    j["spare_core"] = host_threads < available_cores();
    write_json(o.summary, j);
  }
  // dtrain's base Error: a diverging run fits none of the kinds a caller handles (no
  // argument was wrong, no file or peer failed); the command exits 1 naming the step.
  if (stopped)
    DTRAIN_THROW(Error, path, ": training stopped: ", terminate->stopped_at()->to_string(),
                 "; no test figures or weights were written (a learning rate too large for the data, or a NaN or "
                 "Inf in the inputs?)");
  return 0;
}

int run_evaluate(const std::string& path, const Overrides& o) {
  cli::RunConfig c = cli::load_config(path);
  apply(o, c);
  check_outputs(path, o, c);
  const DevicePlacement placed(run_device(o.device, c));
  prepare(c);
  data::Classification d = cli::load_data(c);
  auto model = cli::build_model(c);
  model->compile(cli::build_optimizer(c), cli::build_loss(c), c.metrics);
  const data::Split& split = d.test.x.defined() ? d.test : d.train;
  model->build(Shape(std::vector<std::int64_t>(split.x.shape().dims().begin() + 1, split.x.shape().dims().end())));
  model->load_weights(o.weights);
  const Logs logs = model->evaluate(split.x, split.y, {.batch_size = std::max<std::int64_t>(c.batch_size, 256)});
  std::printf("%s\n", logs_line(d.test.x.defined() ? "test:" : "train:", logs, c, d.bytes_per_token).c_str());
  if (!o.summary.empty()) write_json(o.summary, json{{"config", path}, {"weights", o.weights}, {"test", logs_json(logs)}});
  return 0;
}

int run_summary(const std::string& path) {
  cli::RunConfig c = cli::load_config(path);
  auto model = cli::build_model(c);
  ensure_built(*model, c);
  std::cout << model->summary();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: train neural networks and see where every millisecond of a step went.", "dtrain"};
  app.footer(kExamples);
  app.require_subcommand(1);
  Overrides o;
  std::string config;
  // A path flag given "" (an unset shell variable) names no file: refused, not taken as
  // the flag left out.
  const CLI::Validator a_path(
      [](std::string& text) { return text.empty() ? std::string("expected a path, got an empty one") : std::string(); },
      "PATH");

  auto add_run_flags = [&](CLI::App* cmd) {
    cmd->add_option("config", config, "JSON config file")->required();
    cmd->add_option("--epochs", o.epochs, "Override the config's epochs")->check(CLI::Range(0, 1'000'000));
    cmd->add_option("--batch-size", o.batch_size, "Override the config's batch_size (global)")
        ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 31));
    cmd->add_option("--threads", o.threads, "Compute threads (0 = every core)")->check(CLI::Range(0, 4096));
    cmd->add_option("--device", o.device,
                    "cpu, gpu (or a GPU by name: /GPU:1, cuda:1) or auto: the first GPU where one is present "
                    "(default auto)");
    cmd->add_option("--seed", o.seed, "Seed for weights, shuffling and synthetic data")
        ->check(CLI::Range(std::int64_t{0}, INT64_MAX));
    cmd->add_option("--summary", o.summary, "Write a machine-readable JSON summary here")->check(a_path);
    cmd->add_option("--dtype-policy", o.dtype_policy, "Override the config's dtype_policy")
        ->check(CLI::IsMember({"float32", "mixed_bfloat16", "mixed_float16"}));
  };
  auto add_strategy_flags = [&](CLI::App* cmd) {
    cmd->add_option("--strategy", o.strategy,
                    "default, one_device, mirrored, multi_worker or parameter_server (the last two read TF_CONFIG; overrides the config)")
        ->check(CLI::IsMember({"default", "one_device", "mirrored", "multi_worker", "parameter_server"}));
    cmd->add_option("--replicas", o.replicas,
                    "Replicas of the mirrored strategy (0 = one per core; with a GPU --device, that many logical GPUs of it, 0 = one), or of each multi_worker process")
        ->check(CLI::Range(0, 4096));
    cmd->add_option("--compression", o.compression, "multi_worker: gradient buckets on the wire as none, bf16 or fp16")
        ->check(CLI::IsMember({"none", "bf16", "fp16"}));
    cmd->add_option("--communication", o.communication,
                    "multi_worker: auto (workers that share this host sum through shared memory) or ring (always "
                    "TCP, as between hosts)")
        ->check(CLI::IsMember({"auto", "ring"}));
    cmd->add_option("--collective-timeout", o.collective_timeout,
                    "Seconds any collective waits for the other workers (multi_worker) or replicas (mirrored) "
                    "(default 60)")
        ->check(CLI::Range(0.001, 86400.0))
        ->check(CLI::Validator(
            [](std::string& text) {  // NaN passes the range's comparisons
              return std::isfinite(std::strtod(text.c_str(), nullptr)) ? std::string()
                                                                         : "expected a finite number, got " + text;
            },
            "SECONDS"));
    cmd->add_flag("--no-overlap", o.no_overlap, "multi_worker: send gradient buckets only after backward");
    cmd->add_option("--consistency", o.consistency,
                    "parameter_server: async (default), ssp:K (a worker at most K closures ahead of the slowest) or "
                    "sync[:B] (each update the mean of the first N-B workers' gradients)");
    cmd->add_option("--partitioner", o.partitioner,
                    "parameter_server: how variables are split over the ps on axis 0: fixed:N, "
                    "min_size:BYTES[:MAX_SHARDS] or max_size:BYTES[:MAX_SHARDS] (BYTES may end in k or m; default: "
                    "each variable whole, dealt to the ps in turn)");
    cmd->add_option("--steps-per-execution", o.steps_per_execution,
                    "parameter_server: training steps in each closure a worker runs (async only; default 1)")
        ->check(CLI::Range(1, 65535));
    cmd->add_option("--gradient-noise-every", o.gradient_noise_every,
                    "multi_worker: measure the gradient noise scale every this many steps (default 10; 0: never)")
        ->check(CLI::Range(0, 1'000'000));
    cmd->add_option("--gradient-accumulation-steps", o.accumulation,
                    "Average the gradients of this many batches into one update")
        ->check(CLI::Range(1, 1'000'000));
    cmd->add_option("--cluster", o.cluster,
                    "Where the cluster comes from: tf_config (TF_CONFIG, the default), slurm (srun's variables) or k8s "
                    "(a Kubernetes indexed Job under a headless service)")
        ->check(CLI::IsMember({"tf_config", "slurm", "k8s"}));
    cmd->add_option("--cluster-jobs", o.cluster_jobs,
                    "slurm, k8s: the jobs that take the tasks' ranks in turn, as job:count (chief:1,ps:1,worker:2; "
                    "default: every task a worker)");
    cmd->add_option("--cluster-port", o.cluster_port,
                    "slurm: the first port of each host's tasks (default 8888); k8s: every task's port (default 2222)")
        ->check(CLI::Range(1, 65535));
    cmd->add_option("--cluster-service", o.cluster_service,
                    "k8s: the headless service the Job's pods are under (default: $DTRAIN_SERVICE)");
  };
  CLI::App* fit = app.add_subcommand("fit", "Train the model CONFIG describes");
  add_run_flags(fit);
  add_strategy_flags(fit);
  fit->add_option("--save-weights", o.save_weights, "Save the trained weights (safetensors) here")->check(a_path);
  fit->add_option("--cuda-graph", o.cuda_graph,
                  "on a GPU: on (default) replays the step as CUDA graphs after its first two steps; off runs "
                  "every step kernel by kernel")
      ->check(CLI::IsMember({"on", "off"}));
  fit->add_option("--profile", o.profile,
                  "Write a Chrome trace of every step phase here (Perfetto, chrome://tracing); worker K of several "
                  "writes NAME.worker-K.json")
      ->check(a_path);
  fit->add_option("--tensorboard", o.tensorboard,
                  "Write TensorBoard event files here: DIR/train and DIR/validation (worker K of several: "
                  "DIR/worker_K/...), the epochs' metrics and the run's config")
      ->check(a_path);
  fit->add_option("--verbose", o.verbose, "0 silent, 1 progress bar, 2 one line per epoch (default: auto)")
      ->check(CLI::Range(0, 2));
  fit->add_option("--fault-slow", o.fault_slow,
                  "Testing: make worker K's training steps take F times as long (worker:K:Fx), a straggler for the "
                  "doctor to find; or delay every batch's input by D ms (input:Dms), an input-bound job")
      ->group("Testing");
  fit->add_option("--fault-kill", o.fault_kill,
                  "Testing: worker K sends itself SIGKILL at the start of its training batch S (worker:K:S, S counted "
                  "from 0 over every epoch), or under --strategy parameter_server ps K once it has applied N updates "
                  "(ps:K:N); on the job's first start only (DTRAIN_RESTART_COUNT unset or 0)")
      ->group("Testing");
  fit->add_option("--fault-term", o.fault_term,
                  "Testing: as --fault-kill, with SIGTERM (a preemption notice: with --checkpoint-dir, every worker "
                  "saves and stops, exit code 75)")
      ->group("Testing");
  fit->add_option("--fault-stop", o.fault_stop,
                  "Testing: as --fault-kill, with SIGSTOP (a hung worker: alive, its connections open, answering "
                  "nothing until continued)")
      ->group("Testing");
  fit->add_option("--checkpoint-dir", o.checkpoint_dir,
                  "Save what training needs to resume in this folder (BackupAndRestore); a run started again with "
                  "the same folder resumes where the last one stopped. SIGTERM saves and stops (exit code 75)")
      ->check(a_path);
  fit->add_option("--checkpoint-every", o.checkpoint_every,
                  "Save every N training batches, or \"epoch\" (default: at the end of every epoch)");
  fit->add_flag("--keep-checkpoints", o.keep_checkpoints,
                "Keep the checkpoints when training ends (by default they are deleted then)");
  fit->add_option("--steps-per-epoch", o.steps_per_epoch,
                  "Steps per epoch: the first N global batches of in-memory data, or N batches of the pipeline")
      ->check(CLI::Range(std::int64_t{1}, INT64_MAX));
  cli::DoctorOptions doctor_options;
  CLI::App* doctor = app.add_subcommand("doctor", "Run CONFIG briefly at several scales and say why it scales as it does");
  doctor->add_option("config", doctor_options.config, "JSON config file (or --runs)");
  doctor->add_option("--replicas", doctor_options.replicas, "Replicas per worker to try, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  doctor->add_option("--workers", doctor_options.workers, "Worker processes to try, e.g. 1,2")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  doctor->add_option("--steps", doctor_options.steps,
                     "Steps per epoch of each run (a warm-up epoch, then --rounds epochs measured)")
      ->check(CLI::Range(1, 1'000'000));
  doctor->add_option("--rounds", doctor_options.rounds,
                     "Epochs measured at each scale after the warm-up, for the spread of its samples/s (default 3)")
      ->check(CLI::Range(1, 1000));
  doctor->add_option("--batch-size", doctor_options.batch_size,
                     "Rows per replica per step (default: the config's batch_size); the global batch grows with "
                     "the replicas, as batch_size = 32 * num_replicas_in_sync does")
      ->check(CLI::Range(std::int64_t{1}, INT64_MAX));
  doctor->add_option("--threads-per-worker", doctor_options.threads_per_worker,
                     "Threads of each worker at every scale (default: the cores divided by the most workers tried, "
                     "or OMP_NUM_THREADS)")
      ->check(CLI::Range(1, 4096));
  doctor->add_option("--runs", doctor_options.runs,
                     "Diagnose these fit --summary files (each from a run's chief) instead of running CONFIG")
      ->delimiter(',');
  doctor->add_option("--what-if", doctor_options.what_if,
                     "Predict another scale or link: workers=16,link=10Gbit,latency=50us,burst=64KB,staged=pcie5 (each "
                     "part optional; link also nvlink, pcie5 or pcie4; burst: what the link sends at once after a rest; "
                     "staged: GPU workers that sum on the host, over a bus of that rate)");
  doctor->add_option("--report", doctor_options.report, "Write the study as one self-contained HTML page here")
      ->check(a_path);
  doctor->add_option("--strategies", doctor_options.strategies,
                     "Run both and compare: each of mirrored, multi_worker, parameter_server[:async|ssp:K|sync[:B]] "
                     "trains the job for --epochs epochs at the most --workers (at least 2)")
      ->delimiter(',');
  doctor->add_option("--epochs", doctor_options.epochs, "With --strategies: whole epochs each strategy trains (default 3)")
      ->check(CLI::Range(1, 100000));
  doctor->add_option("--target-loss", doctor_options.target_loss,
                     "With --strategies: the loss to time each strategy to (default: the loss every one reached)")
      ->check(CLI::PositiveNumber);
  doctor->add_option("--ps", doctor_options.ps, "With --strategies: parameter servers of the parameter_server runs (default 1)")
      ->check(CLI::Range(1, 64));
  doctor->add_option("--partitioner", doctor_options.partitioner,
                     "With --strategies: the parameter_server runs' fit --partitioner (fixed:N, min_size:BYTES[:MAX], "
                     "max_size:BYTES[:MAX])");
  doctor->add_option("--fault-slow", doctor_options.fault_slow,
                     "Testing: passed to every run's fit (worker:K:Fx or input:Dms), to see a planted straggler or "
                     "input delay diagnosed")
      ->group("Testing");
  std::string probe_output;
  CLI::App* probe = app.add_subcommand(
      "probe-link", "Measure the link between workers (run one per worker: dtrain launch --workers 2 probe-link)");
  probe->add_option("--output", probe_output, "Write the measurement as JSON here (the chief)")->check(a_path);
  std::string probe_device = "cpu";
  probe->add_option("--device", probe_device,
                    "cpu (default), or a GPU (cuda:0, gpu): each worker's replica on it, and the GPU path fit's "
                    "gradient sums take between the workers measured too, with the copies to and from the host");
  cli::MergeOptions merge_options;
  CLI::App* merge = app.add_subcommand(
      "merge-traces", "Merge the workers' traces (fit --profile) into one: merge-traces OUT.json IN.json...");
  merge->add_option("output", merge_options.output, "The merged trace")->required();
  merge->add_option("inputs", merge_options.inputs, "The workers' traces")->required();
  merge->add_flag("--align-steps", merge_options.align_steps,
                  "Line the traces up on their first common step's end (traces from different hosts)");
  CLI::App* evaluate = app.add_subcommand("evaluate", "Evaluate saved weights on CONFIG's test data");
  add_run_flags(evaluate);
  evaluate->add_option("--weights", o.weights, "Weights file (safetensors)")->required()->check(a_path);
  CLI::App* summary = app.add_subcommand("summary", "Print the model's layer table");
  summary->add_option("config", config, "JSON config file")->required();
  cluster::LaunchOptions launch_options;
  CLI::App* launch = app.add_subcommand(
      "launch", "Run a cluster of local processes, each with its TF_CONFIG: launch [options] -- PROGRAM ARGS... "
                "(or launch [options] fit CONFIG ...)");
  std::string launch_workers;
  launch->add_option("--workers", launch_workers,
                     "Worker tasks: N, or MIN:MAX for an elastic job (MAX workers start; the job goes on while MIN "
                     "are left, and a worker that fails starts again alone while --max-restarts allows)");
  launch->add_option("--ps", launch_options.ps, "Parameter-server tasks")->check(CLI::Range(0, 256));
  launch->add_flag("--chief", launch_options.chief, "Add a chief task");
  launch->add_option("--elastic-keep", launch_options.elastic_keep,
                     "An elastic job's choice when workers come and go: global_batch (each global batch keeps its "
                     "size, the default) or worker_batch (each worker keeps its batch; the global batch and the "
                     "learning rate follow the workers)");
  launch->add_option("--grace-seconds", launch_options.grace_seconds,
                     "Seconds between SIGTERM and SIGKILL when stopping tasks")
      ->check(CLI::Range(0.0, 3600.0));
  launch->add_option("--timeout", launch_options.timeout_seconds,
                     "The job's deadline in seconds: then every task is stopped, the ones still running are named "
                     "and the exit code is 124 (default: none)")
      ->check(CLI::Range(0.001, 1e9));
  launch->add_option("--max-restarts", launch_options.max_restarts,
                     "Start the whole job again after a task fails, at most N times (default 0); a restarted job "
                     "that fails again before it reports new progress is not restarted")
      ->check(CLI::Range(0, 1000));
  launch->prefix_command();

  // `launch ... -- PROGRAM ARGS`: the program begins at the first word launch does not
  // know (prefix_command), so the separator itself is dropped before parsing.
  std::vector<std::string> args(argv + 1, argv + argc);
  const auto launch_at = std::find(args.begin(), args.end(), "launch");
  if (launch_at != args.end()) {
    const auto separator = std::find(launch_at, args.end(), "--");
    if (separator != args.end()) args.erase(separator);
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*fit || *evaluate) resolve_cluster(o);
    if (*fit) return run_fit(config, o);
    if (*evaluate) return run_evaluate(config, o);
    if (*summary) return run_summary(config);
    if (*doctor) {
      doctor_options.self = self_path();
      cli::run_doctor(doctor_options, std::cout);
      return 0;
    }
    if (*merge) {
      cli::run_merge_traces(merge_options);
      return 0;
    }
    if (*probe) {
      cli::run_probe_link(probe_output, probe_device, std::cout);
      return 0;
    }
    if (*launch) {
      if (!launch_workers.empty()) parse_launch_workers(launch_workers, launch_options);
      std::vector<std::string> command = launch->remaining();
      // `dtrain launch ... fit CONFIG`: the tasks run this dtrain.
      if (!command.empty() && (command.front() == "fit" || command.front() == "evaluate" || command.front() == "probe-link"))
        command.insert(command.begin(), "/proc/self/exe");
      // `launch ... fit` trains one model on every task: multi_worker unless said otherwise,
      // parameter_server (with a chief to coordinate) when there are parameter servers.
      if (command.size() > 1 && command[1] == "fit" &&
          std::none_of(command.begin(), command.end(), [](const std::string& a) { return a.rfind("--strategy", 0) == 0; }))
        command.insert(command.end(), {"--strategy", launch_options.ps > 0 ? "parameter_server" : "multi_worker"});
      if (command.size() > 1 && command[1] == "fit" && launch_options.ps > 0) launch_options.chief = true;
      if (!command.empty() && command.front() == "/proc/self/exe") command.front() = self_path();
      launch_options.command = command;
      return cluster::launch(launch_options).exit_code;
    }
  } catch (const Preempted& e) {
    // Not a failure of the job: it saved a checkpoint and stopped when asked; running the
    // same command again resumes there. EX_TEMPFAIL tells `dtrain launch` (and schedulers).
    std::fflush(stdout);
    std::fprintf(stderr, "dtrain: preempted: %s\n", e.what());
    return kPreemptedExitCode;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "dtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
