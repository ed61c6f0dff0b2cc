// Conv2D and DepthwiseConv2D: weights at build, one fused op per call.
#include "dtrain/nn/conv.h"

#include "dtrain/nn/dense.h"
#include "dtrain/nn/initializers.h"

namespace dtrain::nn {
namespace {

std::string pair_text(const Pair& p) { return "(" + std::to_string(p[0]) + ", " + std::to_string(p[1]) + ")"; }

}  // namespace

Padding padding_from_name(const std::string& name) {
  if (name == "valid") return Padding::valid;
  if (name == "same") return Padding::same;
  DTRAIN_THROW(InvalidArgument, "unknown padding '", name, "'; expected \"valid\" or \"same\"");
}

const char* padding_name(Padding padding) { return padding == Padding::same ? "same" : "valid"; }

std::int64_t same_outputs(std::int64_t size, std::int64_t stride) {
  return size / stride + (size % stride != 0 ? 1 : 0);
}

std::array<std::int64_t, 2> same_padding(std::int64_t size, std::int64_t window, std::int64_t stride,
                                         std::int64_t dilation) {
  const std::int64_t out = same_outputs(size, stride);
  const std::int64_t span = dilation * (window - 1) + 1;
  const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * stride + span - size);
  return {total / 2, total - total / 2};
}

std::int64_t stride_within(std::int64_t stride, std::int64_t padded) {
  return std::min(stride, std::max<std::int64_t>(padded, 1));
}

Conv2D::Conv2D(std::int64_t filters, Pair kernel_size, Conv2DOptions options)
    : Conv2D(filters, kernel_size, std::move(options), "Conv2D") {}

Conv2D::Conv2D(std::int64_t filters, Pair kernel_size, Conv2DOptions options, const char* class_name)
    : Layer(options.name), filters_(filters), kernel_size_(kernel_size), options_(std::move(options)),
      groups_(options_.groups), class_name_(class_name) {
  if (filters_ <= 0) fail("filters must be positive, got " + std::to_string(filters_));
  if (kernel_size_[0] < 1 || kernel_size_[1] < 1) fail("kernel_size must be positive, got " + pair_text(kernel_size_));
  if (options_.strides[0] < 1 || options_.strides[1] < 1) fail("strides must be positive, got " + pair_text(options_.strides));
  if (options_.dilation_rate[0] < 1 || options_.dilation_rate[1] < 1)
    fail("dilation_rate must be positive, got " + pair_text(options_.dilation_rate));
  if ((options_.strides[0] > 1 || options_.strides[1] > 1) &&
      (options_.dilation_rate[0] > 1 || options_.dilation_rate[1] > 1))
    fail("strides > 1 cannot be combined with dilation_rate > 1 (as in Keras)");
  if (options_.groups < 1 || filters_ % options_.groups != 0)
    fail("groups must be positive and divide filters (" + std::to_string(filters_) + "), got " +
         std::to_string(options_.groups));
  try {
    padding_from_name(options_.padding);
  } catch (const InvalidArgument& e) {
    fail(e.what());
  }
  check_activation_name(options_.activation);
  check_initializer_name(options_.kernel_initializer);
  check_initializer_name(options_.bias_initializer);
}

Shape Conv2D::kernel_shape(std::int64_t channels) const {
  return {kernel_size_[0], kernel_size_[1], channels / groups_, filters_};
}

Conv2dOptions Conv2D::conv_options(const Shape& input_shape) const {
  Conv2dOptions o;
  o.groups = groups_;
  o.activation = fused_activation(options_.activation);
  const bool same = padding_from_name(options_.padding) == Padding::same;
  for (int i = 0; i < 2; ++i) {
    o.stride[i] = options_.strides[i];
    o.dilation[i] = options_.dilation_rate[i];
    if (same) {
      const auto pad = same_padding(input_shape[1 + i], kernel_size_[i], o.stride[i], o.dilation[i]);
      o.pad_begin[i] = pad[0];
      o.pad_end[i] = pad[1];
    }
    o.stride[i] = stride_within(o.stride[i], input_shape[1 + i] + o.pad_begin[i] + o.pad_end[i]);
  }
  return o;
}

Shape Conv2D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4)
    fail("expects images [batch, height, width, channels] (channels last), got " + input_shape.to_string());
  const std::int64_t channels = input_shape[3];
  if (channels % groups_ != 0)
    fail("groups (" + std::to_string(groups_) + ") must divide the input channels, got " + input_shape.to_string());
  if (built() && !(kernel_->shape() == kernel_shape(channels)))
    fail("expects " + std::to_string(kernel_->shape()[2] * groups_) + " input channels, got " + input_shape.to_string());
  const Conv2dOptions o = conv_options(input_shape);
  std::int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const std::int64_t span = o.dilation[i] * (kernel_size_[i] - 1) + 1;
    const std::int64_t padded = input_shape[1 + i] + o.pad_begin[i] + o.pad_end[i];
    if (padded < span)
      fail("its kernel " + pair_text(kernel_size_) + " (dilation " + pair_text(options_.dilation_rate) +
           ") is larger than the input " + input_shape.to_string() + " with padding \"" + options_.padding + "\"");
    out[i] = (padded - span) / o.stride[i] + 1;
  }
  return {input_shape[0], out[0], out[1], filters_};
}

