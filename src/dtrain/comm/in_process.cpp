// In-memory all-reduce among replica threads.
#include "dtrain/comm/in_process.h"

#include <algorithm>

#include "dtrain/core/error.h"

namespace dtrain::comm {
InProcessAllReduce::InProcessAllReduce(std::vector<std::vector<float*>> inputs, std::vector<std::size_t> bucket_sizes,
                                       std::size_t chunk_floats)
    : replicas_(inputs.empty() ? 1 : static_cast<int>(inputs[0].size())),
      chunk_floats_(std::max<std::size_t>(chunk_floats, 1)),
      buckets_(bucket_sizes.size()) {
  if (inputs.size() != bucket_sizes.size())
    DTRAIN_THROW(InvalidArgument, "InProcessAllReduce: ", inputs.size(), " input lists for ", bucket_sizes.size(),
                 " buckets");
  if (replicas_ < 1) DTRAIN_THROW(InvalidArgument, "InProcessAllReduce: a bucket has no replicas");
  round_.assign(static_cast<std::size_t>(replicas_), 1);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (static_cast<int>(inputs[b].size()) != replicas_)
      DTRAIN_THROW(InvalidArgument, "InProcessAllReduce: bucket ", b, " has ", inputs[b].size(), " inputs, bucket 0 has ",
                   replicas_);
    Bucket& bucket = buckets_[b];
    bucket.size = bucket_sizes[b];
    bucket.chunks = (bucket.size + chunk_floats_ - 1) / chunk_floats_;
    bucket.inputs = std::move(inputs[b]);
  }
}

InProcessAllReduce::~InProcessAllReduce() = default;

void InProcessAllReduce::sum_chunk(Bucket& b, std::size_t chunk) {
  const std::size_t begin = chunk * chunk_floats_;
  const std::size_t n = std::min(b.size, begin + chunk_floats_) - begin;
  float* __restrict out = b.inputs[0] + begin;
  // Always ((in0 + in1) + in2) + ...: the same sum whichever replica does it.
  for (int r = 1; r < replicas_; ++r) {
    const float* __restrict in = b.inputs[static_cast<std::size_t>(r)] + begin;
    for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
  }
}

bool InProcessAllReduce::help(std::uint64_t round) {
  bool any = false;
  const auto replicas = static_cast<std::uint64_t>(replicas_);
  for (Bucket& b : buckets_) {
    if (b.arrived.load(std::memory_order_acquire) < round * replicas) continue;
    const std::uint64_t first = (round - 1) * b.chunks, limit = round * b.chunks;
    std::uint64_t c = b.claimed.load(std::memory_order_relaxed);
    while (c < limit) {
      if (!b.claimed.compare_exchange_weak(c, c + 1, std::memory_order_relaxed)) continue;
      sum_chunk(b, static_cast<std::size_t>(c - first));
      b.done.fetch_add(1, std::memory_order_release);
      any = true;
      c = b.claimed.load(std::memory_order_relaxed);
    }
  }
  if (any) {
    progress_.fetch_add(1, std::memory_order_release);
    progress_.notify_all();
  }
  return any;
}

void InProcessAllReduce::arrive(int replica, std::size_t bucket) {
  const std::uint64_t round = round_[static_cast<std::size_t>(replica)];
  const std::uint64_t n = buckets_[bucket].arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (n == round * static_cast<std::uint64_t>(replicas_)) {
    // The last arrival: the bucket is complete. Sum what we can, and wake helpers.
    if (!help(round)) {
      progress_.fetch_add(1, std::memory_order_release);
      progress_.notify_all();
    }
  }
}

void InProcessAllReduce::finish(int replica) {
  std::uint64_t& round = round_[static_cast<std::size_t>(replica)];
  for (;;) {
    const std::uint64_t seen = progress_.load(std::memory_order_acquire);
    help(round);
    bool complete = true;
    for (const Bucket& b : buckets_)
      if (b.done.load(std::memory_order_acquire) < round * b.chunks ||
          b.arrived.load(std::memory_order_acquire) < round * static_cast<std::uint64_t>(replicas_)) {
        complete = false;
        break;
      }
    if (complete) break;
    const int failed = aborted_by_.load(std::memory_order_acquire);
    if (failed >= 0)
      DTRAIN_THROW(PeerFailure, "all-reduce abandoned: replica ", failed, " failed (", abort_reason_, ")");
    progress_.wait(seen, std::memory_order_acquire);
  }
  ++round;
}

void InProcessAllReduce::abort(int replica, const std::string& why) {
  // Only the first failure is kept; its reason is written before it is published.
  if (!claimed_abort_.exchange(true, std::memory_order_acq_rel)) {
    abort_reason_ = why;
    aborted_by_.store(replica, std::memory_order_release);
  }
  progress_.fetch_add(1, std::memory_order_release);
  progress_.notify_all();
}

}  // namespace dtrain::comm
