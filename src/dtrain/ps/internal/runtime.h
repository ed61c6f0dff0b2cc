// The parts of ParameterServerStrategy every task's role shares (internal to dtrain_ps):
// the runtime a strategy holds (its TF_CONFIG, its variables, its channels to the other
// tasks, the functions and datasets every task defines), the backend fit trains through,
// a closure, and the helpers for gRPC statuses and wire messages.
#pragma once

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
#include <unordered_map>
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


inline std::chrono::duration<double> seconds_or(double given, double fallback) {
  return std::chrono::duration<double>(given > 0 ? given : fallback);
}


inline void set_deadline(grpc::ClientContext& context, std::chrono::duration<double> d) {
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

inline bool is_application_error(grpc::StatusCode code) {
  return code == kInvalidArgument || code == kParameterServerUnavailable || code == kClosureFailed ||
         code == kNoSuchFunction || code == kWrongToken;
}

// An error of kind E made into an exception_ptr. Its temporary (whose message buffer the
// copy shares) ends here, before the caller hands the pointer to another thread.
template <typename E>
inline std::exception_ptr made(std::string message) {
  return std::make_exception_ptr(E(std::move(message)));
}

// The error a failed call means, made without throwing it (so that handing it to another
// thread leaves no reference behind in this one).
inline std::exception_ptr error_of(const grpc::Status& status, const std::string& context) {
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

[[noreturn]] inline void throw_status(const grpc::Status& status, const std::string& context) {
  std::rethrow_exception(error_of(status, context));
}

inline grpc::Status status_of(const std::exception_ptr& error) {
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

inline Clock::time_point deadline_after(std::chrono::duration<double> d) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d);
}

inline std::string shape_text(const Shape& s) { return s.to_string(); }

inline Shape shape_of(const google::protobuf::RepeatedField<std::int64_t>& dims) {
  return Shape(std::vector<std::int64_t>(dims.begin(), dims.end()));
}

// What a task and a ps must share for the ps's segment to serve the task: the host and its
// namespaces, and the user (a segment is made readable by its owner only).
inline std::string attach_identity() { return comm::host_identity() + " uid " + std::to_string(::geteuid()); }

// The name fit() defines its closures' function under on every worker.
constexpr std::string_view kFitFunction = "model.fit";

inline void check_name(const std::string& name) {
  if (name == kFitFunction)
    DTRAIN_THROW(InvalidArgument, "ClusterCoordinator::define: '", name, "' is the name model.fit() uses; choose another");
}

// Rows [begin, end) of a float32 tensor, as bytes.
inline std::string_view rows_bytes(const Tensor& t, std::int64_t begin, std::int64_t end) {
  const std::int64_t row = t.rank() == 0 ? 1 : t.numel() / std::max<std::int64_t>(1, t.dim(0));
  const char* base = static_cast<const char*>(t.raw_data());
  return {base + static_cast<std::size_t>(begin * row) * sizeof(float),
          static_cast<std::size_t>((end - begin) * row) * sizeof(float)};
}

inline std::string_view all_bytes(const Tensor& t) { return {static_cast<const char*>(t.raw_data()), t.nbytes()}; }

inline Shape shard_shape(const Shape& whole, std::int64_t rows) {
  if (whole.rank() == 0) return whole;
  std::vector<std::int64_t> dims(whole.dims().begin(), whole.dims().end());
  dims[0] = rows;
  return Shape(dims);
}

// One shard's rows added to a message: its place, its shape and, where given, its bytes
// (a push through shared memory sends none).
inline wire::Rows* add_rows(google::protobuf::RepeatedPtrField<wire::Rows>* to, int variable, int shard,
                            const Shape& shape, std::optional<std::string_view> values) {
  wire::Rows* rows = to->Add();
  rows->set_variable(variable);
  rows->set_shard(shard);
  for (std::int64_t d : shape.dims()) rows->add_shape(d);
  if (values) rows->set_values(values->data(), values->size());
  return rows;
}

// One optimizer slot of one shard added to a message.
inline void add_slot(google::protobuf::RepeatedPtrField<wire::SlotRows>* to, const std::string& slot, int variable,
                     int shard, std::string_view values) {
  wire::SlotRows* rows = to->Add();
  rows->set_slot(slot);
  rows->set_variable(variable);
  rows->set_shard(shard);
  rows->set_values(values.data(), values.size());
}

// The placement of shard `shard` of variable `variable` on ps `ps`, or null.
inline const ShardPlacement* find_placement(const std::vector<ShardPlacement>& placement, std::size_t variable,
                                     std::int64_t shard, int ps) {
  for (const ShardPlacement& s : placement)
    if (s.index == variable && s.shard == shard && s.ps == ps) return &s;
  return nullptr;
}

// `bytes` into rows [s.row_begin, s.row_end) of `whole`, which they must fill exactly;
// the error begins with `context` and names `what` (a variable or a slot).
inline void copy_rows(Tensor& whole, const ShardPlacement& s, std::string_view bytes, const std::string& context,
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
inline std::string first_difference(const std::string& there, const std::string& here) {
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
  std::optional<Device> placement() const override;

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
    host_values_.erase(&v);
  }
  // The host memory that pulls write `v`'s values into and pushes read them from: its own
  // value where it lives on the CPU. A GPU worker's variable has a page-locked copy here
  // instead, which pull() fills and then copies to the GPU (one copy a variable).
  Tensor& host_value(Variable& v);
  // The same, holding `v`'s values as they are now (copied from its GPU where it is on one).
  const Tensor& current_host_value(Variable& v);
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

  // One call to each ps in `to`, all in flight at once: start(stub, context, request, reply,
  // done) begins ps to[i]'s with requests[i]; returns once every one has answered,
  // throwing the first failure ("worker:0 pulling from ps:1 at ...: ...").
  template <typename Request, typename Reply, typename Start>
  void call_ps_list(const std::vector<int>& to, const std::vector<Request>& requests, std::vector<Reply>& replies,
                    const char* doing, Start start);
  // The same to every ps, requests[p] to ps p.
  template <typename Request, typename Reply, typename Start>
  void call_every_ps(const std::vector<Request>& requests, std::vector<Reply>& replies, const char* doing,
                     Start start) {
    std::vector<int> every(requests.size());
    for (std::size_t p = 0; p < every.size(); ++p) every[p] = static_cast<int>(p);
    call_ps_list(every, requests, replies, doing, start);
  }
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
  // Pulls every shard into `vars` (those of the variables `whole` marks, where given);
  // returns each ps's version.
  std::vector<std::int64_t> pull(const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement,
                                 const std::vector<bool>* whole = nullptr);
  // The placement of the shard ps p sent `rows` of; an InvalidArgument where this task's
  // model places no such shard there (another model).
  const ShardPlacement& placed_there(const std::vector<ShardPlacement>& placement, const std::vector<Variable*>& vars,
                                     const wire::Rows& rows, int p) const;
  // Pulls rows of shards into `vars`: for placement[i], the rows (0-based within the shard)
  // in rows[i], from each ps that holds one at once.
  void pull_rows(const std::vector<Variable*>& vars, const std::vector<ShardPlacement>& placement,
                 const std::vector<std::pair<std::size_t, std::vector<std::int64_t>>>& rows);

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
  std::unordered_map<const Variable*, Tensor> host_values_;  // GPU variables' page-locked copies
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

template <typename Request, typename Reply, typename Start>
void PsRuntime::call_ps_list(const std::vector<int>& to, const std::vector<Request>& requests,
                             std::vector<Reply>& replies, const char* doing, Start start) {
  replies.resize(requests.size());
  std::vector<grpc::ClientContext> contexts(requests.size());
  std::vector<grpc::Status> statuses(requests.size());
  std::latch latch(static_cast<std::ptrdiff_t>(requests.size()));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    set_deadline(contexts[i], rpc_timeout_);
    start(ps(to[i]), &contexts[i], &requests[i], &replies[i], [&, i](grpc::Status s) {
      statuses[i] = std::move(s);
      latch.count_down();
    });
  }
  latch.wait();
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (!statuses[i].ok()) throw_status(statuses[i], task_name_ + " " + doing + " " + describe({"ps", to[i]}));
}

// The gRPC service of a task's role (a ps's or a worker's), and the wait for the
// coordinator to tell it the job is over.
class RoleService {
 public:
  virtual ~RoleService() = default;
  virtual grpc::Service* service() = 0;
  // True once told to stop; false after waiting `d`.
  virtual bool wait_stopped(Clock::duration d) = 0;
};
std::unique_ptr<RoleService> make_ps_service(PsRuntime& runtime);     // ps_service.cpp
std::unique_ptr<RoleService> make_worker_service(PsRuntime& runtime);  // worker_service.cpp

// A service S (made from the runtime, with S::wait_stopped) as a RoleService.
template <typename S>
class ServiceRole final : public RoleService {
 public:
  explicit ServiceRole(PsRuntime& runtime) : service_(runtime) {}
  grpc::Service* service() override { return &service_; }
  bool wait_stopped(Clock::duration d) override { return service_.wait_stopped(d); }

 private:
  S service_;
};

}  // namespace detail
}  // namespace dtrain::distribute
