// The chief's coordinator: scheduling, dispatch to the workers, losing and finding a
// worker again, the heartbeat, and placing and gathering the variables.
#include "dtrain/ps/internal/runtime.h"
#include "dtrain/ps/internal/coordinator.h"

namespace dtrain::distribute::detail {

// ---------------------------------------------------------------- coordinator


void Coordinator::start(optim::Optimizer* restored) {
  // Called under mutex_ by the first schedule().
  started_ = true;
  vars_ = runtime_->variables();
  if (vars_.empty())
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator: no variable was made under ParameterServerStrategy.scope() on ",
                 "the chief; build the model inside the scope before scheduling");
  placement_ = runtime_->placement(vars_);
  model_ = PsRuntime::model_description(vars_);
  place_variables(restored);
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w) dispatchers_.emplace_back([this, w] { dispatch(w); });
}

void Coordinator::place(optim::Optimizer& optimizer, bool restored) {
  std::lock_guard lock(mutex_);
  if (!started_)
    start(restored ? &optimizer : nullptr);
  else if (restored)
    place_variables(&optimizer);
}

void Coordinator::place_variables(optim::Optimizer* restored) {
  const int num_ps = runtime_->config_.cluster.num_tasks("ps");
  // Each ps applies a constraint to the shards it holds: a norm over axis 0 would span shards.
  for (const ShardPlacement& s : placement_) {
    const std::optional<Constraint>& c = vars_[s.index]->constraint();
    if (!c || s.num_shards < 2 || c->kind == Constraint::Kind::non_neg) continue;
    const int rank = vars_[s.index]->shape().rank();
    for (int a : c->axis)
      if (a == 0 || a + rank == 0)
        DTRAIN_THROW(InvalidArgument, "ParameterServerStrategy: variable '", vars_[s.index]->name(), "' is split into ",
                     s.num_shards, " shards along axis 0, and its ", c->class_name(),
                     " constraint takes norms over axis 0, across the shards, which no parameter server holds together; "
                     "keep it in one shard (a variable_partitioner that leaves it whole) or constrain other axes");
  }
  std::uint64_t job = std::random_device{}();
  job = (job << 32) ^ std::random_device{}();
  for (int p = 0; p < num_ps; ++p) {
    wire::CreateRequest request;
    runtime_->fill(request.mutable_caller());
    request.set_job(job);
    const Consistency& mode = runtime_->options_.consistency;
    if (mode.kind == Consistency::Kind::SYNC) request.set_aggregate(static_cast<int>(workers_.size()) - mode.backup_workers);
    for (std::size_t v = 0; v < vars_.size(); ++v) {
      wire::VariableInfo* info = request.add_variables();
      info->set_variable(static_cast<int>(v));
      info->set_name(vars_[v]->name());
      for (std::int64_t d : vars_[v]->shape().dims()) info->add_shape(d);
      if (const std::optional<Constraint>& c = vars_[v]->constraint()) info->set_constraint(constraint_to_json(c).dump());
    }
    for (const ShardPlacement& s : placement_) {
      if (s.ps != p) continue;
      const std::size_t v = s.index;
      add_rows(request.mutable_shards(), static_cast<int>(v), static_cast<int>(s.shard),
               shard_shape(vars_[v]->shape(), s.row_end - s.row_begin),
               rows_bytes(vars_[v]->value(), s.row_begin, s.row_end));
    }
    if (restored) {
      request.set_optimizer(optimizer_to_json(*restored).dump());
      request.set_iterations(restored->iterations());
      for (const ShardPlacement& s : placement_) {
        if (s.ps != p) continue;
        for (const auto& [name, slot] : restored->slots(*vars_[s.index]))
          add_slot(request.mutable_slots(), name, static_cast<int>(s.index), static_cast<int>(s.shard),
                   rows_bytes(*slot, s.row_begin, s.row_end));
      }
    }
    grpc::ClientContext context;
    set_deadline(context, runtime_->rpc_timeout_);
    context.set_wait_for_ready(true);  // the ps may still be starting
    wire::CreateReply reply;
    const grpc::Status status = runtime_->ps(p).Create(&context, request, &reply);
    if (!status.ok()) throw_status(status, "placing the variables on " + runtime_->describe({"ps", p}));
  }
}

