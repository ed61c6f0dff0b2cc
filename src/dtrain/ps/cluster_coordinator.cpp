// ParameterServerStrategy and ClusterCoordinator over gRPC: the public API over the
// runtime (runtime.h), the services of the parameter servers (ps_service.cpp) and the
// workers (worker_service.cpp), the chief's coordinator (coordinator.cpp) and fit's
// backend (ps_backend.cpp).
#include "dtrain/ps/cluster_coordinator.h"

#include "dtrain/ps/internal/coordinator.h"
#include "dtrain/ps/internal/runtime.h"

namespace dtrain::distribute {

// ---------------------------------------------------------------- public API

ParameterServerStrategy::ParameterServerStrategy(ParameterServerOptions options)
    : ParameterServerStrategy(cluster::tf_config_from_environment(), std::move(options)) {}

ParameterServerStrategy::ParameterServerStrategy(const cluster::TfConfig& config, ParameterServerOptions options)
    : runtime_(std::make_shared<detail::PsRuntime>(config, std::move(options))) {}

ParameterServerStrategy::~ParameterServerStrategy() = default;

void ParameterServerStrategy::end_job() {
  if (!is_chief()) DTRAIN_THROW(InvalidArgument, "end_job: ", task().to_string(), " is not the chief");
  runtime_->end_job();
}

dtrain::detail::ScopedStrategy ParameterServerStrategy::scope() const {
  return dtrain::detail::ScopedStrategy(runtime_->backend_);
}
const cluster::TaskId& ParameterServerStrategy::task() const { return runtime_->config_.task; }
int ParameterServerStrategy::num_workers() const { return runtime_->config_.cluster.num_tasks("worker"); }
int ParameterServerStrategy::num_ps() const { return runtime_->config_.cluster.num_tasks("ps"); }
std::vector<Variable*> ParameterServerStrategy::variables() const { return runtime_->variables(); }
std::vector<ShardPlacement> ParameterServerStrategy::placement() const {
  return runtime_->placement(runtime_->variables());
}
void ParameterServerStrategy::set_variable_partitioner(Partitioner partitioner) {
  runtime_->options_.variable_partitioner = std::move(partitioner);
}

std::string Consistency::description() const {
  switch (kind) {
    case Kind::ASYNC:
      return "async";
    case Kind::SSP:
      return "ssp(" + std::to_string(staleness) + ")";
    case Kind::SYNC:
      if (backup_workers == 0) return "sync";
      return "sync with " + std::to_string(backup_workers) + " backup worker" + (backup_workers == 1 ? "" : "s");
  }
  return "?";
}

PerWorkerIterator PerWorkerDataset::iterator() { return {id_, iterators_++}; }

const std::vector<Tensor>& RemoteValue::fetch() const {
  std::unique_lock lock(closure_->mutex);
  closure_->finished.wait(lock, [&] { return closure_->done; });
  if (closure_->error) std::rethrow_exception(closure_->error);
  return closure_->results;
}

bool RemoteValue::done() const {
  std::lock_guard lock(closure_->mutex);
  return closure_->done;
}

ClusterCoordinator::ClusterCoordinator(ParameterServerStrategy& strategy) : runtime_(strategy.runtime_) {
  if (strategy.is_chief()) runtime_->coordinator();  // its heartbeat starts now
}

ClusterCoordinator::~ClusterCoordinator() = default;

detail::Coordinator& ClusterCoordinator::coordinator() const { return runtime_->coordinator(); }

RemoteValue ClusterCoordinator::schedule(const RemoteFunction& fn) {
  if (fn.takes_iterator)
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::schedule: '", fn.name, "' takes an iterator; pass one");
  return RemoteValue(coordinator().schedule(fn, {}));
}

RemoteValue ClusterCoordinator::schedule(const RemoteFunction& fn, const PerWorkerIterator& iterator) {
  if (!fn.takes_iterator)
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::schedule: '", fn.name, "' takes no iterator");
  if (iterator.dataset < 0 || iterator.dataset >= static_cast<int>(runtime_->datasets_.size()))
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::schedule: no per-worker dataset ", iterator.dataset);
  return RemoteValue(coordinator().schedule(fn, iterator));
}

void ClusterCoordinator::join() { coordinator().join(); }
void ClusterCoordinator::wait_for_workers(int count, double timeout_seconds) {
  coordinator().wait_for_workers(count, std::chrono::duration<double>(timeout_seconds));
}
bool ClusterCoordinator::done() const { return coordinator().done(); }
ClusterCoordinator::Statistics ClusterCoordinator::statistics() const { return coordinator().statistics(); }

void ClusterCoordinator::serve() { runtime_->serve(); }

void ClusterCoordinator::serve(ProgramLoader load) {
  if (runtime_->config_.task.type != "worker")
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::serve(load): only a worker loads the chief's program (",
                 runtime_->task_name_, " is not one)");
  if (!load) DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::serve(load): the loader is empty");
  runtime_->loader_ = std::move(load);
  runtime_->serve();
}

void ClusterCoordinator::ship(std::string program, std::string error) {
  coordinator().ship(std::move(program), std::move(error));
}

RemoteFunction ClusterCoordinator::define(const std::string& name, IteratorFunction fn) {
  detail::check_name(name);
  if (!fn) DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::define('", name, "'): the function is empty");
  if (!runtime_->functions_.emplace(name, detail::PsRuntime::Function{std::move(fn), {}}).second)
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::define: a function named '", name, "' is already defined");
  return {name, true};
}

RemoteFunction ClusterCoordinator::define(const std::string& name, PlainFunction fn) {
  detail::check_name(name);
  if (!fn) DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::define('", name, "'): the function is empty");
  if (!runtime_->functions_.emplace(name, detail::PsRuntime::Function{{}, std::move(fn)}).second)
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::define: a function named '", name, "' is already defined");
  return {name, false};
}

PerWorkerDataset ClusterCoordinator::create_per_worker_dataset(std::function<data::Dataset()> dataset_fn) {
  if (!dataset_fn) DTRAIN_THROW(InvalidArgument, "create_per_worker_dataset: dataset_fn is empty");
  runtime_->datasets_.push_back(std::move(dataset_fn));
  return PerWorkerDataset(static_cast<int>(runtime_->datasets_.size()) - 1);
}

}  // namespace dtrain::distribute