void Conv2D::build_weights(const Shape& input_shape) {
  Generator g(options_.seed ? *options_.seed : next_seed());
  kernel_ = &add_weight("kernel", initialize(options_.kernel_initializer, kernel_shape(input_shape[3]), g), true,
                        options_.kernel_regularizer, options_.kernel_constraint);
  if (options_.use_bias)
    bias_ = &add_weight("bias", initialize(options_.bias_initializer, {filters_}, g), true, options_.bias_regularizer,
                        options_.bias_constraint);
}

Variable& Conv2D::kernel() {
  if (!kernel_) fail("has no kernel until it is built (call it once, or build(input_shape))");
  return *kernel_;
}

Tensor Conv2D::call(const Tensor& x, bool /*training*/) {
  const Tensor b = bias_ ? bias_->value() : Tensor();
  Tensor y = conv2d(x, kernel_->value(), b, conv_options(x.shape()), dtype_policy().compute_dtype);
  if (options_.activation == "softmax") y = softmax(y);
  return y;
}

DepthwiseConv2D::DepthwiseConv2D(Pair kernel_size, std::int64_t depth_multiplier, Conv2DOptions options)
    : Conv2D(depth_multiplier > 0 ? depth_multiplier : 1, kernel_size,
             [&] {
               if (options.name == "conv2d") options.name = "depthwise_conv2d";
               options.groups = 1;
               return std::move(options);
             }(),
             "DepthwiseConv2D"),
      depth_multiplier_(depth_multiplier) {
  if (depth_multiplier_ <= 0) fail("depth_multiplier must be positive, got " + std::to_string(depth_multiplier_));
}

// Keras's layout [KH, KW, in, depth_multiplier] is, element for element, the grouped
// convolution's [KH, KW, 1, in * depth_multiplier] with one group per input channel.
Shape DepthwiseConv2D::kernel_shape(std::int64_t channels) const {
  return {kernel_size_[0], kernel_size_[1], channels, depth_multiplier_};
}

Shape DepthwiseConv2D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4)
    fail("expects images [batch, height, width, channels] (channels last), got " + input_shape.to_string());
  if (built() && kernel_->shape()[2] != input_shape[3])
    fail("expects " + std::to_string(kernel_->shape()[2]) + " input channels, got " + input_shape.to_string());
  // A convolution of in * depth_multiplier filters in `in` groups has the same output size.
  Shape out = Conv2D::compute_output_shape(input_shape);
  return out.with_dim(3, input_shape[3] * depth_multiplier_);
}

void DepthwiseConv2D::build_weights(const Shape& input_shape) {
  Generator g(options_.seed ? *options_.seed : next_seed());
  kernel_ = &add_weight("kernel", initialize(options_.kernel_initializer, kernel_shape(input_shape[3]), g), true,
                        options_.kernel_regularizer, options_.kernel_constraint);
  if (options_.use_bias)
    bias_ = &add_weight("bias", initialize(options_.bias_initializer, {input_shape[3] * depth_multiplier_}, g), true,
                        options_.bias_regularizer, options_.bias_constraint);
}

Tensor DepthwiseConv2D::call(const Tensor& x, bool /*training*/) {
  const std::int64_t channels = x.dim(3);
  Conv2dOptions o = conv_options(x.shape());
  o.groups = channels;
  const Tensor k = reshape(kernel_->value(), {kernel_size_[0], kernel_size_[1], 1, channels * depth_multiplier_});
  const Tensor b = bias_ ? bias_->value() : Tensor();
  Tensor y = conv2d(x, k, b, o, dtype_policy().compute_dtype);
  if (options_.activation == "softmax") y = softmax(y);
  return y;
}

namespace {

// Conv1D's options as Conv2D takes them: one row, and "causal" as "valid" on zero-padded steps.
Conv2DOptions one_row(Conv2DOptions o) {
  if (o.name == "conv2d") o.name = "conv1d";
  o.strides[0] = 1;
  o.dilation_rate[0] = 1;
  if (o.padding == "causal") o.padding = "valid";
  return o;
}

}  // namespace

Conv1D::Conv1D(std::int64_t filters, std::int64_t kernel_size, Conv2DOptions options)
    : Conv2D(filters, Pair{1, kernel_size}, one_row(options), "Conv1D"), causal_(options.padding == "causal") {}

void Conv1D::build_weights(const Shape& input_shape) {
  Conv2D::build_weights({input_shape[0], 1, input_shape[1] + causal_steps(), input_shape[2]});
}

Shape Conv1D::kernel_shape(std::int64_t channels) const { return {kernel_size_[1], channels / groups_, filters_}; }

Shape Conv1D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 3) fail("expects sequences [batch, steps, channels], got " + input_shape.to_string());
  const Shape out = Conv2D::compute_output_shape({input_shape[0], 1, input_shape[1] + causal_steps(), input_shape[2]});
  return {out[0], out[2], out[3]};
}

Tensor Conv1D::call(const Tensor& x, bool /*training*/) {
  Tensor image = reshape(x, {x.dim(0), 1, x.dim(1), x.dim(2)});
  if (causal_) image = zero_pad2d(image, 0, 0, causal_steps(), 0);
  const Shape& k = kernel_->shape();
  const Tensor b = bias_ ? bias_->value() : Tensor();
  Tensor y = conv2d(image, reshape(kernel_->value(), {1, k[0], k[1], k[2]}), b, conv_options(image.shape()),
                    dtype_policy().compute_dtype);
  y = reshape(y, {y.dim(0), y.dim(2), y.dim(3)});
  if (options_.activation == "softmax") y = softmax(y);
  return y;
}

}  // namespace dtrain::nn
