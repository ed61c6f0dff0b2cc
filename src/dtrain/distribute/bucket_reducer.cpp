// Bucketed gradient reduction during backward.
#include "dtrain/distribute/bucket_reducer.h"

#include <algorithm>

#include "dtrain/comm/shared_memory.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/threads.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/distribute/worker_comm.h"
#include "dtrain/kernels/backend.h"

namespace dtrain::distribute::detail {

BucketReducer::BucketReducer(int replicas, std::span<Variable* const> vars, std::size_t bucket_bytes,
                             CrossWorker cross, std::span<const DenseVariables> dense,
                             std::chrono::milliseconds timeout)
    : places_(vars.size()), states_(static_cast<std::size_t>(replicas)), cross_(cross), timeout_(timeout) {
  for (const Variable* v : vars)
    if (v->dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, "gradient buckets: variable '", v->name(), "' is ", dtype_name(v->dtype()),
                   "; only float32 variables are reduced");
  // Within one process the replicas compute the dense layers' gradients together; across
  // processes every worker's replicas still need a sum of their own to send.
  if (replicas > 1 && !cross_.workers && !dense.empty())
    together_ = std::make_unique<DenseTogether>(replicas, vars, dense, timeout_);
  std::vector<std::size_t> bucketed;  // the variables the buckets hold
  std::vector<std::int64_t> numels;
  for (std::size_t k = 0; k < vars.size(); ++k)
    if (!together(k)) {
      bucketed.push_back(k);
      numels.push_back(vars[k]->numel());
    }
  const std::vector<std::size_t> bucket_of = gradient_buckets(numels, bucket_bytes);
  std::vector<std::vector<std::size_t>> segments;
  std::vector<std::size_t> sizes;
  for (std::size_t j = bucketed.size(); j-- > 0;) {
    const std::size_t k = bucketed[j];
    const Variable& v = *vars[k];
    if (sizes.size() <= bucket_of[j]) {
      sizes.push_back(0);
      segments.emplace_back();
      bucket_vars_.push_back(0);
    }
    places_[k] = Place{sizes.size() - 1, segments.back().size(), sizes.back(), v.numel()};
    segments.back().push_back(static_cast<std::size_t>(v.numel()));
    sizes.back() += static_cast<std::size_t>(v.numel());
    ++bucket_vars_.back();
  }
  // Each bucket ends with one flag per variable: 1 where a replica had its gradient. The
  // flags are summed with the gradients, so every replica of every worker learns which
  // gradients exist anywhere (a short last batch may leave a worker without any).
  //
  // Between workers that share memory, the buckets lie in a buffer every worker maps: the
  // replicas' sum is written there, and summed between the workers where it lies.
  std::size_t total = 0;
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    flags_at_.push_back(sizes[b]);
    segments[b].push_back(bucket_vars_[b]);
    shared_at_.push_back(total);
    const std::size_t a = comm::kSharedAlignFloats;
    total += (sizes[b] + bucket_vars_[b] + a - 1) / a * a;
  }
  // Every worker takes part, so that all learn whether some worker compresses its buckets.
  if (cross_.workers)
    cross_.workers->run([&](comm::GlooGroup& group) {
      shared_ = group.shared_buffer(total, cross_.wire);
    });
  std::vector<float*> outputs;
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    const Shape shape{static_cast<std::int64_t>(sizes[b] + bucket_vars_[b])};
    outputs_.push_back(shared_ ? Tensor::over(shared_->local() + shared_at_[b], shape, DType::f32, shared_)
                               : Tensor::zeros(shape));
    outputs.push_back(outputs_.back().data<float>());
  }
  all_reduce_ = std::make_unique<comm::InProcessAllReduce>(replicas, std::move(segments), std::move(outputs),
                                                           /*chunk_floats=*/16384, /*streaming_above_bytes=*/0, timeout_);
  summed_round_.assign(outputs_.size(), 0);
  if (cross_.workers) {
    // The first bucket summed in a round starts the round's job on the communication
    // thread: after whatever collectives the replicas made before backward.
    all_reduce_->on_summed([this](std::size_t bucket) {
      std::uint64_t round = 0;
      {
        std::lock_guard lock(summed_mutex_);
        round = ++summed_round_[bucket];
      }
      summed_cv_.notify_all();
      // Without overlap the round starts once backward is over (finish()): collectives the
      // replicas make inside backward (a synchronized batch norm's) then find the
      // communication thread free, in the same order on every worker.
      if (cross_.overlap) start_round(round);
    });
  }
  for (auto& s : states_) {
    s.filled.assign(sizes.size(), 0);
    s.held.resize(vars.size());
    s.sums.resize(vars.size());
    s.summed.assign(vars.size(), 0);
    s.reduced.resize(vars.size());
    for (std::size_t b = 0; b < sizes.size(); ++b) s.flags.emplace_back(bucket_vars_[b], 0.0f);
  }
  for (std::size_t k = 0; k < vars.size(); ++k) {
    if (together(k)) {
      views_.push_back(together_->gradient(k));
      continue;
    }
    const Place& p = places_[k];
    views_.push_back(outputs_[p.bucket]
                         .slice(static_cast<std::int64_t>(p.offset), static_cast<std::int64_t>(p.offset) + p.numel)
                         .reshape(vars[k]->shape()));
  }
}

