// Replica threads, their barrier and the cross-replica calls.
#include "dtrain/distribute/replica_group.h"

#include <pthread.h>

#include <algorithm>

#include "dtrain/comm/in_process.h"
#include "dtrain/core/threads.h"
#include "dtrain/distribute/bucket_reducer.h"

namespace dtrain::distribute::detail {
namespace {

// The caller's kernels use `n` threads while the guard lives.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

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
  for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { worker(r); });
}

ReplicaGroup::~ReplicaGroup() {
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

void ReplicaGroup::run_replica(int replica) {
  dtrain::detail::ScopedReplicaContext context(
      ReplicaContext{id(), replica, num_replicas(), num_replicas() > 1 ? this : nullptr});
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
  errors_[static_cast<std::size_t>(replica)] = std::move(error);
  // The first failure that is not another replica's failure seen second-hand is the cause.
  if (first_failure_ < 0 || (is_peer_failure(errors_[static_cast<std::size_t>(first_failure_)]) &&
                             !is_peer_failure(errors_[static_cast<std::size_t>(replica)])))
    first_failure_ = replica;
  barrier_cv_.notify_all();
}

void ReplicaGroup::run(const std::function<void(int replica)>& fn) {
  if (!fn) DTRAIN_THROW(InvalidArgument, name(), ".run: the replica function is empty");
  if (dtrain::replica_context().strategy != 0)
    DTRAIN_THROW(InvalidArgument, name(), ".run: called from inside a replica function; call it from the caller's thread");
  std::lock_guard one_at_a_time(run_mutex_);
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    first_failure_ = -1;
    first_returned_ = -1;
    barrier_count_ = 0;
    merge_error_ = nullptr;
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

std::unique_ptr<GradientReducer> ReplicaGroup::gradient_reducer(std::span<Variable* const> vars) {
  return std::make_unique<BucketReducer>(num_replicas(), vars, options_.bucket_bytes);
}

void ReplicaGroup::barrier(int replica) {
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
  if (++barrier_count_ == num_replicas()) {
    barrier_count_ = 0;
    ++barrier_generation_;
    barrier_cv_.notify_all();
    return;
  }
  barrier_cv_.wait(lock,
                   [&] { return barrier_generation_ != generation || first_failure_ >= 0 || first_returned_ >= 0; });
  if (barrier_generation_ == generation) throw broken();
}

std::vector<Tensor> ReplicaGroup::all_reduce_sum(std::span<const Tensor> values) {
  const int r = dtrain::replica_context().replica_id, n = num_replicas();
  published_[static_cast<std::size_t>(r)] = values;
  barrier(r);
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
          sums_[i] = Tensor::empty(t.shape());
        } else if (!(sums_[i].shape() == t.shape())) {
          DTRAIN_THROW(InvalidArgument, "all_reduce: tensor ", i, " is ", t.shape().to_string(), " on replica ", k,
                       " but ", sums_[i].shape().to_string(), " on another replica");
        }
      }
    }
  }
  barrier(r);
  // Each replica sums its share of every tensor's elements.
  for (std::size_t i = 0; i < sums_.size(); ++i) {
    if (!sums_[i].defined()) continue;
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
  barrier(r);
  // The next call changes sums_ only after every replica has reached its first barrier,
  // so after this copy.
  return sums_;
}

void ReplicaGroup::merge_call(const std::function<void()>& fn) {
  const int r = dtrain::replica_context().replica_id;
  barrier(r);
  if (r == 0) {
    // The merged function runs outside the replica context, with every core of the group.
    dtrain::detail::ScopedReplicaContext outside(ReplicaContext{id(), 0, 1, nullptr});
    ScopedThreads threads(options_.threads_per_replica * num_replicas());
    try {
      fn();
    } catch (...) {
      merge_error_ = std::current_exception();
    }
  }
  barrier(r);
  if (merge_error_) {
    if (r == 0) std::rethrow_exception(merge_error_);
    DTRAIN_THROW(PeerFailure, "replica ", r, ": the merged call on replica 0 failed");
  }
}

}  // namespace dtrain::distribute::detail
