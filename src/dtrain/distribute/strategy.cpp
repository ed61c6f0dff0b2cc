// Strategies, per-replica reductions, distributed datasets and gradient accumulation.
#include "dtrain/distribute/strategy.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <future>
#include <regex>
#include <set>
#include <thread>

#include "dtrain/autograd/ops.h"
#include "dtrain/comm/local_store.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/percentile.h"
#include "dtrain/core/replica.h"
#include "dtrain/core/rng.h"
#include "dtrain/core/threads.h"
#include "dtrain/distribute/bucket_reducer.h"
#include "dtrain/distribute/device_reducer.h"
#include "dtrain/distribute/replica_group.h"
#include "dtrain/distribute/worker_comm.h"

namespace dtrain::distribute {
namespace {

// "/cpu:3", "cpu:3", "/device:CPU:3", "/job:localhost/replica:0/task:0/device:CPU:3" -> 3;
// the same names of GPUs -> -1 - N (logical GPU N, see set_logical_device_configuration).
int parse_replica_device(const std::string& device) {
  static const std::regex name(R"(^(/job:[^/]+/replica:\d+/task:\d+)?(/device:|/|device:)?(cpu|gpu):(\d{1,6})$)",
                               std::regex::icase);
  std::smatch m;
  if (!std::regex_match(device, m, name))
    DTRAIN_THROW(InvalidArgument, "device '", device,
                 "' is not a replica's device name; expected \"/cpu:N\" or \"/gpu:N\" (TensorFlow's names)");
  const int index = std::stoi(m[4].str());
  return std::tolower(static_cast<unsigned char>(m[3].str()[0])) == 'c' ? index : -1 - index;
}

// The NCCL that `runtime`'s GPUs can use (CUDA's GPUs the machine's, any a test's fake),
// or null with why not in `absence`.
const comm::NcclApi* nccl_for(DeviceRuntime& runtime, std::string& absence) {
  if (std::string(runtime.name()) == "CUDA" || comm::nccl_library_replaced()) return comm::nccl_library(&absence);
  absence = std::string("its GPU's runtime is ") + runtime.name() + ", not CUDA";
  return nullptr;
}

// GPU workers: every worker says which GPU it has and whether it has NCCL; all of them
// then sum in one NCCL group, or all through pinned host memory, saying why.
void choose_gpu_path(detail::GroupOptions& o) {
  detail::WorkerComm& w = *o.workers;
  DeviceRuntime& runtime = *device_runtime(o.placement->type);
  std::string absence;
  const comm::NcclApi* nccl = nccl_for(runtime, absence);
  const std::string mine = runtime.properties(o.placement->index).uuid + "\n" + absence;
  std::vector<std::string> uuids, absences, tasks;
  for (const std::string& theirs : w.exchange("gpu-path", mine)) {
    const std::size_t nl = theirs.find('\n');
    uuids.push_back(theirs.substr(0, nl));
    absences.push_back(nl == std::string::npos ? "" : theirs.substr(nl + 1));
  }
  for (int r = 0; r < w.size(); ++r) tasks.push_back(w.task_name(r));
  o.no_nccl = detail::nccl_refusal(uuids, absences, tasks);
  if (o.no_nccl.empty())
    o.nccl = std::make_shared<comm::NcclGroup>(
        *nccl, w.store(), comm::NcclGroupOptions{w.rank(), w.size(), tasks, o.placement->index, o.timeout});
}

// Replicas on GPUs of their own: NCCL's ranks in this process, one per replica (joined
// at once, from a thread each, through a store of this process), where the machine has
// NCCL and cross_device_ops asks for no copies to one device; else why not.
void choose_replica_path(detail::GroupOptions& o, CrossDeviceOps ops) {
  if (ops == CrossDeviceOps::HIERARCHICAL_COPY || ops == CrossDeviceOps::REDUCTION_TO_ONE_DEVICE) {
    o.no_replica_nccl = ops == CrossDeviceOps::HIERARCHICAL_COPY ? "cross_device_ops HierarchicalCopyAllReduce"
                                                         : "cross_device_ops ReductionToOneDevice";
    return;
  }
  std::string absence;
  const comm::NcclApi* nccl = nccl_for(*device_runtime(o.placement->type), absence);
  if (!nccl) {
    o.no_replica_nccl = "no NCCL: " + absence;
    return;
  }
  const int n = static_cast<int>(o.gpus.size());
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r)
    names.push_back(dtrain::detail::concat("replica ", r, " (", o.gpus[static_cast<std::size_t>(r)].to_string(), ")"));
  auto store = std::make_shared<comm::LocalStore>(o.name + "'s NCCL ranks");
  std::vector<std::future<std::shared_ptr<comm::NcclGroup>>> joining;
  for (int r = 0; r < n; ++r)
    joining.push_back(std::async(std::launch::async, [&, r] {
      return std::make_shared<comm::NcclGroup>(
          *nccl, store,
          comm::NcclGroupOptions{r, n, names, o.gpus[static_cast<std::size_t>(r)].index, o.timeout, "replicas/"});
    }));
  // A rank's own error (a device's, NCCL's) is the cause; the others' Timeouts waiting for
  // it follow from it.
  std::exception_ptr failed, timed_out;
  for (auto& j : joining) {
    try {
      o.replica_nccl.push_back(j.get());
    } catch (const Timeout&) {
      if (!timed_out) timed_out = std::current_exception();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  if (timed_out) std::rethrow_exception(timed_out);
}

std::chrono::milliseconds timeout_of(const CommunicationOptions& comm) {
  if (!(comm.timeout_seconds >= 0.0))
    DTRAIN_THROW(InvalidArgument, "CommunicationOptions: timeout_seconds must be >= 0, got ", comm.timeout_seconds);
  return timeout_from_seconds(comm.timeout_seconds);
}

comm::Wire wire_of(Compression c) {
  switch (c) {
    case Compression::BF16:
      return comm::Wire::bf16;
    case Compression::FP16:
      return comm::Wire::f16;
    case Compression::NONE:
      break;
  }
  return comm::Wire::f32;
}

// `cores` (this process's threads: OMP_NUM_THREADS or set_num_threads, by default every
// core) are shared out among the devices; workers: the other processes (multi-worker).
std::shared_ptr<detail::ReplicaGroup> make_group(std::string name, const std::vector<std::string>& devices,
                                                 CommunicationOptions comm, int cores = num_threads(),
                                                 std::shared_ptr<detail::WorkerComm> workers = nullptr) {
  if (devices.empty()) DTRAIN_THROW(InvalidArgument, name, ": needs at least one device");
  std::set<int> seen;
  detail::GroupOptions o;
  o.name = std::move(name);
  const bool gpus = parse_replica_device(devices.front()) < 0;
  for (const std::string& d : devices) {
    const int index = parse_replica_device(d);
    if (!seen.insert(index).second) DTRAIN_THROW(InvalidArgument, o.name, ": device '", d, "' is listed twice");
    if ((index < 0) != gpus)
      DTRAIN_THROW(InvalidArgument, o.name, ": devices '", devices.front(), "' and '", d,
                   "' are a CPU and a GPU; a strategy's replicas are all CPU thread groups or all GPUs");
    if (index >= 0) {
      o.devices.push_back("/cpu:" + std::to_string(index));
      continue;
    }
    // A GPU, logical or not: replicas on logical GPUs of one GPU share its memory and
    // queue; replicas each on a GPU of its own have a copy of the weights on it.
    const Device gpu = parse_device(d);
    check_device(gpu);
    if (!o.placement) o.placement = gpu;
    o.gpus.push_back(gpu);
    o.devices.push_back("/gpu:" + std::to_string(-1 - index));
  }
  if (gpus) {
    std::string listed;
    for (const std::string& d : devices) listed += (listed.empty() ? "'" : ", '") + d + "'";
    std::set<int> physical;
    for (const Device& g : o.gpus) physical.insert(g.index);
    if (physical.size() == 1) {
      o.gpus.clear();  // one GPU: its logical GPUs share its weights
    } else if (physical.size() < o.gpus.size()) {
      DTRAIN_THROW(Unsupported, o.name, ": devices ", listed, " are logical GPUs of several ",
                   "GPUs; replicas are either on logical GPUs of one GPU or each on a GPU of its own");
    }
  }
  o.threads_per_replica = std::max(1, cores / static_cast<int>(devices.size()));
  o.bucket_bytes = comm.bytes_per_pack ? comm.bytes_per_pack : detail::kDefaultBucketBytes;
  o.workers = std::move(workers);
  o.overlap = comm.overlap;
  o.wire = wire_of(comm.compression);
  o.timeout = timeout_of(comm);
  if (o.placement && o.workers) choose_gpu_path(o);
  if (o.gpus.size() > 1) choose_replica_path(o, comm.cross_device_ops);
  return std::make_shared<detail::ReplicaGroup>(std::move(o));
}

std::vector<std::string> cpu_devices(int n, const char* who) {
  if (n < 1) DTRAIN_THROW(InvalidArgument, who, ": num_replicas must be >= 1, got ", n);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("/cpu:" + std::to_string(i));
  return out;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::SUM ? "SUM" : "MEAN"; }

// The samples a link is fitted from: `timings(floats, repeats)` (every worker calls it
// alike) of 1 KiB (`small_repeats` times), 1 MiB (5) and a large buffer sized to take
// about a quarter of a second (3), their medians; and the 1 MiB timings themselves.
// Every worker must all-reduce the same size: the large one comes from the mean of the
// workers' 1 MiB medians, which the sum over the workers makes the same everywhere.
struct ThreeSizes {
  std::vector<MultiWorkerMirroredStrategy::LinkMeasurement::Sample> samples;
  std::vector<double> middles;
};
ThreeSizes time_three_sizes(detail::ReplicaGroup& group, int n,
                            const std::function<std::vector<double>(std::int64_t, int)>& timings, int small_repeats) {
  const std::int64_t small = 256, middle = 1 << 18;
  ThreeSizes out;
  const double t_small = percentile(timings(small, small_repeats), 0.5);
  out.middles = timings(middle, 5);
  const double t_middle = percentile(out.middles, 0.5);
  std::vector<double> mean{t_middle};
  group.sum_over_workers(mean);
  const double scale = 0.25 / std::max(mean[0] / n, 1e-6);
  const std::int64_t large =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(static_cast<double>(middle) * scale), middle, 1 << 24);
  const double t_large = large == middle ? t_middle : percentile(timings(large, 3), 0.5);
  out.samples = {{static_cast<std::size_t>(small) * 4, t_small},
                 {static_cast<std::size_t>(middle) * 4, t_middle},
                 {static_cast<std::size_t>(large) * 4, t_large}};
  return out;
}

}  // namespace

std::vector<std::size_t> gradient_buckets(const std::vector<std::int64_t>& numels, std::size_t bytes_per_pack) {
  const std::size_t bucket_floats =
      std::max<std::size_t>((bytes_per_pack ? bytes_per_pack : detail::kDefaultBucketBytes) / sizeof(float), 1);
  std::vector<std::size_t> bucket_of(numels.size());
  std::size_t bucket = 0, filled = 0;
  for (std::size_t k = numels.size(); k-- > 0;) {
    if (filled >= bucket_floats) {
      ++bucket;
      filled = 0;
    }
    bucket_of[k] = bucket;
    filled += static_cast<std::size_t>(numels[k]);
  }
  return bucket_of;
}

// ---- Strategy

Strategy::Strategy(std::shared_ptr<detail::ReplicaGroup> group) : group_(std::move(group)) {}
Strategy::~Strategy() = default;

int Strategy::num_replicas_in_sync() const { return group_->num_replicas_in_sync(); }
int Strategy::num_workers() const { return group_->num_workers(); }
int Strategy::worker_index() const { return group_->worker_index(); }
std::string Strategy::name() const { return group_->name(); }
const std::vector<std::string>& Strategy::devices() const { return group_->options().devices; }
int Strategy::threads_per_replica() const { return group_->options().threads_per_replica; }
std::shared_ptr<StrategyBackend> Strategy::backend() const { return group_; }

dtrain::detail::ScopedStrategy Strategy::scope() const { return dtrain::detail::ScopedStrategy(group_); }

void Strategy::check_replicas(int given) const {
  if (given != num_local_replicas())
    DTRAIN_THROW(InvalidArgument, name(), ": a per-replica value has ", given, " values for this process's ",
                 num_local_replicas(), " replicas");
}

void Strategy::run_replicas(const std::function<void(int)>& fn) const { group_->run(fn); }

std::pair<Tensor, std::int64_t> Strategy::local_sum(const PerReplica<Tensor>& value, std::optional<int> axis) const {
  check_replicas(value.num_replicas());
  const int n = value.num_replicas();
  Tensor total;
  std::int64_t count = 0;
  for (int r = 0; r < n; ++r) {
    const Tensor& v = value[r];
    v.check_defined("Strategy::reduce");
    Tensor part = v;
    if (axis) {
      const int a = *axis < 0 ? *axis + v.rank() : *axis;
      if (a < 0 || a >= v.rank())
        DTRAIN_THROW(InvalidArgument, name(), ".reduce: axis ", *axis, " is out of range for replica ", r,
                     "'s value of shape ", v.shape().to_string());
      count += v.dim(a);
      part = reduce_sum(v, {a});
    } else {
      ++count;
    }
    if (total.defined() && !(total.shape() == part.shape()))
      DTRAIN_THROW(InvalidArgument, name(), ".reduce: replica ", r, "'s value ", v.shape().to_string(),
                   axis ? " does not match the other replicas' along the axes kept" : " does not match replica 0's",
                   axis ? std::string() : " " + value[0].shape().to_string());
    // Replicas on GPUs of their own: summed on replica 0's device.
    if (total.defined() && !(part.device() == total.device())) part = part.to(total.device());
    total = total.defined() ? add(total, part) : part.clone();
  }
  return {total, count};
}

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis) const {
  auto [total, count] = local_sum(value, axis);
  if (num_workers() > 1) {
    group_->sum_over_workers(total);
    if (op == ReduceOp::SUM) return total;
    std::vector<double> counts{static_cast<double>(count)};
    group_->sum_over_workers(counts);
    count = static_cast<std::int64_t>(counts[0]);
  }
  if (op == ReduceOp::SUM) return total;
  return scale(total, count > 0 ? 1.0f / static_cast<float>(count) : 0.0f);
}

