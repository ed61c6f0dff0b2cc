// A parameter server's service: it holds its shards of the variables and their optimizer
// slots, applies the workers' pushes as the consistency mode says, and serves pulls,
// through gRPC messages or shared memory with tasks on its host.
#include "dtrain/ps/internal/runtime.h"

namespace dtrain::distribute::detail {
namespace {

// ---------------------------------------------------------------- parameter server

class PsService final : public wire::ParameterServer::Service {
 public:
  explicit PsService(PsRuntime& runtime) : runtime_(runtime) {}

  grpc::Status Create(grpc::ServerContext*, const wire::CreateRequest* request, wire::CreateReply*) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    std::map<int, std::string> names;
    std::map<int, std::optional<Constraint>> constraints;
    try {
      for (const wire::VariableInfo& v : request->variables()) {
        names[v.variable()] = v.name();
        if (!v.constraint().empty())
          constraints[v.variable()] = constraint_from_json({{"constraint", nlohmann::json::parse(v.constraint())}},
                                                           "constraint", "variable '" + v.name() + "'");
      }
    } catch (...) {
      return status_of(std::current_exception());
    }
    std::vector<std::pair<ParameterStore::ShardKey, Variable>> shards;
    for (const wire::Rows& rows : request->shards()) {
      const Shape shape = shape_of(rows.shape());
      if (rows.values().size() != static_cast<std::size_t>(shape.numel()) * sizeof(float))
        return {kInvalidArgument, "shard " + std::to_string(rows.shard()) + " of variable " +
                                      std::to_string(rows.variable()) + " has the wrong number of bytes"};
      Tensor value = Tensor::empty(shape);
      std::memcpy(value.raw_data(), rows.values().data(), rows.values().size());
      Variable shard(names[rows.variable()] + "/part_" + std::to_string(rows.shard()), value);
      // Each shard keeps its variable's constraint: the coordinator placed whole every
      // variable whose constraint needs norms across shards.
      if (const auto c = constraints.find(rows.variable()); c != constraints.end()) shard.set_constraint(c->second);
      shards.emplace_back(ParameterStore::ShardKey{rows.variable(), rows.shard()}, std::move(shard));
    }
    ParameterStore::OptimizerState restored;
    restored.optimizer_json = request->optimizer();
    restored.iterations = request->iterations();
    for (const wire::SlotRows& slot : request->slots()) {
      const ParameterStore::ShardKey key{slot.variable(), slot.shard()};
      const auto shard = std::find_if(shards.begin(), shards.end(), [&](const auto& s) { return s.first == key; });
      if (shard == shards.end() || slot.values().size() != shard->second.value().nbytes())
        return {kInvalidArgument, "slot '" + slot.slot() + "' of shard " + std::to_string(slot.shard()) +
                                      " of variable " + std::to_string(slot.variable()) +
                                      (shard == shards.end() ? " names no shard placed here" : " has the wrong number of bytes")};
      Tensor value = Tensor::empty(shard->second.shape());
      std::memcpy(value.raw_data(), slot.values().data(), slot.values().size());
      restored.slots.push_back({key, slot.slot(), std::move(value)});
    }
    try {
      store_.create(request->job(), std::move(shards), request->aggregate(), std::move(restored));
    } catch (...) {
      return status_of(std::current_exception());
    }
    std::lock_guard lock(segments_mutex_);
    segments_.clear();  // laid out for the shards before: every task attaches again
    return grpc::Status::OK;
  }

