// A worker's service: it runs the closures the coordinator sends (pull, the function,
// push), with the per-worker datasets' iterators it keeps.
#include "dtrain/ps/internal/runtime.h"

#include <iterator>
#include <unordered_map>

#include "dtrain/profile/profiler.h"

namespace dtrain::distribute::detail {
namespace {

// ---------------------------------------------------------------- worker

// The rows of the embedding tables (variables read by rows) a closure's steps read: a
// lookup pulls the rows it lacks and the push sends each table's gradient in those rows
// only (the others are zero). A table something reads whole (a regularizer, a tied output
// layer) is pulled whole from then on, like the other variables. Made once per model and
// set on the thread that runs each closure; its buffers keep their room from step to step.
class RowPuller final : public dtrain::detail::RowReader {
 public:
  RowPuller(PsRuntime& runtime, const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement)
      : runtime_(runtime), vars_(vars), placement_(placement), whole_(vars.size(), true), fresh_(vars.size()) {
    for (std::size_t v = 0; v < vars.size(); ++v) {
      // A table on a GPU worker's GPU is pulled whole: its lookups' ids are on the GPU too.
      whole_[v] = !(runtime.options_.embedding_rows && vars[v]->read_by_rows() && vars[v]->trainable() &&
                    vars[v]->shape().rank() == 2 && vars[v]->value_device().is_cpu());
      index_[vars[v]] = v;
    }
  }
  // Whether variable v comes whole with each pull (null: every one does).
  const std::vector<bool>* whole() const {
    return std::find(whole_.begin(), whole_.end(), false) == whole_.end() ? nullptr : &whole_;
  }
  // A closure begins: the time its lookups spend pulling adds to `seconds`.
  void begin_closure(double& seconds) { seconds_ = &seconds; }
  // A pull began a step: no table's rows are up to date yet.
  void pulled() {
    for (std::vector<std::int64_t>& rows : fresh_) rows.clear();
  }
  // For the push: variable v's rows its gradient may hold (sorted), or null where it is
  // pushed whole.
  const std::vector<std::int64_t>* rows_of(std::size_t v) const { return whole_[v] ? nullptr : &fresh_[v]; }

  void read_whole(const Variable& variable) override {
    const std::size_t v = index(variable);
    if (whole_[v]) return;
    whole_[v] = true;
    std::vector<bool> only(vars_.size(), false);
    only[v] = true;
    const Timed timed(*this);
    runtime_.pull(vars_, placement_, &only);
  }

  void read_rows(const Variable& variable, const Tensor& ids) override {
    const std::size_t v = index(variable);
    if (whole_[v]) return;
    if (ids.dtype() != DType::i32 || !ids.device().is_cpu()) {
      read_whole(variable);  // not ids lookup_ids checked
      return;
    }
    const std::int32_t* id = ids.data<std::int32_t>();
    wanted_.assign(id, id + ids.numel());
    std::sort(wanted_.begin(), wanted_.end());
    wanted_.erase(std::unique(wanted_.begin(), wanted_.end()), wanted_.end());
    std::vector<std::int64_t>& fresh = fresh_[v];
    const std::size_t had = fresh.size();
    std::set_difference(wanted_.begin(), wanted_.end(), fresh.begin(), fresh.begin() + static_cast<std::ptrdiff_t>(had),
                        std::back_inserter(fresh));  // the missing ones, after the rows already here
    if (fresh.size() == had) return;
    const auto missing = fresh.begin() + static_cast<std::ptrdiff_t>(had);
    // Each shard's share of them, numbered within the shard.
    std::vector<std::pair<std::size_t, std::vector<std::int64_t>>> by_shard;
    for (std::size_t i = 0; i < placement_.size(); ++i) {
      const ShardPlacement& s = placement_[i];
      if (s.index != v) continue;
      const auto begin = std::lower_bound(missing, fresh.end(), s.row_begin);
      const auto end = std::lower_bound(begin, fresh.end(), s.row_end);
      if (begin == end) continue;
      std::vector<std::int64_t> local(begin, end);
      for (std::int64_t& row : local) row -= s.row_begin;
      by_shard.emplace_back(i, std::move(local));
    }
    {
      const Timed timed(*this);
      runtime_.pull_rows(vars_, placement_, by_shard);
    }
    std::inplace_merge(fresh.begin(), missing, fresh.end());
  }

 private:
  // Times a pull inside a step: into the closure's pull seconds, and in the step's profile
  // as a pull within forward, where the lookups are.
  class Timed {
   public:
    explicit Timed(RowPuller& puller) : seconds_(*puller.seconds_), start_(Clock::now()) {}
    ~Timed() {
      if (profile::Track* loop = profile::current_loop_track())
        loop->add_nested(profile::Phase::pull, profile::Phase::forward, start_, Clock::now());
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    ScopedSeconds seconds_;
    Clock::time_point start_;
  };

  std::size_t index(const Variable& variable) const {
    const auto it = index_.find(&variable);
    if (it == index_.end())
      DTRAIN_THROW(InvalidArgument, runtime_.task_name_, ": variable '", variable.name(), "' was not made under ",
                   "ParameterServerStrategy.scope(), so no parameter server holds it");
    return it->second;
  }

