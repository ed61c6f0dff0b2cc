// Activation: applies a named activation (tf.keras.layers.Activation).
#pragma once

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

class Activation : public Layer {
 public:
  explicit Activation(std::string activation, std::string name = "activation");
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  std::string class_name() const override { return "Activation"; }
  bool supports_masking() const override { return true; }  // the mask passes through
  const std::string& activation() const { return activation_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::string activation_;
};

}  // namespace dtrain::nn