std::vector<Tensor> Strategy::reduce(ReduceOp op, const PerReplica<std::vector<Tensor>>& value) const {
  check_replicas(value.num_replicas());
  const std::size_t count = value[0].size();
  for (int r = 1; r < value.num_replicas(); ++r)
    if (value[r].size() != count)
      DTRAIN_THROW(InvalidArgument, name(), ".reduce: replica ", r, " has ", value[r].size(), " values, replica 0 has ",
                   count);
  std::vector<Tensor> out(count);
  std::vector<double> defined(count, 0.0);
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<Tensor> parts;
    for (int r = 0; r < value.num_replicas(); ++r)
      if (value[r][i].defined()) parts.push_back(value[r][i]);
    if (parts.empty()) continue;  // no replica had this gradient: stays undefined
    while (static_cast<int>(parts.size()) < value.num_replicas())
      parts.push_back(Tensor::zeros(parts[0].shape(), parts[0].dtype(), parts[0].device()));
    out[i] = local_sum(PerReplica<Tensor>(std::move(parts)), std::nullopt).first;
    defined[i] = 1.0;
  }
  if (num_workers() > 1) {
    // Every worker must sum the same list, so whether each value is defined must agree.
    group_->sum_over_workers(defined);
    for (std::size_t i = 0; i < count; ++i) {
      if (defined[i] != 0.0 && defined[i] != static_cast<double>(num_workers()))
        DTRAIN_THROW(InvalidArgument, name(), ".reduce: value ", i, " is defined on ", defined[i], " of ",
                     num_workers(), " workers (worker ", worker_index(), (out[i].defined() ? " has it" : " does not"),
                     "); every worker must reduce the same values");
      group_->sum_over_workers(out[i]);
    }
  }
  if (op == ReduceOp::MEAN)
    for (Tensor& t : out)
      if (t.defined()) t = scale(t, 1.0f / static_cast<float>(num_replicas_in_sync()));
  return out;
}

