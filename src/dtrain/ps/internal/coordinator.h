// The chief's coordinator (internal to dtrain_ps): the queue of closures, a thread per
// worker that sends them and finds a lost worker again, the heartbeat, and the placing and
// gathering of the variables on the parameter servers.
#pragma once

#include "dtrain/ps/internal/runtime.h"

namespace dtrain::distribute::detail {

class Coordinator {
 public:
  explicit Coordinator(PsRuntime* runtime) : runtime_(runtime) {
    workers_.resize(static_cast<std::size_t>(runtime_->config_.cluster.num_tasks("worker")));
    stats_.closures_per_worker.assign(workers_.size(), 0);
    progress_.assign(workers_.size(), 0);
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }
  ~Coordinator();

  // `steps`: for fit()'s function, the training steps the closure runs.
  std::shared_ptr<Closure> schedule(const RemoteFunction& fn, PerWorkerIterator it, int steps = 0);
  void join();
  bool done() const {
    std::lock_guard lock(mutex_);
    return queue_.empty() && running_ == 0;
  }
  ClusterCoordinator::Statistics statistics() const;
  void wait_for_workers(int count, std::chrono::duration<double> timeout);
  // fit() on the chief, before its first closure: the variables are placed, and where a
  // backup was `restored`, with this process's values and `optimizer`'s state (as a new
  // job, if waiting for the workers placed them already: nothing has run yet). gather()
  // copies every ps's values and optimizer state into this process's variables and
  // `optimizer` (for a checkpoint).
  void place(optim::Optimizer& optimizer, bool restored);
  void gather(optim::Optimizer& optimizer);
  void ship(std::string program, std::string error) {
    std::lock_guard lock(mutex_);
    program_bytes_ = std::make_shared<const std::string>(std::move(program));
    program_error_ = std::move(error);
    ++program_version_;
  }

 private:
  struct WorkerState {
    bool connected = false;
    std::uint64_t incarnation = 0;
    Clock::time_point last_answer;
    grpc::ClientContext* in_flight = nullptr;  // the Run under way, for the heartbeat to cancel
    bool loads_programs = false;  // started with tf.distribute.Server: it runs the program shipped
  };

  void start(optim::Optimizer* restored = nullptr);
  void dispatch(int w);
  enum class Reached { yes, no, refused };
  Reached connect(int w, std::uint64_t& incarnation);
  void lost(int w, std::uint64_t incarnation, const std::shared_ptr<Closure>& closure, const std::string& why);
  void fail(const std::shared_ptr<Closure>& closure, std::exception_ptr error);
  void heartbeat_loop();
  std::shared_ptr<Closure> take(int w);
  bool may_start(int w) const;

  // Places the variables on the parameter servers as a new job, with `restored`'s slots and
  // iteration count where it is not null. Under mutex_.
  void place_variables(optim::Optimizer* restored);

  PsRuntime* runtime_;  // which owns this coordinator
  std::vector<Variable*> vars_;
  std::vector<ShardPlacement> placement_;
  std::string model_;
  bool started_ = false;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Closure>> queue_;
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // the first since the last join
  std::vector<WorkerState> workers_;
  // SSP's clock: closures each worker finished; a worker found again starts level with
  // the slowest of the others, so that it does not hold them back for what it missed.
  std::vector<std::int64_t> progress_;
  std::uint64_t next_closure_ = 1;
  std::uint64_t next_incarnation_ = 1;
  ClusterCoordinator::Statistics stats_;
  std::vector<std::thread> dispatchers_;
  std::thread heartbeat_;
  // The program shipped to workers that load programs (ship()); version 0: none.
  std::uint64_t program_version_ = 0;
  std::shared_ptr<const std::string> program_bytes_;
  std::string program_error_;
};

}  // namespace dtrain::distribute::detail
