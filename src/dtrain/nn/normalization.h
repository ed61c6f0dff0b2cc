// Normalization layers, as tf.keras.layers.BatchNormalization and LayerNormalization, over
// the last axis (channels last; the only axis they take).
//
// BatchNormalization in training normalizes by the batch's mean and (biased) variance and
// moves its moving statistics towards them: moving = moving * momentum + batch * (1 -
// momentum), as Keras 3 does; at inference, and whenever the layer is frozen
// (set_trainable(false)), it normalizes by the moving statistics. Under a strategy with
// several replicas:
// - synchronized = true (Keras 3's synchronized, TensorFlow's SyncBatchNormalization):
//   every replica normalizes by the statistics of the whole global batch, summed over the
//   replicas of every worker in forward and again in backward, so the model trains as on
//   one device;
// - synchronized = false: each replica normalizes by its own rows' statistics (a smaller
//   batch for the statistics); the moving statistics then move towards the mean of the
//   replicas' statistics, as a Keras variable with MEAN aggregation does (one small
//   all-reduce in forward).
#pragma once

#include <mutex>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

struct BatchNormalizationOptions {
  int axis = -1;
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  bool center = true;  // a learned offset beta
  bool scale = true;   // a learned factor gamma
  bool synchronized = false;
  std::string beta_initializer = "zeros";
  std::string gamma_initializer = "ones";
  std::string moving_mean_initializer = "zeros";
  std::string moving_variance_initializer = "ones";
  std::string name = "batch_normalization";
  std::optional<Regularizer> beta_regularizer, gamma_regularizer;  // penalties in losses()
  std::optional<Constraint> beta_constraint, gamma_constraint;     // applied after each update
};

class BatchNormalization : public Layer {
 public:
  explicit BatchNormalization(BatchNormalizationOptions options = {});
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "BatchNormalization"; }
  // The mask passes through; while training, statistics over a masked batch are refused
  // (Keras leaves the padding steps out of them; dtrain does not yet).
  bool supports_masking() const override { return true; }
  const BatchNormalizationOptions& options() const { return options_; }
  Variable* gamma() { return gamma_; }
  Variable* beta() { return beta_; }
  Variable& moving_mean();
  Variable& moving_variance();
  // The layer, then a relu, in one pass over the values (a model runs an Activation("relu")
  // that only reads this layer's output so); builds on the first call as operator() does.
  Tensor call_then_relu(const Tensor& x, bool training);

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;
  Tensor call_masked(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training) override;

 private:
  Tensor normalize(const Tensor& x, bool training, bool relu);

  BatchNormalizationOptions options_;
  Variable* gamma_ = nullptr;
  Variable* beta_ = nullptr;
  Variable* moving_mean_ = nullptr;
  Variable* moving_variance_ = nullptr;
};

struct LayerNormalizationOptions {
  int axis = -1;
  float epsilon = 1e-3f;
  bool center = true;
  bool scale = true;
  std::string beta_initializer = "zeros";
  std::string gamma_initializer = "ones";
  std::string name = "layer_normalization";
  std::optional<Regularizer> beta_regularizer, gamma_regularizer;
  std::optional<Constraint> beta_constraint, gamma_constraint;
};

class LayerNormalization : public Layer {
 public:
  explicit LayerNormalization(LayerNormalizationOptions options = {});
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "LayerNormalization"; }
  bool supports_masking() const override { return true; }  // the mask passes through
  const LayerNormalizationOptions& options() const { return options_; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;

 private:
  LayerNormalizationOptions options_;
  Variable* gamma_ = nullptr;
  Variable* beta_ = nullptr;
};

}  // namespace dtrain::nn