Tensor Strategy::reduce(ReduceOp op, const Tensor&, std::optional<int>) const {
  DTRAIN_THROW(InvalidArgument, name(), ".reduce(", op_name(op),
               "): the value is a plain tensor, not a per-replica value; reduce what strategy.run returned");
}

Tensor Strategy::gather(const PerReplica<Tensor>& value, int axis) const {
  check_replicas(value.num_replicas());
  if (axis != 0) DTRAIN_THROW(Unsupported, name(), ".gather: only axis 0 is supported, got ", axis);
  std::int64_t rows = 0;
  for (int r = 0; r < value.num_replicas(); ++r) {
    const Tensor& v = value[r];
    v.check_defined("Strategy::gather");
    if (v.rank() < 1) DTRAIN_THROW(InvalidArgument, name(), ".gather: replica ", r, "'s value is a scalar");
    const Tensor& first = value[0];
    bool same = v.rank() == first.rank() && v.dtype() == first.dtype();
    for (int d = 1; same && d < v.rank(); ++d) same = v.dim(d) == first.dim(d);
    if (!same)
      DTRAIN_THROW(InvalidArgument, name(), ".gather: replica ", r, "'s value ", v.shape().to_string(),
                   " does not match replica 0's ", first.shape().to_string(), " beyond axis 0");
    rows += v.dim(0);
  }
  Tensor out = Tensor::empty(value[0].shape().with_dim(0, rows), value[0].dtype(), value[0].device());
  std::int64_t at = 0;
  for (int r = 0; r < value.num_replicas(); ++r) {
    const Tensor& v = value[r];
    out.slice(at, at + v.dim(0)).copy_from(v);
    at += v.dim(0);
  }
  return num_workers() > 1 ? group_->gather_over_workers(out) : out;
}

