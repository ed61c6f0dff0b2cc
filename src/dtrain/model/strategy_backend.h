// The interface the model layer trains through under a distribution strategy (the part
// of TensorFlow's tf.distribute.StrategyExtended that Keras's fit uses). The strategies
// themselves (MirroredStrategy, ...) live in the `distribute` layer; fit knows them only
// through this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/autograd/dense_together.h"
#include "dtrain/autograd/variable.h"
#include "dtrain/profile/profiler.h"

namespace dtrain {
namespace optim {
class Optimizer;
}
class Callback;

// A dense layer's variables, as indices into the list a GradientReducer sums: replicas
// that share the weights may compute their gradients together (dense_together.h).
struct DenseVariables {
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t kernel;
  std::size_t bias = kNone;
};

// Sums the replicas' gradients of one fixed list of variables, in buckets, while their
// backward passes still run. Made by a strategy for one fit().
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Before each step: whether it ends an accumulation cycle (its gradients are summed over
  // replicas) or only adds them to each replica's local sums, and the rows of the batch
  // each replica takes, replica r [row_bounds[r], row_bounds[r + 1]).
  virtual void begin_step(bool reduce, std::span<const std::int64_t> row_bounds) = 0;
  // Set on replica `replica`'s thread for its backward pass: the layers whose weight
  // gradients the replicas compute together this step (null: none).
  virtual DenseGradientsTogether* dense_gradients_together(int /*replica*/) { return nullptr; }
  // From replica `replica`'s backward pass: the gradient of variable `index` is final
  // (undefined: the loss does not depend on it).
  virtual void gradient_ready(int replica, std::size_t index, const Tensor& grad) = 0;
  // The replica's backward pass is over; on a reducing step, returns once every bucket is
  // summed (helping to sum them).
  virtual void finish(int replica) = 0;
  // After a reducing step, as `replica` sees them (each replica has its own list, so
  // replicas can read it while others finish): the sums, one per variable (views of the
  // reducer's buffers, valid until the next step; undefined where no replica had one).
  virtual const std::vector<Tensor>& reduced(int replica) const = 0;
  // A replica failed: nobody waits for it any more.
  virtual void abort(int replica, const std::string& why) = 0;
  // Between workers, for the gradient noise scale: asked before begin_step, the reducing
  // step that follows measures the squared norm of this worker's sum of its replicas'
  // gradients and of the sum over every worker (no flags, no other variables), readable
  // after finish() as {local, global}. False where there is no second sum (one process).
  virtual bool measures_gradient_norms() const { return false; }
  virtual void measure_gradient_norms() {}
  virtual std::pair<double, double> gradient_norms() const { return {0.0, 0.0}; }
  // Where the reducer times its work, before the first step: replicas[r] is replica r's
  // thread (its summing, nested in backward, and its waits); `communication` the thread
  // that talks to other processes (ignored within one process).
  virtual void set_profile(std::span<profile::Track* const> /*replicas*/, profile::Track* /*communication*/) {}
};

// Training whose steps run in other processes (ParameterServerStrategy's workers). Every
// task runs the same program and calls fit(): on the coordinator, fit() hands the steps
// out in closures; on every other task it serves them until the coordinator ends the job.
class RemoteTraining {
 public:
  virtual ~RemoteTraining() = default;
  // Whether this process coordinates the training (the chief); the others serve.
  virtual bool coordinates() const = 0;
  // The workers that run steps, and which of them this process is (-1: it runs none).
  virtual int num_remote_workers() const = 0;
  virtual int remote_worker_index() const = 0;
  // "2 workers, 1 ps, async": for fit's first line.
  virtual std::string describe() const = 0;

