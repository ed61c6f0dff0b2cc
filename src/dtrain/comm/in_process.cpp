// In-memory all-reduce among replica threads.
#include "dtrain/comm/in_process.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/core/multiversion.h"

namespace dtrain::comm {
namespace {

DTRAIN_MULTIVERSION void add_loop(float* __restrict out, const float* __restrict in, std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
}

// out[i] = a[i] + b[i]
DTRAIN_MULTIVERSION void sum_loop(float* __restrict out, const float* __restrict a, const float* __restrict b,
                                  std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// out[i] = in[0][i] + in[1][i] + ... (in that order), written around the caches: for sums
// too large to stay cached, this saves reading each output line before writing it.
void sum_streaming(float* out, const float* const* in, int count, std::size_t n) {
  std::size_t i = 0;
  auto scalar = [&](std::size_t j) {
    float v = in[0][j];
    for (int k = 1; k < count; ++k) v += in[k][j];
    out[j] = v;
  };
  for (; i < n && (reinterpret_cast<std::uintptr_t>(out + i) & 15u) != 0; ++i) scalar(i);
  if (count == 2) {  // the common case, a cache line per iteration
    const float* a = in[0];
    const float* b = in[1];
    for (; i + 16 <= n; i += 16) {
      const __m128 v0 = _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
      const __m128 v1 = _mm_add_ps(_mm_loadu_ps(a + i + 4), _mm_loadu_ps(b + i + 4));
      const __m128 v2 = _mm_add_ps(_mm_loadu_ps(a + i + 8), _mm_loadu_ps(b + i + 8));
      const __m128 v3 = _mm_add_ps(_mm_loadu_ps(a + i + 12), _mm_loadu_ps(b + i + 12));
      _mm_stream_ps(out + i, v0);
      _mm_stream_ps(out + i + 4, v1);
      _mm_stream_ps(out + i + 8, v2);
      _mm_stream_ps(out + i + 12, v3);
    }
  }
  for (; i + 4 <= n; i += 4) {
    __m128 v = _mm_loadu_ps(in[0] + i);
    for (int k = 1; k < count; ++k) v = _mm_add_ps(v, _mm_loadu_ps(in[k] + i));
    _mm_stream_ps(out + i, v);
  }
  for (; i < n; ++i) scalar(i);
  _mm_sfence();  // the streamed stores are visible before the chunk is counted done
}

// Outputs larger than this are written around the caches: half the last-level cache.
std::size_t streaming_threshold() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<std::size_t>(l3) / 2 : std::size_t{16} << 20;
}

constexpr int kMaxReplicas = 256;

}  // namespace

void add_into(float* out, const float* in, std::size_t n) { add_loop(out, in, n); }

std::string never_arrived(std::string_view what, int replica, std::chrono::milliseconds waited, int replicas,
                          const std::function<bool(int)>& absent, std::span<const std::string> devices) {
  std::string list;
  for (int r = 0; r < replicas; ++r) {
    if (!absent(r)) continue;
    list += (list.empty() ? "" : ", ") + std::to_string(r);
    if (static_cast<std::size_t>(r) < devices.size()) list += " (" + devices[static_cast<std::size_t>(r)] + ")";
  }
  return dtrain::detail::concat(what, ": replica ", replica, " waited ", std::chrono::duration<double>(waited).count(),
                                " s, and replica(s) ", list, " never arrived (stuck in their input or in user code?)");
}

InProcessAllReduce::InProcessAllReduce(int replicas, std::vector<std::vector<std::size_t>> segments,
                                       std::vector<float*> outputs, std::size_t chunk_floats,
                                       std::size_t streaming_above_bytes, std::chrono::milliseconds timeout)
    : replicas_(replicas), timeout_(timeout), buckets_(segments.size()),
      round_(static_cast<std::size_t>(std::max(replicas, 1)), 1) {
  if (replicas < 1 || replicas > kMaxReplicas)
    DTRAIN_THROW(InvalidArgument, "InProcessAllReduce: replicas must be in [1, ", kMaxReplicas, "], got ", replicas);
  if (outputs.size() != segments.size())
    DTRAIN_THROW(InvalidArgument, "InProcessAllReduce: ", outputs.size(), " outputs for ", segments.size(), " buckets");
  chunk_floats = std::max<std::size_t>(chunk_floats, 1);
  std::size_t total = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.output = outputs[b];
    std::size_t offset = 0;
    for (std::size_t s = 0; s < segments[b].size(); ++s) {
      bucket.offsets.push_back(offset);
      for (std::size_t begin = 0; begin < segments[b][s]; begin += chunk_floats)
        bucket.chunks.push_back(Chunk{s, begin, std::min(segments[b][s], begin + chunk_floats)});
      offset += segments[b][s];
    }
    if (offset > 0 && bucket.output == nullptr)
      DTRAIN_THROW(InvalidArgument, "InProcessAllReduce: bucket ", b, " has no output");
    bucket.inputs.assign(segments[b].size() * static_cast<std::size_t>(replicas), nullptr);
    bucket.arrived_in = std::vector<std::atomic<std::uint64_t>>(static_cast<std::size_t>(replicas));
    total += offset;
  }
  streaming_ = total * sizeof(float) > (streaming_above_bytes ? streaming_above_bytes : streaming_threshold());
}

