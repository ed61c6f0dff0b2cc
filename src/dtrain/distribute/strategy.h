// Distribution strategies with TensorFlow's names (tf.distribute): the default strategy,
// OneDeviceStrategy and MirroredStrategy. On CPU a replica is a logical CPU device: a
// thread with its own share of the cores. Replicas share one copy of the weights and
// keep their own gradients, which fit() sums in fused buckets while backward runs.
//
//   distribute::MirroredStrategy strategy(2);
//   std::unique_ptr<Sequential> model;
//   {
//     auto scope = strategy.scope();  // `with strategy.scope():`
//     model = ...;                    // variables made here belong to the strategy
//   }
//   model->fit(x, y, {.batch_size = 32 * strategy.num_replicas_in_sync()});
//
// Custom loops: strategy.run(fn, args...) runs fn on every replica at once and returns
// a PerReplica value; PerReplica arguments (a distributed batch) are unwrapped, so each
// replica gets its own part. strategy.reduce(SUM | MEAN, value) combines them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/cluster/tf_config.h"
#include "dtrain/data/dataset.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::distribute {

namespace detail {
class ReplicaGroup;
}

enum class ReduceOp { SUM, MEAN };

// One value per replica, as strategy.run returns (TensorFlow's PerReplica).
template <typename T>
class PerReplica {
 public:
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}
  int num_replicas() const { return static_cast<int>(values_.size()); }
  const T& operator[](int replica) const { return values_.at(static_cast<std::size_t>(replica)); }
  // TensorFlow's strategy.experimental_local_results(value).
  const std::vector<T>& values() const { return values_; }

 private:
  std::vector<T> values_;
};

// How gradient buckets travel between workers (MultiWorkerMirroredStrategy): as float32,
// or rounded to 16 bits (half the bytes; see docs/distribute.md for the precision).
enum class Compression { NONE, BF16, FP16 };
// TensorFlow's tf.distribute.experimental.CommunicationImplementation, for CPUs.
enum class CommunicationImplementation { AUTO, RING };
// MirroredStrategy's cross_device_ops (tf.distribute.NcclAllReduce, ...), for replicas on
// GPUs with memories of their own.
enum class CrossDeviceOps { AUTO, NCCL_ALL_REDUCE, HIERARCHICAL_COPY, REDUCTION_TO_ONE_DEVICE };

// tf.distribute.experimental.CommunicationOptions.
struct CommunicationOptions {
  // Gradients are fused into buckets of at least this many bytes; 0: the default (4 MiB,
  // see docs/distribute.md for the measurement behind it).
  std::size_t bytes_per_pack = 0;
  // How long any wait for another replica or worker may last before it fails with
  // Timeout naming the ones that never came and the operation: every collective between
  // workers, and (MirroredStrategy too) every cross-replica call in this process (the
  // gradient all-reduce's buckets, the dense layers' and the step's barriers,
  // all_reduce and merge_call); 0: 60 s (kDefaultTimeout).
  double timeout_seconds = 0;
  // Multi-worker: the buckets' format on the wire.
  Compression compression = Compression::NONE;
  // Multi-worker: each bucket goes to the other workers as soon as backward has made it
  // (false: once backward is over).
  bool overlap = true;
  // Multi-worker: how the workers sum gradients. AUTO: through shared memory where every
  // worker runs on this host (one kernel, network and process namespace), else the TCP
  // ring; RING: always the TCP ring, as between hosts. Compressed buckets always take
  // the TCP ring.
  CommunicationImplementation implementation = CommunicationImplementation::AUTO;
  // MirroredStrategy over GPUs with memories of their own (TensorFlow's cross_device_ops):
  // AUTO and NCCL_ALL_REDUCE sum the gradients with NCCL where the machine has it (else,
  // saying why in fit's first line, as the next two); HIERARCHICAL_COPY and
  // REDUCTION_TO_ONE_DEVICE copy them to the first GPU and sum them there. Replicas on
  // logical GPUs of one GPU sum on it whichever is given (NCCL refuses two ranks on a GPU).
  CrossDeviceOps cross_device_ops = CrossDeviceOps::AUTO;
};

