// A worker's service: it runs the closures the coordinator sends (pull, the function,
// push), with the per-worker datasets' iterators it keeps.
#include "dtrain/ps/internal/runtime.h"

namespace dtrain::distribute::detail {
namespace {

// ---------------------------------------------------------------- worker

// Sends the gradients of a closure's apply_gradients to the parameter servers.
class PushSink final : public optim::detail::GradientSink {
 public:
  PushSink(PsRuntime& runtime, const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement,
           std::uint64_t closure, std::uint64_t incarnation, const std::vector<std::int64_t>& versions)
      : runtime_(runtime), vars_(vars), placement_(placement), closure_(closure), incarnation_(incarnation),
        versions_(versions) {}

  // fit()'s closures run several steps: step `step` pushes what it computed from `versions`.
  void next_step(std::uint32_t step) {
    step_ = step;
    pushed_ = false;
  }

  // After each pull: the non-trainable variables' values (batch norm's moving statistics),
  // so that the push can send what the step changed in them.
  void pulled() {
    pulled_.resize(vars_.size());
    for (std::size_t v = 0; v < vars_.size(); ++v) {
      if (vars_[v]->trainable()) continue;
      const Tensor& now = vars_[v]->value();
      if (!pulled_[v].defined() || !(pulled_[v].shape() == now.shape())) pulled_[v] = Tensor::empty(now.shape());
      pulled_[v].copy_from(now);
    }
  }

  void push(const optim::Optimizer& optimizer, std::span<const Tensor> grads, std::span<Variable* const> vars) override {
    if (pushed_)
      DTRAIN_THROW(InvalidArgument, runtime_.task_name_, ": a closure applied gradients twice; under ",
                   "ParameterServerStrategy each closure pushes once (its closure id makes it count once)");
    pushed_ = true;
    std::vector<const Tensor*> by_variable(vars_.size(), nullptr);
    for (std::size_t i = 0; i < vars.size(); ++i) {
      const auto it = std::find(vars_.begin(), vars_.end(), vars[i]);
      if (it == vars_.end())
        DTRAIN_THROW(InvalidArgument, runtime_.task_name_, ": variable '", vars[i] ? vars[i]->name() : "(null)",
                     "' was not made under ParameterServerStrategy.scope(), so no parameter server holds it");
      if (!grads[i].defined()) continue;
      if (!(grads[i].shape() == vars[i]->shape()) || grads[i].dtype() != DType::f32)
        DTRAIN_THROW(InvalidArgument, optimizer.name(), ": gradient ", grads[i].shape().to_string(),
                     " does not match variable '", vars[i]->name(), "' ", vars[i]->shape().to_string());
      by_variable[static_cast<std::size_t>(it - vars_.begin())] = &grads[i];
    }
    // The non-trainable variables the step changed: their change since the pull.
    changed_.assign(vars_.size(), false);
    for (std::size_t v = 0; v < pulled_.size(); ++v) {
      if (!pulled_[v].defined()) continue;
      const float* now = vars_[v]->value().data<float>();
      float* change = pulled_[v].data<float>();  // becomes the change: pulled_ is refilled by the next pull
      bool any = false;
      for (std::int64_t i = 0; i < pulled_[v].numel(); ++i) {
        change[i] = now[i] - change[i];
        any = any || change[i] != 0.0f;
      }
      changed_[v] = any;
    }
    const std::string optimizer_json = optimizer_to_json(optimizer).dump();
    const int num_ps = runtime_.config_.cluster.num_tasks("ps");
    std::lock_guard lanes_lock(runtime_.lanes_mutex_);
    // To ps p: the gradients of its shards, written into the lane where there is one.
    auto request_to = [&](int p, const PsRuntime::Lane* lane) {
      wire::PushRequest r;
      runtime_.fill(r.mutable_caller());
      r.set_closure(closure_);
      r.set_step(step_);
      r.set_incarnation(incarnation_);
      r.set_optimizer(optimizer_json);
      r.set_pulled_version(versions_[static_cast<std::size_t>(p)]);
      if (lane) r.set_segment(lane->segment);
      for (const ShardPlacement& s : placement_) {
        const std::size_t v = s.index;
        if (s.ps != p || !by_variable[v]) continue;
        const std::string_view bytes = rows_bytes(*by_variable[v], s.row_begin, s.row_end);
        if (lane)
          std::memcpy(lane->gradients({static_cast<int>(v), static_cast<int>(s.shard)}), bytes.data(), bytes.size());
        add_rows(r.mutable_gradients(), static_cast<int>(v), static_cast<int>(s.shard),
                 shard_shape(vars_[v]->shape(), s.row_end - s.row_begin),
                 lane ? std::nullopt : std::optional<std::string_view>(bytes));
      }
      for (const ShardPlacement& s : placement_)
        if (s.ps == p && changed_[s.index])
          add_rows(r.mutable_changes(), static_cast<int>(s.index), static_cast<int>(s.shard),
                   shard_shape(vars_[s.index]->shape(), s.row_end - s.row_begin),
                   rows_bytes(pulled_[s.index], s.row_begin, s.row_end));
      return r;
    };
    const ScopedSeconds timed(push_seconds);
    std::vector<wire::PushRequest> requests;
    for (int p = 0; p < num_ps; ++p) requests.push_back(request_to(p, runtime_.lane(p, vars_, placement_)));
    std::vector<wire::PushReply> replies;
    runtime_.call_every_ps(requests, replies, "pushing to",
                           [](auto& stub, auto* context, auto* request, auto* reply, auto done) {
                             stub.async()->Push(context, request, reply, std::move(done));
                           });
    for (int p = 0; p < num_ps; ++p) {
      if (!replies[static_cast<std::size_t>(p)].detached()) continue;
      // The ps started again and read nothing: the values go in the message this time.
      runtime_.drop_lane(p);
      wire::PushRequest again = request_to(p, nullptr);
      wire::PushReply reply;
      runtime_.call_ps(p, &wire::ParameterServer::Stub::Push, again, reply,
                       runtime_.task_name_ + " pushing to " + runtime_.describe({"ps", p}));
    }
  }

