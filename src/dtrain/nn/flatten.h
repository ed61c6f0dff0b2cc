// Flatten: [batch, d1, d2, ...] -> [batch, d1*d2*...] (tf.keras.layers.Flatten).
#pragma once

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

class Flatten : public Layer {
 public:
  explicit Flatten(std::string name = "flatten") : Layer(std::move(name)) {}
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "Flatten"; }

 protected:
  Tensor call(const Tensor& x, bool training) override;
};

}  // namespace dtrain::nn
