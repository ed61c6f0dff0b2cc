// Collectives among the threads of one process (replicas of MirroredStrategy), in shared
// memory. Knows nothing of models: it sums float32 buffers.
//
// InProcessAllReduce sums buckets of floats over R replicas. A replica writes its
// contribution into input(replica, bucket) and calls arrive(); once every replica has
// arrived at a bucket, the bucket is cut into chunks and whichever replicas come by claim
// chunks and sum them, so all replica threads work on each bucket (a reduce-scatter).
// The sum is written over replica 0's input, which every replica then reads: in one
// address space the all-gather is the readers sharing that buffer. Nobody waits at
// arrive(): a replica that arrives early goes back to its own work (the rest of its
// backward pass) and helps with finished buckets when it next arrives or finishes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::comm {

class InProcessAllReduce {
 public:
  // inputs[bucket][replica] points at bucket_sizes[bucket] floats that the caller owns
  // and keeps alive; chunk_floats is the unit of work one replica claims.
  InProcessAllReduce(std::vector<std::vector<float*>> inputs, std::vector<std::size_t> bucket_sizes,
                     std::size_t chunk_floats = 16384);
  ~InProcessAllReduce();
  InProcessAllReduce(const InProcessAllReduce&) = delete;
  InProcessAllReduce& operator=(const InProcessAllReduce&) = delete;

  int replicas() const { return replicas_; }
  std::size_t num_buckets() const { return buckets_.size(); }
  std::size_t size(std::size_t bucket) const { return buckets_[bucket].size; }

  // Where `replica` writes its contribution to `bucket`.
  float* input(int replica, std::size_t bucket) { return buckets_[bucket].inputs[static_cast<std::size_t>(replica)]; }
  // The sum, once finish() has returned on the reading replica; valid until replica 0
  // writes its next contribution.
  const float* result(std::size_t bucket) const { return buckets_[bucket].inputs[0]; }

  // `replica` has written its input to `bucket` for this round. Reduces whatever chunks
  // of completed buckets are unclaimed, then returns without waiting for anyone.
  void arrive(int replica, std::size_t bucket);
  // Helps until every bucket of this round is summed, then returns. Throws PeerFailure
  // naming the replica when another replica called abort() instead of arriving.
  void finish(int replica);
  // A replica failed: every replica waiting in finish() (now or later this round) throws.
  // The object is not reused after an abort.
  void abort(int replica, const std::string& why);

 private:
  struct Bucket {
    std::size_t size = 0;
    std::size_t chunks = 0;
    std::vector<float*> inputs;  // [replica]
    // Counters grow monotonically over rounds (round g completes at g * replicas
    // arrivals and g * chunks summed chunks), so no reset races with a fast replica.
    std::atomic<std::uint64_t> arrived{0};
    std::atomic<std::uint64_t> claimed{0};
    std::atomic<std::uint64_t> done{0};
  };
  // Sums unclaimed chunks of buckets complete in `round`; true if it summed any.
  bool help(std::uint64_t round);
  void sum_chunk(Bucket& b, std::size_t chunk);

  int replicas_;
  std::size_t chunk_floats_;
  std::vector<Bucket> buckets_;
  std::vector<std::uint64_t> round_;  // [replica]: the round each replica is in (its own slot)
  std::atomic<std::uint64_t> progress_{0};  // bumped on every arrival, summed chunk and abort; waited on
  std::atomic<bool> claimed_abort_{false};
  std::atomic<int> aborted_by_{-1};
  std::string abort_reason_;  // written before aborted_by_ is published
};

}  // namespace dtrain::comm