// The gradient bucket of each variable (index = variable, in the model's order), as fit()
// fuses them: in the reverse of that order, since backward makes the last layer's
// gradients first, each bucket closed once it holds at least `bytes_per_pack` bytes of
// float32 (0: the default, 4 MiB). The number of buckets is the last one's index + 1.
std::vector<std::size_t> gradient_buckets(const std::vector<std::int64_t>& numels, std::size_t bytes_per_pack = 0);

class DistributedDataset;

// What distribute_datasets_from_function's function is told (tf.distribute.InputContext):
// the worker's pipeline among the workers', and the replicas in sync.
struct InputContext {
  int num_input_pipelines = 1;
  int input_pipeline_id = 0;
  int num_replicas_in_sync = 1;
  // global_batch_size / num_replicas_in_sync; InvalidArgument when it does not divide.
  std::int64_t per_replica_batch_size(std::int64_t global_batch_size) const;
};

class Strategy {
 public:
  virtual ~Strategy();

  // Over every worker: num_workers() times this process's replicas.
  int num_replicas_in_sync() const;
  // "MirroredStrategy", "OneDeviceStrategy", "_DefaultDistributionStrategy".
  std::string name() const;
  // This process's replicas: "/cpu:0", "/cpu:1", ...
  const std::vector<std::string>& devices() const;
  int num_local_replicas() const { return static_cast<int>(devices().size()); }
  // Processes training together (1 except under MultiWorkerMirroredStrategy), and this
  // one's place among them (the chief is 0).
  int num_workers() const;
  int worker_index() const;
  // Cores each replica's kernels use.
  int threads_per_replica() const;

  // `with strategy.scope():` models, layers and optimizers created while the returned
  // guard lives belong to this strategy; model.fit then trains on all its replicas.
  dtrain::detail::ScopedStrategy scope() const;

  // Runs fn on every replica of this process at once. PerReplica arguments are unwrapped (replica r gets
  // value r); others are passed to every replica as they are. Returns PerReplica of fn's
  // results (nothing when fn returns void). The first failure is rethrown after every
  // replica returned, naming its replica; replicas waiting for it (all-reduce inside
  // apply_gradients, say) are released with PeerFailure instead of hanging. A replica
  // that never comes to a cross-replica call the others wait at fails them with Timeout
  // after the strategy's timeout_seconds, naming it. run() itself returns only once every
  // replica's fn has returned, since fn may use the caller's variables: fn must not wait
  // for something only the caller would do after run().
  template <typename Fn, typename... Args>
  auto run(Fn&& fn, const Args&... args) const;