std::shared_ptr<Closure> Coordinator::schedule(const RemoteFunction& fn, PerWorkerIterator it, int steps) {
  std::unique_lock lock(mutex_);
  if (error_) {
    // TensorFlow's rule: a pending error surfaces at the next schedule or join.
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
  if (!started_) start();
  auto closure = std::make_shared<Closure>();
  closure->id = next_closure_++;
  closure->function = fn;
  closure->iterator = it;
  closure->steps = steps;
  queue_.push_back(closure);
  ++stats_.closures_scheduled;
  changed_.notify_all();
  return closure;
}

bool Coordinator::may_start(int w) const {
  const Consistency& mode = runtime_->options_.consistency;
  const std::int64_t mine = progress_[static_cast<std::size_t>(w)];
  if (mode.kind == Consistency::Kind::SYNC) {
    // Closure t + 1 waits until N - b live workers have finished closure t: then its
    // update was applied when the last of their pushes was answered. A worker never holds
    // a closure while waiting for the others' gradients.
    int live = 0, level = 0;
    for (std::size_t v = 0; v < workers_.size(); ++v) {
      if (!workers_[v].connected && static_cast<int>(v) != w) continue;
      ++live;
      level += progress_[v] >= mine ? 1 : 0;
    }
    return level >= std::max(1, live - mode.backup_workers);
  }
  if (mode.kind != Consistency::Kind::SSP) return true;
  std::int64_t slowest = progress_[static_cast<std::size_t>(w)];
  for (std::size_t v = 0; v < workers_.size(); ++v)
    if (workers_[v].connected) slowest = std::min(slowest, progress_[v]);
  return progress_[static_cast<std::size_t>(w)] - slowest <= mode.staleness;
}

std::shared_ptr<Closure> Coordinator::take(int w) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return stopping_ || (!queue_.empty() && may_start(w)); });
  if (stopping_) return nullptr;
  std::shared_ptr<Closure> c = queue_.front();
  queue_.pop_front();
  ++running_;
  return c;
}

Coordinator::Reached Coordinator::connect(int w, std::uint64_t& incarnation) {
  wire::PingRequest request;
  runtime_->fill(request.mutable_caller());
  wire::PingReply reply;
  grpc::ClientContext context;
  set_deadline(context, runtime_->heartbeat_ * 4);
  context.set_wait_for_ready(true);
  const grpc::Status status = runtime_->worker(w).Ping(&context, request, &reply);
  if (status.error_code() == kWrongToken) {
    fail(nullptr, made<InvalidArgument>(status.error_message()));
    return Reached::refused;
  }
  if (!status.ok()) return Reached::no;
  // A worker that loads programs builds the model when it loads the chief's (its Run checks it).
  if (!reply.loads_programs() && reply.model() != model_) {
    fail(nullptr, made<InvalidArgument>(dtrain::detail::concat(
                      runtime_->describe({"worker", w}), " built another model than the chief: ",
                      first_difference(reply.model(), model_),
                      "; every task must build the same model under strategy.scope()")));
    return Reached::refused;  // no closure goes to it
  }
  std::lock_guard lock(mutex_);
  incarnation = next_incarnation_++;
  std::int64_t slowest = -1;
  for (std::size_t v = 0; v < workers_.size(); ++v)
    if (workers_[v].connected && (slowest < 0 || progress_[v] < slowest)) slowest = progress_[v];
  if (slowest >= 0) progress_[static_cast<std::size_t>(w)] = std::max(progress_[static_cast<std::size_t>(w)], slowest);
  WorkerState& state = workers_[static_cast<std::size_t>(w)];
  state.connected = true;
  state.loads_programs = reply.loads_programs();
  state.incarnation = incarnation;
  state.last_answer = Clock::now();
  changed_.notify_all();
  return Reached::yes;
}

