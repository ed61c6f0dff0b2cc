// ParameterServerStrategy and ClusterCoordinator (tf.distribute.ParameterServerStrategy,
// tf.distribute.coordinator.ClusterCoordinator): the variables live on the parameter
// servers ("ps" tasks), sharded by a Partitioner; the coordinator (the "chief" task)
// schedules closures, each of which one worker runs: pull the current values, run the
// step with the existing kernels, push the gradients, which the ps holding each shard
// applies with its own copy of the optimizer as they arrive (asynchronous training).
//
// C++ cannot ship a closure, so every task runs the same program and functions travel by
// name:
//
//   distribute::ParameterServerStrategy strategy;        // TF_CONFIG: chief, worker, ps
//   distribute::ClusterCoordinator coordinator(strategy);
//   if (strategy.task().type == "ps") return coordinator.serve(), 0;
//   { auto scope = strategy.scope(); model = build_model(); }    // on chief and workers
//   auto per_worker = coordinator.create_per_worker_dataset(dataset_fn);
//   auto train_step = coordinator.define("train_step", [&](data::Iterator& it) { ...
//       optimizer.apply_gradients(grads, vars);                     // pushes to the ps
//       return std::vector<Tensor>{loss}; });
//   if (!strategy.is_chief()) return coordinator.serve(), 0;   // workers run closures
//   auto it = per_worker.iterator();
//   for (int s = 0; s < steps; ++s) coordinator.schedule(train_step, it);
//   coordinator.join();                         // then the chief's variables hold the ps's values
//
// The rule: every worker defines the same functions and per-worker datasets, in the same
// order, and builds the same model under scope(), before serve(); the coordinator checks
// the model when it first reaches a worker (a mismatch is an error naming the worker and
// the first differing variable), and a closure naming a function the worker lacks fails
// with an error naming both. Every RPC carries the job's cluster token and a deadline.
// See docs/parameter_server.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/cluster/tf_config.h"
#include "dtrain/data/dataset.h"
#include "dtrain/model/strategy_backend.h"
#include "dtrain/ps/partitioner.h"

namespace dtrain::distribute {

// How the workers' updates are ordered: the seeds' sync-versus-async question as a setting.
struct Consistency {
  enum class Kind { ASYNC, SSP, SYNC };
  Kind kind = Kind::ASYNC;
  int staleness = 0;       // SSP: a worker may run this many closures ahead of the slowest
  int backup_workers = 0;  // SYNC: updates take the first (workers - backup_workers) gradients
  // Each push applied as it arrives (TensorFlow's ParameterServerStrategy).
  static Consistency async() { return {}; }
  // Stale-synchronous parallel (Ho et al. 2013): a worker may not start its closure
  // t + k + 1 before every live worker has finished closure t.
  static Consistency ssp(int k) { return {Kind::SSP, k, 0}; }
  // Synchronous with backup workers (Chen et al. 2016): each update is the mean of the
  // first N - b gradients computed from the current weights, one per worker; later ones
  // are dropped, and a worker that gave its gradient waits for the update before pulling.
  static Consistency sync(int backup_workers = 0) { return {Kind::SYNC, 0, backup_workers}; }
  // "async", "ssp(2)", "sync", "sync with 1 backup worker".
  std::string description() const;
};

struct ParameterServerOptions {
  // How variables are split over the parameter servers (default: whole, dealt in turn).
  Partitioner variable_partitioner;
  Consistency consistency;
  // The deadline of every RPC that moves variables or gradients or checks a task; 0: 60 s.
  double rpc_timeout_seconds = 0;
  // The coordinator pings every task this often (seconds; 0: 0.5).
  double heartbeat_seconds = 0;
  // A worker that answers no ping for this long is lost: its closure runs elsewhere and
  // its later pushes are refused (0: 10 s).
  double worker_timeout_seconds = 0;
  // A worker or ps that hears nothing from the coordinator for this long stops serving
  // (the coordinator died; 0: 30 s).
  double coordinator_timeout_seconds = 0;
  // The job's cluster token; empty: DTRAIN_CLUSTER_TOKEN, else one derived from TF_CONFIG.
  std::string token;
  // A task on the same host as a ps (same kernel, network and process namespaces) pulls
  // values and pushes gradients through shared memory the ps makes for it, with only the
  // small messages through gRPC; false: everything through gRPC. A ps on another host
  // always goes through gRPC.
  bool shared_memory = true;
  // A variable its layer reads by rows (an Embedding's table, trainable) is pulled by a
  // worker only in the rows each batch looks up, and its gradient pushed in those rows
  // only, as TensorFlow's lookups in a sharded embedding are; something else reading it
  // whole (a regularizer, a tied output layer) pulls it whole, and whole from then on. The update
  // on the ps is the one the whole gradient (zero in the other rows) gives. false: such
  // variables are pulled and pushed whole, like every other.
  bool embedding_rows = true;
  // Called on a ps after each update it applies, with the count of updates applied so far
  // (for monitoring and fault injection; it runs on the ps's RPC thread, so keep it short).
  std::function<void(std::int64_t updates)> on_update;
};

namespace detail {
class PsRuntime;
class Coordinator;
struct Closure;
}  // namespace detail

class ParameterServerStrategy {
 public:
  // Reads TF_CONFIG, which must name a chief, at least one worker and at least one ps.
  explicit ParameterServerStrategy(ParameterServerOptions options = {});
  explicit ParameterServerStrategy(const cluster::TfConfig& config, ParameterServerOptions options = {});
  ~ParameterServerStrategy();
  ParameterServerStrategy(const ParameterServerStrategy&) = delete;
  ParameterServerStrategy& operator=(const ParameterServerStrategy&) = delete;