  // Combines a per-replica value. Without axis, element-wise over replicas (shapes must
  // match); with an axis, also along that axis (MEAN divides by the total count along it).
  // Under MultiWorkerMirroredStrategy, over every worker's replicas: each worker calls it.
  Tensor reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis = std::nullopt) const;
  // Each position reduced over replicas (per-replica gradient lists).
  std::vector<Tensor> reduce(ReduceOp op, const PerReplica<std::vector<Tensor>>& value) const;
  // A plain tensor is not per-replica: InvalidArgument saying so.
  Tensor reduce(ReduceOp op, const Tensor& value, std::optional<int> axis = std::nullopt) const;
  // Concatenates the replicas' values along `axis` (0 only), every worker's in order.
  Tensor gather(const PerReplica<Tensor>& value, int axis = 0) const;

  // Each element of `dataset` (a global batch) is split along its first axis across the
  // replicas: as evenly as possible, the first replicas taking one row more when it does
  // not divide (a short last batch may leave the last replicas empty batches). The first
  // batch must have at least one row per replica. With several workers the dataset's
  // auto_shard_policy decides (data::auto_shard): under DATA and AUTO each worker runs the
  // whole pipeline and keeps its replicas' rows, so the pipeline must give the same order
  // everywhere (unseeded shuffles do: see MultiWorkerMirroredStrategy); under FILE each
  // worker reads its own files and makes its part of each global batch; under OFF the
  // dataset is this worker's own. With FILE and OFF a worker's batches are split over its
  // replicas only, and the loop must end when the workers' data does (fit agrees on that
  // step by step; a custom loop whose workers run out at different steps fails at the
  // collective timeout).
  DistributedDataset experimental_distribute_dataset(const data::Dataset& dataset) const;
  // strategy.distribute_datasets_from_function(dataset_fn): dataset_fn(context) is called
  // once in each worker and gives that worker's pipeline, batched with the per-replica
  // batch size (context.per_replica_batch_size) and sharded as the function chooses (by
  // context.input_pipeline_id of num_input_pipelines); a step takes one element for each
  // of the worker's replicas. Nothing is sharded for it.
  DistributedDataset distribute_datasets_from_function(const std::function<data::Dataset(const InputContext&)>& dataset_fn) const;
  InputContext input_context() const;

  // The interface fit() trains through.
  std::shared_ptr<StrategyBackend> backend() const;

 protected:
  explicit Strategy(std::shared_ptr<detail::ReplicaGroup> group);
  detail::ReplicaGroup& group() const { return *group_; }

 private:
  template <typename T>
  static const T& local(const T& value, int) {
    return value;
  }
  template <typename T>
  static const T& local(const PerReplica<T>& value, int replica) {
    return value[replica];
  }
  template <typename T>
  void check_arity(const T&) const {}
  template <typename T>
  void check_arity(const PerReplica<T>& value) const {
    check_replicas(value.num_replicas());
  }
  void check_replicas(int given) const;
  void run_replicas(const std::function<void(int)>& fn) const;
  // Over this process's replicas: the element-wise sum, and how many values went into it
  // (replicas, or rows along `axis`).
  std::pair<Tensor, std::int64_t> local_sum(const PerReplica<Tensor>& value, std::optional<int> axis) const;

  std::shared_ptr<detail::ReplicaGroup> group_;
};

// The strategy with one replica that fit() uses when no scope is open
// (tf.distribute.get_strategy() outside any scope).
class DefaultStrategy final : public Strategy {
 public:
  DefaultStrategy();
};

// One replica on one device, using all cores (tf.distribute.OneDeviceStrategy("/cpu:0")),
// or on a GPU ("/gpu:0"), where scope() places the variables it sees made.
class OneDeviceStrategy final : public Strategy {
 public:
  explicit OneDeviceStrategy(const std::string& device = "/cpu:0");
};

// Synchronous replicas in this process (tf.distribute.MirroredStrategy). Devices are
// logical CPU devices "/cpu:N" (also "cpu:N", "/device:CPU:N" and TensorFlow's full
// "/job:localhost/replica:0/task:0/device:CPU:N"); the process's threads
// (OMP_NUM_THREADS or set_num_threads, by default every core) are shared out evenly, at
// least one thread per replica. Devices may instead be logical GPUs of one GPU ("/gpu:0",
// "/gpu:1", ... after set_logical_device_configuration): the replicas share its one copy of
// the weights and sum their gradients on it (docs/gpu.md); GPUs with memories of their own
// are Unsupported for now. Of the CommunicationOptions, bytes_per_pack (CPUs) and
// timeout_seconds apply (a replica waits at most that long for the others at any
// cross-replica call; see docs/distribute.md).
class MirroredStrategy final : public Strategy {
 public:
  // One replica per core.
  MirroredStrategy();
  explicit MirroredStrategy(int num_replicas, CommunicationOptions options = {});
  explicit MirroredStrategy(const std::vector<std::string>& devices, CommunicationOptions options = {});
};

