// ParameterServerStrategy and ClusterCoordinator over gRPC: the coordinator's queue and
// its thread per worker, the workers' and parameter servers' services, and the pulls and
// pushes between them.
#include "dtrain/ps/cluster_coordinator.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iomanip>
#include <latch>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/comm/shared_memory.h"
#include "dtrain/core/error.h"
#include "dtrain/core/files.h"
#include "dtrain/distribute/worker_comm.h"
#include "dtrain/model/compile_config.h"
#include "dtrain/model/serialization.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/ps/parameter_store.h"
#include "dtrain/ps/ps.grpc.pb.h"

namespace dtrain::distribute {
namespace wire = dtrain::ps::wire;

namespace detail {

using Clock = std::chrono::steady_clock;

namespace {

std::chrono::duration<double> seconds_or(double given, double fallback) {
  return std::chrono::duration<double>(given > 0 ? given : fallback);
}


void set_deadline(grpc::ClientContext& context, std::chrono::duration<double> d) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(d));
}

// The codes a worker's Run answers with for an error of its closure; every other code
// means the call itself failed (the worker died, hung or cannot be reached).
constexpr grpc::StatusCode kInvalidArgument = grpc::StatusCode::INVALID_ARGUMENT;
constexpr grpc::StatusCode kParameterServerUnavailable = grpc::StatusCode::FAILED_PRECONDITION;
constexpr grpc::StatusCode kClosureFailed = grpc::StatusCode::ABORTED;
constexpr grpc::StatusCode kNoSuchFunction = grpc::StatusCode::NOT_FOUND;
constexpr grpc::StatusCode kWrongToken = grpc::StatusCode::PERMISSION_DENIED;
// A worker that loads programs lacks the version a Run names: the coordinator sends it again
// with its bytes.
constexpr grpc::StatusCode kNeedsProgram = grpc::StatusCode::OUT_OF_RANGE;

bool is_application_error(grpc::StatusCode code) {
  return code == kInvalidArgument || code == kParameterServerUnavailable || code == kClosureFailed ||
         code == kNoSuchFunction || code == kWrongToken;
}

// An error of kind E made into an exception_ptr. Its temporary (whose message buffer the
// copy shares) ends here, before the caller hands the pointer to another thread.
template <typename E>
std::exception_ptr made(std::string message) {
  return std::make_exception_ptr(E(std::move(message)));
}

// The error a failed call means, made without throwing it (so that handing it to another
// thread leaves no reference behind in this one).
std::exception_ptr error_of(const grpc::Status& status, const std::string& context) {
  const std::string message = context + ": " + status.error_message();
  switch (status.error_code()) {
    case kInvalidArgument:
    case kNoSuchFunction:
    case kWrongToken:
      return made<InvalidArgument>(message);
    case kParameterServerUnavailable:
    case grpc::StatusCode::UNAVAILABLE:
      return made<Unavailable>(message);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return std::make_exception_ptr(
          Unavailable(context + ": no answer before the deadline (" + status.error_message() + ")"));
    default:
      return made<Error>(message);
  }
}

[[noreturn]] void throw_status(const grpc::Status& status, const std::string& context) {
  std::rethrow_exception(error_of(status, context));
}

grpc::Status status_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    return {kInvalidArgument, e.what()};
  } catch (const Unavailable& e) {
    return {kParameterServerUnavailable, e.what()};
  } catch (const std::exception& e) {
    return {kClosureFailed, e.what()};
  } catch (...) {
    return {kClosureFailed, "an exception that is not a std::exception"};
  }
}

Clock::time_point deadline_after(std::chrono::duration<double> d) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d);
}

std::string shape_text(const Shape& s) { return s.to_string(); }

Shape shape_of(const google::protobuf::RepeatedField<std::int64_t>& dims) {
  return Shape(std::vector<std::int64_t>(dims.begin(), dims.end()));
}

// What a task and a ps must share for the ps's segment to serve the task: the host and its
// namespaces, and the user (a segment is made readable by its owner only).
std::string attach_identity() { return comm::host_identity() + " uid " + std::to_string(::geteuid()); }

// The name fit() defines its closures' function under on every worker.
constexpr std::string_view kFitFunction = "model.fit";