void Coordinator::dispatch(int w) {
  std::uint64_t incarnation = 0;
  bool connected = false;
  std::uint64_t holds_program = 0;  // the program version the worker loaded, as far as known here
  const cluster::TaskId task{"worker", w};
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (stopping_) return;
    }
    if (!connected) {
      const Reached reached = connect(w, incarnation);
      if (reached == Reached::refused) return;
      connected = reached == Reached::yes;
      if (!connected) {
        std::unique_lock lock(mutex_);
        changed_.wait_for(lock, runtime_->heartbeat_, [&] { return stopping_; });
      }
      continue;
    }
    std::shared_ptr<Closure> closure = take(w);
    if (!closure) return;
    wire::RunRequest request;
    runtime_->fill(request.mutable_caller());
    request.set_function(closure->function.name);
    request.set_closure(closure->id);
    request.set_incarnation(incarnation);
    request.set_dataset(closure->function.takes_iterator ? closure->iterator.dataset : -1);
    request.set_iterator(closure->iterator.iterator);
    request.set_steps(closure->steps);
    {
      std::unique_lock lock(mutex_);
      if (workers_[static_cast<std::size_t>(w)].loads_programs) {
        if (!program_error_.empty() || program_version_ == 0) {
          const std::string why = program_version_ == 0 ? "the chief shipped no program (run the training program "
                                                          "with dtrain's Python package on the chief)"
                                                        : program_error_;
          lock.unlock();
          fail(closure, made<InvalidArgument>(dtrain::detail::concat(
                            runtime_->describe(task), " runs the program the chief ships (tf.distribute.Server), and ",
                            why)));
          continue;
        }
        request.set_program(program_version_);
        request.set_model(model_);
        if (holds_program != program_version_) request.set_program_bytes(*program_bytes_);
      }
    }
    wire::RunReply reply;
    grpc::ClientContext context;
    set_deadline(context, std::chrono::hours(1));  // a hung worker is found by the heartbeat sooner
    {
      std::lock_guard lock(mutex_);
      workers_[static_cast<std::size_t>(w)].in_flight = &context;
    }
    const auto sent = Clock::now();
    const grpc::Status status = runtime_->worker(w).Run(&context, request, &reply);
    const double call_seconds = std::chrono::duration<double>(Clock::now() - sent).count();
    {
      std::lock_guard lock(mutex_);
      workers_[static_cast<std::size_t>(w)].in_flight = nullptr;
      if (stopping_) {
        --running_;
        closure->finish({}, made<Cancelled>("the job ended (the strategy was destroyed) while the closure ran"));
        return;
      }
    }
    if (status.error_code() == kNeedsProgram) {  // it came back without it: send it again, with the bytes
      holds_program = 0;
      std::lock_guard lock(mutex_);
      --running_;
      queue_.push_front(closure);
      changed_.notify_all();
      continue;
    }
    if (status.ok()) {
      holds_program = request.program();
      std::vector<Tensor> results;
      std::string malformed;
      for (const wire::TensorValue& v : reply.results()) {
        const Shape shape = shape_of(v.shape());
        Tensor t = Tensor::empty(shape, v.dtype() == "int32" ? DType::i32 : DType::f32);
        if (v.data().size() != t.nbytes()) {
          malformed = dtrain::detail::concat(runtime_->describe(task), " returned ", v.data().size(),
                                             " bytes for a ", v.dtype(), " ", shape.to_string(), " result");
          break;
        }
        std::memcpy(t.raw_data(), v.data().data(), t.nbytes());
        results.push_back(std::move(t));
      }
      if (!malformed.empty()) {
        fail(closure, made<InternalError>(malformed));
        continue;
      }
      closure->finish(std::move(results), nullptr, {reply.figures().begin(), reply.figures().end()}, w);
      std::lock_guard lock(mutex_);
      stats_.pull_seconds += reply.pull_seconds();
      stats_.push_seconds += reply.push_seconds();
      stats_.run_seconds += reply.run_seconds();
      stats_.dispatch_seconds += std::max(0.0, call_seconds - reply.run_seconds());
      stats_.steps_finished += std::max(1, closure->steps);
      --running_;
      ++stats_.closures_finished;
      ++stats_.closures_per_worker[static_cast<std::size_t>(w)];
      ++progress_[static_cast<std::size_t>(w)];
      changed_.notify_all();
    } else if (is_application_error(status.error_code())) {
      fail(closure, error_of(status, dtrain::detail::concat(runtime_->describe(task), " running '",
                                                             closure->function.name, "' (closure ", closure->id, ")")));
    } else {
      lost(w, incarnation, closure, status.error_message());
      connected = false;
      holds_program = 0;
    }
  }
}

void Coordinator::lost(int w, std::uint64_t incarnation, const std::shared_ptr<Closure>& closure,
                       const std::string& /*why*/) {
  // Fence first: pushes the lost incarnation still sends are refused, so the closure's
  // gradients count once whichever run of it reaches a ps first.
  const std::string task = cluster::TaskId{"worker", w}.to_string();
  for (int p = 0; p < runtime_->config_.cluster.num_tasks("ps"); ++p) {
    wire::FenceRequest request;
    runtime_->fill(request.mutable_caller());
    request.set_task(task);
    request.set_incarnation(incarnation);
    wire::FenceReply reply;
    grpc::ClientContext context;
    set_deadline(context, runtime_->rpc_timeout_);
    const grpc::Status status = runtime_->ps(p).Fence(&context, request, &reply);
    if (!status.ok()) {
      fail(closure, error_of(status, "fencing off the lost " + task + " on " + runtime_->describe({"ps", p})));
      return;
    }
  }
  std::lock_guard lock(mutex_);
  WorkerState& state = workers_[static_cast<std::size_t>(w)];
  state.connected = false;
  ++stats_.workers_lost;
  ++stats_.closures_rerun;
  --running_;
  queue_.push_front(closure);
  changed_.notify_all();
}

