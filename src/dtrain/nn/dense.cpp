// Dense layer: weights at build, one fused op per call.
#include "dtrain/nn/dense.h"

#include "dtrain/nn/initializers.h"

namespace dtrain::nn {

kernels::Activation fused_activation(const std::string& name) {
  using kernels::Activation;
  if (name == "relu") return Activation::relu;
  if (name == "sigmoid") return Activation::sigmoid;
  if (name == "tanh") return Activation::tanh;
  if (name == "gelu") return Activation::gelu;
  return Activation::linear;
}

Dense::Dense(std::int64_t units, std::string activation, DenseOptions options)
    : Layer(options.name), units_(units), activation_(std::move(activation)), options_(std::move(options)) {
  if (units_ <= 0) fail("units must be positive, got " + std::to_string(units_));
  check_activation_name(activation_);
  check_initializer_name(options_.kernel_initializer);
  check_initializer_name(options_.bias_initializer);
}

Shape Dense::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() < 2)
    fail("expects inputs of rank >= 2 ([batch, ..., features]), got " + input_shape.to_string());
  if (built() && input_shape[-1] != kernel_->shape()[0])
    fail("expects " + std::to_string(kernel_->shape()[0]) + " input features, got " + input_shape.to_string());
  return input_shape.with_dim(-1, units_);
}

void Dense::build_weights(const Shape& input_shape) {
  Generator g(options_.seed ? *options_.seed : next_seed());
  const std::int64_t in = input_shape[-1];
  kernel_ = &add_weight("kernel", initialize(options_.kernel_initializer, {in, units_}, g), true,
                        options_.kernel_regularizer, options_.kernel_constraint);
  if (options_.use_bias)
    bias_ = &add_weight("bias", initialize(options_.bias_initializer, {units_}, g), true, options_.bias_regularizer,
                        options_.bias_constraint);
}

Variable& Dense::kernel() {
  if (!kernel_) fail("has no kernel until it is built (call it once, or build(input_shape))");
  return *kernel_;
}

Tensor Dense::call(const Tensor& x, bool /*training*/) {
  const Tensor& w = kernel_->value();
  const Tensor b = bias_ ? bias_->value() : Tensor();
  Tensor y = dense(x, w, b, fused_activation(activation_), dtype_policy().compute_dtype);
  if (activation_ == "softmax") y = softmax(y);
  return y;
}

}  // namespace dtrain::nn
