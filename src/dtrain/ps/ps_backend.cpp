// What a model made under ParameterServerStrategy's scope trains through: fit's steps run
// as closures on the workers (RemoteTraining), and the statistics fit prints.
#include "dtrain/ps/internal/runtime.h"
#include "dtrain/ps/internal/coordinator.h"

namespace dtrain::distribute::detail {

PsRuntime& PsBackend::alive() const {
  if (!runtime)
    DTRAIN_THROW(InvalidArgument, "fit: the ParameterServerStrategy this model was made under is gone; keep the ",
                 "strategy alive while the model trains");
  return *runtime;
}

int PsBackend::remote_ps_index() const {
  const cluster::TaskId& task = alive().config_.task;
  return task.type == "ps" ? task.index : -1;
}

void PsBackend::trace_server(std::size_t max_pushes) { alive().push_trace_max_ = max_pushes; }

// Chrome trace events: on thread 0 each push the store took, as "apply" (with its task and
// staleness), "refused" (a closure's second run, a fenced task) or "dropped" (too late for
// its synchronous update); on thread 1 + k, worker k's pushes queueing for the store.
void PsBackend::write_server_trace(const std::string& path) const {
  const PsRuntime& r = alive();
  const int pid = 1000 + r.config_.task.index;
  auto micros = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
  };
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", r.task_name_}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "updates"}}}});
  std::set<int> queues;
  std::lock_guard lock(r.push_trace_mutex_);
  for (const PsRuntime::PushEvent& e : r.push_trace_) {
    const ParameterStore::PushResult& p = e.result;
    const char* outcome = p.applied ? "apply" : p.dropped ? "dropped" : "refused";
    events.push_back({{"ph", "X"}, {"cat", "ps apply"}, {"name", std::string(outcome) + " " + e.task},
                      {"pid", pid}, {"tid", 0}, {"ts", micros(p.locked)}, {"dur", micros(p.done) - micros(p.locked)},
                      {"args", {{"task", e.task}, {"staleness", p.staleness}, {"version", p.version}}}});
    // "worker:K" queues on thread 1 + K; anything else (the chief) on thread 1000.
    const int tid = e.task.rfind("worker:", 0) == 0 ? 1 + std::atoi(e.task.c_str() + 7) : 1000;
    if (queues.insert(tid).second)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid},
                        {"args", {{"name", "queued: " + e.task}}}});
    events.push_back({{"ph", "X"}, {"cat", "ps queue"}, {"name", "queued"}, {"pid", pid}, {"tid", tid},
                      {"ts", micros(p.arrived)}, {"dur", micros(p.locked) - micros(p.arrived)}});
  }
  write_file_replacing(path, nlohmann::json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}}.dump() + "\n",
                       "fit: the parameter server's trace");
}

// TensorFlow's layout: the parameter servers and the chief hold variables in host memory,
// and a worker computes where its placement is (its GPU, where it has one).
std::optional<Device> PsBackend::placement() const {
  if (runtime && runtime->config_.task.type != "worker") return Device::cpu();
  return std::nullopt;
}

bool PsBackend::coordinates() const { return alive().config_.task.type == "chief"; }
int PsBackend::num_remote_workers() const { return alive().config_.cluster.num_tasks("worker"); }
int PsBackend::remote_worker_index() const {
  const cluster::TaskId& task = alive().config_.task;
  return task.type == "worker" ? task.index : -1;
}

std::string PsBackend::describe() const {
  const PsRuntime& rt = alive();
  const int workers = rt.config_.cluster.num_tasks("worker"), ps = rt.config_.cluster.num_tasks("ps");
  return dtrain::detail::concat(workers, workers == 1 ? " worker, " : " workers, ", ps, " ps, ",
                                rt.options_.consistency.description());
}

void PsBackend::serve(Steps steps) {
  PsRuntime& rt = alive();
  if (rt.config_.task.type == "worker") rt.functions_[std::string(kFitFunction)].steps = std::move(steps);
  rt.serve();
}

void PsBackend::gather(optim::Optimizer& optimizer) { alive().coordinator().gather(optimizer); }

void PsBackend::place(optim::Optimizer& optimizer, bool restored) {
  alive().coordinator().place(optimizer, restored);
}

void PsBackend::begin_fit(int steps_per_closure) {
  const Consistency& mode = alive().options_.consistency;
  if (fitted)
    DTRAIN_THROW(InvalidArgument, "fit under ParameterServerStrategy runs once per strategy: the workers serve the ",
                 "first fit's input, options and callbacks until the job ends; to train on, give the first fit more ",
                 "epochs, or make a new strategy (a new job) for another fit");
  fitted = true;
  if (steps_per_closure < 1 || static_cast<std::uint32_t>(steps_per_closure) > ParameterStore::kMaxStepsPerClosure)
    DTRAIN_THROW(InvalidArgument, "fit: steps_per_execution must be in [1, ", ParameterStore::kMaxStepsPerClosure,
                 "], got ", steps_per_closure);
  if (steps_per_closure > 1 && mode.kind != Consistency::Kind::ASYNC)
    DTRAIN_THROW(InvalidArgument, "fit: steps_per_execution ", steps_per_closure, " under ", mode.description(),
                 " consistency: the coordinator orders closures, not the steps inside one, so only async ",
                 "training runs several steps to a closure; use steps_per_execution 1");
}