void Coordinator::fail(const std::shared_ptr<Closure>& closure, std::exception_ptr error) {
  const std::string message = message_of(error);
  if (closure) closure->finish({}, error);
  std::deque<std::shared_ptr<Closure>> cancelled;
  {
    std::lock_guard lock(mutex_);
    // The last reference this thread holds goes inside the lock: whoever takes the error
    // out of error_ does so after this thread is done with it.
    if (!error_) error_ = std::move(error);
    error = nullptr;
    cancelled.swap(queue_);
    if (closure) {
      --running_;
      ++stats_.closures_finished;
    }
    changed_.notify_all();
  }
  for (const auto& c : cancelled)
    c->finish({}, made<Cancelled>(dtrain::detail::concat(
                      "closure ", c->id, " ('", c->function.name, "') was cancelled: an earlier closure failed: ",
                      message)));
}

void Coordinator::heartbeat_loop() {
  const int num_workers = static_cast<int>(workers_.size());
  const int num_ps = runtime_->config_.cluster.num_tasks("ps");
  std::vector<Clock::time_point> ps_answered(static_cast<std::size_t>(num_ps), Clock::now());
  std::vector<bool> ps_reported(static_cast<std::size_t>(num_ps), false);
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (changed_.wait_for(lock, runtime_->heartbeat_, [&] { return stopping_; })) return;
    }
    wire::PingRequest request;
    runtime_->fill(request.mutable_caller());
    for (int p = 0; p < num_ps; ++p) {
      wire::PingReply reply;
      grpc::ClientContext context;
      set_deadline(context, runtime_->heartbeat_);
      const auto i = static_cast<std::size_t>(p);
      if (runtime_->ps(p).Ping(&context, request, &reply).ok()) {
        ps_answered[i] = Clock::now();
      } else if (Clock::now() - ps_answered[i] > runtime_->rpc_timeout_ && !ps_reported[i]) {
        bool started = false;
        {
          std::lock_guard lock(mutex_);
          started = started_;
        }
        if (started) {
          ps_reported[i] = true;
          fail(nullptr, made<Unavailable>(dtrain::detail::concat(
                            runtime_->describe({"ps", p}), " has not answered for ",
                            std::chrono::duration<double>(runtime_->rpc_timeout_).count(), " s")));
        }
      }
    }
    for (int w = 0; w < num_workers; ++w) {
      {
        std::lock_guard lock(mutex_);
        if (!workers_[static_cast<std::size_t>(w)].connected) continue;
      }
      wire::PingReply reply;
      grpc::ClientContext context;
      set_deadline(context, runtime_->heartbeat_);
      const bool ok = runtime_->worker(w).Ping(&context, request, &reply).ok();
      std::lock_guard lock(mutex_);
      WorkerState& state = workers_[static_cast<std::size_t>(w)];
      if (ok) {
        state.last_answer = Clock::now();
      } else if (Clock::now() - state.last_answer > runtime_->worker_timeout_ && state.in_flight) {
        state.in_flight->TryCancel();  // its dispatcher then counts it lost
      }
    }
  }
}

void Coordinator::wait_for_workers(int count, std::chrono::duration<double> timeout) {
  std::unique_lock lock(mutex_);
  if (!started_) start();
  auto connected = [&] {
    int n = 0;
    for (const WorkerState& w : workers_) n += w.connected ? 1 : 0;
    return n;
  };
  const int wanted = std::min(count, static_cast<int>(workers_.size()));
  if (changed_.wait_until(lock, deadline_after(timeout), [&] { return connected() >= wanted || error_; })) {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return;
  }
  std::string missing;
  for (std::size_t w = 0; w < workers_.size(); ++w)
    if (!workers_[w].connected)
      missing += (missing.empty() ? "" : ", ") + runtime_->describe({"worker", static_cast<int>(w)});
  DTRAIN_THROW(Timeout, "ClusterCoordinator::wait_for_workers: ", connected(), " of the ", wanted, " workers wanted ",
               "answered within ", timeout.count(), " s; not: ", missing);
}

void Coordinator::join() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return (queue_.empty() && running_ == 0) || stopping_; });
    if (error_) {
      std::exception_ptr e = std::exchange(error_, nullptr);
      std::rethrow_exception(e);
    }
    if (!started_) return;
  }
  runtime_->pull(vars_, placement_);
}