BucketReducer::~BucketReducer() {
  if (!cross_.workers) return;
  // A step that never ran (its fit failed first) must not leave the communication thread
  // waiting for buckets, reading buffers about to be freed.
  stop_waiting("the training step was abandoned");
  try {
    cross_.workers->wait();
  } catch (const std::exception&) {  // already reported by the step that failed
  }
}

void BucketReducer::begin_step(bool reduce, std::span<const std::int64_t> row_bounds) {
  // The gradients computed together accumulate in place over a group's micro-batches:
  // every step after one that did not reduce.
  if (together_) together_->begin_step(row_bounds, /*accumulate=*/!reduce_);
  reduce_ = reduce;
  // Set before the replicas run, read on the communication thread in the round they start.
  measuring_ = reduce && measure_next_;
  if (reduce) measure_next_ = false;
  if (measuring_) local_sq_ = global_sq_ = 0;
}

DenseGradientsTogether* BucketReducer::dense_gradients_together(int replica) {
  return together_ ? together_->replica(replica) : nullptr;
}

void BucketReducer::abort(int replica, const std::string& why) {
  all_reduce_->abort(replica, why);
  if (together_) together_->abort(replica, why);
  if (cross_.workers) stop_waiting("replica " + std::to_string(replica) + " failed (" + why + ")");
}

void BucketReducer::stop_waiting(const std::string& why) {
  {
    std::lock_guard lock(summed_mutex_);
    if (stopped_.empty()) stopped_ = why;
  }
  summed_cv_.notify_all();
}

void BucketReducer::wait_summed(std::size_t bucket, std::uint64_t round) {
  std::unique_lock lock(summed_mutex_);
  // The replicas' own waits end sooner when one of them is missing (and stop this one);
  // this bounds the wait when no replica waits, as with one replica stuck in user code.
  if (!summed_cv_.wait_for(lock, timeout_, [&] { return summed_round_[bucket] >= round || !stopped_.empty(); }))
    DTRAIN_THROW(Timeout, "gradient all-reduce across workers: the communication thread waited ",
                 std::chrono::duration<double>(timeout_).count(), " s for this process's replicas to sum bucket ",
                 bucket, " (of ", outputs_.size(), "); a replica is stuck in its input or in user code?");
  if (summed_round_[bucket] < round) DTRAIN_THROW(PeerFailure, "gradient all-reduce abandoned: ", stopped_);
}

void BucketReducer::start_round(std::uint64_t round) {
  {
    std::lock_guard lock(summed_mutex_);
    if (round <= started_round_) return;  // another replica started it
    started_round_ = round;
  }
  cross_.workers->submit([this, round](comm::GlooGroup& group) { reduce_across_workers(group, round); });
  {
    std::lock_guard lock(summed_mutex_);
    submitted_round_ = round;
  }
  summed_cv_.notify_all();
}

// The squared norm of bucket b's gradients (not the flags after them), on the calling
// thread alone: the communication thread must not start a team of compute threads.
double BucketReducer::squared_norm(std::size_t b) const {
  const ScopedThreads alone(1);
  return kernels::backend().sum_squares(outputs_[b].slice(0, static_cast<std::int64_t>(flags_at_[b])));
}

void BucketReducer::reduce_across_workers(comm::GlooGroup& group, std::uint64_t round) {
  // Buckets go in index order on every worker: the order backward completes them.
  if (!cross_.overlap)
    for (std::size_t b = 0; b < outputs_.size(); ++b) wait_summed(b, round);
  for (std::size_t b = 0; b < outputs_.size(); ++b) {
    wait_summed(b, round);
    const auto count = static_cast<std::size_t>(outputs_[b].numel());
    if (measuring_) local_sq_ += squared_norm(b);
    const Clock::time_point start = Clock::now();
    if (shared_) group.allreduce(*shared_, shared_at_[b], count);
    else group.allreduce(outputs_[b].data<float>(), count, b, cross_.wire);
    const Clock::time_point end = Clock::now();
    if (comm_track_) {
      // The wait for a late peer is its own phase; the rest moved the bytes.
      const Clock::time_point joined = start + group.last_peer_wait();
      if (joined > start) comm_track_->add(profile::Phase::straggler_wait, start, joined, "waiting for peers");
      comm_track_->add(profile::Phase::communication, joined, end, "all-reduce across workers");
      comm_track_->add_bytes(comm::wire_bytes(count, cross_.wire));
    }
    if (measuring_) global_sq_ += squared_norm(b);
  }
}

