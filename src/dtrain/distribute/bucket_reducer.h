// Gradients summed over replicas in fused buckets while backward still runs. Variables
// are grouped in the reverse of their order (backward produces the last layer's
// gradients first) into buckets of at least `bucket_bytes`; once a replica has every
// final gradient of a bucket, it hands the bucket to the in-process all-reduce, which
// reads the gradients where backward left them, and goes on with its backward. When
// accumulating, each replica adds its gradients into buffers of its own and the last
// micro-batch of a group hands those over instead.
//
// Across processes (MultiWorkerMirroredStrategy), each bucket's in-process sum is then
// all-reduced between the workers on the communication thread, bucket by bucket in a
// fixed order, starting as soon as the bucket is whole (overlap) or once backward is over.
// Where the workers share memory, the buckets lie in a buffer every worker maps: the
// in-process sum is written there and summed between the workers where it lies.
// Internal to the distribute layer.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "dtrain/comm/gloo_group.h"
#include "dtrain/comm/nccl_group.h"
#include "dtrain/comm/in_process.h"
#include "dtrain/distribute/dense_together.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::distribute::detail {

// What fit uses when no size is given; see docs/distribute.md for the measurement.
inline constexpr std::size_t kDefaultBucketBytes = 4u << 20;

class WorkerComm;

struct CrossWorker {
  WorkerComm* workers = nullptr;  // null: one process
  bool overlap = true;            // start each bucket while backward runs
  comm::Wire wire = comm::Wire::f32;
  // GPU workers: their NCCL group (null: their sums go through pinned host memory).
  comm::NcclGroup* nccl = nullptr;
};

class BucketReducer final : public GradientReducer {
 public:
  // The `dense` layers' gradients are computed by the replicas together, outside the
  // buckets, within one process. Every wait for another replica (or, multi-worker, for
  // this process's sum of a bucket) lasts at most `timeout`.
  BucketReducer(int replicas, std::span<Variable* const> vars, std::size_t bucket_bytes, CrossWorker cross = {},
                std::span<const DenseVariables> dense = {}, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~BucketReducer() override;

  void begin_step(bool reduce, std::span<const std::int64_t> row_bounds) override;
  DenseGradientsTogether* dense_gradients_together(int replica) override;
  void gradient_ready(int replica, std::size_t index, const Tensor& grad) override;
  void finish(int replica) override;
  const std::vector<Tensor>& reduced(int replica) const override {
    return states_[static_cast<std::size_t>(replica)].reduced;
  }
  void abort(int replica, const std::string& why) override;
  bool measures_gradient_norms() const override { return cross_.workers != nullptr; }
  void measure_gradient_norms() override { measure_next_ = true; }
  std::pair<double, double> gradient_norms() const override { return {local_sq_, global_sq_}; }
  void set_profile(std::span<profile::Track* const> replicas, profile::Track* communication) override {
    tracks_.assign(replicas.begin(), replicas.end());
    comm_track_ = communication;
  }

 private:
  struct Place {
    std::size_t bucket;
    std::size_t segment;  // the variable's place in its bucket
    std::size_t offset;   // floats into the bucket's output
    std::int64_t numel;
  };
  struct ReplicaState {
    std::vector<std::size_t> filled;  // [bucket] gradients received this step
    bool fresh = true;                // the first micro-batch of a group
    std::vector<Tensor> held;         // [variable] gradients the all-reduce reads, kept alive
    std::vector<Tensor> sums;         // [variable] accumulation buffers (allocated on first use)
    std::vector<char> summed;         // [variable] sums holds a gradient this group
    std::vector<Tensor> reduced;      // [variable] this replica's copy of the result list
    std::vector<std::vector<float>> flags;  // [bucket][variable in it] 1: had a gradient
    std::uint64_t rounds = 0;         // reductions finished (multi-worker)
  };
  // On the communication thread: each bucket, once summed here, summed over the workers.
  // The round's sums across workers, submitted to the communication thread once (by
  // whichever replica or bucket gets there first).
  void start_round(std::uint64_t round);
  void reduce_across_workers(comm::GlooGroup& group, std::uint64_t round);
  double squared_norm(std::size_t bucket) const;
  void wait_summed(std::size_t bucket, std::uint64_t round);
  void stop_waiting(const std::string& why);
  bool together(std::size_t index) const { return together_ && together_->covers(index); }

  bool reduce_ = true;  // this step's; until begin_step, the previous step's
  std::unique_ptr<DenseTogether> together_;         // null: every gradient goes in a bucket
  std::vector<Place> places_;                       // [variable] (those in buckets)
  std::vector<std::size_t> bucket_vars_;            // [bucket] how many variables
  std::vector<Tensor> outputs_;                     // [bucket] the sums, flat float32, then the flags
  std::vector<std::size_t> flags_at_;               // [bucket] where its flags start in the output
  std::shared_ptr<comm::SharedBuffer> shared_;      // the outputs, where the workers share memory
  std::vector<std::size_t> shared_at_;              // [bucket] where its output starts in shared_
  std::unique_ptr<comm::InProcessAllReduce> all_reduce_;
  std::vector<ReplicaState> states_;                // [replica], each touched by its replica only
  std::vector<Tensor> views_;                       // [variable] the sum, shaped like it
  std::vector<profile::Track*> tracks_;             // [replica], empty when not profiled
  profile::Track* comm_track_ = nullptr;
  // The gradient noise scale's two squared norms: asked for the next reducing step
  // (measure_next_), measured in this round (measuring_, read by the communication thread
  // after the round's job was submitted), their last values.
  bool measure_next_ = false, measuring_ = false;
  double local_sq_ = 0, global_sq_ = 0;

  // Multi-worker: which round each bucket's in-process sum is complete for.
  CrossWorker cross_;
  std::chrono::milliseconds timeout_;
  std::mutex summed_mutex_;
  std::condition_variable summed_cv_;
  std::vector<std::uint64_t> summed_round_;  // [bucket]
  std::uint64_t started_round_ = 0;          // the last round whose job is being submitted
  std::uint64_t submitted_round_ = 0;        // ... and is in the communication queue
  std::string stopped_;                      // why the cross-worker stage stopped waiting
};

}  // namespace dtrain::distribute::detail