// Synchronous replicas in several processes, on one host or many
// (tf.distribute.MultiWorkerMirroredStrategy). TF_CONFIG says which processes make up the
// cluster (the chief, or worker 0 without one, and the workers) and which one this is;
// `dtrain launch` sets it for a cluster on this machine. Every worker builds the same
// model under scope(); fit() then checks that they did, starts every worker from the
// chief's weights, splits each global batch over every worker's replicas and sums the
// gradients in buckets across processes over Gloo while backward still runs.
//
// Joining: the chief serves a rendezvous store on its own TF_CONFIG address; a process
// joins with the cluster token (DTRAIN_CLUSTER_TOKEN, else one derived from the cluster's
// addresses) and waits at most the timeout, naming the tasks that never arrived. Every
// collective has the same timeout: a dead or stuck worker is an error naming it on every
// other worker, never a hang. The strategy also gives every worker the chief's place in
// the seed sequence (set_random_seed) without drawing from it, so unseeded initialisers
// and shuffles match everywhere, and the initial weights are those one process builds
// from the same seed, whatever the strategy and the number of workers.
// DTRAIN_CHECK_COLLECTIVES=1 makes every collective first compare what each worker is
// about to run (a debugging aid: it doubles the number of messages).
// An elastic job's side of a worker (Horovod Elastic's, TorchElastic's): `dtrain launch
// --workers MIN:MAX` sets it in each worker's environment (elastic_from_environment).
struct ElasticJob {
  int min_workers = 1, max_workers = 1;
  std::string store;  // "host:port" of the rendezvous store the launcher serves
  std::string id;     // this worker, "worker:2": the same when it starts again
  // The job's token (empty: DTRAIN_CLUSTER_TOKEN), which the store asks for.
  std::string token;
  // Training batches between two commits of the state in memory (each a copy of the
  // weights and the optimizer's slots): a failure loses at most these, trained again.
  // 0: as often as costs at most 5% of the training time (agreed at each commit).
  std::int64_t commit_every = 0;
  // How long a new round waits for the members of the one before that did not come (alive
  // but stopped), and for MIN workers; 0: the collective timeout.
  double join_timeout_seconds = 0;
  // The address the other workers reach this one at.
  std::string host = "127.0.0.1";
  // When the workers change: false keeps each global batch its size (each worker's share
  // grows as workers leave); true keeps each worker's batch (fit's batch_size / MAX
  // rows), so that the global batch and, with it, the learning rate follow the workers
  // (the linear scaling rule). Tensors only: a dataset's batches are its own.
  bool keep_worker_batch = false;
};
// From DTRAIN_ELASTIC ("MIN:MAX"), DTRAIN_ELASTIC_STORE, DTRAIN_ELASTIC_ID and optionally
// DTRAIN_ELASTIC_COMMIT_EVERY, DTRAIN_ELASTIC_HOST and DTRAIN_ELASTIC_KEEP (global_batch,
// the default, or worker_batch); nothing without DTRAIN_ELASTIC. A
// malformed value is an error naming the variable.
std::optional<ElasticJob> elastic_from_environment();

class MultiWorkerMirroredStrategy final : public Strategy {
 public:
  // Reads TF_CONFIG from the environment; without it (or with "" or "{}"), a single
  // worker that trains at once, meeting nobody. A cluster of one training task is the
  // same: world size 1, the same code path as the default strategy. Under `dtrain launch
  // --workers MIN:MAX` (elastic_from_environment()), an elastic job instead.
  explicit MultiWorkerMirroredStrategy(CommunicationOptions options = {});
  // An elastic job: the workers meet in rounds through the launcher's store. fit() commits
  // the state in memory every few batches (ElasticJob::commit_every); when a worker dies or stops
  // answering, the others agree on who is left, take the latest commit among them,
  // reconnect and go on, each global batch split over the workers left (its size, and so
  // the computation, as a fixed-size run of the same membership history); a worker that
  // starts again joins at the next commit and receives it. num_workers() and
  // worker_index() follow the changes. The model must be built before fit(). See
  // docs/cluster.md ("Elastic training").
  explicit MultiWorkerMirroredStrategy(const ElasticJob& elastic, CommunicationOptions options = {},
                                       const std::vector<std::string>& local_devices = {"/cpu:0"});
  // TensorFlow's cluster_resolver argument, as a parsed TF_CONFIG. `local_devices` may be
  // GPUs as MirroredStrategy takes them: the workers then sum through pinned host memory
  // (docs/gpu.md); an elastic job's may not, for now.
  explicit MultiWorkerMirroredStrategy(const cluster::TfConfig& cluster, CommunicationOptions options = {},
                                       const std::vector<std::string>& local_devices = {"/cpu:0"});
  // This task, as TF_CONFIG names it ("worker", 1); the chief is worker_index() 0.
  const std::string& task_type() const { return task_.type; }
  int task_id() const { return task_.index; }
  bool is_chief() const { return worker_index() == 0; }

