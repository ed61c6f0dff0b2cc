// What a parameter server holds: its shards of the model's variables, the optimizer that
// updates them (with its slots, per shard), and the record that makes every closure's
// gradients count once. Thread-safe: pulls and pushes from any number of workers are
// serialised by one lock, each push applied whole as it arrives.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::distribute {

class ParameterStore {
 public:
  // One shard of variable `variable` (its place in the model's order), `name` for errors.
  struct ShardKey {
    int variable = 0;
    int shard = 0;
    friend bool operator==(const ShardKey&, const ShardKey&) = default;
  };

  // Takes the shards a coordinator placed here, with their first values. `job` names the
  // coordinator's run: the same job again (a coordinator retrying) keeps what is here, a
  // new one replaces it (and forgets the optimizer and the closures applied).
  // `aggregate` > 0 makes updates synchronous: each update is the mean of the first
  // `aggregate` gradients computed from the current version, one per task; a gradient
  // from an older version arrives too late and is dropped (backup workers), and so is a
  // task's second one for the same update. 0: every push is applied as it arrives
  // (asynchronous).
  // The optimizer's state for the shards: its Keras JSON, iteration count and slots.
  struct OptimizerState {
    std::string optimizer_json;  // empty: none
    std::int64_t iterations = 0;
    struct Slot {
      ShardKey key;
      std::string name;  // "m", "v", "momentum"
      Tensor value;
    };
    std::vector<Slot> slots;
  };
  // `restored` (a job restored from a checkpoint): the optimizer starts from this state
  // instead of from the first push (slots not given start as zeros); a slot for a shard not
  // held here, or of another shape, is an error naming it, and nothing is created.
  void create(std::uint64_t job, std::vector<std::pair<ShardKey, Variable>> shards, int aggregate,
              OptimizerState restored);
  void create(std::uint64_t job, std::vector<std::pair<ShardKey, Variable>> shards, int aggregate = 0);
  bool created() const;
  // A copy of every shard's value and of the optimizer's state (empty before the first
  // update of a job not restored), taken at one version.
  struct Snapshot {
    std::vector<std::pair<ShardKey, Tensor>> values;
    OptimizerState optimizer;
  };
  Snapshot snapshot() const;

  // Calls fn(key, value) for every shard under the lock, so the values are one version;
  // returns that version (updates applied so far).
  template <typename Fn>
  std::int64_t read(Fn&& fn) const {
    std::lock_guard lock(mutex_);
    for (const Shard& s : shards_) fn(s.key, s.value.mutable_value());
    return version_;
  }

  // A closure runs at most this many steps, each pushing once.
  static constexpr std::uint32_t kMaxStepsPerClosure = 1u << 16;
  struct Push {
    std::uint64_t closure = 0;
    std::uint32_t step = 0;  // the closure's step, below kMaxStepsPerClosure
    std::string task;            // who pushes, for errors
    std::uint64_t incarnation = 0;  // the worker's, as the coordinator last found it
    std::string optimizer_json;  // the worker's optimizer: the first push makes this one
    std::vector<std::pair<ShardKey, Tensor>> gradients;
    // What the step changed in non-trainable variables (batch norm's moving statistics),
    // added to the values here with the gradients' update (TensorFlow's assign_sub of
    // a moving average, computed on the worker).
    std::vector<std::pair<ShardKey, Tensor>> changes;
    std::int64_t pulled_version = 0;
  };
  struct PushResult {
    bool applied = false;  // false: the closure's gradients were applied before
    std::int64_t version = 0;
    bool dropped = false;        // synchronous: computed from an older version, or a second one
    std::int64_t staleness = 0;  // versions behind the store when it arrived
    // When the push reached the store, had its lock (the time between: queueing) and was
    // done with, for a parameter server's trace.
    std::chrono::steady_clock::time_point arrived, locked, done;
  };
  // Applies the gradients once per closure and step: a closure run again (its worker died after
  // pushing) is refused, and so is a push from an incarnation of a task fenced off. A gradient for a shard not held here, or of another shape, is an
  // InvalidArgument naming the task and the shard, and nothing is applied.
  PushResult push(const Push& push);

  // Refuses `task`'s pushes made under `incarnation` or before (the coordinator lost it
  // and runs its closure elsewhere).
  void fence(const std::string& task, std::uint64_t incarnation);

  struct Statistics {
    std::int64_t version = 0;
    std::int64_t pushes_applied = 0;
    std::int64_t pushes_refused = 0;
    std::int64_t pushes_dropped = 0;  // synchronous: computed from an older version
    double apply_seconds = 0;
    double queue_seconds = 0;  // pushes waiting for the store (another push or a pull holds it)
    std::vector<std::int64_t> staleness_counts;  // [s]: pushes computed s versions behind
  };
  Statistics statistics() const;

 private:
  struct Shard {
    ShardKey key;
    mutable Variable value;
  };
  const Shard& find(const ShardKey& key, const std::string& task) const;
  // The optimizer `json` describes, refused where it clips by norm (errors begin with `who`).
  static std::shared_ptr<optim::Optimizer> make_optimizer(const std::string& json, const std::string& who);
  void apply();  // grads_ to vars_, one more version

  mutable std::mutex mutex_;
  std::uint64_t job_ = 0;
  bool created_ = false;
  std::vector<Shard> shards_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::string optimizer_json_;
  std::unordered_set<std::uint64_t> applied_;  // closure * kMaxStepsPerClosure + step, once applied
  std::unordered_map<std::string, std::uint64_t> fenced_;  // task -> last refused incarnation
  std::int64_t version_ = 0;
  Statistics stats_;
  // Reused by every push: no allocation in the steady state.
  std::vector<Tensor> grads_;
  std::vector<Variable*> vars_;
  std::vector<std::size_t> indices_;  // of each gradient's shard in shards_
  // Synchronous updates: the gradients gathered for the next one, per shard (summed), and
  // the tasks that gave them.
  int aggregate_ = 0;
  std::vector<Tensor> sums_;  // [shard], undefined until a gradient came
  std::vector<Tensor> change_sums_;  // [shard], the same for changes
  std::vector<std::pair<std::size_t, Tensor>> changes_;  // (shard index, change) of one push
  std::unordered_set<std::string> contributors_;
};

}  // namespace dtrain::distribute
