// BatchNormalization and LayerNormalization.
#include "dtrain/nn/normalization.h"

#include "dtrain/core/replica.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/nn/initializers.h"

namespace dtrain::nn {

BatchNormalization::BatchNormalization(BatchNormalizationOptions options)
    : Layer(options.name), options_(std::move(options)) {
  if (options_.axis != -1 && options_.axis != 3 && options_.axis != 1)
    fail("normalizes over the last axis (axis -1, channels last) only, got axis " + std::to_string(options_.axis));
  if (!(options_.momentum >= 0.0f && options_.momentum <= 1.0f))
    fail("momentum must be in [0, 1], got " + std::to_string(options_.momentum));
  if (!(options_.epsilon > 0.0f)) fail("epsilon must be positive, got " + std::to_string(options_.epsilon));
  for (const auto* name : {&options_.beta_initializer, &options_.gamma_initializer, &options_.moving_mean_initializer,
                           &options_.moving_variance_initializer})
    check_initializer_name(*name);
}

Shape BatchNormalization::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() < 2) fail("expects [batch, ..., channels], got " + input_shape.to_string());
  // axis 1 of a rank-2 input, or 3 of a rank-4 one, is the last axis too.
  if (options_.axis != -1 && options_.axis != input_shape.rank() - 1)
    fail("normalizes over the last axis only; axis " + std::to_string(options_.axis) + " of " +
         input_shape.to_string() + " is not the last");
  if (built() && moving_mean_->shape()[0] != input_shape[-1])
    fail("expects " + std::to_string(moving_mean_->shape()[0]) + " channels, got " + input_shape.to_string());
  return input_shape;
}

void BatchNormalization::build_weights(const Shape& input_shape) {
  const Shape c{input_shape[-1]};
  Generator g(0);  // the initializers here are constants
  if (options_.scale)
    gamma_ = &add_weight("gamma", initialize(options_.gamma_initializer, c, g), true, options_.gamma_regularizer,
                         options_.gamma_constraint);
  if (options_.center)
    beta_ = &add_weight("beta", initialize(options_.beta_initializer, c, g), true, options_.beta_regularizer,
                        options_.beta_constraint);
  moving_mean_ = &add_weight("moving_mean", initialize(options_.moving_mean_initializer, c, g), false);
  moving_variance_ = &add_weight("moving_variance", initialize(options_.moving_variance_initializer, c, g), false);
}

Variable& BatchNormalization::moving_mean() {
  if (!moving_mean_) fail("has no moving statistics until it is built");
  return *moving_mean_;
}

Variable& BatchNormalization::moving_variance() {
  if (!moving_variance_) fail("has no moving statistics until it is built");
  return *moving_variance_;
}

Tensor BatchNormalization::call_masked(std::span<const Tensor> inputs, std::span<const Tensor> /*masks*/,
                                       bool training) {
  if (training)
    fail("got a masked sequence while training: batch statistics that leave the padding steps out are not "
         "supported; use LayerNormalization on sequences, or no mask (Embedding's mask_zero=False)");
  return call(inputs[0], training);
}

Tensor BatchNormalization::call(const Tensor& x, bool training) { return normalize(x, training, false); }

Tensor BatchNormalization::call_then_relu(const Tensor& x, bool training) {
  x.check_defined(name().c_str());
  build(x.shape());
  return normalize(x, training, true);
}

Tensor BatchNormalization::normalize(const Tensor& x, bool training, bool relu) {
  const Tensor gamma = gamma_ ? gamma_->value() : Tensor();
  const Tensor beta = beta_ ? beta_->value() : Tensor();
  // A frozen batch norm runs in inference mode, as Keras's does (fine-tuning keeps the
  // moving statistics and normalizes by them).
  if (!training || !trainable())
    return batch_norm_inference(x, moving_mean_->value(), moving_variance_->value(), gamma, beta, options_.epsilon,
                                relu);
  Tensor mean, variance;
  Tensor y = batch_norm(x, gamma, beta, options_.epsilon, options_.synchronized, &mean, &variance, relu);
  const ReplicaContext& replica = replica_context();
  // The moving statistics take the replicas' own statistics' mean: their sums (on the
  // device that holds them), scaled in the update below.
  float share = 1.0f;
  if (!options_.synchronized && replica.cross != nullptr && replica.num_replicas_in_sync > 1) {
    // One tensor [mean, variance] (a collective between workers, not two), on their device.
    const std::int64_t c = mean.numel();
    Tensor both = Tensor::empty({2, c}, DType::f32, mean.device());
    both.slice(0, 1).copy_from(mean.reshape({1, c}));
    both.slice(1, 2).copy_from(variance.reshape({1, c}));
    const auto start = std::chrono::steady_clock::now();
    const Tensor sums = replica.cross->all_reduce_sum(std::span<const Tensor>(&both, 1)).front();
    timed_cross_replica_calls().push_back(
        {start, std::chrono::steady_clock::now(), false, "batch norm (moving statistics' mean)"});
    mean = sums.slice(0, 1).reshape({c});
    variance = sums.slice(1, 2).reshape({c});
    share = 1.0f / static_cast<float>(replica.num_replicas_in_sync);
  }
  // Every replica holds the same figures now; the first of each process writes them into
  // the variables the replicas share (outside any tape).
  if (replica.replica_id == 0) {
    // moving = moving * momentum + batch * (1 - momentum), on the variables' device.
    const float m = options_.momentum;
    Tensor& mm = moving_mean_->mutable_value();
    Tensor& mv = moving_variance_->mutable_value();
    auto& be = kernels::backend(mm.device());
    be.axpby((1.0f - m) * share, mean, m, mm);
    be.axpby((1.0f - m) * share, variance, m, mv);
  }
  return y;
}

LayerNormalization::LayerNormalization(LayerNormalizationOptions options)
    : Layer(options.name), options_(std::move(options)) {
  if (!(options_.epsilon > 0.0f)) fail("epsilon must be positive, got " + std::to_string(options_.epsilon));
  check_initializer_name(options_.beta_initializer);
  check_initializer_name(options_.gamma_initializer);
}

Shape LayerNormalization::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() < 2) fail("expects [batch, ..., features], got " + input_shape.to_string());
  if (options_.axis != -1 && options_.axis != input_shape.rank() - 1)
    fail("normalizes over the last axis only; axis " + std::to_string(options_.axis) + " of " +
         input_shape.to_string() + " is not the last");
  if (built() && (*this->input_shape())[-1] != input_shape[-1])
    fail("expects " + std::to_string((*this->input_shape())[-1]) + " features, got " + input_shape.to_string());
  return input_shape;
}

void LayerNormalization::build_weights(const Shape& input_shape) {
  const Shape d{input_shape[-1]};
  Generator g(0);
  if (options_.scale)
    gamma_ = &add_weight("gamma", initialize(options_.gamma_initializer, d, g), true, options_.gamma_regularizer,
                         options_.gamma_constraint);
  if (options_.center)
    beta_ = &add_weight("beta", initialize(options_.beta_initializer, d, g), true, options_.beta_regularizer,
                        options_.beta_constraint);
}

Tensor LayerNormalization::call(const Tensor& x, bool /*training*/) {
  return layer_norm(x, gamma_ ? gamma_->value() : Tensor(), beta_ ? beta_->value() : Tensor(), options_.epsilon);
}

}  // namespace dtrain::nn
