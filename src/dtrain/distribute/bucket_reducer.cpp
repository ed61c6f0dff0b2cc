// Bucketed gradient reduction during backward.
#include "dtrain/distribute/bucket_reducer.h"

#include <algorithm>


namespace dtrain::distribute::detail {

BucketReducer::BucketReducer(int replicas, std::span<Variable* const> vars, std::size_t bucket_bytes)
    : places_(vars.size()), states_(static_cast<std::size_t>(replicas)) {
  const std::size_t bucket_floats = std::max<std::size_t>(bucket_bytes / sizeof(float), 1);
  std::vector<std::vector<std::size_t>> segments;
  std::vector<std::size_t> sizes;
  for (std::size_t k = vars.size(); k-- > 0;) {
    const Variable& v = *vars[k];
    if (v.dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, "gradient buckets: variable '", v.name(), "' is ", dtype_name(v.dtype()),
                   "; only float32 variables are reduced");
    if (sizes.empty() || sizes.back() >= bucket_floats) {
      sizes.push_back(0);
      segments.emplace_back();
      bucket_vars_.push_back(0);
    }
    places_[k] = Place{sizes.size() - 1, segments.back().size(), sizes.back(), v.numel()};
    segments.back().push_back(static_cast<std::size_t>(v.numel()));
    sizes.back() += static_cast<std::size_t>(v.numel());
    ++bucket_vars_.back();
  }
  std::vector<float*> outputs;
  for (std::size_t n : sizes) {
    outputs_.push_back(Tensor::zeros(Shape{static_cast<std::int64_t>(n)}));
    outputs.push_back(outputs_.back().data<float>());
  }
  all_reduce_ = std::make_unique<comm::InProcessAllReduce>(replicas, std::move(segments), std::move(outputs));
  for (auto& s : states_) {
    s.filled.assign(sizes.size(), 0);
    s.defined.assign(vars.size(), 0);
    s.held.resize(vars.size());
    s.sums.resize(vars.size());
    s.summed.assign(vars.size(), 0);
    s.reduced.resize(vars.size());
  }
  for (std::size_t k = 0; k < vars.size(); ++k) {
    const Place& p = places_[k];
    views_.push_back(outputs_[p.bucket]
                         .slice(static_cast<std::int64_t>(p.offset), static_cast<std::int64_t>(p.offset) + p.numel)
                         .reshape(vars[k]->shape()));
  }
}

void BucketReducer::gradient_ready(int replica, std::size_t index, const Tensor& grad) {
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
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
    state.defined[index] = input != nullptr;
    all_reduce_->set_input(replica, p.bucket, p.segment, input);
    if (++state.filled[p.bucket] == bucket_vars_[p.bucket]) all_reduce_->arrive(replica, p.bucket);
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
  if (!reduce_) return;
  all_reduce_->finish(replica);
  // Every chunk is summed, so nobody reads this replica's gradients any more.
  std::fill(state.held.begin(), state.held.end(), Tensor());
  // finish() synchronised with every replica's arrivals, so every replica can read which
  // gradients were defined; each writes only its own list.
  for (std::size_t k = 0; k < views_.size(); ++k) {
    bool any = false;
    for (const ReplicaState& s : states_) any = any || s.defined[k];
    state.reduced[k] = any ? views_[k] : Tensor();
  }
}

}  // namespace dtrain::distribute::detail