DistributedDataset Strategy::experimental_distribute_dataset(const data::Dataset& dataset) const {
  // A custom loop has no step-by-step agreement on when the workers' data ends, so AUTO
  // keeps every worker on the same global batches (DATA); FILE and OFF, asked for, give
  // each worker its own batches, split over its replicas only.
  data::Dataset placed = dataset;
  if (dataset.options().auto_shard_policy == data::AutoShardPolicy::AUTO) {
    data::DatasetOptions options = dataset.options();
    options.auto_shard_policy = data::AutoShardPolicy::DATA;
    placed = dataset.with_options(options);
  }
  const data::WorkerShard shard = data::auto_shard(placed, num_workers(), worker_index());
  if (shard.own_batches) return DistributedDataset(shard.dataset, group_->num_replicas(), 1, 0);
  return DistributedDataset(dataset, group_->num_replicas(), num_workers(), worker_index());
}

InputContext Strategy::input_context() const {
  return {.num_input_pipelines = num_workers(), .input_pipeline_id = worker_index(),
          .num_replicas_in_sync = num_replicas_in_sync()};
}

std::int64_t InputContext::per_replica_batch_size(std::int64_t global_batch_size) const {
  if (global_batch_size % num_replicas_in_sync != 0)
    DTRAIN_THROW(InvalidArgument, "get_per_replica_batch_size: the global batch size ", global_batch_size,
                 " is not divisible by num_replicas_in_sync ", num_replicas_in_sync);
  return global_batch_size / num_replicas_in_sync;
}

DistributedDataset Strategy::distribute_datasets_from_function(
    const std::function<data::Dataset(const InputContext&)>& dataset_fn) const {
  if (!dataset_fn) DTRAIN_THROW(InvalidArgument, "distribute_datasets_from_function: the function is empty");
  return DistributedDataset(dataset_fn(input_context()), group_->num_replicas(), 1, 0, true);
}

DefaultStrategy::DefaultStrategy()
    : Strategy(make_group("_DefaultDistributionStrategy", {"/cpu:0"}, {})) {}

namespace {

// One replica on `device`: the CPU's logical devices as MirroredStrategy's, or a GPU, where
// scope() places the variables.
std::shared_ptr<detail::ReplicaGroup> one_device_group(const std::string& device) {
  const Device d = parse_device(device);
  if (d.is_cpu()) return make_group("OneDeviceStrategy", {device}, {});
  check_device(d);
  detail::GroupOptions o;
  o.name = "OneDeviceStrategy";
  o.devices = {"/gpu:" + std::to_string(d.index)};
  o.threads_per_replica = std::max(1, num_threads());
  o.bucket_bytes = detail::kDefaultBucketBytes;
  o.placement = d;
  return std::make_shared<detail::ReplicaGroup>(std::move(o));
}

}  // namespace

OneDeviceStrategy::OneDeviceStrategy(const std::string& device) : Strategy(one_device_group(device)) {}

MirroredStrategy::MirroredStrategy() : MirroredStrategy(available_cores()) {}

MirroredStrategy::MirroredStrategy(int num_replicas, CommunicationOptions options)
    : Strategy(make_group("MirroredStrategy", cpu_devices(num_replicas, "MirroredStrategy"), options)) {}

MirroredStrategy::MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options)
    : Strategy(make_group("MirroredStrategy", devices, options)) {}

namespace {

std::shared_ptr<detail::ReplicaGroup> make_multi_worker_group(const cluster::TfConfig& config,
                                                              const CommunicationOptions& comm,
                                                              const std::vector<std::string>& devices);
std::shared_ptr<detail::ReplicaGroup> make_elastic_group(const ElasticJob& elastic, const CommunicationOptions& comm,
                                                         const std::vector<std::string>& devices);

// "worker:2" as a task; the elastic job's ids are the launcher's.
cluster::TaskId task_of(const std::string& id) {
  const std::size_t colon = id.rfind(':');
  cluster::TaskId t;
  t.type = id.substr(0, colon);
  if (colon != std::string::npos) {
    try {
      t.index = std::stoi(id.substr(colon + 1));
    } catch (const std::exception&) {
      t.index = 0;
    }
  }
  return t;
}

}  // namespace

