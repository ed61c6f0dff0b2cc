// Rescaling: x * scale + offset, as float32 (tf.keras.layers.Rescaling). Its input may be
// uint8, so images can travel through the input pipeline as bytes (a quarter of the
// float32 memory traffic per batch) and become floats inside the step:
// Rescaling(1.0f / 255) as a model's first layer.
#pragma once

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

class Rescaling : public Layer {
 public:
  explicit Rescaling(float scale, float offset = 0.0f, std::string name = "rescaling");
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  std::string class_name() const override { return "Rescaling"; }
  bool supports_masking() const override { return true; }  // the mask passes through
  float scale() const { return scale_; }
  float offset() const { return offset_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  float scale_, offset_;
};

}  // namespace dtrain::nn