void InProcessAllReduce::sum_chunk(const Bucket& b, const Chunk& c) const {
  float* out = b.output + b.offsets[c.segment] + c.begin;
  const std::size_t n = c.end - c.begin;
  // The replicas that have this segment, in replica order: the sum is always
  // ((in0 + in1) + in2) + ..., the same whichever replica computes it.
  std::array<const float*, kMaxReplicas> in;
  int count = 0;
  for (int r = 0; r < replicas_; ++r)
    if (const float* p = b.inputs[c.segment * static_cast<std::size_t>(replicas_) + static_cast<std::size_t>(r)])
      in[static_cast<std::size_t>(count++)] = p + c.begin;
  if (count == 0) {
    std::fill(out, out + n, 0.0f);
  } else if (streaming_) {
    sum_streaming(out, in.data(), count, n);
  } else if (count == 1) {
    std::copy(in[0], in[0] + n, out);
  } else {
    sum_loop(out, in[0], in[1], n);
    for (int k = 2; k < count; ++k) add_loop(out, in[static_cast<std::size_t>(k)], n);
  }
}

bool InProcessAllReduce::help(std::uint64_t round) {
  bool any = false;
  const auto replicas = static_cast<std::uint64_t>(replicas_);
  for (std::size_t index = 0; index < buckets_.size(); ++index) {
    Bucket& b = buckets_[index];
    if (b.arrived.load(std::memory_order_acquire) < round * replicas) continue;
    const std::uint64_t chunks = b.chunks.size();
    const std::uint64_t first = (round - 1) * chunks, limit = round * chunks;
    std::uint64_t c = b.claimed.load(std::memory_order_relaxed);
    while (c < limit) {
      if (!b.claimed.compare_exchange_weak(c, c + 1, std::memory_order_relaxed)) continue;
      sum_chunk(b, b.chunks[static_cast<std::size_t>(c - first)]);
      // The last chunk's acquire sees every other chunk's sum.
      if (b.done.fetch_add(1, std::memory_order_acq_rel) + 1 == limit && on_summed_) on_summed_(index);
      any = true;
      c = b.claimed.load(std::memory_order_relaxed);
    }
  }
  if (any) progress_.bump();
  return any;
}

void InProcessAllReduce::arrive(int replica, std::size_t bucket) {
  failure_.throw_if_failed("all-reduce");
  const std::uint64_t round = round_[static_cast<std::size_t>(replica)];
  buckets_[bucket].arrived_in[static_cast<std::size_t>(replica)].store(round, std::memory_order_relaxed);
  const std::uint64_t n = buckets_[bucket].arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (n == round * static_cast<std::uint64_t>(replicas_)) {
    // The last arrival: the bucket is complete. Sum what we can, and wake helpers.
    if (buckets_[bucket].chunks.empty() && on_summed_) on_summed_(bucket);  // nothing to sum
    if (!help(round)) progress_.bump();
  }
}

void InProcessAllReduce::finish(int replica) {
  std::uint64_t& round = round_[static_cast<std::size_t>(replica)];
  for (;;) {
    const std::uint64_t seen = progress_.value();
    help(round);
    bool complete = true;
    for (const Bucket& b : buckets_)
      if (b.done.load(std::memory_order_acquire) < round * b.chunks.size() ||
          b.arrived.load(std::memory_order_acquire) < round * static_cast<std::uint64_t>(replicas_)) {
        complete = false;
        break;
      }
    if (complete) break;
    failure_.throw_if_failed("all-reduce");
    // Any progress (an arrival, a summed chunk) starts the timeout again: only a round
    // that stands still for the whole timeout is given up.
    if (!progress_.wait(seen, kSpinPauses, timeout_)) {
      const std::string why = missing(replica, round);
      abort(replica, why);  // the others stop waiting too
      DTRAIN_THROW(Timeout, why);
    }
  }
  ++round;
}