void BucketReducer::gradient_ready(int replica, std::size_t index, const Tensor& grad) {
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
  if (together(index)) {
    // Already the sum over every replica's rows, in the one tensor the update reads
    // (undefined where the loss does not depend on the layer).
    if (grad.defined() && !grad.shares_storage_with(together_->gradient(index)))
      DTRAIN_THROW(InvalidArgument, together_->name(index),
                   " is also read outside its dense layer (weights tied between layers, say); under "
                   "MirroredStrategy a dense layer's variables may be read by that layer only, once per step");
    return;
  }
  const Place& p = places_[index];
  if (grad.defined() && (grad.numel() != p.numel || grad.dtype() != DType::f32))
    DTRAIN_THROW(InternalError, "gradient buckets: gradient ", index, " is ", dtype_name(grad.dtype()), " ",
                 grad.shape().to_string(), ", expected ", p.numel, " float32 values");
  const float* input = nullptr;
  if (state.fresh && reduce_) {
    // The common case: the all-reduce reads the gradient where backward left it.
    state.held[index] = grad;
    input = grad.defined() ? grad.data<float>() : nullptr;
  } else {
    // Accumulating: this replica's own sums, handed over on the group's last micro-batch.
    Tensor& sum = state.sums[index];
    if (state.fresh) sum = Tensor();
    if (grad.defined()) {
      // The group's first gradient becomes the sum without a copy (once its backward pass
      // is over nothing else uses it), unless another variable's sum shares its storage,
      // as when one op hands the same tensor to two variables. Later ones are added in.
      if (!sum.defined()) {
        bool shared = false;
        for (const Tensor& other : state.sums) shared = shared || (other.defined() && other.shares_storage_with(grad));
        sum = shared ? grad.clone() : grad;
      } else {
        comm::add_into(sum.data<float>(), grad.data<float>(), static_cast<std::size_t>(p.numel));
      }
    }
    state.summed[index] = sum.defined();
    input = state.summed[index] ? sum.data<float>() : nullptr;
  }
  if (reduce_) {
    state.flags[p.bucket][p.segment] = input != nullptr ? 1.0f : 0.0f;
    all_reduce_->set_input(replica, p.bucket, p.segment, input);
    if (++state.filled[p.bucket] == bucket_vars_[p.bucket]) {
      all_reduce_->set_input(replica, p.bucket, bucket_vars_[p.bucket], state.flags[p.bucket].data());
      const Clock::time_point start = Clock::now();
      all_reduce_->arrive(replica, p.bucket);
      if (!tracks_.empty())
        tracks_[static_cast<std::size_t>(replica)]->add_nested(profile::Phase::communication, profile::Phase::backward,
                                                              start, Clock::now(), "sum buckets");
    }
  } else {
    ++state.filled[p.bucket];
  }
}

void BucketReducer::finish(int replica) {
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
  for (std::size_t b = 0; b < state.filled.size(); ++b)
    if (state.filled[b] != bucket_vars_[b])
      DTRAIN_THROW(InternalError, "gradient buckets: replica ", replica, " reported ", state.filled[b], " of ",
                   bucket_vars_[b], " gradients of bucket ", b);
  std::fill(state.filled.begin(), state.filled.end(), 0);
  state.fresh = reduce_;  // after a reduction, the next micro-batch starts a new group
  profile::Track* track = tracks_.empty() ? nullptr : tracks_[static_cast<std::size_t>(replica)];
  const Clock::time_point start = Clock::now();
  // The blocks of the gradients computed together are whole once every replica is here.
  if (together_) together_->finish(replica);
  if (!reduce_) return;
  all_reduce_->finish(replica);
  if (cross_.workers && !cross_.overlap) start_round(state.rounds + 1);
  // Every chunk is summed, so nobody reads this replica's gradients any more.
  std::fill(state.held.begin(), state.held.end(), Tensor());
  const Clock::time_point summed = Clock::now();
  if (track) track->add(profile::Phase::communication, start, summed, "sum buckets");
  // Then the sums over the other workers. The round's job may still be on its way to the
  // queue (the replica that summed the first bucket submits it after publishing the sum):
  // wait for it to be there, or wait() could return before it ran.
  if (cross_.workers) {
    const std::uint64_t round = ++state.rounds;
    {
      std::unique_lock lock(summed_mutex_);
      // The submitting replica is a few instructions from it; bounded all the same.
      if (!summed_cv_.wait_for(lock, timeout_, [&] { return submitted_round_ >= round || !stopped_.empty(); }))
        DTRAIN_THROW(Timeout, "gradient all-reduce across workers: replica ", replica, " waited ",
                     std::chrono::duration<double>(timeout_).count(), " s for round ", round,
                     " to reach the communication thread");
    }
    cross_.workers->wait();
    if (track) {
      const Clock::time_point end = Clock::now();
      track->add(profile::Phase::communication, summed, end, "wait for other workers");
      track->add_wait_for_communication_thread(seconds_between(summed, end));
    }
  }
  // A gradient is defined where some replica of some worker had it (its summed flag);
  // each replica writes only its own list.
  for (std::size_t k = 0; k < views_.size(); ++k) {
    if (together(k)) {
      state.reduced[k] = together_->computed(k) ? views_[k] : Tensor();
      continue;
    }
    const Place& p = places_[k];
    const bool any = outputs_[p.bucket].data<float>()[flags_at_[p.bucket] + p.segment] > 0.0f;
    state.reduced[k] = any ? views_[k] : Tensor();
  }
}

}  // namespace dtrain::distribute::detail
