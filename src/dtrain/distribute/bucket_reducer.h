// Gradients summed over replicas in fused buckets while backward still runs. Variables
// are grouped in the reverse of their order (backward produces the last layer's
// gradients first) into buckets of at least `bucket_bytes`; a replica copies each final
// gradient into its own buffer of the bucket and, once it has every gradient of a
// bucket, hands the bucket to the in-process all-reduce and goes on with its backward.
// Internal to the distribute layer.
#pragma once

#include <memory>
#include <vector>

#include "dtrain/comm/in_process.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::distribute::detail {

// What fit uses when no size is given; see docs/distribute.md for the measurement.
inline constexpr std::size_t kDefaultBucketBytes = 4u << 20;

class BucketReducer final : public GradientReducer {
 public:
  BucketReducer(int replicas, std::span<Variable* const> vars, std::size_t bucket_bytes);

  void set_reduce_this_step(bool reduce) override { reduce_ = reduce; }
  void gradient_ready(int replica, std::size_t index, const Tensor& grad) override;
  void finish(int replica) override;
  const std::vector<Tensor>& reduced(int replica) const override {
    return states_[static_cast<std::size_t>(replica)].reduced;
  }
  void abort(int replica, const std::string& why) override { all_reduce_->abort(replica, why); }

  std::size_t num_buckets() const { return bucket_vars_.size(); }

 private:
  struct Place {
    std::size_t bucket;
    std::size_t offset;  // floats into the bucket
    std::int64_t numel;
  };
  struct ReplicaState {
    std::vector<std::size_t> filled;  // [bucket] gradients received this step
    std::vector<char> defined;        // [variable] some gradient was defined this cycle
    bool fresh = true;                // the first micro-batch of a cycle: copy, do not add
    std::vector<Tensor> reduced;      // [variable] this replica's copy of the result list
  };

  int replicas_;
  bool reduce_ = true;
  std::vector<Place> places_;                       // [variable]
  std::vector<std::size_t> bucket_vars_;            // [bucket] how many variables
  std::vector<std::vector<Tensor>> buffers_;        // [bucket][replica], flat float32
  std::unique_ptr<comm::InProcessAllReduce> all_reduce_;
  std::vector<ReplicaState> states_;                // [replica], each touched by its replica only
  std::vector<Tensor> views_;                       // [variable] the sum, shaped like it
};

}  // namespace dtrain::distribute::detail
