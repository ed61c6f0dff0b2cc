// Dense: y = activation(x · kernel + bias), kernel [in, units], as tf.keras.layers.Dense.
// relu, sigmoid, tanh and gelu are fused into the matmul; softmax follows it.
#pragma once

#include <optional>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

struct DenseOptions {
  bool use_bias = true;
  std::string kernel_initializer = "glorot_uniform";
  std::string bias_initializer = "zeros";
  std::optional<std::uint64_t> seed;  // unset: the next of set_random_seed's sequence
  std::string name = "dense";
  std::optional<Regularizer> kernel_regularizer, bias_regularizer;  // penalties in losses()
  std::optional<Constraint> kernel_constraint, bias_constraint;     // applied after each update
};

// The activation a matmul or convolution can apply in its own pass, by Keras name
// (linear for any other: softmax runs after it).
kernels::Activation fused_activation(const std::string& name);

class Dense : public Layer {
 public:
  explicit Dense(std::int64_t units, std::string activation = "", DenseOptions options = {});

  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "Dense"; }
  bool supports_masking() const override { return true; }  // the mask passes through

  std::int64_t units() const { return units_; }
  const std::string& activation() const { return activation_; }
  const DenseOptions& options() const { return options_; }
  Variable& kernel();
  Variable* bias() { return bias_; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::int64_t units_;
  std::string activation_;
  DenseOptions options_;
  Variable* kernel_ = nullptr;
  Variable* bias_ = nullptr;
};

}  // namespace dtrain::nn