std::optional<ElasticJob> elastic_from_environment() {
  const char* range = std::getenv("DTRAIN_ELASTIC");
  if (!range || !*range) return std::nullopt;
  ElasticJob job;
  const std::string text = range;
  const std::size_t colon = text.find(':');
  try {
    // A whole number, all of `part`.
    auto count = [&](const std::string& part) {
      std::size_t used = 0;
      const int n = std::stoi(part, &used);
      if (used != part.size()) throw std::invalid_argument(text);
      return n;
    };
    job.min_workers = count(text.substr(0, colon));
    job.max_workers = colon == std::string::npos ? job.min_workers : count(text.substr(colon + 1));
  } catch (const std::exception&) {
    DTRAIN_THROW(InvalidArgument, "DTRAIN_ELASTIC='", text, "': expected MIN:MAX, two numbers of workers");
  }
  auto needed = [](const char* name) {
    const char* value = std::getenv(name);
    if (!value || !*value)
      DTRAIN_THROW(InvalidArgument, "DTRAIN_ELASTIC is set, but ", name, " is not (`dtrain launch --workers MIN:MAX` sets both)");
    return std::string(value);
  };
  job.store = needed("DTRAIN_ELASTIC_STORE");
  job.id = needed("DTRAIN_ELASTIC_ID");
  if (const char* every = std::getenv("DTRAIN_ELASTIC_COMMIT_EVERY"); every && *every) {
    char* end = nullptr;
    job.commit_every = std::strtoll(every, &end, 10);
    if (*end != '\0' || job.commit_every < 0)
      DTRAIN_THROW(InvalidArgument, "DTRAIN_ELASTIC_COMMIT_EVERY='", every,
                   "': expected a number of batches >= 1, or 0 (chosen by cost)");
  }
  if (const char* host = std::getenv("DTRAIN_ELASTIC_HOST"); host && *host) job.host = host;
  if (const char* keep = std::getenv("DTRAIN_ELASTIC_KEEP"); keep && *keep) {
    const std::string k = keep;
    if (k != "global_batch" && k != "worker_batch")
      DTRAIN_THROW(InvalidArgument, "DTRAIN_ELASTIC_KEEP='", k, "': expected global_batch or worker_batch");
    job.keep_worker_batch = k == "worker_batch";
  }
  return job;
}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(CommunicationOptions options)
    : MultiWorkerMirroredStrategy(elastic_from_environment(), options) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const std::optional<ElasticJob>& elastic,
                                                         CommunicationOptions options)
    : Strategy(elastic ? make_elastic_group(*elastic, options, {"/cpu:0"})
                       : make_multi_worker_group(cluster::tf_config_from_environment(), options, {"/cpu:0"})),
      task_(elastic ? task_of(elastic->id) : cluster::tf_config_from_environment().task) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const ElasticJob& elastic, CommunicationOptions options,
                                                         const std::vector<std::string>& local_devices)
    : Strategy(make_elastic_group(elastic, options, local_devices)), task_(task_of(elastic.id)) {}

