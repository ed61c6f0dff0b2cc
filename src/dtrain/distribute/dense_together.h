// The replicas of one process compute the weight gradients of the model's dense layers
// together (autograd/dense_together.h): each copies its rows of the layer's input and
// output gradient into buffers that hold the whole batch, and after a barrier computes
// its block of the gradient's columns over every row, straight into the one gradient the
// update reads. Nothing is summed afterwards, and the product over the whole batch runs
// faster than one per replica. For BucketReducer, whose buckets leave these variables out.
// Internal to the distribute layer.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "dtrain/autograd/dense_together.h"
#include "dtrain/comm/in_process.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::distribute::detail {

class DenseTogether {
 public:
  // Replicas wait at most `timeout` for each other at a layer and after backward.
  DenseTogether(int replicas, std::span<Variable* const> vars, std::span<const DenseVariables> layers,
                std::chrono::milliseconds timeout = kDefaultTimeout);

  // Whether variable `index` (of the reducer's list) is a kernel or bias computed here.
  bool covers(std::size_t index) const { return gradients_[index].defined(); }
  // The gradient of a covered variable, shaped like it; whole after finish().
  const Tensor& gradient(std::size_t index) const { return gradients_[index]; }
  // Whether a replica computed it since the accumulation group began (after finish()).
  bool computed(std::size_t index) const;

  // Before each step, on the training thread: the replicas' rows (as
  // GradientReducer::begin_step) and whether the step adds to gradients already begun
  // (a micro-batch after the first of an accumulation group).
  void begin_step(std::span<const std::int64_t> row_bounds, bool accumulate);
  // Set on replica r's thread during its backward pass.
  DenseGradientsTogether* replica(int r);
  // Every replica, with rows this step or not: returns once all blocks are computed.
  void finish(int r) { finish_barrier_.arrive_and_wait(r); }
  // A replica failed: nobody waits for it.
  void abort(int r, const std::string& why) {
    layer_barrier_.abort(r, why);
    finish_barrier_.abort(r, why);
  }
  const std::string& name(std::size_t index) const { return vars_[index]->name(); }

 private:
  struct Layer {
    std::size_t kernel, bias;
    const void* key = nullptr;  // the kernel's values this step, as dense's backward sees them
    Tensor x, dz;               // [rows, in] and [rows, out]: every replica's rows
    Tensor ones;                // [1, rows], for the bias gradient's column sums
    Tensor bias_row;            // the bias gradient, viewed as [1, out]
    std::vector<std::uint64_t> step_used;   // [replica] the last step its backward reached the layer
    std::vector<std::uint64_t> group_done;  // [replica] the last group it computed its block in
  };
  class Hook;

  Layer& layer_of(const Tensor& kernel);
  // After the copies: replica r's block of columns of the layer's gradients.
  void compute_block(int r, Layer& layer);
  int spins_for(int threads) const;

  int cores_;
  std::vector<Variable*> vars_;
  std::vector<Layer> layers_;  // in the model's order
  std::vector<Tensor> gradients_;  // [variable] the shared gradients; undefined: not covered
  std::vector<std::unique_ptr<DenseGradientsTogether>> hooks_;  // [replica]
  std::vector<std::int64_t> bounds_;
  // The replicas with rows this step share the layers' columns; one without rows (a short
  // last batch) has no backward pass to take part in and waits at finish() alone.
  std::vector<int> part_;  // [replica] its place among those with rows, or -1
  std::vector<bool> with_rows_;  // [replica] part_ >= 0, the layer barrier's members (kept: a step allocates nothing)
  int parts_ = 0;
  bool accumulate_ = false;
  std::uint64_t step_ = 0, group_ = 0;  // counted from 1
  std::mutex buffers_mutex_;  // the first replica at a layer sizes its buffers for the step
  comm::InProcessBarrier layer_barrier_;   // the replicas with rows, at each layer
  comm::InProcessBarrier finish_barrier_;  // every replica, after backward (the step barrier)
};

}  // namespace dtrain::distribute::detail
