// Layers that join several inputs, as tf.keras.layers.Add and Concatenate (functional
// models call them on a list of tensors).
#pragma once

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

// The sum of its inputs, all of one shape.
class Add : public Layer {
 public:
  explicit Add(std::string name = "add") : Layer(std::move(name)) {}
  bool takes_several_inputs() const override { return true; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Shape compute_output_shape_of(std::span<const Shape> input_shapes) const override;
  std::string class_name() const override { return "Add"; }
  // A step is real where it is real in every input that has a mask (Keras's merge).
  bool supports_masking() const override { return true; }
  Tensor compute_mask(std::span<const Tensor> inputs, std::span<const Tensor> masks) const override;

 protected:
  Tensor call(const Tensor& x, bool training) override;
  Tensor call_several(std::span<const Tensor> inputs, bool training) override;
};

// Its inputs joined along `axis` (every other axis equal).
class Concatenate : public Layer {
 public:
  explicit Concatenate(int axis = -1, std::string name = "concatenate") : Layer(std::move(name)), axis_(axis) {}
  bool takes_several_inputs() const override { return true; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Shape compute_output_shape_of(std::span<const Shape> input_shapes) const override;
  std::string class_name() const override { return "Concatenate"; }
  // As Keras 3: joined along the features, a step is real where any input's mask calls it
  // real (an input without a mask: every step); joined along a masked axis, the masks are
  // joined too (an input without one is all real).
  bool supports_masking() const override { return true; }
  Tensor compute_mask(std::span<const Tensor> inputs, std::span<const Tensor> masks) const override;
  int axis() const { return axis_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;
  Tensor call_several(std::span<const Tensor> inputs, bool training) override;

 private:
  int axis_;
};

}  // namespace dtrain::nn