namespace {

// Every worker takes the chief's place in its seed sequence, without drawing from it:
// what draws from it without a seed of its own (initialisers, shuffles) then draws the
// same everywhere, and the same as one process would from the same seed.
// An elastic job's worker that joins later takes what the first round's first worker
// published, so that what it draws before fit (an unseeded shuffle) draws alike too.
void take_first_workers_seeds(detail::WorkerComm& workers) {
  std::string chief;
  if (workers.is_elastic() && workers.round() > 0) {
    const std::optional<std::string> first = workers.first_round_value("seed");
    if (!first) return;
    chief = *first;
  } else {
    const SeedSequence mine = seed_sequence();
    chief = workers.exchange("seed", std::to_string(mine.seed) + " " + std::to_string(mine.drawn)).front();
  }
  const std::size_t space = chief.find(' ');
  set_seed_sequence({std::stoull(chief.substr(0, space)), std::stoull(chief.substr(space + 1))});
}

// What every worker's connection takes from the strategy's options.
detail::WorkerCommOptions worker_comm_options(const CommunicationOptions& comm) {
  detail::WorkerCommOptions w;
  w.timeout = timeout_of(comm);
  const char* check = std::getenv("DTRAIN_CHECK_COLLECTIVES");
  w.check_collectives = check && *check && std::string(check) != "0";
  w.shared_memory = comm.implementation == CommunicationImplementation::AUTO;
  return w;
}

std::shared_ptr<detail::ReplicaGroup> make_multi_worker_group(const cluster::TfConfig& config,
                                                              const CommunicationOptions& comm,
                                                              const std::vector<std::string>& devices) {
  // Checked here, before the one-task shortcut below: WorkerComm, built only here, relies on it.
  if (config.task.type != "chief" && config.task.type != "worker")
    DTRAIN_THROW(InvalidArgument, "MultiWorkerMirroredStrategy: TF_CONFIG's task is ", config.task.to_string(),
                 "; this strategy trains on the chief and the workers only");
  // One training task (no TF_CONFIG, an empty one, or a cluster of one worker) is the
  // degenerate case: world size 1, nothing to meet or wait for, as TensorFlow does.
  std::shared_ptr<detail::WorkerComm> workers;
  if (config.cluster.training_tasks().size() > 1) {
    detail::WorkerCommOptions w = worker_comm_options(comm);
    w.config = config;
    workers = std::make_shared<detail::WorkerComm>(std::move(w));
    take_first_workers_seeds(*workers);
  }
  // Several processes on one machine share its cores: OMP_NUM_THREADS (which `dtrain
  // launch` sets) says how many are this one's.
  return make_group("MultiWorkerMirroredStrategy", devices, comm, num_threads(), std::move(workers));
}

std::shared_ptr<detail::ReplicaGroup> make_elastic_group(const ElasticJob& elastic, const CommunicationOptions& comm,
                                                         const std::vector<std::string>& devices) {
  for (const std::string& d : devices)
    if (parse_replica_device(d) < 0)
      DTRAIN_THROW(Unsupported, "MultiWorkerMirroredStrategy (elastic): device '", d,
                   "': an elastic job's workers train on CPUs for now (\"/cpu:N\")");
  detail::WorkerCommOptions w = worker_comm_options(comm);
  w.token = elastic.token;
  if (w.token.empty())
    if (const char* token = std::getenv("DTRAIN_CLUSTER_TOKEN"); token && *token) w.token = token;
  if (w.token.empty())
    DTRAIN_THROW(InvalidArgument, "MultiWorkerMirroredStrategy (elastic): the job's token is not given (ElasticJob::token ",
                 "or DTRAIN_CLUSTER_TOKEN; `dtrain launch` sets it)");
  detail::WorkerCommOptions::Elastic e;
  e.store = elastic.store;
  e.id = elastic.id;
  e.rounds.min_workers = elastic.min_workers;
  e.rounds.max_workers = elastic.max_workers;
  e.rounds.join_timeout = elastic.join_timeout_seconds > 0
                              ? std::chrono::milliseconds(static_cast<std::int64_t>(elastic.join_timeout_seconds * 1000))
                              : w.timeout;
  e.host = elastic.host;
  if (elastic.commit_every < 0)
    DTRAIN_THROW(InvalidArgument, "MultiWorkerMirroredStrategy (elastic): commit_every must be >= 0, got ",
                 elastic.commit_every);
  e.commit_every = elastic.commit_every;
  e.keep_worker_batch = elastic.keep_worker_batch;
  w.elastic = std::move(e);
  auto workers = std::make_shared<detail::WorkerComm>(std::move(w));
  // The first round's workers start from the same seed sequence, as a fixed job's do; a
  // worker joining later receives the whole state instead.
  take_first_workers_seeds(*workers);
  return make_group("MultiWorkerMirroredStrategy", devices, comm, num_threads(), std::move(workers));
}

}  // namespace

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const cluster::TfConfig& cluster, CommunicationOptions options,
                                                         const std::vector<std::string>& local_devices)
    : Strategy(make_multi_worker_group(cluster, options, local_devices)), task_(cluster.task) {}

MultiWorkerMirroredStrategy::LinkMeasurement MultiWorkerMirroredStrategy::measure_link() const {
  const int n = num_workers();
  if (n < 2)
    DTRAIN_THROW(InvalidArgument, "measure_link: TF_CONFIG lists ", n,
                 " worker; the link is between workers, so it needs at least 2");
  // Zeros stay zeros however often they are summed. Each all-reduce after `rest` seconds
  // in which no worker sends (all start resting together, after a small all-reduce).
  auto timings = [&](std::int64_t floats, int repeats, double rest = 0) {
    Tensor buffer = Tensor::zeros(Shape{floats});
    group().sum_over_workers(buffer);  // first use: Gloo's buffers for this size
    std::vector<double> seconds;
    for (int i = 0; i < repeats; ++i) {
      if (rest > 0) {
        std::vector<double> together{0};
        group().sum_over_workers(together);
        std::this_thread::sleep_for(std::chrono::duration<double>(rest));
      }
      const Clock::time_point start = Clock::now();
      group().sum_over_workers(buffer);
      seconds.push_back(seconds_since(start));
    }
    return seconds;
  };
  const std::int64_t middle = 1 << 18;  // 1 MiB
  const ThreeSizes sized = time_three_sizes(group(), n, timings, 41);
  const double t_middle = sized.samples[1].seconds;
  std::vector<double> deviations;
  for (double x : sized.middles) deviations.push_back(std::abs(x - t_middle));
  const double deviation = percentile(deviations, 0.5);
  LinkMeasurement m = LinkMeasurement::fit(n, sized.samples);
  // Workers that sum through shared memory have no rate limiter between them to look for
  // (and every worker knows it alike).
  if (group().shares_memory()) return m;
  // A rest as long as the middle buffer takes refills a bucket as deep as it, up to 0.1 s
  // (below TCP's shortest retransmission timeout, after which it would start the
  // connection's window afresh); every worker rests as long as the chief's timing says
  // (it is summed with the others' zeros).
  std::vector<double> rest{is_chief() ? std::clamp(t_middle, 0.02, 0.1) : 0.0};
  group().sum_over_workers(rest);
  m.rest_seconds = rest[0];
  m.rested = {static_cast<std::size_t>(middle) * 4, percentile(timings(middle, 3, m.rest_seconds), 0.5)};
  m.burst_bytes = LinkMeasurement::burst(t_middle, deviation, m.rested.seconds, m.bytes_per_second);
  return m;
}

