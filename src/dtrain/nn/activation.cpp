// Activation layer.
#include "dtrain/nn/activation.h"

namespace dtrain::nn {

Activation::Activation(std::string activation, std::string name)
    : Layer(std::move(name)), activation_(std::move(activation)) {
  check_activation_name(activation_);
}

Tensor Activation::call(const Tensor& x, bool /*training*/) { return dtrain::activation(x, activation_); }

}  // namespace dtrain::nn