  PsRuntime& runtime_;
  const std::vector<Variable*>& vars_;
  const std::vector<ShardPlacement>& placement_;
  std::vector<bool> whole_;  // [variable]: pulled whole with each pull
  std::vector<std::vector<std::int64_t>> fresh_;  // [variable]: a table's rows pulled since the pull, sorted
  std::unordered_map<const Variable*, std::size_t> index_;
  std::vector<std::int64_t> wanted_;  // a lookup's ids, sorted and unique
  double* seconds_ = nullptr;         // the closure's pull seconds
};

// Sends the gradients of a closure's apply_gradients to the parameter servers.
class PushSink final : public optim::detail::GradientSink {
 public:
  PushSink(PsRuntime& runtime, const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement,
           std::uint64_t closure, std::uint64_t incarnation, const std::vector<std::int64_t>& versions,
           const RowPuller& rows, std::vector<Tensor>& host_grads)
      : runtime_(runtime), vars_(vars), placement_(placement), closure_(closure), incarnation_(incarnation),
        versions_(versions), rows_(rows), host_grads_(host_grads) {}

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
      const Tensor& now = vars_[v]->mutable_value();
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
    host_grads_.resize(vars_.size());
    for (std::size_t i = 0; i < vars.size(); ++i) {
      const auto it = std::find(vars_.begin(), vars_.end(), vars[i]);
      if (it == vars_.end())
        DTRAIN_THROW(InvalidArgument, runtime_.task_name_, ": variable '", vars[i] ? vars[i]->name() : "(null)",
                     "' was not made under ParameterServerStrategy.scope(), so no parameter server holds it");
      if (!grads[i].defined()) continue;
      if (!(grads[i].shape() == vars[i]->shape()) || grads[i].dtype() != DType::f32)
        DTRAIN_THROW(InvalidArgument, optimizer.name(), ": gradient ", grads[i].shape().to_string(),
                     " does not match variable '", vars[i]->name(), "' ", vars[i]->shape().to_string());
      const auto v = static_cast<std::size_t>(it - vars_.begin());
      by_variable[v] = &grads[i];
      if (!grads[i].on_cpu()) {  // a GPU worker's: to the host through a page-locked buffer
        Tensor& host = host_grads_.at(v);
        if (!host.defined() || !(host.shape() == grads[i].shape()))
          host = Tensor::empty_pinned(grads[i].shape(), grads[i].dtype());
        host.copy_from(grads[i]);
        by_variable[v] = &host;
      }
    }
    // The non-trainable variables the step changed: their change since the pull.
    changed_.assign(vars_.size(), false);
    for (std::size_t v = 0; v < pulled_.size(); ++v) {
      if (!pulled_[v].defined()) continue;
      const float* now = runtime_.current_host_value(*vars_[v]).data<float>();
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
        if (const std::vector<std::int64_t>* rows = rows_.rows_of(v)) {
          // A table's gradient in the rows the step looked up (zero in the others), in the message.
          wire::Rows* out = add_rows(r.mutable_gradients(), static_cast<int>(v), static_cast<int>(s.shard),
                                     shard_shape(vars_[v]->shape(), s.row_end - s.row_begin), std::nullopt);
          out->set_by_rows(true);
          std::string* values = out->mutable_values();
          for (auto id = std::lower_bound(rows->begin(), rows->end(), s.row_begin);
               id != rows->end() && *id < s.row_end; ++id) {
            out->add_row_ids(*id - s.row_begin);
            values->append(rows_bytes(*by_variable[v], *id, *id + 1));
          }
          continue;
        }
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
  const RowPuller& rows_;
  std::uint32_t step_ = 0;
  bool pushed_ = false;
  std::vector<Tensor> pulled_;  // [variable]: non-trainable ones' pulled values, then their change
  std::vector<bool> changed_;   // [variable]: the step changed it (kept to allocate nothing per step)
  std::vector<Tensor>& host_grads_;  // [variable]: a GPU gradient's page-locked copy, kept from push to push

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
        rows_.emplace(runtime_, vars_, placement_);
      }
      double pull_seconds = 0;
      std::vector<std::int64_t> versions;
      RowPuller& rows = *rows_;
      rows.begin_closure(pull_seconds);
      PushSink sink(runtime_, vars_, placement_, request->closure(), request->incarnation(), versions, rows,
                    host_grads_);
      auto pull = [&] {
        const ScopedSeconds timed(pull_seconds);
        versions = runtime_.pull(vars_, placement_, rows.whole());
        rows.pulled();
        sink.pulled();
      };
      if (!fn->second.steps) pull();
      optim::detail::ScopedGradientSink scoped(&sink);
      const dtrain::detail::ScopedRowReader reading(&rows);
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
        const Tensor host = t.on_cpu() ? t : t.to(Device::cpu());
        const Tensor value = host.dtype() == DType::bf16 ? host.astype(DType::f32) : host;
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
  std::optional<RowPuller> rows_;  // for vars_ and placement_
  std::vector<Tensor> host_grads_;   // the pushes' page-locked gradients (GPU workers), kept between closures
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