  grpc::Status Attach(grpc::ServerContext*, const wire::AttachRequest* request, wire::AttachReply* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    if (!store_.created())
      return {grpc::StatusCode::FAILED_PRECONDITION, runtime_.task_name_ + " holds no variables yet"};
    if (!runtime_.options_.shared_memory) {
      reply->set_why_not(runtime_.task_name_ + " keeps to gRPC (shared_memory is off)");
      return grpc::Status::OK;
    }
    const std::string here = attach_identity();
    if (request->host() != here || here.find('?') != std::string::npos) {
      reply->set_why_not(request->caller().task() + " is not on " + runtime_.task_name_ +
                         "'s host, or in another network or process namespace, or runs as another user");
      return grpc::Status::OK;
    }
    auto segment = std::make_shared<Segment>();
    std::uint64_t offset = 0;
    store_.read([&](const ParameterStore::ShardKey& key, const Tensor& value) {
      wire::SegmentPlace* place = reply->add_places();
      place->set_variable(key.variable);
      place->set_shard(key.shard);
      place->set_offset(offset);
      place->set_bytes(value.nbytes());
      segment->places[{key.variable, key.shard}] = {offset, value.nbytes()};
      offset += (value.nbytes() + 63) / 64 * 64;  // each shard on whole cache lines
    });
    segment->gradients_offset = std::max<std::uint64_t>(4096, (offset + 4095) / 4096 * 4096);
    std::string why_not;
    segment->memory = comm::NamedSegment::create(2 * segment->gradients_offset, why_not);
    if (!segment->memory.mapping) {
      reply->clear_places();
      reply->set_why_not(runtime_.task_name_ + ": " + why_not);
      return grpc::Status::OK;
    }
    segment->name = segment->memory.name();
    reply->set_segment(segment->name);
    reply->set_bytes(2 * segment->gradients_offset);
    reply->set_gradients_offset(segment->gradients_offset);
    std::lock_guard lock(segments_mutex_);
    segments_[request->caller().task()] = std::move(segment);
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext*, const wire::PullRequest* request, wire::PullReply* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    if (!store_.created())
      return {grpc::StatusCode::FAILED_PRECONDITION, runtime_.task_name_ + " holds no variables yet"};
    const std::set<int> whole(request->whole().begin(), request->whole().end());
    auto wanted_whole = [&](int variable) { return !request->select_whole() || whole.contains(variable); };
    std::map<std::pair<int, int>, const wire::RowIds*> rows_of;
    for (const wire::RowIds& r : request->rows()) rows_of[{r.variable(), r.shard()}] = &r;
    std::string error;
    // The rows asked of a shard, into the reply (under the store's lock, as its values are).
    auto add_asked_rows = [&](const ParameterStore::ShardKey& key, const Tensor& value) {
      const auto asked = rows_of.find({key.variable, key.shard});
      if (asked == rows_of.end()) return;
      const wire::RowIds& ids = *asked->second;
      rows_of.erase(asked);
      const std::int64_t rows = value.rank() == 0 ? 1 : value.dim(0);
      wire::Rows* out = add_rows(reply->mutable_rows(), key.variable, key.shard,
                                 shard_shape(value.shape(), ids.rows_size()), std::nullopt);
      out->set_by_rows(true);
      std::string* bytes = out->mutable_values();
      for (std::int64_t id : ids.rows()) {
        if (id < 0 || id >= rows) {
          error = request->caller().task() + " asked for row " + std::to_string(id) + " of shard " +
                  std::to_string(key.shard) + " of variable " + std::to_string(key.variable) + ", which has " +
                  std::to_string(rows) + " rows";
          return;
        }
        out->add_row_ids(id);
        bytes->append(rows_bytes(value, id, id + 1));
      }
      message_bytes_ += static_cast<std::int64_t>(bytes->size());
    };
    auto rows_answered = [&]() -> grpc::Status {
      if (!error.empty()) return {kInvalidArgument, error};
      if (!rows_of.empty())
        return {kInvalidArgument, request->caller().task() + " asked for rows of shard " +
                                      std::to_string(rows_of.begin()->first.second) + " of variable " +
                                      std::to_string(rows_of.begin()->first.first) + ", which " +
                                      runtime_.task_name_ + " does not hold"};
      return grpc::Status::OK;
    };
    if (const auto segment = segment_of(request->caller().task(), request->segment())) {
      std::lock_guard lock(segment->mutex);
      segment->memory.remove_name();  // the task has mapped it
      bool laid_out = true;
      reply->set_version(store_.read([&](const ParameterStore::ShardKey& key, const Tensor& value) {
        add_asked_rows(key, value);
        if (!wanted_whole(key.variable)) return;
        const auto place = segment->places.find({key.variable, key.shard});
        if (place == segment->places.end() || place->second.second != value.nbytes()) {
          laid_out = false;
          return;
        }
        std::memcpy(segment->memory.mapping.base() + place->second.first, value.raw_data(), value.nbytes());
        shared_memory_bytes_ += static_cast<std::int64_t>(value.nbytes());
      }));
      if (!laid_out)
        return {grpc::StatusCode::INTERNAL, runtime_.task_name_ + ": a shard has no place in " +
                                                request->caller().task() + "'s segment"};
      reply->set_in_segment(true);
      return rows_answered();
    }
    const std::int64_t version = store_.read([&](const ParameterStore::ShardKey& key, const Tensor& value) {
      add_asked_rows(key, value);
      if (!wanted_whole(key.variable)) return;
      add_rows(reply->mutable_shards(), key.variable, key.shard, value.shape(), all_bytes(value));
      message_bytes_ += static_cast<std::int64_t>(value.nbytes());
    });
    reply->set_version(version);
    return rows_answered();
  }

