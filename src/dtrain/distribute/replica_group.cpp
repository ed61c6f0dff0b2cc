// Replica threads, their barrier and the cross-replica calls.
#include "dtrain/distribute/replica_group.h"

#include <pthread.h>

#include <algorithm>

#include "dtrain/checkpoint/elastic_training.h"
#include "dtrain/comm/in_process.h"
#include "dtrain/core/threads.h"
#include "dtrain/distribute/bucket_reducer.h"
#include "dtrain/distribute/device_reducer.h"
#include "dtrain/distribute/worker_comm.h"

namespace dtrain::distribute::detail {
namespace {

bool is_peer_failure(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const PeerFailure&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

ReplicaGroup::ReplicaGroup(GroupOptions options) : options_(std::move(options)) {
  const int n = num_replicas();
  errors_.resize(static_cast<std::size_t>(n));
  published_.resize(static_cast<std::size_t>(n));
  barrier_arrived_.resize(static_cast<std::size_t>(n));
  waited_for_.resize(static_cast<std::size_t>(n));
  for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { worker(r); });
  if (several_gpus()) dtrain::detail::track_variables(id(), this);
}

ReplicaGroup::~ReplicaGroup() {
  if (several_gpus()) dtrain::detail::track_variables(id(), nullptr);
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReplicaGroup::worker(int replica) {
  const std::string name = "dtrain-replica" + std::to_string(replica);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  set_num_threads(options_.threads_per_replica);
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    run_replica(replica);
    lock.lock();
    if (--pending_ == 0) done_.notify_all();
  }
}

void ReplicaGroup::created(Variable& v) {
  std::lock_guard lock(variables_mutex_);
  variables_.push_back(&v);
}

void ReplicaGroup::destroyed(Variable& v) {
  std::lock_guard lock(variables_mutex_);
  std::erase(variables_, &v);
}

void ReplicaGroup::refresh_mirrors() {
  std::lock_guard lock(variables_mutex_);
  for (Variable* v : variables_) {
    const Tensor& value = v->mutable_value();
    std::vector<Tensor>& mirrors = v->mirrors();
    // A variable placed elsewhere (on the CPU, under tf.device) is read there by every replica.
    if (!(value.device() == options_.gpus.front())) {
      mirrors.clear();
      continue;
    }
    mirrors.resize(options_.gpus.size() - 1);
    for (std::size_t k = 0; k < mirrors.size(); ++k) {
      Tensor& m = mirrors[k];
      const Device gpu = options_.gpus[k + 1];
      if (!m.defined() || !(m.shape() == value.shape()) || m.dtype() != value.dtype() || !(m.device() == gpu))
        m = Tensor::empty(value.shape(), value.dtype(), gpu);
      m.unshare();  // a tensor of the last run (a result, a tape's record) keeps what it read
      m.copy_from(value);
    }
  }
}

void ReplicaGroup::run_replica(int replica) {
  const int in_sync = num_replicas_in_sync();
  ReplicaContext here{id(), replica, num_replicas(), worker_index() * num_replicas() + replica, in_sync,
                      in_sync > 1 ? this : nullptr};
  if (several_gpus()) here.mirror = replica - 1;  // replica 0 reads the variables themselves
  dtrain::detail::ScopedReplicaContext context(here);
  // On a GPU, what the replica makes (a lazily built layer's weights) goes there too.
  std::optional<DevicePlacement> placed;
  if (several_gpus()) placed.emplace(options_.gpus[static_cast<std::size_t>(replica)]);
  else if (options_.placement) placed.emplace(*options_.placement);
  try {
    (*job_)(replica);
  } catch (...) {
    fail(replica, std::current_exception());
    return;
  }
  // A replica that is done cannot take part in a collective any more: release anyone
  // waiting for it at the barrier.
  std::lock_guard lock(mutex_);
  if (first_returned_ < 0) first_returned_ = replica;
  barrier_cv_.notify_all();
}

void ReplicaGroup::fail(int replica, std::exception_ptr error) {
  std::lock_guard lock(mutex_);
  const auto r = static_cast<std::size_t>(replica);
  errors_[r] = std::move(error);
  // The cause is the first failure that is not seen second-hand: neither another
  // replica's failure met at a barrier nor, once this replica's own error comes, a
  // Timeout of another replica that waited for this one.
  if (first_failure_ < 0 ||
      (!is_peer_failure(errors_[r]) &&
       (is_peer_failure(errors_[static_cast<std::size_t>(first_failure_)]) || waited_for_[r]))) {
    first_failure_ = replica;
    std::fill(waited_for_.begin(), waited_for_.end(), false);
  }
  barrier_cv_.notify_all();
}

void ReplicaGroup::run(const std::function<void(int replica)>& fn) {
  if (!fn) DTRAIN_THROW(InvalidArgument, name(), ".run: the replica function is empty");
  if (dtrain::replica_context().strategy != 0)
    DTRAIN_THROW(InvalidArgument, name(), ".run: called from inside a replica function; call it from the caller's thread");
  std::lock_guard one_at_a_time(run_mutex_);
  if (several_gpus()) refresh_mirrors();  // the weights as last updated, on every GPU
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    first_failure_ = -1;
    first_returned_ = -1;
    std::fill(waited_for_.begin(), waited_for_.end(), false);
    // A failed run may have left replicas counted and marked at a barrier nobody passed.
    barrier_count_ = 0;
    ++barrier_generation_;
    pending_ = num_replicas() - 1;
    ++generation_;
  }
  start_.notify_all();
  {
    ScopedThreads threads(options_.threads_per_replica);
    run_replica(0);
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (first_failure_ < 0) return;
  const auto f = static_cast<std::size_t>(first_failure_);
  const std::exception_ptr error = errors_[f];
  lock.unlock();
  rethrow_with_context(error, name() + " replica " + std::to_string(f) + " (" + options_.devices[f] + ")");
}

int ReplicaGroup::num_workers() const { return options_.workers ? options_.workers->size() : 1; }
int ReplicaGroup::worker_index() const { return options_.workers ? options_.workers->rank() : 0; }
std::string ReplicaGroup::transport() const {
  if (several_gpus() && !options_.workers)
    return options_.replica_nccl.empty()
               ? "copies to " + options_.placement->to_string() + " (" + options_.no_replica_nccl + ")"
               : options_.replica_nccl.front()->describe();
  if (!options_.workers) return "";
  if (!on_gpu()) return options_.workers->transport();
  if (options_.nccl) return options_.nccl->describe();
  return options_.workers->transport() + ", staged through pinned host memory from " + options_.placement->to_string() +
         " (NCCL not used: " + options_.no_nccl + ")";
}
std::string ReplicaGroup::replicas_note() const {
  if (!on_gpu()) return "";
  std::string names;
  for (const std::string& d : options_.devices) names += (names.empty() ? "" : ", ") + d;
  if (several_gpus()) {
    std::string gpus;
    for (const Device& d : options_.gpus) gpus += (gpus.empty() ? "" : ", ") + d.to_string();
    std::string note = dtrain::detail::concat(
        name(), ": ", num_replicas(), " replicas on ", gpus, ", each with a copy of the weights on its GPU, sum "
        "their gradients ",
        options_.replica_nccl.empty()
            ? "after backward on " + options_.placement->to_string() + ", where the update runs (reduction to one "
                  "device: " + options_.no_replica_nccl + ")"
            : "with NCCL while backward runs (a rank per GPU in this process), and the update on " +
                  options_.placement->to_string() + " reaches the others before the next step");
    if (!options_.workers) return note;
    return dtrain::detail::concat(note, "; then ", options_.placement->to_string(), "'s sum goes to the other workers' ",
                                  options_.nccl ? "in " + options_.nccl->describe() : staged_words());
  }
  const std::string gpu = options_.placement->to_string();
  std::string note;
  if (num_replicas() > 1)
    note = dtrain::detail::concat(
        name(), ": ", num_replicas(), " replicas on logical GPUs of ", gpu, " (", names,
        ") share its one copy of the weights and sum their gradients on it after backward (reduction to one "
        "device: NCCL refuses two ranks on one GPU, \"Duplicate GPU detected\")");
  if (!options_.workers) return note;
  note += note.empty() ? name() + ": worker " + std::to_string(worker_index()) + "'s replica on " + gpu + " sums"
                       : std::string("; then they sum");
  if (options_.nccl)
    return note + " with the other workers' in " + options_.nccl->describe() +
           (num_replicas() == 1 ? ", each bucket while backward runs" : " after backward");
  return note + " with the other workers' " + staged_words();
}

std::string ReplicaGroup::staged_words() const {
  return dtrain::detail::concat("through pinned host memory after backward (", options_.workers->transport(),
                                "), not with NCCL: ", options_.no_nccl);
}

bool ReplicaGroup::shares_memory() const { return options_.workers && options_.workers->shares_memory(); }

std::unique_ptr<GradientReducer> ReplicaGroup::gradient_reducer(std::span<Variable* const> vars,
                                                              std::span<const DenseVariables> dense,
                                                              bool collectives_in_backward) {
  const bool overlap = options_.overlap && !collectives_in_backward;
  // On GPUs the sum across workers follows the replicas' own, from the first GPU.
  const CrossWorker after_replicas{options_.workers.get(), false, options_.wire, options_.nccl.get()};
  if (several_gpus())
    return std::make_unique<MultiGpuReducer>(options_.gpus, vars, options_.bucket_bytes, options_.timeout,
                                             options_.replica_nccl, overlap, after_replicas);
  // A GPU worker of one replica in NCCL's group: its buckets summed with the other workers'
  // while backward runs.
  if (on_gpu() && options_.nccl && num_replicas() == 1)
    return std::make_unique<MultiGpuReducer>(std::vector<Device>{*options_.placement}, vars, options_.bucket_bytes,
                                             options_.timeout,
                                             std::vector<std::shared_ptr<comm::NcclGroup>>{options_.nccl}, overlap);
  // Replicas on one GPU's logical GPUs sum on the device, after backward: they share its
  // one queue, so there is nothing to overlap.
  if (on_gpu())
    return std::make_unique<DeviceReducer>(num_replicas(), vars, *options_.placement, options_.timeout, after_replicas);
  return std::make_unique<BucketReducer>(num_replicas(), vars, options_.bucket_bytes,
                                         CrossWorker{options_.workers.get(), overlap, options_.wire}, dense,
                                         options_.timeout);
}

ElasticMembership* ReplicaGroup::elastic() {
  return options_.workers && options_.workers->is_elastic() ? options_.workers.get() : nullptr;
}

std::uint64_t ReplicaGroup::membership_generation() const {
  return options_.workers ? options_.workers->generation() : 0;
}

std::shared_ptr<Callback> ReplicaGroup::fit_callback() {
  ElasticMembership* workers = elastic();
  if (!workers) return nullptr;
  train::ElasticTrainingOptions o;
  o.commit_every = options_.workers->elastic_options().commit_every;
  return std::make_shared<train::ElasticTraining>(*workers, o);
}

void ReplicaGroup::synchronize_variables(std::span<Variable* const> vars, const std::vector<std::string>& description) {
  // An elastic job's workers compare their states and take the latest commit whenever they
  // change (train::ElasticTraining), the start of fit included.
  if (!options_.workers || options_.workers->is_elastic()) return;
  WorkerComm& w = *options_.workers;
  // Everyone compares every worker's model with the chief's, so every worker reports the
  // same mismatch.
  std::vector<std::string> lines = description;
  lines.push_back(dtrain::detail::concat("gradient buckets of ", options_.bucket_bytes, " bytes, ",
                                         comm::wire_name(options_.wire), " on the wire"));
  std::string mine;
  for (const std::string& l : lines) mine += l + "\n";
  const std::vector<std::string> all = w.exchange("model/" + std::to_string(++synchronized_), mine);
  auto split = [](const std::string& text) {
    std::vector<std::string> out;
    std::size_t at = 0;
    for (std::size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) out.push_back(text.substr(at, nl - at));
    return out;
  };
  const std::vector<std::string> chief = split(all[0]);
  for (int r = 1; r < w.size(); ++r) {
    if (all[static_cast<std::size_t>(r)] == all[0]) continue;
    const std::vector<std::string> theirs = split(all[static_cast<std::size_t>(r)]);
    std::size_t k = 0;
    while (k < chief.size() && k < theirs.size() && chief[k] == theirs[k]) ++k;
    auto line = [&](const std::vector<std::string>& v) { return k < v.size() ? "'" + v[k] + "'" : std::string("nothing"); };
    DTRAIN_THROW(InvalidArgument, name(), ": ", w.task_name(r), " built a different model from ", w.task_name(0),
                 ": where ", w.task_name(0), " has ", line(chief), ", ", w.task_name(r), " has ", line(theirs),
                 " (every worker must build the same model, in the same order)");
  }
  for (Variable* v : vars)
    if (v->dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, name(), ": variable '", v->name(), "' is ", dtype_name(v->dtype()),
                   "; only float32 variables are kept in sync between workers");
  // Then every worker starts from the chief's values (a GPU's through the host).
  std::vector<Tensor> staged;  // a CPU variable's own value
  for (Variable* v : vars) staged.push_back(v->mutable_value().to(Device::cpu()));
  w.run([&](comm::GlooGroup& group) {
    for (Tensor& t : staged) group.broadcast(t.data<float>(), static_cast<std::size_t>(t.numel()), 0);
  });
  for (std::size_t i = 0; i < vars.size(); ++i)
    if (!vars[i]->value_device().is_cpu()) vars[i]->mutable_value().copy_from(staged[i]);
}

void ReplicaGroup::sum_over_workers(std::span<double> values) {
  if (!options_.workers || values.empty()) return;
  options_.workers->run([&](comm::GlooGroup& group) { group.allreduce(values.data(), values.size()); });
}

void ReplicaGroup::sum_over_workers(Tensor& value) {
  if (!options_.workers || !value.defined()) return;
  value.check_dtype(DType::f32, "reduce");
  Tensor host = value.to(Device::cpu());  // a GPU's value goes through the host
  options_.workers->run([&](comm::GlooGroup& group) {
    // A key of its own, above any bucket's.
    group.allreduce(host.data<float>(), static_cast<std::size_t>(host.numel()), ~std::uint64_t{0});
  });
  if (!value.device().is_cpu()) value.copy_from(host);
}

Tensor ReplicaGroup::gather_over_workers(const Tensor& on_device) {
  if (!options_.workers) return on_device;
  on_device.check_dtype(DType::f32, "gather");
  const Tensor value = on_device.to(Device::cpu());  // a GPU's value goes through the host
  const auto n = static_cast<std::size_t>(num_workers());
  const std::int64_t row = value.dim(0) > 0 ? value.numel() / value.dim(0) : value.shape().with_dim(0, 1).numel();
  std::vector<double> rows(n, 0.0);
  rows[static_cast<std::size_t>(worker_index())] = static_cast<double>(value.dim(0));
  sum_over_workers(rows);  // every worker's row count
  std::int64_t most = 0, total = 0;
  for (double r : rows) {
    most = std::max(most, static_cast<std::int64_t>(r));
    total += static_cast<std::int64_t>(r);
  }
  // Gloo gathers equal sizes: each worker sends `most` rows, the unused ones zero.
  std::vector<float> mine(static_cast<std::size_t>(most * row), 0.0f), all(mine.size() * n);
  if (value.numel() > 0) std::copy_n(value.data<float>(), value.numel(), mine.begin());
  options_.workers->run([&](comm::GlooGroup& group) { group.allgather(mine.data(), all.data(), mine.size()); });
  Tensor out = Tensor::empty(value.shape().with_dim(0, total));
  float* dst = out.data<float>();
  for (std::size_t w = 0; w < n; ++w) {
    const auto count = static_cast<std::size_t>(static_cast<std::int64_t>(rows[w]) * row);
    dst = std::copy_n(all.data() + w * mine.size(), count, dst);
  }
  return out.to(on_device.device());
}

void ReplicaGroup::barrier(int replica, const char* what, std::chrono::milliseconds timeout, bool for_replica_0) {
  std::unique_lock lock(mutex_);
  auto broken = [&] {
    if (first_failure_ >= 0)
      return PeerFailure(dtrain::detail::concat("replica ", replica, " stopped waiting for the other replicas: replica ",
                                                first_failure_, " failed"));
    return PeerFailure(dtrain::detail::concat("replica ", replica, " stopped waiting for the other replicas: replica ",
                                              first_returned_, " returned without joining this cross-replica call ",
                                              "(every replica must make the same calls, e.g. apply_gradients)"));
  };
  if (first_failure_ >= 0 || first_returned_ >= 0) throw broken();
  const std::uint64_t generation = barrier_generation_;
  barrier_arrived_[static_cast<std::size_t>(replica)] = generation + 1;
  if (++barrier_count_ == num_replicas()) {
    barrier_count_ = 0;
    ++barrier_generation_;
    barrier_cv_.notify_all();
    return;
  }
  const bool ended = barrier_cv_.wait_for(
      lock, timeout, [&] { return barrier_generation_ != generation || first_failure_ >= 0 || first_returned_ >= 0; });
  if (!ended) {
    auto absent = [&](int r) { return barrier_arrived_[static_cast<std::size_t>(r)] != generation + 1; };
    Timeout timeout_error(
        for_replica_0
            ? dtrain::detail::concat(what, ": replica ", replica, " waited ", std::chrono::duration<double>(timeout).count(),
                                     " s, and replica 0 (", options_.devices[0], ") had not finished; twice ",
                                     "CommunicationOptions::timeout_seconds sets the limit")
            : comm::never_arrived(what, replica, timeout, num_replicas(), absent, options_.devices) +
                  "; CommunicationOptions::timeout_seconds sets the limit");
    // Recorded as this replica's failure, so that the others stop waiting and run() reports
    // it even if the replica's function catches it; unless one it waited for fails on its
    // own account later (fail()).
    errors_[static_cast<std::size_t>(replica)] = std::make_exception_ptr(timeout_error);
    if (first_failure_ < 0 || is_peer_failure(errors_[static_cast<std::size_t>(first_failure_)])) {
      first_failure_ = replica;
      for (int r = 0; r < num_replicas(); ++r) waited_for_[static_cast<std::size_t>(r)] = absent(r);
    }
    barrier_cv_.notify_all();
    throw timeout_error;
  }
  if (barrier_generation_ == generation) throw broken();
}

std::vector<Tensor> ReplicaGroup::all_reduce_sum(std::span<const Tensor> values) {
  const int r = dtrain::replica_context().replica_id, n = num_replicas();
  published_[static_cast<std::size_t>(r)] = values;
  barrier(r, "all_reduce");
  if (r == 0) {
    // Replica 0 checks that every replica brought the same values, and makes the sums.
    sums_.assign(values.size(), Tensor());
    for (int k = 0; k < n; ++k) {
      const auto& theirs = published_[static_cast<std::size_t>(k)];
      if (theirs.size() != values.size())
        DTRAIN_THROW(InvalidArgument, "all_reduce: replica ", k, " gave ", theirs.size(), " tensors, replica 0 gave ",
                     values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        const Tensor& t = theirs[i];
        if (!t.defined()) continue;
        t.check_dtype(DType::f32, "all_reduce");
        if (!sums_[i].defined()) {
          // On GPUs of their own, the sums are made on the first (replica 0's, the update's).
          sums_[i] = Tensor::empty(t.shape(), DType::f32,
                                   several_gpus() && !t.device().is_cpu() ? options_.gpus.front() : t.device());
        } else if (!(sums_[i].shape() == t.shape())) {
          DTRAIN_THROW(InvalidArgument, "all_reduce: tensor ", i, " is ", t.shape().to_string(), " on replica ", k,
                       " but ", sums_[i].shape().to_string(), " on another replica");
        }
      }
    }
  }
  barrier(r, "all_reduce");
  // Each replica sums its share of every tensor's elements: on a GPU (logical GPUs of one
  // GPU share its memory), its share of the tensors, with the device's kernels.
  for (std::size_t i = 0; i < sums_.size(); ++i) {
    if (!sums_[i].defined()) continue;
    if (!sums_[i].device().is_cpu()) {
      if (static_cast<int>(i % static_cast<std::size_t>(n)) == r) {
        // GPUs of their own: the other replicas' values are copied to the sum's GPU first.
        std::vector<Tensor> inputs;
        for (const auto& theirs : published_) {
          const Tensor& t = theirs[i];
          inputs.push_back(t.defined() && !(t.device() == sums_[i].device()) ? t.to(sums_[i].device()) : t);
        }
        sum_on_device(inputs, sums_[i]);
      }
      continue;
    }
    const std::int64_t count = sums_[i].numel();
    const std::int64_t begin = count * r / n, end = count * (r + 1) / n;
    float* out = sums_[i].data<float>();
    bool first = true;
    for (int k = 0; k < n; ++k) {
      const Tensor& t = published_[static_cast<std::size_t>(k)][i];
      if (!t.defined()) continue;
      const float* in = t.data<float>();
      if (first) std::copy(in + begin, in + end, out + begin);
      else comm::add_into(out + begin, in + begin, static_cast<std::size_t>(end - begin));
      first = false;
    }
  }
  barrier(r, "all_reduce");
  if (options_.workers) {
    // Then over the workers, on replica 0, whose error (naming the worker) fails the run.
    // Whether a tensor is defined must agree among them.
    if (r == 0) {
      try {
        std::vector<double> defined(sums_.size());
        for (std::size_t i = 0; i < sums_.size(); ++i) defined[i] = sums_[i].defined() ? 1.0 : 0.0;
        sum_over_workers(defined);
        for (std::size_t i = 0; i < sums_.size(); ++i)
          if (defined[i] != 0.0 && defined[i] != static_cast<double>(num_workers()))
            DTRAIN_THROW(InvalidArgument, "all_reduce: tensor ", i, " is defined on ", defined[i], " of ",
                         num_workers(), " workers; every worker must bring the same tensors");
        for (Tensor& t : sums_) sum_over_workers(t);
      } catch (...) {
        fail(0, std::current_exception());  // the others stop waiting, even if the caller catches it
        throw;
      }
    }
    wait_for_replica_0(r, "all_reduce (waiting for replica 0's sum across workers)");
  }
  // The next call changes sums_ only after every replica has reached its first barrier,
  // so after this copy. A replica on a GPU of its own gets the sums there.
  if (!several_gpus() || r == 0) return sums_;
  std::vector<Tensor> mine;
  for (const Tensor& t : sums_)
    mine.push_back(t.defined() && !t.device().is_cpu() ? t.to(options_.gpus[static_cast<std::size_t>(r)]) : t);
  return mine;
}

void ReplicaGroup::merge_call(const std::function<void()>& fn) {
  const int r = dtrain::replica_context().replica_id;
  barrier(r, "merge_call");
  if (r == 0) {
    // The merged function runs outside the replica context, with every core of the group.
    dtrain::detail::ScopedReplicaContext outside(ReplicaContext{id(), 0, 1, 0, 1, nullptr});
    ScopedThreads threads(options_.threads_per_replica * num_replicas());
    try {
      fn();
    } catch (...) {
      fail(0, std::current_exception());  // the others stop waiting, even if the caller catches it
      throw;
    }
  }
  wait_for_replica_0(r, "merge_call (waiting for replica 0's merged function)");
}

}  // namespace dtrain::distribute::detail
