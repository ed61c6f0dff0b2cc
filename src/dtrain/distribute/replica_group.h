// The engine behind the in-process strategies: R replica threads (the caller is replica
// 0), each with its own share of the cores, a barrier that a failed replica breaks, and
// the cross-replica calls (all-reduce, merge_call) replicas make inside run().
// Internal to the distribute layer; users see Strategy.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/comm/gloo_group.h"
#include "dtrain/comm/nccl_group.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/replica.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::distribute::detail {

class WorkerComm;

struct GroupOptions {
  std::string name;                  // "MirroredStrategy"
  std::vector<std::string> devices;  // one per replica, "/cpu:0"
  int threads_per_replica = 1;
  std::size_t bucket_bytes = 0;      // 0: the default
  // Multi-worker: the other processes, and how buckets travel between them.
  std::shared_ptr<WorkerComm> workers;
  bool overlap = true;
  comm::Wire wire = comm::Wire::f32;
  // How long a replica waits for the others at any cross-replica call (barriers, the
  // gradient all-reduce) before it fails naming those that never came: the strategy's
  // CommunicationOptions::timeout_seconds.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Where scope() places variables (OneDeviceStrategy on a GPU); nullopt: unchanged.
  std::optional<Device> placement;
  // GPU workers: the NCCL group their gradients are summed in, or (null) why they go
  // through pinned host memory instead.
  std::shared_ptr<comm::NcclGroup> nccl;
  std::string no_nccl;
  // Replicas on GPUs with memories of their own: replica r's GPU (placement is the first),
  // and the NCCL ranks they sum in ([replica]; empty: reduced to the first GPU, and why).
  std::vector<Device> gpus;
  std::vector<std::shared_ptr<comm::NcclGroup>> replica_nccl;
  std::string no_replica_nccl;
};

class ReplicaGroup final : public StrategyBackend, public CrossReplica, public dtrain::detail::VariableTracker {
 public:
  explicit ReplicaGroup(GroupOptions options);
  ~ReplicaGroup() override;

  std::string name() const override { return options_.name; }
  std::optional<Device> placement() const override { return options_.placement; }
  int num_replicas() const override { return static_cast<int>(options_.devices.size()); }
  int num_workers() const override;
  int worker_index() const override;
  std::string transport() const override;
  bool shares_memory() const override;
  std::string replicas_note() const override;
  const GroupOptions& options() const { return options_; }
  // Whether the replicas run on GPUs: logical GPUs of one, or GPUs of their own.
  bool on_gpu() const { return options_.placement && !options_.placement->is_cpu(); }
  // Whether each replica has a GPU of its own, and a mirror of every variable on it.
  bool several_gpus() const { return options_.gpus.size() > 1; }
  // Several GPUs: the variables made under scope() (their mirrors follow them).
  void created(Variable& v) override;
  void destroyed(Variable& v) override;
  void run(const std::function<void(int replica)>& fn) override;
  std::unique_ptr<GradientReducer> gradient_reducer(std::span<Variable* const> vars,
                                                    std::span<const DenseVariables> dense,
                                                    bool collectives_in_backward) override;
  void synchronize_variables(std::span<Variable* const> vars, const std::vector<std::string>& description) override;
  ElasticMembership* elastic() override;
  std::uint64_t membership_generation() const override;
  std::shared_ptr<Callback> fit_callback() override;
  void sum_over_workers(std::span<double> values) override;

  // Outside run(), multi-worker: `value` summed over the workers, in place (nothing to do
  // with one worker); and the workers' values concatenated along axis 0 (sizes may differ).
  void sum_over_workers(Tensor& value);
  Tensor gather_over_workers(const Tensor& value);

  // CrossReplica, called from inside run() by every replica.
  std::vector<Tensor> all_reduce_sum(std::span<const Tensor> values) override;
  void merge_call(const std::function<void()>& fn) override;

 private:
  void worker(int replica);
  void run_replica(int replica);
  // Several GPUs, before the replicas run: every variable's value copied to its mirrors
  // (made the first time) on the other GPUs.
  void refresh_mirrors();
  // Workers summing through the host: "through pinned host memory after backward (...), not
  // with NCCL: why".
  std::string staged_words() const;
  // Every replica waits until all have arrived; throws PeerFailure once a replica failed,
  // and Timeout naming `what` and the replicas that never arrived once the timeout passed
  // (which fails the run for everyone).
  void barrier(int replica, const char* what) { barrier(replica, what, options_.timeout, false); }
  // The others wait for replica 0, which arrived at the barrier before and does the
  // call's work alone meanwhile (the merged function, the sum across workers): twice the
  // timeout, since that work may wait for other workers a whole timeout itself; the
  // Timeout says that replica 0 was still at it. Replica 0 does not come here with an
  // error: it throws, and fail() releases the others.
  void wait_for_replica_0(int replica, const char* what) { barrier(replica, what, 2 * options_.timeout, true); }
  void barrier(int replica, const char* what, std::chrono::milliseconds timeout, bool for_replica_0);
  void fail(int replica, std::exception_ptr error);

  GroupOptions options_;
  std::vector<std::thread> threads_;  // replicas 1..R-1

  std::mutex run_mutex_;  // one run() at a time (two models may share a strategy)
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;  // [replica], this run
  int first_failure_ = -1;
  // [replica] named by first_failure_'s Timeout as the one it waited for: a later error of
  // that replica's own (not a PeerFailure) is the cause instead.
  std::vector<bool> waited_for_;
  int first_returned_ = -1;  // a replica whose function returned; nobody can wait for it

  // The barrier, and the values replicas exchange through it.
  std::condition_variable barrier_cv_;
  int barrier_count_ = 0;
  std::uint64_t barrier_generation_ = 0;
  // [replica] the generation it last arrived in, + 1; run() moves the generation on, so
  // that marks left by a failed run mean nothing in the next.
  std::vector<std::uint64_t> barrier_arrived_;
  std::vector<std::span<const Tensor>> published_;  // [replica]
  std::vector<Tensor> sums_;
  std::uint64_t synchronized_ = 0;
  std::mutex variables_mutex_;
  std::vector<Variable*> variables_;  // several GPUs: made under scope(), in order  // synchronize_variables calls, naming their exchanges
};

}  // namespace dtrain::distribute::detail