 private:
  PsRuntime& runtime_;
  const std::vector<Variable*>& vars_;
  const std::vector<ShardPlacement>& placement_;
  std::uint64_t closure_, incarnation_;
  const std::vector<std::int64_t>& versions_;
  std::uint32_t step_ = 0;
  bool pushed_ = false;
  std::vector<Tensor> pulled_;  // [variable]: non-trainable ones' pulled values, then their change
  std::vector<bool> changed_;   // [variable]: the step changed it (kept to allocate nothing per step)

 public:
  double push_seconds = 0;  // spent pushing, over the closure
};

class WorkerService final : public wire::Worker::Service {
 public:
  explicit WorkerService(PsRuntime& runtime) : runtime_(runtime) {}

  grpc::Status Run(grpc::ServerContext*, const wire::RunRequest* request, wire::RunReply* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    std::lock_guard run_lock(run_mutex_);  // one closure at a time
    if (runtime_.loader_ && request->program() != 0 && request->program() != runtime_.program_loaded()) {
      if (request->program_bytes().empty())
        return {kNeedsProgram, runtime_.task_name_ + " does not hold the chief's program " +
                                   std::to_string(request->program())};
      try {
        runtime_.load_program(request->program(), request->program_bytes());
        vars_.clear();  // the program made (more) variables
        const std::string model = PsRuntime::model_description(runtime_.variables());
        if (model != request->model())
          DTRAIN_THROW(InvalidArgument, "the chief's program, loaded here, built another model than the chief's: ",
                       first_difference(model, request->model()),
                       "; make every variable under strategy.scope() on the chief before scheduling");
      } catch (...) {
        return status_of(std::current_exception());
      }
    }
    const auto fn = runtime_.functions_.find(request->function());
    if (fn == runtime_.functions_.end()) {
      std::string known;
      for (const auto& [name, f] : runtime_.functions_) known += (known.empty() ? "'" : ", '") + name + "'";
      return {kNoSuchFunction, runtime_.task_name_ + " has no function '" + request->function() + "' (it defined " +
                                   (known.empty() ? "none" : known) +
                                   (request->function() == kFitFunction
                                        ? "); the chief runs model.fit, so every worker must call model.fit too"
                                        : "); every task must define the same functions before serve()")};
    }
    const auto run_start = Clock::now();
    try {
      data::Iterator* it = nullptr;
      if (request->dataset() >= 0) it = &iterator(request->dataset(), request->iterator());
      if (vars_.empty()) {
        vars_ = runtime_.variables();
        placement_ = runtime_.placement(vars_);
      }
      double pull_seconds = 0;
      std::vector<std::int64_t> versions;
      PushSink sink(runtime_, vars_, placement_, request->closure(), request->incarnation(), versions);
      auto pull = [&] {
        const ScopedSeconds timed(pull_seconds);
        versions = runtime_.pull(vars_, placement_);
        sink.pulled();
      };
      if (!fn->second.steps) pull();
      optim::detail::ScopedGradientSink scoped(&sink);
      if (fn->second.steps) {
        // fit()'s closure: each step trains on the weights as they are when it starts (the
        // pull is the step's first phase in the worker's profile).
        const std::vector<double> figures = fn->second.steps(request->steps(), [&](int step) {
          pull();
          sink.next_step(static_cast<std::uint32_t>(step));
        });
        reply->mutable_figures()->Add(figures.begin(), figures.end());
      }
      std::vector<Tensor> results;
      if (!fn->second.steps) results = it ? fn->second.with_iterator(*it) : fn->second.plain();
      reply->set_pull_seconds(pull_seconds);
      reply->set_push_seconds(sink.push_seconds);
      reply->set_run_seconds(std::chrono::duration<double>(Clock::now() - run_start).count());
      for (const Tensor& t : results) {
        wire::TensorValue* out = reply->add_results();
        const Tensor value = t.dtype() == DType::bf16 ? t.astype(DType::f32) : t;
        out->set_dtype(std::string(dtype_name(value.dtype())));
        for (std::int64_t d : value.shape().dims()) out->add_shape(d);
        out->set_data(value.raw_data(), value.nbytes());
      }
    } catch (...) {
      return status_of(std::current_exception());
    }
    return grpc::Status::OK;
  }