MultiWorkerMirroredStrategy::GpuPathMeasurement MultiWorkerMirroredStrategy::measure_gpu_path() const {
  const int n = num_workers();
  if (!group().on_gpu() || n < 2)
    DTRAIN_THROW(InvalidArgument, "measure_gpu_path: the path between GPU workers needs replicas on GPUs and 2 or more ",
                 "workers; this strategy has ", n, " worker", n == 1 ? "" : "s", " of replicas on ",
                 group().on_gpu() ? "GPUs" : "CPUs");
  const Device gpu = *group().placement();
  DeviceRuntime& runtime = *device_runtime(gpu.type);
  GpuPathMeasurement out;
  out.path = group().transport();
  // One variable's gradient of `floats` zeros a replica, summed by fit's own reducer.
  auto timings = [&](std::int64_t floats, int repeats) {
    Variable variable("probe", Tensor::zeros(Shape{floats}, DType::f32, gpu));
    Variable* vars[] = {&variable};
    const std::unique_ptr<GradientReducer> reducer = group().gradient_reducer(vars, {}, false);
    const Tensor gradient = Tensor::zeros(Shape{floats}, DType::f32, gpu);
    std::vector<double> seconds;
    for (int i = 0; i <= repeats; ++i) {  // the first: the buffers' first use, not counted
      runtime.synchronize(gpu.index);
      const Clock::time_point start = Clock::now();
      reducer->begin_step(true, {});
      group().run([&](int r) {
        reducer->gradient_ready(r, 0, gradient);
        reducer->finish(r);
      });
      runtime.synchronize(gpu.index);
      if (i > 0) seconds.push_back(seconds_since(start));
    }
    return seconds;
  };
  out.link = LinkMeasurement::fit(n, time_three_sizes(group(), n, timings, 21).samples);
  // The copies alone, each way.
  const std::int64_t copy_floats = std::int64_t{16} << 20;  // 64 MiB
  Tensor host = Tensor::empty_pinned(Shape{copy_floats});
  Tensor device = Tensor::zeros(Shape{copy_floats}, DType::f32, gpu);
  host.copy_from(device);
  std::vector<double> up, down;
  for (int i = 0; i < 5; ++i) {
    Clock::time_point start = Clock::now();
    device.copy_from(host);
    up.push_back(seconds_since(start));
    start = Clock::now();
    host.copy_from(device);
    down.push_back(seconds_since(start));
  }
  const double bytes = static_cast<double>(copy_floats) * 4;
  out.copy_bytes_per_second = 2 * bytes / std::max(percentile(up, 0.5) + percentile(down, 0.5), 1e-12);
  return out;
}

double MultiWorkerMirroredStrategy::LinkMeasurement::burst(double busy, double deviation, double rested,
                                                            double bytes_per_second) {
  const double saved = busy - rested;
  return saved > std::max(2 * deviation, 0.03 * busy) ? saved * bytes_per_second : 0;
}

MultiWorkerMirroredStrategy::LinkMeasurement MultiWorkerMirroredStrategy::LinkMeasurement::fit(
    int workers, std::vector<Sample> samples) {
  if (workers < 2 || samples.size() < 2)
    DTRAIN_THROW(InvalidArgument, "LinkMeasurement::fit: needs 2 or more workers and samples, got ", workers, " and ",
                 samples.size());
  std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.bytes < b.bytes; });
  const Sample& lo = samples.front();
  const Sample& hi = samples.back();
  if (hi.bytes == lo.bytes) DTRAIN_THROW(InvalidArgument, "LinkMeasurement::fit: the samples need two sizes");
  const double share = 2.0 * (workers - 1) / workers;  // of the bytes each worker sends
  const double per_byte =
      std::max((hi.seconds - lo.seconds) / static_cast<double>(hi.bytes - lo.bytes), 1e-15);  // noise: never negative
  LinkMeasurement m;
  m.bytes_per_second = share / per_byte;
  m.latency_seconds =
      std::max(0.0, lo.seconds - share * static_cast<double>(lo.bytes) / m.bytes_per_second) / (2.0 * (workers - 1));
  m.samples = std::move(samples);
  return m;
}

// ---- losses and batches

Tensor compute_average_loss(const Tensor& per_example_loss, std::int64_t global_batch_size) {
  per_example_loss.check_defined("compute_average_loss");
  if (global_batch_size < 0) {
    const std::int64_t local = per_example_loss.rank() > 0 ? per_example_loss.dim(0) : 1;
    global_batch_size = local * replica_context().num_replicas_in_sync;
  }
  if (global_batch_size == 0) return scale(reduce_sum(per_example_loss), 0.0f);
  return scale(reduce_sum(per_example_loss), 1.0f / static_cast<float>(global_batch_size));
}

Tensor scale_regularization_loss(const Tensor& regularization_loss) {
  regularization_loss.check_defined("scale_regularization_loss");
  const int replicas = replica_context().num_replicas_in_sync;
  return replicas == 1 ? regularization_loss : scale(regularization_loss, 1.0f / static_cast<float>(replicas));
}

std::vector<data::Element> split_batch(const data::Element& batch, int replicas) {
  if (batch.empty()) DTRAIN_THROW(InvalidArgument, "split_batch: the element has no components");
  std::int64_t rows = -1;
  for (std::size_t c = 0; c < batch.size(); ++c) {
    const Tensor& t = batch[c];
    t.check_defined("split_batch");
    if (t.rank() < 1)
      DTRAIN_THROW(InvalidArgument, "split_batch: component ", c, " is a scalar; a distributed dataset needs batches ",
                   "(add .batch(global_batch_size))");
    if (rows >= 0 && t.dim(0) != rows)
      DTRAIN_THROW(InvalidArgument, "split_batch: component ", c, " has ", t.dim(0), " rows, component 0 has ", rows);
    rows = t.dim(0);
  }
  std::vector<data::Element> out(static_cast<std::size_t>(replicas));
  const std::int64_t base = rows / replicas, extra = rows % replicas;
  std::int64_t begin = 0;
  for (int r = 0; r < replicas; ++r) {
    const std::int64_t end = begin + base + (r < extra ? 1 : 0);
    for (const Tensor& t : batch) out[static_cast<std::size_t>(r)].push_back(t.slice(begin, end));
    begin = end;
  }
  return out;
}