  std::string name() const { return "ParameterServerStrategy"; }
  // `with strategy.scope():` variables made meanwhile live on the parameter servers.
  dtrain::detail::ScopedStrategy scope() const;
  const cluster::TaskId& task() const;
  bool is_chief() const { return task().type == "chief"; }
  int num_workers() const;
  int num_ps() const;
  // The variables made under scope() in this process, in the order made.
  std::vector<Variable*> variables() const;
  // Where each shard of variables() lives.
  std::vector<ShardPlacement> placement() const;
  // A worker that loads the chief's program (ClusterCoordinator::serve(ProgramLoader)):
  // the chief's partitioner, set by the program before it builds the model.
  void set_variable_partitioner(Partitioner partitioner);
  // The chief: ends the job now, as destroying the strategy and every coordinator handle
  // does: closures still queued are cancelled, and every worker and ps is told to stop
  // serving. For a program whose strategy outlives its training (a Python program's,
  // kept until the interpreter exits). Nothing can be scheduled afterwards.
  void end_job();

 private:
  friend class ClusterCoordinator;
  std::shared_ptr<detail::PsRuntime> runtime_;
};

// A function every task defined under one name (ClusterCoordinator::define).
struct RemoteFunction {
  std::string name;
  bool takes_iterator = false;
};

// An iterator over a per-worker dataset: each worker makes and keeps its own.
struct PerWorkerIterator {
  int dataset = 0;
  int iterator = 0;
};

class PerWorkerDataset {
 public:
  // A new iterator (each worker makes it the first time a closure uses it).
  PerWorkerIterator iterator();

 private:
  friend class ClusterCoordinator;
  explicit PerWorkerDataset(int id) : id_(id) {}
  int id_;
  int iterators_ = 0;
};

// The result of a scheduled closure (TensorFlow's RemoteValue). Results are copied to the
// coordinator as soon as the closure ends, so they survive the worker.
class RemoteValue {
 public:
  // Waits for the closure; its results, or its error (Cancelled when an earlier error
  // cancelled it before it ran).
  const std::vector<Tensor>& fetch() const;
  bool done() const;

 private:
  friend class ClusterCoordinator;
  explicit RemoteValue(std::shared_ptr<detail::Closure> closure) : closure_(std::move(closure)) {}
  std::shared_ptr<detail::Closure> closure_;
};

class ClusterCoordinator {
 public:
  using IteratorFunction = std::function<std::vector<Tensor>(data::Iterator&)>;
  using PlainFunction = std::function<std::vector<Tensor>()>;

  // The chief has one coordinator per strategy, which model.fit() shares: every
  // ClusterCoordinator made from the strategy is a handle on it. When the strategy and
  // every handle are gone, it tells every worker and ps that the job is over (waiting
  // for nothing).
  explicit ClusterCoordinator(ParameterServerStrategy& strategy);
  ~ClusterCoordinator();
  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  // Every task: `fn` under `name` (unique; "model.fit" is fit()'s). Inside fn, optimizer.apply_gradients pushes
  // the gradients to the parameter servers instead of applying them.
  RemoteFunction define(const std::string& name, IteratorFunction fn);
  RemoteFunction define(const std::string& name, PlainFunction fn);
  // Every task: a dataset each worker builds with dataset_fn() (rebuilt by a worker that
  // comes back).
  PerWorkerDataset create_per_worker_dataset(std::function<data::Dataset()> dataset_fn);