void check_name(const std::string& name) {
  if (name == kFitFunction)
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::define: '", name, "' is the name model.fit() uses; choose another");
}

// Rows [begin, end) of a float32 tensor, as bytes.
std::string_view rows_bytes(const Tensor& t, std::int64_t begin, std::int64_t end) {
  const std::int64_t row = t.rank() == 0 ? 1 : t.numel() / std::max<std::int64_t>(1, t.dim(0));
  const char* base = static_cast<const char*>(t.raw_data());
  return {base + static_cast<std::size_t>(begin * row) * sizeof(float),
          static_cast<std::size_t>((end - begin) * row) * sizeof(float)};
}

std::string_view all_bytes(const Tensor& t) { return {static_cast<const char*>(t.raw_data()), t.nbytes()}; }

Shape shard_shape(const Shape& whole, std::int64_t rows) {
  if (whole.rank() == 0) return whole;
  std::vector<std::int64_t> dims(whole.dims().begin(), whole.dims().end());
  dims[0] = rows;
  return Shape(dims);
}

// One shard's rows added to a message: its place, its shape and, where given, its bytes
// (a push through shared memory sends none).
wire::Rows* add_rows(google::protobuf::RepeatedPtrField<wire::Rows>* to, int variable, int shard, const Shape& shape,
                     std::optional<std::string_view> values) {
  wire::Rows* rows = to->Add();
  rows->set_variable(variable);
  rows->set_shard(shard);
  for (std::int64_t d : shape.dims()) rows->add_shape(d);
  if (values) rows->set_values(values->data(), values->size());
  return rows;
}

// One optimizer slot of one shard added to a message.
void add_slot(google::protobuf::RepeatedPtrField<wire::SlotRows>* to, const std::string& slot, int variable, int shard,
              std::string_view values) {
  wire::SlotRows* rows = to->Add();
  rows->set_slot(slot);
  rows->set_variable(variable);
  rows->set_shard(shard);
  rows->set_values(values.data(), values.size());
}

// The placement of shard `shard` of variable `variable` on ps `ps`, or null.
const ShardPlacement* find_placement(const std::vector<ShardPlacement>& placement, std::size_t variable,
                                     std::int64_t shard, int ps) {
  for (const ShardPlacement& s : placement)
    if (s.index == variable && s.shard == shard && s.ps == ps) return &s;
  return nullptr;
}

// `bytes` into rows [s.row_begin, s.row_end) of `whole`, which they must fill exactly;
// the error begins with `context` and names `what` (a variable or a slot).
void copy_rows(Tensor& whole, const ShardPlacement& s, std::string_view bytes, const std::string& context,
               const std::string& what) {
  const std::string_view target = rows_bytes(whole, s.row_begin, s.row_end);
  if (bytes.size() != target.size())
    DTRAIN_THROW(InvalidArgument, context, ": ", bytes.size(), " bytes for shard ", s.shard, " of ", what,
                 ", which takes ", target.size());
  std::memcpy(const_cast<char*>(target.data()), bytes.data(), target.size());
}

// Adds the seconds of its own lifetime to `total`.
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double& total) : total_(total), start_(Clock::now()) {}
  ~ScopedSeconds() { total_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double& total_;
  Clock::time_point start_;
};

// The first line where a worker's model description differs from the chief's.
std::string first_difference(const std::string& there, const std::string& here) {
  std::istringstream a(there), b(here);
  std::string x, y;
  for (;;) {
    const bool has_x = static_cast<bool>(std::getline(a, x));
    const bool has_y = static_cast<bool>(std::getline(b, y));
    if (!has_x && !has_y) return "(no difference)";
    if (!has_x) return "it lacks " + y;
    if (!has_y) return "it has " + x + " in addition";
    if (x != y) return "it has " + x + " where the chief has " + y;
  }
}

}  // namespace

struct Closure {
  std::uint64_t id = 0;
  RemoteFunction function;
  PerWorkerIterator iterator;
  int steps = 0;  // fit()'s closures: the training steps to run
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::vector<Tensor> results;
  std::vector<double> figures;  // fit()'s closures: what the worker's steps measured
  int worker = -1;              // the worker whose run finished it
  std::exception_ptr error;

