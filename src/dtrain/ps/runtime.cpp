// The runtime every task of a ParameterServerStrategy job holds: its channels to the other
// tasks, the placement of the variables, pulls, and serving (with a worker's loading of
// the program the chief ships).
#include "dtrain/ps/internal/runtime.h"
#include "dtrain/ps/internal/coordinator.h"

namespace dtrain::distribute::detail {

PsRuntime::PsRuntime(cluster::TfConfig config, ParameterServerOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  const cluster::ClusterSpec& c = config_.cluster;
  config_.require_chief("ParameterServerStrategy");
  if (c.num_tasks("ps") == 0)
    DTRAIN_THROW(InvalidArgument, "TF_CONFIG: ParameterServerStrategy needs at least one 'ps' task to hold the ",
                 "variables; cluster.ps is missing or empty");
  if (c.num_tasks("worker") == 0)
    DTRAIN_THROW(InvalidArgument, "TF_CONFIG: ParameterServerStrategy needs at least one 'worker' task to run the ",
                 "closures; cluster.worker is missing or empty");
  if (config_.task.type != "chief" && config_.task.type != "worker" && config_.task.type != "ps")
    DTRAIN_THROW(InvalidArgument, "TF_CONFIG: task ", config_.task.to_string(),
                 " has no part in ParameterServerStrategy (chief, worker and ps do)");
  const Consistency& mode = options_.consistency;
  if (mode.kind == Consistency::Kind::SSP && mode.staleness < 0)
    DTRAIN_THROW(InvalidArgument, "ParameterServerStrategy: ssp(", mode.staleness, "): the staleness must be >= 0");
  if (mode.kind == Consistency::Kind::SYNC && (mode.backup_workers < 0 || mode.backup_workers >= c.num_tasks("worker")))
    DTRAIN_THROW(InvalidArgument, "ParameterServerStrategy: sync with ", mode.backup_workers, " backup workers: ",
                 "it must be at least 0 and fewer than the ", c.num_tasks("worker"), " workers");
  token_ = options_.token.empty() ? token_for(c) : options_.token;
  task_name_ = config_.task.to_string();
  rpc_timeout_ = seconds_or(options_.rpc_timeout_seconds, 60);
  heartbeat_ = seconds_or(options_.heartbeat_seconds, 0.5);
  worker_timeout_ = seconds_or(options_.worker_timeout_seconds, 10);
  coordinator_timeout_ = seconds_or(options_.coordinator_timeout_seconds, 30);
  ps_stubs_.resize(static_cast<std::size_t>(c.num_tasks("ps")));
  worker_stubs_.resize(static_cast<std::size_t>(c.num_tasks("worker")));
  lanes_.resize(static_cast<std::size_t>(c.num_tasks("ps")));
  dtrain::detail::track_variables(backend_->id(), this);
  backend_->runtime = this;
}

std::vector<ShardPlacement> PsRuntime::placement(const std::vector<Variable*>& vars) const {
  std::vector<VariableSpec> specs;
  specs.reserve(vars.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    if (vars[i]->dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, "ParameterServerStrategy: variable '", vars[i]->name(), "' is ",
                   dtype_name(vars[i]->dtype()), "; the parameter servers hold float32 variables");
    specs.push_back({vars[i]->name(), vars[i]->shape(), vars[i]->dtype()});
  }
  return place_shards(specs, options_.variable_partitioner, config_.cluster.num_tasks("ps"));
}

std::string PsRuntime::model_description(const std::vector<Variable*>& vars) {
  std::ostringstream out;
  for (std::size_t i = 0; i < vars.size(); ++i)
    out << "variable " << i << " '" << vars[i]->name() << "' " << shape_text(vars[i]->shape()) << "\n";
  return out.str();
}

std::shared_ptr<grpc::Channel> PsRuntime::channel(const cluster::TaskId& task) {
  const std::string target = address_of(task);
  std::lock_guard lock(channels_mutex_);
  auto& ch = channels_[target];
  if (!ch) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // A worker that comes back is found within a heartbeat or two, not after gRPC's
    // default back-off of up to two minutes. (The minimum, which is also each connection
    // attempt's own deadline, stays at gRPC's 20 s: a loaded peer may take long to answer.)
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  return ch;
}

wire::ParameterServer::Stub& PsRuntime::ps(int i) {
  std::lock_guard lock(stubs_mutex_);  // the chief reaches it from fit's thread and the heartbeat's
  auto& stub = ps_stubs_.at(static_cast<std::size_t>(i));
  if (!stub) stub = wire::ParameterServer::NewStub(channel({"ps", i}));
  return *stub;
}

wire::Worker::Stub& PsRuntime::worker(int i) {
  std::lock_guard lock(stubs_mutex_);
  auto& stub = worker_stubs_.at(static_cast<std::size_t>(i));
  if (!stub) stub = wire::Worker::NewStub(channel({"worker", i}));
  return *stub;
}


PsRuntime::Lane* PsRuntime::lane(int p, const std::vector<Variable*>& vars,
                                  const std::vector<ShardPlacement>& placement) {
  Lane& lane = lanes_.at(static_cast<std::size_t>(p));
  if (!options_.shared_memory || !lane.why_not.empty()) return nullptr;
  if (lane.mapping) return &lane;
  wire::AttachRequest request;
  fill(request.mutable_caller());
  request.set_host(attach_identity());
  wire::AttachReply reply;
  grpc::ClientContext context;
  set_deadline(context, rpc_timeout_);
  // A failed call is tried again next time; the pull or push through gRPC says what is wrong.
  if (!ps(p).Attach(&context, request, &reply).ok()) return nullptr;
  if (reply.segment().empty()) {
    lane.why_not = reply.why_not();
    return nullptr;
  }
  // The segment must fit this task's shards exactly; where it does not (another model),
  // the pulls through gRPC name the difference.
  std::size_t on_p = 0;
  for (const ShardPlacement& s : placement) on_p += s.ps == p;
  for (const wire::SegmentPlace& place : reply.places()) {
    const auto v = static_cast<std::size_t>(place.variable());
    const ShardPlacement* at = find_placement(placement, v, place.shard(), p);
    // Each shard within the values area, and the gradients area no larger than it.
    if (at == nullptr || v >= vars.size() ||
        rows_bytes(host_value(*vars[v]), at->row_begin, at->row_end).size() != place.bytes() ||
        reply.gradients_offset() > reply.bytes() / 2 || place.bytes() > reply.gradients_offset() ||
        place.offset() > reply.gradients_offset() - place.bytes()) {
      lane.why_not = describe({"ps", p}) + " holds shards this task's model does not";
      break;
    }
    lane.offsets[{place.variable(), place.shard()}] = place.offset();
  }
  if (lane.offsets.size() != on_p)
    lane = Lane{.why_not = describe({"ps", p}) + " holds other shards than this task's model places there"};
  if (lane.why_not.empty()) lane.mapping = comm::open_segment(reply.segment(), reply.bytes(), lane.why_not);
  if (!lane.mapping) {
    ::shm_unlink(reply.segment().c_str());  // refused: the ps would keep its name until the job ends
    return nullptr;
  }
  lane.segment = reply.segment();
  lane.gradients_offset = reply.gradients_offset();
  return &lane;
}

Tensor& PsRuntime::host_value(Variable& v) {
  Tensor& value = v.mutable_value();
  if (value.on_cpu()) return value;
  std::lock_guard lock(vars_mutex_);
  Tensor& host = host_values_[&v];
  if (!host.defined() || !(host.shape() == value.shape()) || host.dtype() != value.dtype())
    host = Tensor::empty_pinned(value.shape(), value.dtype());
  return host;
}

const Tensor& PsRuntime::current_host_value(Variable& v) {
  Tensor& host = host_value(v);
  host.copy_from(v.mutable_value());  // nothing where it is the value itself
  return host;
}

std::vector<std::int64_t> PsRuntime::pull(const std::vector<Variable*>& vars,
                                          const std::vector<ShardPlacement>& placement,
                                          const std::vector<bool>* whole) {
  const int num_ps = config_.cluster.num_tasks("ps");
  std::lock_guard lanes_lock(lanes_mutex_);
  std::vector<wire::PullRequest> requests(static_cast<std::size_t>(num_ps));
  auto wanted = [&](std::size_t v) { return !whole || (*whole)[v]; };
  for (int p = 0; p < num_ps; ++p) {
    wire::PullRequest& r = requests[static_cast<std::size_t>(p)];
    fill(r.mutable_caller());
    if (const Lane* l = lane(p, vars, placement)) r.set_segment(l->segment);
    if (whole) {
      r.set_select_whole(true);
      for (std::size_t v = 0; v < vars.size(); ++v)
        if (wanted(v)) r.add_whole(static_cast<int>(v));
    }
  }
  std::vector<wire::PullReply> replies;
  call_every_ps(requests, replies, "pulling from", [](auto& stub, auto* context, auto* request, auto* reply, auto done) {
    stub.async()->Pull(context, request, reply, std::move(done));
  });
  std::vector<std::int64_t> versions(requests.size());
  for (int p = 0; p < num_ps; ++p) {
    const auto i = static_cast<std::size_t>(p);
    versions[i] = replies[i].version();
    if (replies[i].in_segment() && !requests[i].segment().empty()) {
      const Lane& l = lanes_[i];
      for (const ShardPlacement& s : placement) {
        if (s.ps != p || !wanted(s.index)) continue;
        const std::string_view target = rows_bytes(host_value(*vars[s.index]), s.row_begin, s.row_end);
        std::memcpy(const_cast<char*>(target.data()), l.values({static_cast<int>(s.index), static_cast<int>(s.shard)}),
                    target.size());
      }
      continue;
    }
    if (!requests[i].segment().empty()) drop_lane(p);  // the ps started again: attach anew next time
    for (const wire::Rows& rows : replies[i].shards()) {
      const ShardPlacement& where = placed_there(placement, vars, rows, p);
      copy_rows(host_value(*vars[where.index]), where, rows.values(),
                task_name_ + ": " + describe({"ps", p}) + " sent", "'" + vars[where.index]->name() + "'");
    }
  }
  // A GPU worker's variables: from their page-locked copies to the GPU.
  for (std::size_t v = 0; v < vars.size(); ++v) {
    Tensor& value = vars[v]->mutable_value();
    if (wanted(v) && !value.on_cpu()) value.copy_from(host_value(*vars[v]));
  }
  return versions;
}

const ShardPlacement& PsRuntime::placed_there(const std::vector<ShardPlacement>& placement,
                                              const std::vector<Variable*>& vars, const wire::Rows& rows, int p) const {
  const auto v = static_cast<std::size_t>(rows.variable());
  const ShardPlacement* where = find_placement(placement, v, rows.shard(), p);
  if (v >= vars.size() || where == nullptr)
    DTRAIN_THROW(InvalidArgument, task_name_, ": ", describe({"ps", p}), " sent shard ", rows.shard(), " of variable ",
                 v, ", which this task's model does not place there (another model?)");
  return *where;
}

void PsRuntime::pull_rows(const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement,
                          const std::vector<std::pair<std::size_t, std::vector<std::int64_t>>>& rows) {
  std::map<int, wire::PullRequest> by_ps;
  for (const auto& [i, ids] : rows) {
    const ShardPlacement& s = placement.at(i);
    wire::PullRequest& r = by_ps[s.ps];
    r.set_select_whole(true);  // and none whole
    wire::RowIds* asked = r.add_rows();
    asked->set_variable(static_cast<int>(s.index));
    asked->set_shard(static_cast<int>(s.shard));
    asked->mutable_rows()->Add(ids.begin(), ids.end());
  }
  std::vector<int> to;
  std::vector<wire::PullRequest> requests;
  for (auto& [p, r] : by_ps) {
    fill(r.mutable_caller());
    to.push_back(p);
    requests.push_back(std::move(r));
  }
  std::vector<wire::PullReply> replies;
  call_ps_list(to, requests, replies, "pulling rows from",
               [](auto& stub, auto* context, auto* request, auto* reply, auto done) {
                 stub.async()->Pull(context, request, reply, std::move(done));
               });
  for (std::size_t i = 0; i < to.size(); ++i) {
    for (const wire::Rows& got : replies[i].rows()) {
      const ShardPlacement* where = &placed_there(placement, vars, got, to[i]);
      const std::size_t v = where->index;
      Tensor& value = vars[v]->mutable_value();
      if (!value.on_cpu())
        DTRAIN_THROW(InternalError, task_name_, ": rows of '", vars[v]->name(), "' pulled into ", value.device().to_string(),
                     "; a GPU worker pulls its tables whole");
      const std::size_t row_bytes = rows_bytes(value, 0, 1).size();
      if (got.values().size() != row_bytes * static_cast<std::size_t>(got.row_ids_size()))
        DTRAIN_THROW(InvalidArgument, task_name_, ": ", describe({"ps", to[i]}), " sent ", got.values().size(),
                     " bytes for ", got.row_ids_size(), " rows of '", vars[v]->name(), "', which take ",
                     row_bytes * static_cast<std::size_t>(got.row_ids_size()));
      for (int k = 0; k < got.row_ids_size(); ++k) {
        const std::int64_t row = where->row_begin + got.row_ids(k);
        if (got.row_ids(k) < 0 || row >= where->row_end)
          DTRAIN_THROW(InvalidArgument, task_name_, ": ", describe({"ps", to[i]}), " sent row ", got.row_ids(k),
                       " of shard ", got.shard(), " of '", vars[v]->name(), "', which has ",
                       where->row_end - where->row_begin, " rows");
        std::memcpy(const_cast<char*>(rows_bytes(value, row, row + 1).data()),
                    got.values().data() + static_cast<std::size_t>(k) * row_bytes, row_bytes);
      }
    }
  }
}


// ---------------------------------------------------------------- the runtime's roles

PsRuntime::~PsRuntime() {
  end_job();  // while everything the coordinator uses is still here
  backend_->runtime = nullptr;
  dtrain::detail::track_variables(backend_->id(), nullptr);
}

void PsRuntime::end_job() {
  std::unique_ptr<Coordinator> ending;
  {
    std::lock_guard lock(coordinator_mutex_);
    ended_ = true;
    ending = std::move(coordinator_);
  }
  ending.reset();  // cancels what is queued and tells every task the job is over
}

Coordinator& PsRuntime::coordinator() {
  if (config_.task.type != "chief")
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator: ", task_name_, " is not the coordinator; only the chief ",
                 "schedules closures (workers and parameter servers call serve())");
  std::lock_guard lock(coordinator_mutex_);
  if (ended_) DTRAIN_THROW(InvalidArgument, "ClusterCoordinator: the job has ended (end_job); nothing more can be scheduled");
  if (!coordinator_) coordinator_ = std::make_unique<Coordinator>(this);
  return *coordinator_;
}