void PsBackend::train(std::int64_t first_step, std::int64_t steps, int steps_per_closure, const Finished& finished) {
  PsRuntime& rt = alive();
  Coordinator& coordinator = rt.coordinator();
  struct Scheduled {
    std::int64_t first;
    int steps;
    std::shared_ptr<Closure> closure;
  };
  // Two closures a worker ahead of those finished: enough that no worker waits for the
  // coordinator, few enough that a stop (an error, stop_training) ends training soon.
  const std::size_t ahead = 2 * static_cast<std::size_t>(rt.config_.cluster.num_tasks("worker"));
  std::deque<Scheduled> scheduled;
  std::int64_t next = first_step;
  auto top_up = [&] {
    while (next < steps && scheduled.size() < ahead) {
      const int n = static_cast<int>(std::min<std::int64_t>(steps_per_closure, steps - next));
      scheduled.push_back({next, n, coordinator.schedule({std::string(kFitFunction), false}, {}, n)});
      next += n;
    }
  };
  std::exception_ptr failure;
  for (top_up(); !scheduled.empty(); top_up()) {
    const Scheduled s = scheduled.front();
    scheduled.pop_front();
    std::unique_lock lock(s.closure->mutex);
    s.closure->finished.wait(lock, [&] { return s.closure->done; });
    if (s.closure->error) {
      failure = s.closure->error;
      break;
    }
    const std::vector<double> figures = s.closure->figures;
    const int worker = s.closure->worker;
    lock.unlock();
    try {
      if (!finished(s.first, s.steps, worker, figures)) break;  // stop_training: no more steps
    } catch (...) {
      // A callback failed: the few closures still out end before fit leaves.
      failure = std::current_exception();
      break;
    }
  }
  // Waits for the rest and raises the first error (once: the next join starts clean),
  // then brings this process's variables up to date.
  coordinator.join();
  if (failure) std::rethrow_exception(failure);
}

namespace {

// The mean of staleness counts ([s]: pushes s versions behind); -1 when there are none.
double mean_staleness(const std::vector<std::int64_t>& counts) {
  std::int64_t pushes = 0, weighted = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    pushes += counts[k];
    weighted += counts[k] * static_cast<std::int64_t>(k);
  }
  return pushes > 0 ? static_cast<double>(weighted) / static_cast<double>(pushes) : -1.0;
}

}  // namespace

std::string PsBackend::statistics() const {
  const ClusterCoordinator::Statistics s = alive().coordinator().statistics();
  using Ps = ClusterCoordinator::Statistics::Ps;
  const double stale = mean_staleness(s.staleness_counts);
  std::ostringstream o;
  o << "closures " << s.closures_finished << " (" << s.closures_rerun << " run again after " << s.workers_lost
    << " lost worker" << (s.workers_lost == 1 ? "" : "s") << "), updates applied " << s.updates(&Ps::pushes_applied)
    << ", refused " << s.updates(&Ps::pushes_refused) << ", dropped " << s.updates(&Ps::pushes_dropped);
  if (stale >= 0)
    o << ", staleness mean " << std::fixed << std::setprecision(2) << stale << " max " << s.staleness_counts.size() - 1;
  if (s.steps_finished > 0 && s.pushes_applied > 0) {
    // Where a step's time went, on the workers and at the parameter servers.
    const double steps = static_cast<double>(s.steps_finished), ms = 1000.0;
    o << std::fixed << std::setprecision(2) << "; a step on a worker: pull " << s.pull_seconds / steps * ms
      << " ms, compute " << (s.run_seconds - s.pull_seconds - s.push_seconds) / steps * ms << " ms, push "
      << s.push_seconds / steps * ms << " ms; a push at a ps: queued "
      << s.queue_seconds / static_cast<double>(s.pushes_applied + s.pushes_refused + s.pushes_dropped) * ms
      << " ms, applied in " << s.apply_seconds / static_cast<double>(s.pushes_applied) * ms << " ms";
  }
  if (const std::int64_t moved = s.shared_memory_bytes + s.message_bytes; moved > 0 && s.steps_finished > 0)
    o << std::fixed << std::setprecision(2) << "; moved "
      << static_cast<double>(moved) / static_cast<double>(s.steps_finished) / 1e6 << " MB a step, "
      << std::setprecision(0) << 100.0 * static_cast<double>(s.shared_memory_bytes) / static_cast<double>(moved)
      << "% through shared memory";
  return o.str();
}

std::string PsBackend::servers_table(double training_seconds) const {
  const ClusterCoordinator::Statistics s = alive().coordinator().statistics();
  std::ostringstream o;
  o << std::fixed << std::setprecision(2)
    << "| ps | updates applied | refused | dropped | apply ms | queued ms | busy applying | staleness mean | "
       "staleness max | MB pulled and pushed per push |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (std::size_t p = 0; p < s.per_ps.size(); ++p) {
    const ClusterCoordinator::Statistics::Ps& ps = s.per_ps[p];
    const std::int64_t arrived = ps.pushes_applied + ps.pushes_refused + ps.pushes_dropped;
    auto per = [](double total, std::int64_t n) { return n > 0 ? total / static_cast<double>(n) : 0.0; };
    o << "| " << p << " | " << ps.pushes_applied << " | " << ps.pushes_refused << " | " << ps.pushes_dropped << " | "
      << per(ps.apply_seconds * 1000, ps.pushes_applied) << " | " << per(ps.queue_seconds * 1000, arrived) << " | "
      << std::setprecision(1) << (training_seconds > 0 ? 100.0 * ps.apply_seconds / training_seconds : 0.0) << "% | "
      << std::setprecision(2) << std::max(0.0, mean_staleness(ps.staleness_counts)) << " | "
      << (ps.staleness_counts.empty() ? 0 : ps.staleness_counts.size() - 1) << " | "
      << per(static_cast<double>(ps.shared_memory_bytes + ps.message_bytes) / 1e6, arrived) << " |\n";
  }
  return o.str();
}

}  // namespace dtrain::distribute::detail
