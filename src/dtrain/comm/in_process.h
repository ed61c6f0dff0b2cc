// Collectives among the threads of one process (replicas of MirroredStrategy), in shared
// memory. Knows nothing of models: it sums float32 arrays.
//
// InProcessAllReduce sums buckets of float arrays over R replicas. A bucket is a list of
// segments (a model's gradients, say); each replica points set_input() at its own copy of
// each segment, wherever it lies (no copy into a staging buffer), then calls arrive().
// Once every replica has arrived at a bucket, the bucket is cut into chunks and whichever
// replicas come by claim chunks and write their sums into the bucket's output, so all
// replica threads work on each bucket (a reduce-scatter). Every replica then reads the
// one output: in one address space the all-gather is the readers sharing that buffer.
// Nobody waits at arrive(): a replica that arrives early goes back to its own work (the
// rest of its backward pass) and helps with complete buckets when it next arrives or
// finishes. When all outputs together exceed half the last-level cache, sums are written
// with streaming stores, which skip reading each output line before overwriting it.
// Every wait has a deadline: a replica that does not come (stuck in its input or in user
// code) is a Timeout naming it and the operation, and its siblings are released.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/clock.h"

namespace dtrain::comm {

// out[i] += in[i] for i < n, vectorised for the CPU it runs on.
void add_into(float* out, const float* in, std::size_t n);

// The message of a Timeout at an in-process wait: "WHAT: replica R waited S s, and
// replica(s) A, B never arrived (stuck in their input or in user code?)", listing each
// replica r < replicas for which absent(r) holds, followed by " (DEVICE)" where `devices`
// names the replicas.
std::string never_arrived(std::string_view what, int replica, std::chrono::milliseconds waited, int replicas,
                          const std::function<bool(int)>& absent, std::span<const std::string> devices = {});

// One pause of a spinning wait: lets the other hardware thread of the core run.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Pauses a waiter spins before it sleeps: about 20-50 microseconds on current x86 cores.
// Replicas arrive close together, and a sleeping thread takes tens of microseconds to wake.
inline constexpr int kSpinPauses = 4000;

// A counter that threads wait on to move. A waiter spins for a while, then sleeps until
// the counter moves or its deadline passes (std::atomic::wait has no deadline). Moving it
// makes a system call only when somebody sleeps, as std::atomic::notify_all does.
class Signal {
 public:
  std::uint64_t value() const { return value_.load(std::memory_order_acquire); }
  // Moves the counter and wakes whoever waits for it to move.
  void bump();
  // Returns true once value() != seen; false once `timeout` has passed since it began to
  // sleep. The clock is read only when it is about to sleep, never while it spins.
  bool wait(std::uint64_t seen, int spins, std::chrono::milliseconds timeout) const;

 private:
  std::atomic<std::uint64_t> value_{0};
  mutable std::atomic<int> sleepers_{0};
  mutable std::mutex mutex_;  // only for sleeping
  mutable std::condition_variable cv_;
};

// The first of the replicas' failures, for everyone who waits on the others.
class FirstFailure {
 public:
  // Records `replica`'s failure unless one was recorded before; returns once a failure is
  // visible to replica() (the first one, when two race).
  void record(int replica, const std::string& why);
  int replica() const { return replica_.load(std::memory_order_acquire); }  // -1: none
  // Throws PeerFailure "<what> abandoned: replica R failed (why)" once one failed.
  void throw_if_failed(const char* what) const;

 private:
  std::atomic<bool> claimed_{false};
  std::atomic<int> replica_{-1};
  std::string why_;  // written before replica_ is published
};

class InProcessAllReduce {
 public:
  // segments[bucket] lists the sizes (in floats) of the bucket's segments; outputs[bucket]
  // points at their sum, laid end to end (caller-owned, kept alive). chunk_floats is the
  // unit of work one replica claims. Outputs larger than streaming_above_bytes in total
  // are written with streaming stores (0: half the last-level cache). finish() waits at
  // most `timeout` for the other replicas (the strategy's timeout_seconds).
  InProcessAllReduce(int replicas, std::vector<std::vector<std::size_t>> segments, std::vector<float*> outputs,
                     std::size_t chunk_floats = 16384, std::size_t streaming_above_bytes = 0,
                     std::chrono::milliseconds timeout = kDefaultTimeout);
  InProcessAllReduce(const InProcessAllReduce&) = delete;
  InProcessAllReduce& operator=(const InProcessAllReduce&) = delete;

