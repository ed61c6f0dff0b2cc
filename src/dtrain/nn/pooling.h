// Pooling layers over channels-last images, as tf.keras.layers.MaxPooling2D,
// AveragePooling2D and GlobalAveragePooling2D. strides default to the pool size; "same"
// average pooling divides by the taps inside the image, as Keras does.
#pragma once

#include <optional>

#include "dtrain/nn/conv.h"

namespace dtrain::nn {

class Pooling2D : public Layer {
 public:
  Shape compute_output_shape(const Shape& input_shape) const override;
  // Defined here, not in the two subclasses: the constructor's checks name the class
  // while only this part of the layer is built.
  std::string class_name() const override {
    return kind_ == kernels::Pool::max ? "MaxPooling2D" : "AveragePooling2D";
  }
  const Pair& pool_size() const { return pool_size_; }
  const Pair& strides() const { return strides_; }
  const std::string& padding() const { return padding_; }
  kernels::Pool kind() const { return kind_; }

 protected:
  Pooling2D(kernels::Pool kind, Pair pool_size, std::optional<Pair> strides, std::string padding, std::string name);
  Tensor call(const Tensor& x, bool training) override;
  Pool2dOptions pool_options(const Shape& input_shape) const;

 private:
  kernels::Pool kind_;
  Pair pool_size_;
  Pair strides_;
  std::string padding_;
};

class MaxPooling2D : public Pooling2D {
 public:
  explicit MaxPooling2D(Pair pool_size = {2, 2}, std::optional<Pair> strides = std::nullopt,
                        std::string padding = "valid", std::string name = "max_pooling2d")
      : Pooling2D(kernels::Pool::max, pool_size, strides, std::move(padding), std::move(name)) {}
};

class AveragePooling2D : public Pooling2D {
 public:
  explicit AveragePooling2D(Pair pool_size = {2, 2}, std::optional<Pair> strides = std::nullopt,
                            std::string padding = "valid", std::string name = "average_pooling2d")
      : Pooling2D(kernels::Pool::average, pool_size, strides, std::move(padding), std::move(name)) {}
};

// MaxPooling1D and AveragePooling1D over sequences [batch, steps, channels]: the 2-D
// pooling of [batch, 1, steps, channels] with a window of 1 x pool_size.
class Pooling1D : public Pooling2D {
 public:
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return kind() == kernels::Pool::max ? "MaxPooling1D" : "AveragePooling1D"; }

 protected:
  Pooling1D(kernels::Pool kind, std::int64_t pool_size, std::optional<std::int64_t> strides, std::string padding,
            std::string name)
      : Pooling2D(kind, Pair{1, pool_size}, Pair{1, strides ? *strides : pool_size}, std::move(padding), std::move(name)) {}
  Tensor call(const Tensor& x, bool training) override;
};

class MaxPooling1D : public Pooling1D {
 public:
  explicit MaxPooling1D(std::int64_t pool_size = 2, std::optional<std::int64_t> strides = std::nullopt,
                        std::string padding = "valid", std::string name = "max_pooling1d")
      : Pooling1D(kernels::Pool::max, pool_size, strides, std::move(padding), std::move(name)) {}
};

class AveragePooling1D : public Pooling1D {
 public:
  explicit AveragePooling1D(std::int64_t pool_size = 2, std::optional<std::int64_t> strides = std::nullopt,
                            std::string padding = "valid", std::string name = "average_pooling1d")
      : Pooling1D(kernels::Pool::average, pool_size, strides, std::move(padding), std::move(name)) {}
};

// The mean over height and width: [batch, H, W, C] -> [batch, C] ([batch, 1, 1, C] with keepdims).
class GlobalAveragePooling2D : public Layer {
 public:
  explicit GlobalAveragePooling2D(bool keepdims = false, std::string name = "global_average_pooling2d")
      : Layer(std::move(name)), keepdims_(keepdims) {}
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string class_name() const override { return "GlobalAveragePooling2D"; }
  bool keepdims() const { return keepdims_; }

 protected:
  Tensor call(const Tensor& x, bool training) override;

 private:
  bool keepdims_;
};

}  // namespace dtrain::nn