  // Runs one closure on a worker: `steps` training steps, calling before_step(i) before
  // step i (which pulls the current weights); returns the closure's figures.
  using Steps = std::function<std::vector<double>(int steps, const std::function<void(int)>& before_step)>;
  // A worker or parameter server: answers the coordinator, running `steps` for each of
  // its closures, until the coordinator ends the job.
  virtual void serve(Steps steps) = 0;
  // Which parameter server this process is (-1: none).
  virtual int remote_ps_index() const { return -1; }
  // A parameter server, before serve(): keep the first `max_pushes` pushes' queueing and
  // applying for a trace, which write_server_trace writes afterwards as Chrome trace
  // events (timestamps comparable with the workers' traces on the same host).
  virtual void trace_server(std::size_t /*max_pushes*/) {}
  virtual void write_server_trace(const std::string& /*path*/) const {}
  // The coordinator, at the start of each fit(): the workers serve one fit's steps (its
  // input, options and callbacks) for the whole job, so a second fit is refused by name;
  // so are steps_per_closure the consistency mode cannot order.
  virtual void begin_fit(int steps_per_closure) = 0;
  // The coordinator, once the callbacks began (a backup may have been restored), before the
  // first step: the variables are placed with this process's values and, where `restored`,
  // with `optimizer`'s slots and iteration count.
  virtual void place(optim::Optimizer& optimizer, bool restored) = 0;
  // Called on the coordinator as each closure ends, in the order they were handed out:
  // its first step, its number of steps, the worker that ran it and its figures; returns
  // false to stop handing out steps (fit's stop_training).
  using Finished =
      std::function<bool(std::int64_t first_step, int steps, int worker, const std::vector<double>& figures)>;
  // The coordinator: runs steps [first_step, steps) on the workers, `steps_per_closure` to a
  // closure, a few closures ahead of those finished, then copies the trained values into
  // this process's variables. Rethrows the first error a closure raised.
  virtual void train(std::int64_t first_step, std::int64_t steps, int steps_per_closure, const Finished& finished) = 0;
  // The coordinator: copies the values and the optimizer's state (slots, iteration count)
  // held remotely into this process's variables and `optimizer`, each remote holder's at
  // one moment: for a checkpoint.
  virtual void gather(optim::Optimizer& optimizer) = 0;
  // The coordinator: what the job has done so far, in one line (closures rerun, pushes
  // applied and refused, staleness).
  virtual std::string statistics() const = 0;
  // The coordinator: a table with a row per remote holder of the variables (a parameter
  // server's updates, apply and queueing times, staleness, its busy share of
  // `training_seconds`), for fit's end.
  virtual std::string servers_table(double training_seconds) const = 0;
};

// The workers of an elastic job (MultiWorkerMirroredStrategy under `dtrain launch --workers
// MIN:MAX`): who trains may change between two steps. A failed collective (a worker died or
// stopped answering) or a worker waiting to join makes the members meet again in a new
// round and reconnect; what they trained must then be made the same on all of them again
// (train::ElasticTraining does both for fit).
class ElasticMembership {
 public:
  virtual ~ElasticMembership() = default;
  struct Change {
    std::int64_t round = 0;
    std::vector<std::string> left, joined;  // against the round before
    double agree_seconds = 0;  // from asking for the round to knowing its members
    double ring_seconds = 0;   // connecting to them
  };
  // This worker's id ("worker:2"), the round and its members in rank order.
  virtual const std::string& id() const = 0;
  virtual std::int64_t round() const = 0;
  virtual const std::vector<std::string>& members() const = 0;
  // Every live member calls it: after a collective failed, or where newcomer_waiting() said
  // so. Waits until everything submitted to the old connections ended, drops them, meets
  // the others in the next round and connects to its members.
  virtual Change reform(bool after_failure) = 0;
  // At one step boundary, on every member: whether a worker waits to join (one member asks
  // the rendezvous; all learn its answer), and `value` replaced by the mean of every
  // member's (one collective for both).
  virtual bool newcomer_waiting(double& value) = 0;
  // fit ended well: a worker still waiting to join is told that the job is over (the
  // first member tells it).
  virtual void end_job() = 0;
  // The user's choice when the workers change: false keeps each global batch its size
  // (each worker's share grows); true keeps each worker's batch, so that the global batch
  // follows the workers (fit's batch_size being that of max_workers() workers) and the
  // learning rate is scaled with it.
  virtual bool keeps_worker_batch() const = 0;
  virtual int max_workers() const = 0;
  // `bytes` bytes at `data` from member `root` to every member (a collective).
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Every member's value, in rank order, through the rendezvous (keys unique per round).
  virtual std::vector<std::string> exchange(const std::string& key, const std::string& mine) = 0;
};

class StrategyBackend {
 public:
  virtual ~StrategyBackend() = default;
  StrategyBackend(const StrategyBackend&) = delete;
  StrategyBackend& operator=(const StrategyBackend&) = delete;

