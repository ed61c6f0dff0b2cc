// Bucketed gradient reduction during backward.
#include "dtrain/distribute/bucket_reducer.h"

#include <algorithm>
#include <cstring>

#include "dtrain/kernels/backend.h"

namespace dtrain::distribute::detail {
namespace {

constexpr std::size_t kAlignFloats = 16;  // each gradient starts on a 64-byte boundary

}  // namespace

BucketReducer::BucketReducer(int replicas, std::span<Variable* const> vars, std::size_t bucket_bytes)
    : replicas_(replicas), places_(vars.size()), states_(static_cast<std::size_t>(replicas)) {
  const std::size_t bucket_floats = std::max<std::size_t>(bucket_bytes / sizeof(float), 1);
  std::vector<std::size_t> sizes;
  for (std::size_t k = vars.size(); k-- > 0;) {
    const Variable& v = *vars[k];
    if (v.dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, "gradient buckets: variable '", v.name(), "' is ", dtype_name(v.dtype()),
                   "; only float32 variables are reduced");
    if (sizes.empty() || sizes.back() >= bucket_floats) {
      sizes.push_back(0);
      bucket_vars_.push_back(0);
    }
    places_[k] = Place{sizes.size() - 1, sizes.back(), v.numel()};
    sizes.back() += (static_cast<std::size_t>(v.numel()) + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    ++bucket_vars_.back();
  }
  std::vector<std::vector<float*>> inputs(sizes.size());
  buffers_.resize(sizes.size());
  for (std::size_t b = 0; b < sizes.size(); ++b)
    for (int r = 0; r < replicas; ++r) {
      buffers_[b].push_back(Tensor::zeros(Shape{static_cast<std::int64_t>(sizes[b])}));
      inputs[b].push_back(buffers_[b].back().data<float>());
    }
  all_reduce_ = std::make_unique<comm::InProcessAllReduce>(std::move(inputs), sizes);
  for (auto& s : states_) {
    s.filled.assign(sizes.size(), 0);
    s.defined.assign(vars.size(), 0);
    s.reduced.resize(vars.size());
  }
  // The sum lands in replica 0's buffers.
  for (std::size_t k = 0; k < vars.size(); ++k) {
    const Place& p = places_[k];
    views_.push_back(buffers_[p.bucket][0]
                         .slice(static_cast<std::int64_t>(p.offset), static_cast<std::int64_t>(p.offset) + p.numel)
                         .reshape(vars[k]->shape()));
  }
}

void BucketReducer::gradient_ready(int replica, std::size_t index, const Tensor& grad) {
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
  const Place& p = places_[index];
  float* dst = all_reduce_->input(replica, p.bucket) + p.offset;
  const auto n = static_cast<std::size_t>(p.numel);
  if (grad.defined()) {
    if (grad.numel() != p.numel || grad.dtype() != DType::f32)
      DTRAIN_THROW(InternalError, "gradient buckets: gradient ", index, " is ", dtype_name(grad.dtype()), " ",
                   grad.shape().to_string(), ", expected ", p.numel, " float32 values");
    const float* src = grad.data<float>();
    if (state.fresh) std::memcpy(dst, src, n * sizeof(float));
    else
      for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
    state.defined[index] = 1;
  } else if (state.fresh) {
    std::memset(dst, 0, n * sizeof(float));
    state.defined[index] = 0;
  }
  if (++state.filled[p.bucket] == bucket_vars_[p.bucket] && reduce_) all_reduce_->arrive(replica, p.bucket);
}

void BucketReducer::finish(int replica) {
  ReplicaState& state = states_[static_cast<std::size_t>(replica)];
  for (std::size_t b = 0; b < state.filled.size(); ++b)
    if (state.filled[b] != bucket_vars_[b])
      DTRAIN_THROW(InternalError, "gradient buckets: replica ", replica, " reported ", state.filled[b], " of ",
                   bucket_vars_[b], " gradients of bucket ", b);
  std::fill(state.filled.begin(), state.filled.end(), 0);
  state.fresh = reduce_;  // after a reduction, the next micro-batch starts a new cycle
  if (!reduce_) return;
  all_reduce_->finish(replica);
  // Every replica's gradients are in (finish synchronised with each arrival), so every
  // replica can read which were defined; each writes only its own list.
  for (std::size_t k = 0; k < views_.size(); ++k) {
    bool any = false;
    for (const ReplicaState& s : states_) any = any || s.defined[k];
    state.reduced[k] = any ? views_[k] : Tensor();
  }
}

}  // namespace dtrain::distribute::detail