  // One shard's values in a push message (a gradient or a change), copied out into `into`;
  // values of another size than the shape's are refused naming `task`.
  grpc::Status take_from_message(const wire::Rows& rows, const std::string& task, const char* what,
                                 std::vector<std::pair<ParameterStore::ShardKey, Tensor>>& into) {
    const Shape shape = shape_of(rows.shape());
    if (rows.values().size() != static_cast<std::size_t>(shape.numel()) * sizeof(float))
      return {kInvalidArgument, task + " pushed a " + what + " of " + std::to_string(rows.values().size()) +
                                    " bytes for a " + shape.to_string() + " shard " + std::to_string(rows.shard()) +
                                    " of variable " + std::to_string(rows.variable())};
    Tensor values = Tensor::empty(shape);
    std::memcpy(values.raw_data(), rows.values().data(), rows.values().size());
    into.emplace_back(ParameterStore::ShardKey{rows.variable(), rows.shard()}, std::move(values));
    message_bytes_ += static_cast<std::int64_t>(rows.values().size());
    return grpc::Status::OK;
  }

  // A shard's gradient of some rows only (by_rows: an embedding table's rows a batch looked
  // up, in increasing order), made whole with zeros in the other rows; ids outside the
  // shard or out of order are refused.
  grpc::Status take_rows_from_message(const wire::Rows& rows, const std::string& task,
                                      std::vector<std::pair<ParameterStore::ShardKey, Tensor>>& into) {
    const Shape shape = shape_of(rows.shape());
    Tensor values = Tensor::zeros(shape);
    const std::int64_t num_rows = shape.rank() == 0 ? 1 : shape[0];
    const std::size_t row_bytes = rows_bytes(values, 0, std::min<std::int64_t>(1, num_rows)).size();
    const auto where = [&] {
      return "shard " + std::to_string(rows.shard()) + " of variable " + std::to_string(rows.variable()) + " (" +
             shape.to_string() + ")";
    };
    if (rows.values().size() != row_bytes * static_cast<std::size_t>(rows.row_ids_size()))
      return {kInvalidArgument, task + " pushed " + std::to_string(rows.values().size()) + " bytes for " +
                                    std::to_string(rows.row_ids_size()) + " rows of " + where()};
    for (int i = 0; i < rows.row_ids_size(); ++i) {
      const std::int64_t id = rows.row_ids(i);
      if (id < 0 || id >= num_rows || (i > 0 && id <= rows.row_ids(i - 1)))
        return {kInvalidArgument, task + " pushed a gradient for row " + std::to_string(id) + " of " + where() +
                                      (id >= 0 && id < num_rows ? ", out of order" : "")};
      std::memcpy(const_cast<char*>(rows_bytes(values, id, id + 1).data()),
                  rows.values().data() + static_cast<std::size_t>(i) * row_bytes, row_bytes);
    }
    into.emplace_back(ParameterStore::ShardKey{rows.variable(), rows.shard()}, std::move(values));
    message_bytes_ += static_cast<std::int64_t>(rows.values().size());
    return grpc::Status::OK;
  }

  grpc::Status Push(grpc::ServerContext*, const wire::PushRequest* request, wire::PushReply* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    ParameterStore::Push push;
    push.closure = request->closure();
    push.step = request->step();
    push.task = request->caller().task();
    push.incarnation = request->incarnation();
    push.optimizer_json = request->optimizer();
    push.pulled_version = request->pulled_version();
    std::shared_ptr<Segment> segment;
    std::unique_lock<std::mutex> segment_lock;
    if (!request->segment().empty()) {
      segment = segment_of(push.task, request->segment());
      if (!segment) {
        reply->set_detached(true);
        return grpc::Status::OK;
      }
      segment_lock = std::unique_lock(segment->mutex);
      segment->memory.remove_name();
    }
    for (const wire::Rows& rows : request->gradients()) {
      if (rows.by_rows()) {
        if (grpc::Status s = take_rows_from_message(rows, push.task, push.gradients); !s.ok()) return s;
        continue;
      }
      const Shape shape = shape_of(rows.shape());
      const std::size_t bytes = static_cast<std::size_t>(shape.numel()) * sizeof(float);
      if (segment) {
        // Read where it lies: the ps copies nothing.
        const auto place = segment->places.find({rows.variable(), rows.shard()});
        if (place == segment->places.end() || place->second.second != bytes)
          return {kInvalidArgument, push.task + " pushed a gradient for a " + shape.to_string() + " shard " +
                                        std::to_string(rows.shard()) + " of variable " +
                                        std::to_string(rows.variable()) + " that its segment has no place for"};
        char* at = segment->memory.mapping.base() + segment->gradients_offset + place->second.first;
        push.gradients.emplace_back(ParameterStore::ShardKey{rows.variable(), rows.shard()},
                                    Tensor::over(at, shape, DType::f32, segment));
        shared_memory_bytes_ += static_cast<std::int64_t>(bytes);
        continue;
      }
      if (grpc::Status s = take_from_message(rows, push.task, "gradient", push.gradients); !s.ok()) return s;
    }
    for (const wire::Rows& rows : request->changes())
      if (grpc::Status s = take_from_message(rows, push.task, "change", push.changes); !s.ok()) return s;
    try {
      const ParameterStore::PushResult result = store_.push(push);
      if (runtime_.push_trace_max_ > 0) runtime_.record_push(push.task, result);
      reply->set_applied(result.applied);
      reply->set_version(result.version);
      if (result.applied && runtime_.options_.on_update) runtime_.options_.on_update(result.version);
    } catch (...) {
      return status_of(std::current_exception());
    }
    return grpc::Status::OK;
  }