  void finish(std::vector<Tensor> values, std::exception_ptr failure, std::vector<double> measured = {}, int by = -1) {
    std::lock_guard lock(mutex);
    results = std::move(values);
    figures = std::move(measured);
    worker = by;
    error = std::move(failure);
    done = true;
    finished.notify_all();
  }
};

class PsRuntime;

// What a model made under scope() trains through: fit() hands its steps to the runtime
// (RemoteTraining), whose workers run each step as one device does.
class PsBackend final : public StrategyBackend, public RemoteTraining {
 public:
  std::string name() const override { return "ParameterServerStrategy"; }
  int num_replicas() const override { return 1; }
  void run(const std::function<void(int)>& fn) override { fn(0); }
  std::unique_ptr<GradientReducer> gradient_reducer(std::span<Variable* const>, std::span<const DenseVariables>,
                                                    bool) override {
    DTRAIN_THROW(InternalError, "ParameterServerStrategy: no gradient reducer (its workers train as one device does)");
  }
  RemoteTraining* remote_training() override { return this; }

  bool coordinates() const override;
  int num_remote_workers() const override;
  int remote_worker_index() const override;
  std::string describe() const override;
  void serve(Steps steps) override;
  int remote_ps_index() const override;
  void trace_server(std::size_t max_pushes) override;
  void write_server_trace(const std::string& path) const override;
  void begin_fit(int steps_per_closure) override;
  void place(optim::Optimizer& optimizer, bool restored) override;
  void train(std::int64_t first_step, std::int64_t steps, int steps_per_closure, const Finished& finished) override;
  void gather(optim::Optimizer& optimizer) override;
  std::string statistics() const override;
  std::string servers_table(double training_seconds) const override;

  // Set while the strategy lives (a model may outlive it).
  PsRuntime* runtime = nullptr;
  bool fitted = false;  // the chief began a fit

 private:
  PsRuntime& alive() const;
};

class PsRuntime final : public dtrain::detail::VariableTracker {
 public:
  PsRuntime(cluster::TfConfig config, ParameterServerOptions options);
  ~PsRuntime() override;

  // --- the variables made under scope()
  void created(Variable& v) override {
    std::lock_guard lock(vars_mutex_);
    vars_.push_back(&v);
  }
  void destroyed(Variable& v) override {
    std::lock_guard lock(vars_mutex_);
    std::erase(vars_, &v);
  }
  std::vector<Variable*> variables() const {
    std::lock_guard lock(vars_mutex_);
    return vars_;
  }
  std::vector<ShardPlacement> placement(const std::vector<Variable*>& vars) const;
  static std::string model_description(const std::vector<Variable*>& vars);