  virtual std::string name() const = 0;  // "MirroredStrategy"
  // Replicas in this process.
  virtual int num_replicas() const = 0;
  // Processes that train together, each with num_replicas() replicas
  // (MultiWorkerMirroredStrategy's workers); 1 for the in-process strategies.
  virtual int num_workers() const { return 1; }
  virtual int worker_index() const { return 0; }
  // How gradients travel between the workers ("shared memory", "TCP (...)"); empty
  // within one process.
  virtual std::string transport() const { return ""; }
  // How the replicas of this process share their work where fit should say so first, in
  // one line (replicas on logical GPUs of one GPU); empty otherwise.
  virtual std::string replicas_note() const { return ""; }
  // Whether the gradients between the workers are summed in shared memory throughout.
  virtual bool shares_memory() const { return false; }
  int num_replicas_in_sync() const { return num_replicas() * num_workers(); }

  // Before fit's first step, on every worker: checks that all workers built the same
  // model (`description`: a line for the model, then one per variable; a mismatch is an
  // error on every worker naming the worker and the first differing line) and gives
  // every worker the chief's variable values. Nothing to do within one process.
  virtual void synchronize_variables(std::span<Variable* const> /*vars*/,
                                     const std::vector<std::string>& /*description*/) {}
  // values[i] summed over the workers, in place (epoch totals, per-step agreement).
  virtual void sum_over_workers(std::span<double> /*values*/) {}
  // A number no other strategy of this process has (variables remember it).
  std::uint64_t id() const { return id_; }
  // Non-null when training steps run in other processes (fit then goes through it).
  virtual RemoteTraining* remote_training() { return nullptr; }
  // Non-null for an elastic job's workers.
  virtual ElasticMembership* elastic() { return nullptr; }
  // Changes with every change of the workers (elastic jobs): what fit made for the workers
  // it had (gradient buckets over their connections) is made again.
  virtual std::uint64_t membership_generation() const { return 0; }
  // A callback the strategy adds to every fit() (last, after the given ones); null: none.
  virtual std::shared_ptr<Callback> fit_callback() { return nullptr; }
  // Where scope() places the variables it sees made (OneDeviceStrategy("/gpu:0"): cuda:0);
  // nullopt leaves the placement as it was.
  virtual std::optional<Device> placement() const { return std::nullopt; }

  // Runs fn(replica) on every replica at once and returns when all are done. A failure
  // stops the other replicas' cross-replica calls; the first one is rethrown, naming its
  // replica, once every replica has returned.
  virtual void run(const std::function<void(int replica)>& fn) = 0;
  // `dense`: the model's dense layers whose gradients the replicas may compute together.
  // `collectives_in_backward`: the replicas' backward passes make cross-replica calls of
  // their own (a synchronized batch norm's sums), so the gradients' sums across workers
  // must not hold the communication thread while backward runs.
  virtual std::unique_ptr<GradientReducer> gradient_reducer(std::span<Variable* const> vars,
                                                            std::span<const DenseVariables> dense,
                                                            bool collectives_in_backward = false) = 0;

 protected:
  StrategyBackend();

 private:
  std::uint64_t id_;
};

// The strategy whose scope() is open on this thread; null for the default strategy.
std::shared_ptr<StrategyBackend> current_strategy();

namespace detail {
// Opens `strategy`'s scope on this thread (variables created meanwhile belong to it).
class ScopedStrategy {
 public:
  explicit ScopedStrategy(std::shared_ptr<StrategyBackend> strategy);
  ~ScopedStrategy();
  ScopedStrategy(ScopedStrategy&& other) noexcept;
  ScopedStrategy(const ScopedStrategy&) = delete;
  ScopedStrategy& operator=(const ScopedStrategy&) = delete;
  ScopedStrategy& operator=(ScopedStrategy&&) = delete;

 private:
  bool active_ = true;
  std::shared_ptr<StrategyBackend> saved_;
  std::uint64_t saved_scope_;
  bool placed_ = false;                   // the strategy set a placement
  std::optional<Device> saved_placement_;  // the one it replaced
};
}  // namespace detail

}  // namespace dtrain