  grpc::Status GetStatistics(grpc::ServerContext*, const wire::StatisticsRequest* request,
                             wire::Statistics* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    const ParameterStore::Statistics st = store_.statistics();
    reply->set_version(st.version);
    reply->set_pushes_applied(st.pushes_applied);
    reply->set_pushes_refused(st.pushes_refused);
    reply->set_pushes_dropped(st.pushes_dropped);
    reply->set_apply_seconds(st.apply_seconds);
    reply->set_queue_seconds(st.queue_seconds);
    reply->set_shared_memory_bytes(shared_memory_bytes_.load());
    reply->set_message_bytes(message_bytes_.load());
    for (std::int64_t c : st.staleness_counts) reply->add_staleness_counts(c);
    return grpc::Status::OK;
  }

  grpc::Status GetState(grpc::ServerContext*, const wire::StateRequest* request, wire::State* reply) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    if (!store_.created())
      return {grpc::StatusCode::FAILED_PRECONDITION, runtime_.task_name_ + " holds no variables yet"};
    const ParameterStore::Snapshot snapshot = store_.snapshot();
    for (const auto& [key, value] : snapshot.values)
      add_rows(reply->mutable_values(), key.variable, key.shard, value.shape(), all_bytes(value));
    const ParameterStore::OptimizerState& state = snapshot.optimizer;
    reply->set_optimizer(state.optimizer_json);
    reply->set_iterations(state.iterations);
    for (const ParameterStore::OptimizerState::Slot& slot : state.slots)
      add_slot(reply->mutable_slots(), slot.name, slot.key.variable, slot.key.shard, all_bytes(slot.value));
    return grpc::Status::OK;
  }

  grpc::Status Fence(grpc::ServerContext*, const wire::FenceRequest* request, wire::FenceReply*) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    store_.fence(request->task(), request->incarnation());
    return grpc::Status::OK;
  }

  grpc::Status Ping(grpc::ServerContext*, const wire::PingRequest* request, wire::PingReply*) override {
    return runtime_.check(request->caller());
  }

  grpc::Status Shutdown(grpc::ServerContext*, const wire::ShutdownRequest* request, wire::ShutdownReply*) override {
    if (auto s = runtime_.check(request->caller()); !s.ok()) return s;
    stop();
    return grpc::Status::OK;
  }

  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    changed_.notify_all();
  }
  // Waits until told to stop (true) or for at most `d` (false).
  bool wait_stopped(Clock::duration d) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, d, [&] { return stopped_; });
  }

 private:
  // A task's segment: the values area from 0, the gradients area from gradients_offset,
  // each shard at the same offset in both.
  struct Segment {
    comm::NamedSegment memory;  // named until the task first uses it
    std::string name;
    std::map<std::pair<int, int>, std::pair<std::uint64_t, std::uint64_t>> places;  // (variable, shard) -> (offset, bytes)
    std::uint64_t gradients_offset = 0;
    std::mutex mutex;  // one pull or push of the task's at a time
  };
  // The segment `task` attached to as `name`, or null (none named, or not the current one).
  std::shared_ptr<Segment> segment_of(const std::string& task, const std::string& name) {
    if (name.empty()) return nullptr;
    std::lock_guard lock(segments_mutex_);
    const auto it = segments_.find(task);
    return it == segments_.end() || it->second->name != name ? nullptr : it->second;
  }

  PsRuntime& runtime_;
  ParameterStore store_;
  std::mutex segments_mutex_;
  std::map<std::string, std::shared_ptr<Segment>> segments_;  // by task
  std::atomic<std::int64_t> shared_memory_bytes_{0}, message_bytes_{0};  // pulled and pushed
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<RoleService> make_ps_service(PsRuntime& runtime) {
  return std::make_unique<ServiceRole<PsService>>(runtime);
}

}  // namespace dtrain::distribute::detail