// ---- DistributedDataset

std::optional<PerReplica<data::Element>> DistributedDataset::Iterator::next() {
  if (per_replica_) {
    // One element per replica; at the end, replicas left without one get an empty batch
    // shaped as the last one given (as TensorFlow pads a partial step).
    std::vector<data::Element> parts;
    for (int r = 0; r < replicas_; ++r) {
      std::optional<data::Element> e = it_.next();
      if (!e) break;
      parts.push_back(std::move(*e));
    }
    if (parts.empty()) return std::nullopt;
    while (static_cast<int>(parts.size()) < replicas_) {
      data::Element empty;
      for (const Tensor& t : parts.back()) empty.push_back(t.rank() > 0 ? t.slice(0, 0) : t);
      parts.push_back(std::move(empty));
    }
    return PerReplica<data::Element>(std::move(parts));
  }
  std::optional<data::Element> e = it_.next();
  if (!e) return std::nullopt;
  const int in_sync = replicas_ * workers_;
  std::vector<data::Element> parts = split_batch(*e, in_sync);
  if (first_ && parts.back().front().dim(0) == 0) {
    const std::int64_t rows = e->front().dim(0);
    DTRAIN_THROW(InvalidArgument, "experimental_distribute_dataset: the global batch has ", rows, " rows, fewer than the ",
                 in_sync, " replicas; batch the dataset with a global batch of at least ", in_sync,
                 " (per-replica batch * num_replicas_in_sync)");
  }
  first_ = false;
  // This worker's replicas take their parts of the global batch; the rest belong to the others.
  const auto first = parts.begin() + static_cast<std::ptrdiff_t>(worker_) * replicas_;
  return PerReplica<data::Element>(std::vector<data::Element>(first, first + replicas_));
}

DistributedDataset::Iterator DistributedDataset::make_iterator(std::uint64_t iteration) const {
  return Iterator(dataset_.make_iterator(iteration), replicas_, workers_, worker_, per_replica_);
}

DistributedDataset::RangeIterator DistributedDataset::begin() const {
  return RangeIterator(std::make_shared<Iterator>(make_iterator()));
}

// ---- GradientAccumulator

GradientAccumulator::GradientAccumulator(const Strategy& strategy, int steps)
    : strategy_(strategy),
      steps_(steps),
      sums_(static_cast<std::size_t>(strategy.num_local_replicas())),
      counts_(static_cast<std::size_t>(strategy.num_local_replicas()), 0) {
  if (steps < 1) DTRAIN_THROW(InvalidArgument, "GradientAccumulator: steps must be >= 1, got ", steps);
}

void GradientAccumulator::accumulate(std::span<const Tensor> grads) {
  const ReplicaContext& context = replica_context();
  int replica = 0;
  if (context.strategy == strategy_.backend()->id()) {
    replica = context.replica_id;
  } else if (strategy_.num_local_replicas() > 1) {
    DTRAIN_THROW(InvalidArgument, "GradientAccumulator::accumulate: call it inside strategy.run() of its ",
                 strategy_.name(), " (", strategy_.num_local_replicas(), " replicas)");
  }
  std::vector<Tensor>& sums = sums_[static_cast<std::size_t>(replica)];
  if (sums.empty()) sums.resize(grads.size());
  if (sums.size() != grads.size())
    DTRAIN_THROW(InvalidArgument, "GradientAccumulator::accumulate: ", grads.size(), " gradients, earlier calls gave ",
                 sums.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    if (!sums[i].defined()) {
      sums[i] = grads[i].clone();
    } else {
      check_same_shape(sums[i], grads[i], "GradientAccumulator::accumulate");
      kernels::backend(grads[i].device()).binary(kernels::Binary::add, sums[i], grads[i], sums[i]);
    }
  }
  ++counts_[static_cast<std::size_t>(replica)];
}

std::vector<Tensor> GradientAccumulator::reduce(ReduceOp op) {
  if (replica_context().strategy != 0)
    DTRAIN_THROW(InvalidArgument, "GradientAccumulator::reduce: call it outside strategy.run()");
  const int count = counts_.front();
  if (count == 0) DTRAIN_THROW(InvalidArgument, "GradientAccumulator::reduce: nothing was accumulated");
  for (std::size_t r = 0; r < counts_.size(); ++r)
    if (counts_[r] != count)
      DTRAIN_THROW(InvalidArgument, "GradientAccumulator::reduce: replica ", r, " accumulated ", counts_[r],
                   " micro-batches, replica 0 ", count);
  std::size_t width = 0;
  for (const auto& s : sums_) width = std::max(width, s.size());
  for (auto& s : sums_) s.resize(width);
  std::vector<Tensor> out = strategy_.reduce(op, PerReplica<std::vector<Tensor>>(sums_));
  for (Tensor& t : out)
    if (t.defined()) t = scale(t, 1.0f / static_cast<float>(count));
  for (auto& s : sums_) s.clear();
  std::fill(counts_.begin(), counts_.end(), 0);
  return out;
}

}  // namespace dtrain::distribute