void Coordinator::gather(optim::Optimizer& optimizer) {
  {
    std::lock_guard lock(mutex_);
    if (!started_) return;
  }
  std::int64_t iterations = -1;
  for (int p = 0; p < runtime_->config_.cluster.num_tasks("ps"); ++p) {
    wire::StateRequest request;
    wire::State reply;
    const std::string what = "copying the values and optimizer state of " + runtime_->describe({"ps", p});
    runtime_->call_ps(p, &wire::ParameterServer::Stub::GetState, request, reply, what);
    auto placed = [&](int variable, int shard) -> const ShardPlacement& {
      if (const ShardPlacement* s = find_placement(placement_, static_cast<std::size_t>(variable), shard, p)) return *s;
      DTRAIN_THROW(InvalidArgument, what, ": it holds shard ", shard, " of variable ", variable,
                   ", which the chief's model does not place there");
    };
    for (const wire::Rows& rows : reply.values()) {
      const ShardPlacement& s = placed(rows.variable(), rows.shard());
      copy_rows(vars_[s.index]->mutable_value(), s, rows.values(), what, "'" + vars_[s.index]->name() + "'");
    }
    if (reply.optimizer().empty()) continue;
    iterations = std::max(iterations, reply.iterations());
    for (const wire::SlotRows& rows : reply.slots()) {
      const ShardPlacement& s = placed(rows.variable(), rows.shard());
      Tensor* whole = nullptr;
      for (const auto& [name, slot] : optimizer.slots(*vars_[s.index], /*create=*/true))
        if (name == rows.slot()) whole = slot;
      if (whole == nullptr)
        DTRAIN_THROW(InvalidArgument, what, ": slot '", rows.slot(), "' of '", vars_[s.index]->name(),
                     "' is not one of the chief's optimizer ", optimizer.name());
      copy_rows(*whole, s, rows.values(), what, "slot '" + rows.slot() + "' of '" + vars_[s.index]->name() + "'");
    }
  }
  if (iterations >= 0) optimizer.set_iterations(iterations);
}

ClusterCoordinator::Statistics Coordinator::statistics() const {
  ClusterCoordinator::Statistics s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  for (int p = 0; p < runtime_->config_.cluster.num_tasks("ps"); ++p) {
    wire::StatisticsRequest request;
    wire::Statistics reply;
    runtime_->call_ps(p, &wire::ParameterServer::Stub::GetStatistics, request, reply,
                      "asking " + runtime_->describe({"ps", p}) + " for its statistics");
    ClusterCoordinator::Statistics::Ps& ps = s.per_ps.emplace_back();
    ps.pushes_applied = reply.pushes_applied();
    ps.pushes_refused = reply.pushes_refused();
    ps.pushes_dropped = reply.pushes_dropped();
    ps.apply_seconds = reply.apply_seconds();
    ps.queue_seconds = reply.queue_seconds();
    ps.shared_memory_bytes = reply.shared_memory_bytes();
    ps.message_bytes = reply.message_bytes();
    ps.staleness_counts.assign(reply.staleness_counts().begin(), reply.staleness_counts().end());
    s.pushes_applied += ps.pushes_applied;
    s.pushes_refused += ps.pushes_refused;
    s.pushes_dropped += ps.pushes_dropped;
    s.apply_seconds += ps.apply_seconds;
    s.queue_seconds += ps.queue_seconds;
    s.shared_memory_bytes += ps.shared_memory_bytes;
    s.message_bytes += ps.message_bytes;
    if (s.staleness_counts.size() < ps.staleness_counts.size()) s.staleness_counts.resize(ps.staleness_counts.size(), 0);
    for (std::size_t i = 0; i < ps.staleness_counts.size(); ++i) s.staleness_counts[i] += ps.staleness_counts[i];
  }
  return s;
}

Coordinator::~Coordinator() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (WorkerState& w : workers_)
      if (w.in_flight) w.in_flight->TryCancel();
    changed_.notify_all();
  }
  for (std::thread& t : dispatchers_) t.join();
  heartbeat_.join();
  for (const auto& c : queue_)
    c->finish({}, made<Cancelled>("the job ended (the strategy was destroyed) before the closure ran"));
  // Tell every task the job is over (those that cannot be reached stop by themselves).
  wire::ShutdownRequest request;
  runtime_->fill(request.mutable_caller());
  auto tell = [&](auto& stub) {
    wire::ShutdownReply reply;
    grpc::ClientContext context;
    set_deadline(context, std::chrono::seconds(2));
    (void)stub.Shutdown(&context, request, &reply);
  };
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w) tell(runtime_->worker(w));
  for (int p = 0; p < runtime_->config_.cluster.num_tasks("ps"); ++p) tell(runtime_->ps(p));
}

}  // namespace dtrain::distribute::detail
