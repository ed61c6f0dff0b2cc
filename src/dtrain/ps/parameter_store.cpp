// A parameter server's shards and their updates.
#include "dtrain/ps/parameter_store.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/model/compile_config.h"

namespace dtrain::distribute {

std::shared_ptr<optim::Optimizer> ParameterStore::make_optimizer(const std::string& json, const std::string& who) {
  std::shared_ptr<optim::Optimizer> made = optimizer_from_json(nlohmann::json::parse(json), "optimizer");
  if (made->options().clipnorm || made->options().global_clipnorm)
    DTRAIN_THROW(InvalidArgument, who, "'s optimizer clips gradients (clipnorm or global_clipnorm): under ",
                 "ParameterServerStrategy each parameter server updates its own shards, so no norm over a whole ",
                 "variable or over every variable exists there; clip the gradients in the step function instead");
  return made;
}

void ParameterStore::create(std::uint64_t job, std::vector<std::pair<ShardKey, Variable>> shards, int aggregate) {
  create(job, std::move(shards), aggregate, OptimizerState{});
}

void ParameterStore::create(std::uint64_t job, std::vector<std::pair<ShardKey, Variable>> shards, int aggregate,
                            OptimizerState restored) {
  std::shared_ptr<optim::Optimizer> optimizer;
  if (!restored.optimizer_json.empty()) {
    // Built and filled before anything here changes: a bad state leaves the store as it was.
    optimizer = make_optimizer(restored.optimizer_json, "the coordinator");
    optimizer->set_iterations(restored.iterations);
    for (const OptimizerState::Slot& given : restored.slots) {
      const auto shard = std::find_if(shards.begin(), shards.end(), [&](const auto& s) { return s.first == given.key; });
      Tensor* slot = nullptr;
      if (shard != shards.end())
        for (auto& [name, t] : optimizer->slots(shard->second, /*create=*/true))
          if (name == given.name) slot = t;
      if (slot == nullptr || !(given.value.shape() == slot->shape()))
        DTRAIN_THROW(InvalidArgument, "the coordinator restored slot '", given.name, "' ", given.value.shape().to_string(),
                     " of shard ", given.key.shard, " of variable ", given.key.variable, ", which ",
                     slot ? "has another shape here" : "this parameter server's optimizer has no place for");
      *slot = given.value.clone();
    }
  }
  std::lock_guard lock(mutex_);
  if (created_ && job == job_) return;
  aggregate_ = aggregate;
  sums_.assign(shards.size(), Tensor());
  change_sums_.assign(shards.size(), Tensor());
  contributors_.clear();
  shards_.clear();
  for (auto& [key, value] : shards) shards_.push_back(Shard{key, std::move(value)});
  job_ = job;
  created_ = true;
  optimizer_ = std::move(optimizer);
  optimizer_json_ = restored.optimizer_json;
  applied_.clear();
  fenced_.clear();
  version_ = 0;
  stats_ = {};
}

bool ParameterStore::created() const {
  std::lock_guard lock(mutex_);
  return created_;
}

const ParameterStore::Shard& ParameterStore::find(const ShardKey& key, const std::string& task) const {
  for (const Shard& s : shards_)
    if (s.key == key) return s;
  DTRAIN_THROW(InvalidArgument, task, " pushed a gradient for shard ", key.shard, " of variable ", key.variable,
               ", which this parameter server does not hold (another model?)");
}

ParameterStore::PushResult ParameterStore::push(const Push& push) {
  PushResult result;
  result.arrived = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  result.locked = std::chrono::steady_clock::now();
  stats_.queue_seconds += std::chrono::duration<double>(result.locked - result.arrived).count();
  // Every answer: whether applied, the version now, and when the store was done with it.
  auto answer = [&](bool applied) {
    result.applied = applied;
    result.version = version_;
    result.done = std::chrono::steady_clock::now();
    return result;
  };
  if (!created_) DTRAIN_THROW(InvalidArgument, push.task, " pushed gradients before the coordinator placed any variable");
  if (push.step >= kMaxStepsPerClosure)
    DTRAIN_THROW(InvalidArgument, push.task, " pushed step ", push.step, " of closure ", push.closure, "; a closure runs at most ",
                 kMaxStepsPerClosure, " steps");
  const std::uint64_t once = push.closure * kMaxStepsPerClosure + push.step;
  const auto fenced = fenced_.find(push.task);
  if (applied_.contains(once) || (fenced != fenced_.end() && push.incarnation <= fenced->second)) {
    ++stats_.pushes_refused;
    return answer(false);
  }
  grads_.clear();
  vars_.clear();
  indices_.clear();
  for (const auto& [key, grad] : push.gradients) {
    const Shard& s = find(key, push.task);
    indices_.push_back(static_cast<std::size_t>(&s - shards_.data()));
    if (!(grad.shape() == s.value.shape()))
      DTRAIN_THROW(InvalidArgument, push.task, " pushed a ", grad.shape().to_string(), " gradient for '",
                   s.value.name(), "', whose shard here is ", s.value.shape().to_string());
    grads_.push_back(grad);
    vars_.push_back(&s.value);
  }
  changes_.clear();
  for (const auto& [key, change] : push.changes) {
    const Shard& s = find(key, push.task);
    if (!(change.shape() == s.value.shape()))
      DTRAIN_THROW(InvalidArgument, push.task, " pushed a ", change.shape().to_string(), " change for '",
                   s.value.name(), "', whose shard here is ", s.value.shape().to_string());
    changes_.emplace_back(static_cast<std::size_t>(&s - shards_.data()), change);
  }
  if (!optimizer_) {
    optimizer_ = make_optimizer(push.optimizer_json, push.task);
    optimizer_json_ = push.optimizer_json;
  } else if (push.optimizer_json != optimizer_json_) {
    DTRAIN_THROW(InvalidArgument, push.task, "'s optimizer ", push.optimizer_json, " differs from the one the ",
                 "first push brought, ", optimizer_json_, " (every worker must compile the same optimizer)");
  }
  applied_.insert(once);
  const std::int64_t staleness = std::max<std::int64_t>(0, version_ - push.pulled_version);
  result.staleness = staleness;
  if (aggregate_ == 0) {
    apply();
    for (auto& [shard, change] : changes_)
      kernels::backend().axpby(1.0f, change, 1.0f, shards_[shard].value.mutable_value());
    if (stats_.staleness_counts.size() <= static_cast<std::size_t>(staleness))
      stats_.staleness_counts.resize(static_cast<std::size_t>(staleness) + 1, 0);
    ++stats_.staleness_counts[static_cast<std::size_t>(staleness)];
    ++stats_.pushes_applied;
    return answer(true);
  }
  // Synchronous: gather; the first `aggregate_` gradients of this version make the update.
  if (staleness > 0 || contributors_.contains(push.task)) {
    ++stats_.pushes_dropped;
    result.dropped = true;
    return answer(false);
  }
  // `x` added into `sum`, which the first one starts.
  auto accumulate = [](Tensor& sum, const Tensor& x) {
    if (!sum.defined())
      sum = x.clone();
    else
      kernels::backend().axpby(1.0f, x, 1.0f, sum);
  };
  for (std::size_t i = 0; i < grads_.size(); ++i)
    if (grads_[i].defined()) accumulate(sums_[indices_[i]], grads_[i]);
  for (auto& [shard, change] : changes_) accumulate(change_sums_[shard], change);
  contributors_.insert(push.task);
  ++stats_.pushes_applied;
  if (static_cast<int>(contributors_.size()) < aggregate_) return answer(true);
  grads_.clear();
  vars_.clear();
  const float mean = 1.0f / static_cast<float>(contributors_.size());
  for (std::size_t s = 0; s < shards_.size(); ++s) {
    if (!sums_[s].defined()) continue;
    kernels::backend().axpby(0.0f, sums_[s], mean, sums_[s]);
    grads_.push_back(sums_[s]);
    vars_.push_back(&shards_[s].value);
  }
  apply();
  for (std::size_t s = 0; s < shards_.size(); ++s)
    if (change_sums_[s].defined()) kernels::backend().axpby(mean, change_sums_[s], 1.0f, shards_[s].value.mutable_value());
  if (stats_.staleness_counts.empty()) stats_.staleness_counts.assign(1, 0);
  stats_.staleness_counts[0] += static_cast<std::int64_t>(contributors_.size());
  for (Tensor& t : sums_) t = Tensor();
  for (Tensor& t : change_sums_) t = Tensor();
  contributors_.clear();
  return answer(true);
}

void ParameterStore::apply() {
  const auto start = std::chrono::steady_clock::now();
  optimizer_->apply_gradients(grads_, vars_);
  stats_.apply_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++version_;
}

void ParameterStore::fence(const std::string& task, std::uint64_t incarnation) {
  std::lock_guard lock(mutex_);
  std::uint64_t& last = fenced_[task];
  last = std::max(last, incarnation);
}

ParameterStore::Snapshot ParameterStore::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot snapshot;
  for (const Shard& s : shards_) snapshot.values.emplace_back(s.key, s.value.value().clone());
  if (!optimizer_) return snapshot;
  OptimizerState& state = snapshot.optimizer;
  state.optimizer_json = optimizer_json_;
  state.iterations = optimizer_->iterations();
  for (const Shard& s : shards_)
    for (auto& [name, slot] : optimizer_->slots(s.value))
      state.slots.push_back({s.key, name, slot->clone()});
  return snapshot;
}

ParameterStore::Statistics ParameterStore::statistics() const {
  std::lock_guard lock(mutex_);
  Statistics s = stats_;
  s.version = version_;
  return s;
}

}  // namespace dtrain::distribute
