// Convolution layers over channels-last images [batch, height, width, channels], as
// tf.keras.layers.Conv2D and DepthwiseConv2D: the kernel is [KH, KW, in / groups, filters]
// (Keras's layout, so weights load from Keras unchanged); relu, sigmoid and tanh are fused
// into the convolution, softmax follows it.
#pragma once

#include <array>
#include <optional>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

// Keras's padding names: "valid" (none) or "same" (the output is ceil(input / stride) and
// the zeros are split as TensorFlow splits them, the odd one after).
enum class Padding : std::uint8_t { valid, same };
Padding padding_from_name(const std::string& name);
const char* padding_name(Padding padding);
// The outputs of one axis of `size` pixels under "same" at `stride`: ceil(size / stride),
// without the overflow of (size + stride - 1) for a stride near 2^63.
std::int64_t same_outputs(std::int64_t size, std::int64_t stride);
// Zeros before and after one axis of `size` pixels for a window of `window` taps.
std::array<std::int64_t, 2> same_padding(std::int64_t size, std::int64_t window, std::int64_t stride,
                                         std::int64_t dilation);

// A stride past the `padded` extent of an axis (its pixels and zeros) as that extent:
// either takes the first window alone, and oneDNN refuses strides far past the image.
std::int64_t stride_within(std::int64_t stride, std::int64_t padded);

using Pair = std::array<std::int64_t, 2>;

struct Conv2DOptions {
  Pair strides{1, 1};
  std::string padding = "valid";
  Pair dilation_rate{1, 1};
  std::int64_t groups = 1;
  std::string activation;
  bool use_bias = true;
  std::string kernel_initializer = "glorot_uniform";
  std::string bias_initializer = "zeros";
  std::optional<std::uint64_t> seed;  // unset: the next of set_random_seed's sequence
  std::string name = "conv2d";
  // DepthwiseConv2D's depthwise_regularizer and depthwise_constraint are its kernel's.
  std::optional<Regularizer> kernel_regularizer, bias_regularizer;  // penalties in losses()
  std::optional<Constraint> kernel_constraint, bias_constraint;     // applied after each update
};

class Conv2D : public Layer {
 public:
  Conv2D(std::int64_t filters, Pair kernel_size, Conv2DOptions options = {});
  Conv2D(std::int64_t filters, std::int64_t kernel_size, Conv2DOptions options = {})
      : Conv2D(filters, Pair{kernel_size, kernel_size}, std::move(options)) {}

  Shape compute_output_shape(const Shape& input_shape) const override;
  // DepthwiseConv2D's too: the constructor's checks name the class while only this part
  // of the layer is built.
  std::string class_name() const override { return class_name_; }

  std::int64_t filters() const { return filters_; }
  const Pair& kernel_size() const { return kernel_size_; }
  const Conv2DOptions& options() const { return options_; }
  Variable& kernel();
  Variable* bias() { return bias_; }

 protected:
  Conv2D(std::int64_t filters, Pair kernel_size, Conv2DOptions options, const char* class_name);
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;
  // The kernel's shape for `channels` input channels, and the oneDNN options for an input.
  virtual Shape kernel_shape(std::int64_t channels) const;
  Conv2dOptions conv_options(const Shape& input_shape) const;

  std::int64_t filters_;
  Pair kernel_size_;
  Conv2DOptions options_;
  std::int64_t groups_;  // of the convolution (DepthwiseConv2D: the input channels)
  Variable* kernel_ = nullptr;
  Variable* bias_ = nullptr;

 private:
  const char* class_name_;
};

// Each input channel convolved with its own depth_multiplier filters:
// kernel [KH, KW, in, depth_multiplier], output channels in * depth_multiplier.
class DepthwiseConv2D : public Conv2D {
 public:
  DepthwiseConv2D(Pair kernel_size, std::int64_t depth_multiplier = 1, Conv2DOptions options = {});
  DepthwiseConv2D(std::int64_t kernel_size, std::int64_t depth_multiplier = 1, Conv2DOptions options = {})
      : DepthwiseConv2D(Pair{kernel_size, kernel_size}, depth_multiplier, std::move(options)) {}

  Shape compute_output_shape(const Shape& input_shape) const override;
  std::int64_t depth_multiplier() const { return depth_multiplier_; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;
  Shape kernel_shape(std::int64_t channels) const override;

 private:
  std::int64_t depth_multiplier_;
};

// tf.keras.layers.Conv1D over sequences [batch, steps, channels]: the convolution of
// Conv2D on [batch, 1, steps, channels], with Keras's kernel layout [K, in / groups,
// filters]. strides and dilation_rate are the options' second entries; padding "valid",
// "same" or "causal" ((K - 1) * dilation zeros before the steps, none after: an output
// sees no later step).
class Conv1D : public Conv2D {
 public:
  Conv1D(std::int64_t filters, std::int64_t kernel_size, Conv2DOptions options = {});
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::int64_t kernel_length() const { return kernel_size_[1]; }
  std::string padding() const { return causal_ ? "causal" : options_.padding; }

 protected:
  void build_weights(const Shape& input_shape) override;
  Tensor call(const Tensor& x, bool training) override;
  Shape kernel_shape(std::int64_t channels) const override;

 private:
  std::int64_t causal_steps() const { return causal_ ? (kernel_size_[1] - 1) * options_.dilation_rate[1] : 0; }
  bool causal_;
};

}  // namespace dtrain::nn