void PsRuntime::serve() {
  if (config_.task.type == "chief")
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::serve: the chief coordinates; workers and parameter ",
                 "servers serve");
  if (job_over_) return;  // a later fit() in the same program: the coordinator already ended the job
  if (wait_stopped_) {
    // A shipped program's fit, loaded on this serving thread: its steps are defined, so the
    // Run that waits for the load may go on; this thread serves on until the job ends.
    {
      std::lock_guard lock(program_mutex_);
      if (program_loading_ != 0) program_loaded_ = program_loading_;
      program_changed_.notify_all();
    }
    wait_serving();
    return;
  }
  const std::string address = address_of(config_.task);
  std::unique_ptr<RoleService> role;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use is an error, not shared
  if (config_.task.type == "ps") {
    // Every pull and push builds and frees messages of the variables' size. glibc would give
    // the freed top of its heaps back to the kernel each time and fault the pages in again,
    // zeroed, at the next call: a ps that holds nothing else made a 2-worker job 17% slower
    // at 1 Gbit/s (docs/parameter_server.md). The ps keeps what it freed, up to 256 MiB.
    if constexpr (!DTRAIN_SANITIZED) {
      mallopt(M_MMAP_THRESHOLD, 32 << 20);
      mallopt(M_TRIM_THRESHOLD, 256 << 20);
    }
    role = make_ps_service(*this);
  } else {
    role = make_worker_service(*this);
  }
  builder.RegisterService(role->service());
  wait_stopped_ = [&](Clock::duration d) { return role->wait_stopped(d); };
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    wait_stopped_ = nullptr;
    DTRAIN_THROW(IoError, task_name_, " cannot listen on ", address, " (TF_CONFIG's address for it; is the port ",
                 "in use?)");
  }
  heard();
  try {
    wait_serving();
  } catch (...) {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    wait_stopped_ = nullptr;
    throw;
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  wait_stopped_ = nullptr;
  std::lock_guard lock(program_mutex_);
  job_over_ = true;
  program_changed_.notify_all();  // a Run still waiting for a load gives up
}