  // The chief: queues the closure and returns at once; some free worker runs it at least
  // once, and its gradients are applied exactly once.
  RemoteValue schedule(const RemoteFunction& fn);
  RemoteValue schedule(const RemoteFunction& fn, const PerWorkerIterator& iterator);
  // The chief: waits until nothing is queued or running, then copies the parameter
  // servers' values into this process's variables. Throws the first error a closure
  // raised since the last join (the closures queued behind it were cancelled).
  void join();
  // Whether nothing is queued or running.
  bool done() const;
  // The chief: places the variables on the parameter servers if no schedule() has yet,
  // then waits until `count` workers answer with the right model (a benchmark's or a
  // test's start line; training needs no such wait). Timeout after `timeout_seconds`,
  // naming the workers still missing.
  void wait_for_workers(int count, double timeout_seconds = 60);

  struct Statistics {
    std::int64_t closures_scheduled = 0;
    std::int64_t closures_finished = 0;
    std::int64_t closures_rerun = 0;  // run again after their worker was lost
    std::int64_t workers_lost = 0;
    std::int64_t pushes_applied = 0;  // over every ps
    std::int64_t pushes_refused = 0;  // a closure's second run, a fenced worker's
    std::int64_t pushes_dropped = 0;  // SYNC: arrived after the update they were computed for
    std::vector<std::int64_t> staleness_counts;  // over every ps: [s] pushes s versions behind
    std::vector<std::int64_t> closures_per_worker;  // finished, by worker index
    // Seconds, summed over the closures that finished: on the workers, pulling the weights,
    // pushing the gradients and the whole run (the rest is the steps' own work); over
    // every ps, applying pushes and pushes waiting for the store (queueing).
    double pull_seconds = 0, push_seconds = 0, run_seconds = 0;
    // The chief's dispatch, summed over the same closures (the first epoch's included):
    // each call that ran one less the worker's run: the request and the reply on their
    // way, gRPC at both ends, the worker's wait to start it and its results' encoding.
    double dispatch_seconds = 0;
    std::int64_t steps_finished = 0;  // the finished closures' steps (fit's run several each)
    double apply_seconds = 0, queue_seconds = 0;
    // Values pulled and gradients pushed over every ps, in bytes: through shared memory
    // (tasks on a ps's host) and in gRPC messages.
    std::int64_t shared_memory_bytes = 0, message_bytes = 0;
    // The same figures ps by ps (the sums above are over these).
    struct Ps {
      std::int64_t pushes_applied = 0, pushes_refused = 0, pushes_dropped = 0;
      double apply_seconds = 0, queue_seconds = 0;
      std::int64_t shared_memory_bytes = 0, message_bytes = 0;
      std::vector<std::int64_t> staleness_counts;
    };
    std::vector<Ps> per_ps;
    // The job's updates applied (refused, dropped: `count`): a push brings every ps its
    // shards' part, which each counts on its own, so the most any one ps counted.
    std::int64_t updates(std::int64_t Ps::*count) const {
      std::int64_t most = 0;
      for (const Ps& p : per_ps) most = std::max(most, p.*count);
      return most;
    }
  };
  // The chief: counts so far (asks every ps).
  Statistics statistics() const;

  // Workers and parameter servers: answers the coordinator until it ends the job, then
  // returns. Throws PeerFailure when the coordinator falls silent for
  // coordinator_timeout_seconds.
  void serve();

  // A worker that runs no program of its own (tf.distribute.Server(...).join()): serves as
  // serve() does, and loads the program the chief ships with its closures by calling
  // `load` with its bytes on this thread, before the first closure that needs it runs. A
  // load that trains (a shipped fit) serves on inside it. The loaded program must build
  // the chief's model under scope(); a closure whose program fails to load fails with
  // the load's error.
  using ProgramLoader = std::function<void(const std::string& bytes)>;
  void serve(ProgramLoader load);
  // The chief: the program every worker that loads programs is sent (replacing the last;
  // a worker loads each version once). Where the program could not be made, `error` says
  // why, and a closure sent to such a worker fails with it.
  void ship(std::string program, std::string error = {});

 private:
  detail::Coordinator& coordinator() const;

  std::shared_ptr<detail::PsRuntime> runtime_;
};

}  // namespace dtrain::distribute
