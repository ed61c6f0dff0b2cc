// Reshape and ZeroPadding2D, as tf.keras.layers.Reshape and ZeroPadding2D. Reshape's
// target excludes the batch axis and may hold one -1, inferred from the rest.
#pragma once

#include <array>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

class Reshape : public Layer {
 public:
  explicit Reshape(std::vector<std::int64_t> target_shape, std::string name = "reshape");
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "Reshape"; }
  const std::vector<std::int64_t>& target_shape() const { return target_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  std::vector<std::int64_t> target_;
};

// ((top, bottom), (left, right)) rows and columns of zeros around each image.
class ZeroPadding2D : public Layer {
 public:
  using Padding2 = std::array<std::array<std::int64_t, 2>, 2>;
  explicit ZeroPadding2D(Padding2 padding, std::string name = "zero_padding2d");
  explicit ZeroPadding2D(std::int64_t padding = 1, std::string name = "zero_padding2d")
      : ZeroPadding2D(Padding2{{{padding, padding}, {padding, padding}}}, std::move(name)) {}
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "ZeroPadding2D"; }
  const Padding2& padding() const { return padding_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  Padding2 padding_;
};

}  // namespace dtrain::nn