void PsRuntime::wait_serving() {
  const auto poll = std::chrono::milliseconds(100);
  for (;;) {
    if (wait_stopped_(loader_ ? std::chrono::milliseconds(5) : poll)) return;
    if (loader_) load_wanted_program();
    if (silence() > coordinator_timeout_)
      DTRAIN_THROW(PeerFailure, task_name_, ": the coordinator (", describe({"chief", 0}), ") has not been heard ",
                   "from for ", std::chrono::duration<double>(coordinator_timeout_).count(),
                   " s; it died or was stopped, so this task stops too");
  }
}

void PsRuntime::load_wanted_program() {
  std::string bytes;
  std::uint64_t version = 0;
  {
    std::lock_guard lock(program_mutex_);
    if (program_wanted_ == 0 || program_wanted_ == program_loaded_ || program_wanted_ == program_failed_) return;
    version = program_loading_ = program_wanted_;
    bytes = std::move(program_bytes_);
    program_bytes_.clear();
  }
  std::exception_ptr error;
  try {
    loader_(bytes);
  } catch (const std::exception& e) {
    error = made<InvalidArgument>(task_name_ + " loading the chief's program: " + e.what());
  } catch (...) {
    error = made<InvalidArgument>(task_name_ + " loading the chief's program: an unknown error");
  }
  std::lock_guard lock(program_mutex_);
  program_loading_ = 0;
  if (error) {
    program_failed_ = version;
    program_error_ = error;
  } else {
    program_loaded_ = version;
  }
  program_changed_.notify_all();
}

void PsRuntime::load_program(std::uint64_t version, const std::string& bytes) {
  std::unique_lock lock(program_mutex_);
  if (program_loaded_ == version) return;
  program_wanted_ = version;
  program_bytes_ = bytes;
  program_failed_ = 0;
  program_error_ = nullptr;
  // The serving thread loads it between its polls; a load that trains serves on inside
  // it and marks the version loaded first.
  program_changed_.wait(lock, [&] { return program_loaded_ == version || program_failed_ == version || job_over_; });
  if (program_failed_ == version) std::rethrow_exception(program_error_);
  if (program_loaded_ != version)
    DTRAIN_THROW(Cancelled, task_name_, ": the job ended while the chief's program was loading");
}

}  // namespace dtrain::distribute::detail