  // Where `replica`'s copy of a segment is this round; null counts as zeros. It must stay
  // unchanged until finish() returns on that replica.
  void set_input(int replica, std::size_t bucket, std::size_t segment, const float* data) {
    buckets_[bucket].inputs[segment * static_cast<std::size_t>(replicas_) + static_cast<std::size_t>(replica)] = data;
  }
  // `replica` has set every input of `bucket` for this round. Sums whatever chunks of
  // complete buckets are unclaimed, then returns without waiting for anyone.
  void arrive(int replica, std::size_t bucket);
  // Helps until every bucket of this round is summed into its output, then returns.
  // Throws PeerFailure naming the replica when another replica called abort() instead,
  // and Timeout naming the bucket and the replicas that never arrived at it when the
  // timeout passes without progress; a timeout aborts the round for everyone.
  void finish(int replica);
  // A replica failed: every replica waiting in finish() (now or later this round) throws.
  // The object is not reused after an abort.
  void abort(int replica, const std::string& why);
  // Called once per bucket and round, on the thread that completed the bucket's sum, as
  // soon as its output is whole (a multi-worker strategy hands it on to other processes).
  // Set before the first round.
  void on_summed(std::function<void(std::size_t bucket)> fn) { on_summed_ = std::move(fn); }

 private:
  struct Chunk {
    std::size_t segment, begin, end;  // floats within the segment
  };
  struct Bucket {
    std::vector<std::size_t> offsets;  // [segment] into the output
    std::vector<std::atomic<std::uint64_t>> arrived_in;  // [replica] the last round it arrived in (for messages)
    std::vector<Chunk> chunks;
    std::vector<const float*> inputs;  // [segment * replicas + replica]
    float* output = nullptr;
    // Counters grow monotonically over rounds (round g completes at g * replicas
    // arrivals and g * chunks summed chunks), so no reset races with a fast replica.
    std::atomic<std::uint64_t> arrived{0};
    std::atomic<std::uint64_t> claimed{0};
    std::atomic<std::uint64_t> done{0};
  };
  // Sums unclaimed chunks of buckets complete in `round`; true if it summed any.
  bool help(std::uint64_t round);
  void sum_chunk(const Bucket& b, const Chunk& c) const;
  // What `replica` waited for when its timeout passed in `round`.
  std::string missing(int replica, std::uint64_t round) const;

  int replicas_;
  std::chrono::milliseconds timeout_;
  bool streaming_ = false;  // sums too large for the caches bypass them
  std::vector<Bucket> buckets_;
  std::vector<std::uint64_t> round_;  // [replica]: the round each replica is in (its own slot)
  Signal progress_;  // bumped on completed buckets, summed chunks and aborts; waited on
  FirstFailure failure_;
  std::function<void(std::size_t)> on_summed_;
};

// R threads wait for each other, over and over: replicas that must all have written
// something before any reads it. Waiters spin for `spins` pauses, then sleep; with more
// replicas than cores, spinning takes the core a late replica needs, so give 0. `name`
// says what the barrier is in a timeout's message ("dense layer barrier").
class InProcessBarrier {
 public:
  explicit InProcessBarrier(int replicas, int spins = kSpinPauses, std::chrono::milliseconds timeout = kDefaultTimeout,
                            std::string name = "barrier");
  InProcessBarrier(const InProcessBarrier&) = delete;
  InProcessBarrier& operator=(const InProcessBarrier&) = delete;

  // Returns once all members have arrived this time. Throws PeerFailure naming the
  // replica once another called abort() instead (also when the others had arrived), and
  // Timeout naming the members that never arrived once `timeout` has passed; a timeout
  // aborts the barrier for everyone.
  void arrive_and_wait(int replica);
  // A replica failed: every replica waiting now or later throws. Not reused afterwards.
  void abort(int replica, const std::string& why);
  // Which replicas arrive each time from now on ([replica] true: a member), and how long
  // they spin; only while nobody waits. Copied into a list of the same size: no allocation.
  void reset(const std::vector<bool>& members, int spins);

 private:
  int replicas_;  // members
  int spins_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  std::vector<bool> members_;
  std::vector<std::atomic<std::uint64_t>> arrived_in_;  // [replica] the generation it last arrived in, + 1
  std::atomic<int> arrived_{0};
  Signal generation_;  // bumped when all have arrived, and on abort; waited on
  FirstFailure failure_;
};

}  // namespace dtrain::comm