std::string InProcessAllReduce::missing(int replica, std::uint64_t round) const {
  for (std::size_t index = 0; index < buckets_.size(); ++index) {
    const Bucket& b = buckets_[index];
    if (b.arrived.load(std::memory_order_acquire) >= round * static_cast<std::uint64_t>(replicas_)) continue;
    return never_arrived(dtrain::detail::concat("all-reduce of gradient bucket ", index, " (of ", buckets_.size(), ")"),
                         replica, timeout_, replicas_, [&](int r) {
                           return b.arrived_in[static_cast<std::size_t>(r)].load(std::memory_order_relaxed) < round;
                         });
  }
  return dtrain::detail::concat("all-reduce: replica ", replica, " waited ", std::chrono::duration<double>(timeout_).count(),
                                " s for the buckets' sums, and nobody summed a chunk in that time");
}

void InProcessAllReduce::abort(int replica, const std::string& why) {
  failure_.record(replica, why);
  progress_.bump();
}

void Signal::bump() {
  // Sequentially consistent, as the sleeper's count and check below: either this sees a
  // sleeper, or the sleeper sees the new value before it sleeps.
  value_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);  // a sleeper is either before its check or asleep
    cv_.notify_all();
  }
}

bool Signal::wait(std::uint64_t seen, int spins, std::chrono::milliseconds timeout) const {
  for (int spin = 0; spin < spins; ++spin) {
    if (value_.load(std::memory_order_acquire) != seen) return true;
    cpu_relax();
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  std::unique_lock lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  bool moved = true;
  while (value_.load(std::memory_order_seq_cst) == seen)
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && value_.load(std::memory_order_seq_cst) == seen) {
      moved = false;
      break;
    }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return moved;
}

void FirstFailure::record(int replica, const std::string& why) {
  if (!claimed_.exchange(true, std::memory_order_acq_rel)) {
    why_ = why;
    replica_.store(replica, std::memory_order_release);
  }
  // A second failure waits until the first is published, so that whoever it wakes finds one.
  while (replica_.load(std::memory_order_acquire) < 0) cpu_relax();
}

void FirstFailure::throw_if_failed(const char* what) const {
  if (const int failed = replica(); failed >= 0)
    DTRAIN_THROW(PeerFailure, what, " abandoned: replica ", failed, " failed (", why_, ")");
}

InProcessBarrier::InProcessBarrier(int replicas, int spins, std::chrono::milliseconds timeout, std::string name)
    : replicas_(replicas), spins_(spins), timeout_(timeout), name_(std::move(name)),
      members_(static_cast<std::size_t>(std::max(replicas, 0)), true),
      arrived_in_(static_cast<std::size_t>(std::max(replicas, 0))) {}

void InProcessBarrier::reset(const std::vector<bool>& members, int spins) {
  DTRAIN_CHECK(members.size() == members_.size(), "a barrier's members are its replicas");
  std::copy(members.begin(), members.end(), members_.begin());
  replicas_ = static_cast<int>(std::count(members.begin(), members.end(), true));
  spins_ = spins;
}

void InProcessBarrier::arrive_and_wait(int replica) {
  // The generation is read before the check for an abort, which publishes the failure
  // before it moves the generation: an abort after the check still ends the wait below.
  const std::uint64_t generation = generation_.value();
  failure_.throw_if_failed("replicas");
  arrived_in_[static_cast<std::size_t>(replica)].store(generation + 1, std::memory_order_relaxed);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == replicas_) {
    arrived_.store(0, std::memory_order_relaxed);  // nobody arrives again before the bump below
    generation_.bump();
  } else if (!generation_.wait(generation, spins_, timeout_)) {
    const std::string why =
        never_arrived(name_, replica, timeout_, static_cast<int>(members_.size()), [&](int r) {
          const auto i = static_cast<std::size_t>(r);
          return members_[i] && arrived_in_[i].load(std::memory_order_relaxed) != generation + 1;
        });
    abort(replica, why);  // the others stop waiting too
    DTRAIN_THROW(Timeout, why);
  }
  failure_.throw_if_failed("replicas");
}

void InProcessBarrier::abort(int replica, const std::string& why) {
  // Published before the bump: a waiter it wakes finds the failure.
  failure_.record(replica, why);
  generation_.bump();
}

}  // namespace dtrain::comm