  // --- RPC plumbing
  void fill(wire::Caller* caller) const {
    caller->set_token(token_);
    caller->set_task(task_name_);
  }
  grpc::Status check(const wire::Caller& caller) {
    if (caller.token() != token_)
      return {kWrongToken, task_name_ + " refuses a call from " + (caller.task().empty() ? "a process" : caller.task()) +
                               " with another cluster token (a process of another job? DTRAIN_CLUSTER_TOKEN differs)"};
    if (caller.task() == "chief:0") heard();
    return grpc::Status::OK;
  }
  void heard() { last_heard_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  Clock::duration silence() const {
    return Clock::now() - Clock::time_point(Clock::duration(last_heard_.load(std::memory_order_relaxed)));
  }
  std::string address_of(const cluster::TaskId& task) const { return config_.cluster.address(task).to_string(); }
  std::string describe(const cluster::TaskId& task) const { return task.to_string() + " at " + address_of(task); }
  std::shared_ptr<grpc::Channel> channel(const cluster::TaskId& task);
  wire::ParameterServer::Stub& ps(int i);
  wire::Worker::Stub& worker(int i);

  // One call to every ps, all in flight at once: start(stub, context, request, reply,
  // done) begins ps p's with requests[p]; returns once every one has answered, throwing
  // the first failure ("worker:0 pulling from ps:1 at ...: ...").
  template <typename Request, typename Reply, typename Start>
  void call_every_ps(const std::vector<Request>& requests, std::vector<Reply>& replies, const char* doing,
                     Start start);
  // One call to ps p, `method` of its stub, with the RPC deadline (the request's caller is
  // filled here); a failure throws, beginning with `doing`.
  template <typename Request, typename Reply, typename Method>
  void call_ps(int p, Method method, Request& request, Reply& reply, const std::string& doing) {
    fill(request.mutable_caller());
    grpc::ClientContext context;
    set_deadline(context, rpc_timeout_);
    if (const grpc::Status status = (ps(p).*method)(&context, request, &reply); !status.ok())
      throw_status(status, doing);
  }
  // Pulls every shard into `vars`; returns each ps's version.
  std::vector<std::int64_t> pull(const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement);

  // A segment of shared memory a ps on this host made for this task: values are pulled
  // into its first area and gradients pushed from its second, with only small messages
  // through gRPC.
  struct Lane {
    comm::SharedMapping mapping;  // unmapped: none (yet)
    std::string segment;
    std::map<std::pair<int, int>, std::uint64_t> offsets;  // (variable, shard) -> offset in each area
    std::uint64_t gradients_offset = 0;
    std::string why_not;  // set: the ps cannot share memory with this task; gRPC only
    char* values(std::pair<int, int> shard) const { return mapping.base() + offsets.at(shard); }
    char* gradients(std::pair<int, int> shard) const { return values(shard) + gradients_offset; }
  };
  // Held through each pull and push: the lanes and their areas are used by one at a time.
  std::mutex lanes_mutex_;
  // The lane to ps p for the shards `placement` puts there, attached on first use; null
  // where shared memory is off, the ps is on another host or the segment cannot be had.
  Lane* lane(int p, const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement);
  void drop_lane(int p) { lanes_.at(static_cast<std::size_t>(p)) = Lane{}; }

  cluster::TfConfig config_;
  ParameterServerOptions options_;
  std::string token_;
  std::string task_name_;
  std::shared_ptr<PsBackend> backend_ = std::make_shared<PsBackend>();
  std::chrono::duration<double> rpc_timeout_, heartbeat_, worker_timeout_, coordinator_timeout_;

  // Defined by every task (ClusterCoordinator::define, create_per_worker_dataset).
  struct Function {
    ClusterCoordinator::IteratorFunction with_iterator;
    ClusterCoordinator::PlainFunction plain;
    RemoteTraining::Steps steps;  // fit()'s, under kFitFunction
  };
  std::map<std::string, Function> functions_;
  std::vector<std::function<data::Dataset()>> datasets_;

  // The chief's one coordinator, shared by fit() and every ClusterCoordinator (made on
  // first use; the job ends when the runtime does).
  Coordinator& coordinator();
  // The chief: ends the job now (ParameterServerStrategy::end_job).
  void end_job();
  // Workers and parameter servers: answers the coordinator until it ends the job. Called
  // again while serving (a shipped program's fit on the serving thread), serves on there.
  void serve();
  // Until the job ends: the coordinator's silence, and programs to load (serving thread).
  void wait_serving();

  // --- a worker that loads the chief's programs (ClusterCoordinator::serve(ProgramLoader))
  ClusterCoordinator::ProgramLoader loader_;
  // A Run handler: has the serving thread load `version` (unless it holds it); throws the
  // load's error.
  void load_program(std::uint64_t version, const std::string& bytes);
  std::uint64_t program_loaded() {
    std::lock_guard lock(program_mutex_);
    return program_loaded_;
  }

  // A parameter server's trace of the pushes it received (RemoteTraining::trace_server).
  struct PushEvent {
    std::string task;
    ParameterStore::PushResult result;
  };
  void record_push(const std::string& task, const ParameterStore::PushResult& result) {
    std::lock_guard lock(push_trace_mutex_);
    if (push_trace_.size() < push_trace_max_) push_trace_.push_back({task, result});
  }
  std::size_t push_trace_max_ = 0;  // set before serve(): 0, no trace
  mutable std::mutex push_trace_mutex_;
  std::vector<PushEvent> push_trace_;

 private:
  mutable std::mutex vars_mutex_;
  std::vector<Variable*> vars_;
  std::mutex channels_mutex_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  std::mutex stubs_mutex_;
  std::vector<std::unique_ptr<wire::ParameterServer::Stub>> ps_stubs_;
  std::vector<std::unique_ptr<wire::Worker::Stub>> worker_stubs_;
  std::vector<Lane> lanes_;  // [ps]
  std::atomic<Clock::rep> last_heard_{Clock::now().time_since_epoch().count()};
  std::mutex coordinator_mutex_;
  std::unique_ptr<Coordinator> coordinator_;
  bool ended_ = false;     // the chief ended the job (end_job): no coordinator any more
  bool job_over_ = false;  // serve() returned because the coordinator ended the job
  std::function<bool(Clock::duration)> wait_stopped_;  // set while serving
  std::mutex program_mutex_;
  std::condition_variable program_changed_;
  std::uint64_t program_wanted_ = 0, program_loading_ = 0, program_loaded_ = 0, program_failed_ = 0;
  std::string program_bytes_;
  std::exception_ptr program_error_;
  // The serving thread: loads the version a Run waits for, if one does.
  void load_wanted_program();
};

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

template <typename Request, typename Reply, typename Start>
void PsRuntime::call_every_ps(const std::vector<Request>& requests, std::vector<Reply>& replies, const char* doing,
                              Start start) {
  replies.resize(requests.size());
  std::vector<grpc::ClientContext> contexts(requests.size());
  std::vector<grpc::Status> statuses(requests.size());
  std::latch latch(static_cast<std::ptrdiff_t>(requests.size()));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    set_deadline(contexts[i], rpc_timeout_);
    start(ps(static_cast<int>(i)), &contexts[i], &requests[i], &replies[i], [&, i](grpc::Status s) {
      statuses[i] = std::move(s);
      latch.count_down();
    });
  }
  latch.wait();
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (!statuses[i].ok())
      throw_status(statuses[i], task_name_ + " " + doing + " " + describe({"ps", static_cast<int>(i)}));
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
        rows_bytes(vars[v]->value(), at->row_begin, at->row_end).size() != place.bytes() ||
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

std::vector<std::int64_t> PsRuntime::pull(const std::vector<Variable*>& vars,
                                          const std::vector<ShardPlacement>& placement) {
  const int num_ps = config_.cluster.num_tasks("ps");
  std::lock_guard lanes_lock(lanes_mutex_);
  std::vector<wire::PullRequest> requests(static_cast<std::size_t>(num_ps));
  for (int p = 0; p < num_ps; ++p) {
    wire::PullRequest& r = requests[static_cast<std::size_t>(p)];
    fill(r.mutable_caller());
    if (const Lane* l = lane(p, vars, placement)) r.set_segment(l->segment);
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
        if (s.ps != p) continue;
        const std::string_view target = rows_bytes(vars[s.index]->mutable_value(), s.row_begin, s.row_end);
        std::memcpy(const_cast<char*>(target.data()), l.values({static_cast<int>(s.index), static_cast<int>(s.shard)}),
                    target.size());
      }
      continue;
    }
    if (!requests[i].segment().empty()) drop_lane(p);  // the ps started again: attach anew next time
    for (const wire::Rows& rows : replies[i].shards()) {
      const auto v = static_cast<std::size_t>(rows.variable());
      const ShardPlacement* where = find_placement(placement, v, rows.shard(), p);
      if (v >= vars.size() || where == nullptr)
        DTRAIN_THROW(InvalidArgument, task_name_, ": ", describe({"ps", p}), " holds shard ", rows.shard(),
                     " of variable ", v, ", which this task's model does not place there (another model?)");
      copy_rows(vars[v]->mutable_value(), *where, rows.values(), task_name_ + ": " + describe({"ps", p}) + " sent",
                "'" + vars[v]->name() + "'");
    }
  }
  return versions;
}

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
    if (const auto segment = segment_of(request->caller().task(), request->segment())) {
      std::lock_guard lock(segment->mutex);
      segment->memory.remove_name();  // the task has mapped it
      bool laid_out = true;
      reply->set_version(store_.read([&](const ParameterStore::ShardKey& key, const Tensor& value) {
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
      return grpc::Status::OK;
    }
    const std::int64_t version = store_.read([&](const ParameterStore::ShardKey& key, const Tensor& value) {
      add_rows(reply->mutable_shards(), key.variable, key.shard, value.shape(), all_bytes(value));
      message_bytes_ += static_cast<std::int64_t>(value.nbytes());
    });
    reply->set_version(version);
    return grpc::Status::OK;
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

// ---------------------------------------------------------------- coordinator

class Coordinator {
 public:
  explicit Coordinator(PsRuntime* runtime) : runtime_(runtime) {
    workers_.resize(static_cast<std::size_t>(runtime_->config_.cluster.num_tasks("worker")));
    stats_.closures_per_worker.assign(workers_.size(), 0);
    progress_.assign(workers_.size(), 0);
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }
  ~Coordinator();

  // `steps`: for fit()'s function, the training steps the closure runs.
  std::shared_ptr<Closure> schedule(const RemoteFunction& fn, PerWorkerIterator it, int steps = 0);
  void join();
  bool done() const {
    std::lock_guard lock(mutex_);
    return queue_.empty() && running_ == 0;
  }
  ClusterCoordinator::Statistics statistics() const;
  void wait_for_workers(int count, std::chrono::duration<double> timeout);
  // fit() on the chief, before its first closure: the variables are placed, and where a
  // backup was `restored`, with this process's values and `optimizer`'s state (as a new
  // job, if waiting for the workers placed them already: nothing has run yet). gather()
  // copies every ps's values and optimizer state into this process's variables and
  // `optimizer` (for a checkpoint).
  void place(optim::Optimizer& optimizer, bool restored);
  void gather(optim::Optimizer& optimizer);
  void ship(std::string program, std::string error) {
    std::lock_guard lock(mutex_);
    program_bytes_ = std::make_shared<const std::string>(std::move(program));
    program_error_ = std::move(error);
    ++program_version_;
  }

 private:
  struct WorkerState {
    bool connected = false;
    std::uint64_t incarnation = 0;
    Clock::time_point last_answer;
    grpc::ClientContext* in_flight = nullptr;  // the Run under way, for the heartbeat to cancel
    bool loads_programs = false;  // started with tf.distribute.Server: it runs the program shipped
  };

  void start(optim::Optimizer* restored = nullptr);
  void dispatch(int w);
  enum class Reached { yes, no, refused };
  Reached connect(int w, std::uint64_t& incarnation);
  void lost(int w, std::uint64_t incarnation, const std::shared_ptr<Closure>& closure, const std::string& why);
  void fail(const std::shared_ptr<Closure>& closure, std::exception_ptr error);
  void heartbeat_loop();
  std::shared_ptr<Closure> take(int w);
  bool may_start(int w) const;

  // Places the variables on the parameter servers as a new job, with `restored`'s slots and
  // iteration count where it is not null. Under mutex_.
  void place_variables(optim::Optimizer* restored);

  PsRuntime* runtime_;  // which owns this coordinator
  std::vector<Variable*> vars_;
  std::vector<ShardPlacement> placement_;
  std::string model_;
  bool started_ = false;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Closure>> queue_;
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // the first since the last join
  std::vector<WorkerState> workers_;
  // SSP's clock: closures each worker finished; a worker found again starts level with
  // the slowest of the others, so that it does not hold them back for what it missed.
  std::vector<std::int64_t> progress_;
  std::uint64_t next_closure_ = 1;
  std::uint64_t next_incarnation_ = 1;
  ClusterCoordinator::Statistics stats_;
  std::vector<std::thread> dispatchers_;
  std::thread heartbeat_;
  // The program shipped to workers that load programs (ship()); version 0: none.
  std::uint64_t program_version_ = 0;
  std::shared_ptr<const std::string> program_bytes_;
  std::string program_error_;
};

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
  std::unique_ptr<PsService> ps_service;
  std::unique_ptr<WorkerService> worker_service;
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
    ps_service = std::make_unique<PsService>(*this);
    builder.RegisterService(ps_service.get());
    wait_stopped_ = [&](Clock::duration d) { return ps_service->wait_stopped(d); };
  } else {
    worker_service = std::make_unique<WorkerService>(*this);
    builder.RegisterService(worker_service.get());
    wait_stopped_ = [&](Clock::duration d) { return worker_service->wait_stopped(d); };
  }
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

}  // namespace detail

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