  // The link to the other workers as the gradient all-reduce sees it (the communication
  // thread's hand-off and Gloo's ring included): all-reduces of a small and a large
  // buffer, their median times fitted to the ring's cost, 2(N-1) messages of latency
  // plus 2(N-1)/N of the bytes at the bandwidth. Then the 1 MiB buffer again, three
  // times, after the links rested as long as it takes to send (20 to 100 ms): where it
  // goes faster than back to back, by more than twice the back-to-back timings' median
  // deviation and 3%, the link sends a burst at once after a rest (a rate limiter's
  // token bucket, as clouds' and tc tbf's are) of the bytes the time saved would carry.
  // Every worker must call it; it takes about a second on a fast link (the large buffer
  // is sized to take about 0.25 s, the rests add up to 0.3 s).
  struct LinkMeasurement {
    double bytes_per_second = 0;  // per direction
    double latency_seconds = 0;   // per message
    double burst_bytes = 0;       // sent at once after a rest
    struct Sample {
      std::size_t bytes;
      double seconds;  // median
    };
    std::vector<Sample> samples;
    Sample rested{0, 0};       // the middle buffer after a rest
    double rest_seconds = 0;   // how long the links rested
    // The fit of the smallest and the largest sample to the ring's cost among `workers`.
    static LinkMeasurement fit(int workers, std::vector<Sample> samples);
    // The burst: the bytes at `bytes_per_second` of the time a transfer of `busy` seconds
    // back to back (their median deviation `deviation`) saved after a rest, taking
    // `rested`; 0 where it saved no more than twice the deviation or 3% of `busy`.
    static double burst(double busy, double deviation, double rested, double bytes_per_second);
  };
  LinkMeasurement measure_link() const;

  // GPU workers (replicas on GPUs): the path their gradients' sums take, timed as fit uses
  // it (its gradient reducer over one buffer: NCCL in place on the GPU, or a copy to
  // pinned host memory, the workers' all-reduce, and a copy back), and fitted to the
  // ring's cost as measure_link's samples are; then the copies between the GPU and pinned
  // host memory alone (64 MiB each way, the median of 5), the rate the doctor's what-if
  // takes as `staged=`. Every worker must call it; InvalidArgument where the replicas are
  // on CPUs or there is one worker.
  struct GpuPathMeasurement {
    std::string path;                  // transport(): "staged through pinned host memory ..."
    LinkMeasurement link;              // the whole path as one link
    double copy_bytes_per_second = 0;  // between the GPU and pinned host memory, each way (mean)
  };
  GpuPathMeasurement measure_gpu_path() const;

 private:
  // An elastic job where given, else the cluster TF_CONFIG names.
  MultiWorkerMirroredStrategy(const std::optional<ElasticJob>& elastic, CommunicationOptions options);
  cluster::TaskId task_;
};

// sum(per_example_loss) / global_batch_size: the loss each replica minimises so that the
// replicas' gradients add up to the gradient of the mean over the global batch
// (tf.nn.compute_average_loss). global_batch_size < 0: this replica's batch times the
// number of replicas in sync.
Tensor compute_average_loss(const Tensor& per_example_loss, std::int64_t global_batch_size = -1);
// A regularization loss (the sum of model.losses) divided by the replicas in sync
// (tf.nn.scale_regularization_loss): the replicas' gradients then add up to it once.
Tensor scale_regularization_loss(const Tensor& regularization_loss);

// A global batch's rows for each of `replicas`, as views: sizes differ by at most one,
// the first replicas taking the extra rows.
std::vector<data::Element> split_batch(const data::Element& batch, int replicas);