  grpc::Status Ping(grpc::ServerContext*, const wire::PingRequest* request, wire::PingReply* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    reply->set_model(PsRuntime::model_description(runtime_.variables()));
    reply->set_loads_programs(static_cast<bool>(runtime_.loader_));
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext*, const wire::ShutdownRequest* request, wire::ShutdownReply*) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    std::lock_guard lock(mutex_);
    stopped_ = true;
    changed_.notify_all();
    return grpc::Status::OK;
  }

  bool wait_stopped(Clock::duration d) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, d, [&] { return stopped_; });
  }

 private:
  data::Iterator& iterator(int dataset, int index) {
    if (dataset >= static_cast<int>(runtime_.datasets_.size()))
      DTRAIN_THROW(InvalidArgument, runtime_.task_name_, " has no per-worker dataset ", dataset, " (it made ",
                   runtime_.datasets_.size(), "); every task must make the same per-worker datasets before serve()");
    const auto key = std::make_pair(dataset, index);
    auto it = iterators_.find(key);
    if (it == iterators_.end())
      it = iterators_.emplace(key, runtime_.datasets_[static_cast<std::size_t>(dataset)]().make_iterator()).first;
    return it->second;
  }

  PsRuntime& runtime_;
  std::mutex run_mutex_;
  std::vector<Variable*> vars_;
  std::vector<ShardPlacement> placement_;
  std::map<std::pair<int, int>, data::Iterator> iterators_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<RoleService> make_worker_service(PsRuntime& runtime) {
  return std::make_unique<ServiceRole<WorkerService>>(runtime);
}

}  // namespace dtrain::distribute::detail
