// Where the calling thread stands in a distribution strategy, as thread-local state the
// layers below `distribute` can read without knowing about strategies:
// - the creation scope: the strategy whose scope() is open on this thread; variables
//   remember it, so a variable made outside a strategy's scope is caught when a replica
//   of that strategy uses it;
// - the replica context: set on a replica's thread while it runs the replica function
//   (TensorFlow's tf.distribute.get_replica_context()).
// A strategy is named here only by a number: 0 is the default strategy.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain {

// What a replica may ask of the other replicas from inside run() (TensorFlow's
// ReplicaContext.all_reduce and merge_call). Every replica must make the same calls in
// the same order; a replica that fails instead makes the others' calls throw.
class CrossReplica {
 public:
  virtual ~CrossReplica() = default;
  // Each tensor summed over the replicas (undefined where every replica's is undefined;
  // an undefined tensor counts as zeros otherwise). Every replica gets the same tensors.
  virtual std::vector<Tensor> all_reduce_sum(std::span<const Tensor> values) = 0;
  // Runs fn once, on replica 0 with every core of the strategy, while the others wait.
  virtual void merge_call(const std::function<void()>& fn) = 0;
};

struct ReplicaContext {
  std::uint64_t strategy = 0;  // 0: not inside any strategy's run()
  int replica_id = 0;     // among this process's replicas
  int num_replicas = 1;   // this process's replicas
  // Over every process of the strategy (TensorFlow's replica_id_in_sync_group and
  // num_replicas_in_sync); the same as the two above for in-process strategies.
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
  CrossReplica* cross = nullptr;  // set inside run() of a strategy with several replicas
  // Replicas on GPUs with memories of their own: which copy of each variable this replica
  // reads (k: the variable's mirror k, on the replica's GPU; -1: its own value).
  int mirror = -1;
};

// A cross-replica call made inside a replica's forward or backward pass (a synchronized
// batch norm's sums), timed for the step's profile.
struct TimedCrossReplicaCall {
  std::chrono::steady_clock::time_point start, end;
  bool backward = false;  // made inside backward (else forward)
  const char* what = "";
};
// This thread's calls since the last drain: the trainer moves them into the replica's
// profile track after each step.
std::vector<TimedCrossReplicaCall>& timed_cross_replica_calls();

// The calling thread's replica context (strategy 0 outside run()).
const ReplicaContext& replica_context();
// The strategy whose scope creates variables on this thread (0: the default strategy).
std::uint64_t creation_scope();

namespace detail {
// Set for the lifetime of the guard, then restored (strategies nest scopes).
class ScopedReplicaContext {
 public:
  explicit ScopedReplicaContext(const ReplicaContext& context);
  ~ScopedReplicaContext();
  ScopedReplicaContext(const ScopedReplicaContext&) = delete;
  ScopedReplicaContext& operator=(const ScopedReplicaContext&) = delete;

 private:
  ReplicaContext saved_;
};

// Sets the strategy whose scope creates variables on this thread (Strategy::scope()
// sets and restores it).
void set_creation_scope(std::uint64_t strategy);
}  // namespace detail

}  // namespace dtrain