// A dataset whose elements are PerReplica batches (strategy.experimental_distribute_dataset).
class DistributedDataset {
 public:
  class Iterator {
   public:
    std::optional<PerReplica<data::Element>> next();

   private:
    friend class DistributedDataset;
    Iterator(data::Iterator it, int replicas, int workers, int worker, bool per_replica)
        : it_(std::move(it)), replicas_(replicas), workers_(workers), worker_(worker), per_replica_(per_replica) {}
    data::Iterator it_;
    int replicas_;  // this process's
    int workers_, worker_;
    bool per_replica_;  // each element one replica's batch (distribute_datasets_from_function)
    bool first_ = true;
  };
  // A new pass over the data (`iteration` seeds reshuffling, as Dataset::make_iterator).
  Iterator make_iterator(std::uint64_t iteration = 0) const;

  // Range-for support: for (const auto& batch : distributed) ...
  class RangeIterator {
   public:
    const PerReplica<data::Element>& operator*() const { return *current_; }
    RangeIterator& operator++() {
      current_ = it_->next();
      return *this;
    }
    bool operator!=(std::default_sentinel_t) const { return current_.has_value(); }

   private:
    friend class DistributedDataset;
    explicit RangeIterator(std::shared_ptr<Iterator> it) : it_(std::move(it)), current_(it_->next()) {}
    std::shared_ptr<Iterator> it_;
    std::optional<PerReplica<data::Element>> current_;
  };
  RangeIterator begin() const;
  std::default_sentinel_t end() const { return {}; }
  int num_replicas() const { return replicas_; }

 private:
  friend class Strategy;
  DistributedDataset(data::Dataset dataset, int replicas, int workers, int worker, bool per_replica = false)
      : dataset_(std::move(dataset)), replicas_(replicas), workers_(workers), worker_(worker), per_replica_(per_replica) {}
  data::Dataset dataset_;
  int replicas_;
  int workers_, worker_;
  bool per_replica_;
};

// Gradient accumulation for custom loops: each replica adds its gradients to its own sums
// (no communication, like PyTorch's no_sync); every `steps` micro-batches, reduce() sums
// them over the replicas once and divides by `steps`.
//
//   strategy.run([&](const data::Element& b) { ...; accumulator.accumulate(tape.gradient(loss, vars)); }, batch);
//   if (accumulator.ready()) optimizer.apply_gradients(accumulator.reduce(), vars);
class GradientAccumulator {
 public:
  GradientAccumulator(const Strategy& strategy, int steps);
  // Inside strategy.run() (or outside it with one replica): adds this replica's gradients.
  void accumulate(std::span<const Tensor> grads);
  int steps() const { return steps_; }
  // Outside run(): micro-batches accumulated since the last reduce().
  int count() const { return counts_.front(); }
  bool ready() const { return count() >= steps_; }
  // Outside run(): the sums over replicas and micro-batches divided by the micro-batch
  // count (MEAN also divides by the replicas); then starts again from zero.
  std::vector<Tensor> reduce(ReduceOp op = ReduceOp::SUM);

 private:
  Strategy strategy_;  // a handle: the accumulator keeps the replicas alive
  int steps_;
  std::vector<std::vector<Tensor>> sums_;  // [replica][gradient]
  std::vector<int> counts_;                // [replica], each written by its replica only
};

// --- templates

template <typename Fn, typename... Args>
auto Strategy::run(Fn&& fn, const Args&... args) const {
  (check_arity(args), ...);
  using Result = std::invoke_result_t<Fn&, decltype(local(args, 0))...>;
  if constexpr (std::is_void_v<Result>) {
    run_replicas([&]([[maybe_unused]] int r) { fn(local(args, r)...); });
  } else {
    std::vector<std::optional<Result>> results(static_cast<std::size_t>(num_local_replicas()));
    run_replicas([&](int r) { results[static_cast<std::size_t>(r)].emplace(fn(local(args, r)...)); });
    std::vector<Result> values;
    values.reserve(results.size());
    for (auto& v : results) values.push_back(std::move(*v));
    return PerReplica<Result>(std::move(values));
  }
}

}  // namespace dtrain::distribute
