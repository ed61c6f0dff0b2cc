// Device -> backend dispatch.
#include "dtrain/kernels/backend.h"

#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::kernels {

Backend& backend(Device device) {
  if (device.type == DeviceType::cpu) return cpu_backend();
  DTRAIN_THROW(Unsupported, "no compute backend for device ", device.to_string(),
               " in this build");
}

const char* primitive_name(Primitive op) {
  switch (op) {
    case Primitive::matmul: return "matmul";
    case Primitive::unary: return "unary";
    case Primitive::unary_backward: return "unary_backward";
    case Primitive::binary: return "binary";
    case Primitive::reduce: return "reduce";
    case Primitive::softmax: return "softmax";
    case Primitive::softmax_backward: return "softmax_backward";
    case Primitive::convert: return "convert";
    case Primitive::fill: return "fill";
    case Primitive::axpby: return "axpby";
    case Primitive::sum_squares: return "sum_squares";
    case Primitive::softmax_cross_entropy: return "softmax_cross_entropy";
    case Primitive::softmax_cross_entropy_backward: return "softmax_cross_entropy_backward";
    case Primitive::dropout: return "dropout";
    case Primitive::argmax: return "argmax";
    case Primitive::one_hot: return "one_hot";
    case Primitive::sgd_update: return "sgd_update";
    case Primitive::adam_update: return "adam_update";
    case Primitive::conv2d: return "conv2d";
    case Primitive::conv2d_backward_data: return "conv2d_backward_data";
    case Primitive::conv2d_backward_weights: return "conv2d_backward_weights";
    case Primitive::pool2d: return "pool2d";
    case Primitive::pool2d_backward: return "pool2d_backward";
    case Primitive::channel_sums: return "channel_sums";
    case Primitive::channel_affine: return "channel_affine";
    case Primitive::layer_norm: return "layer_norm";
    case Primitive::layer_norm_backward: return "layer_norm_backward";
    case Primitive::copy_block: return "copy_block";
  }
  return "?";
}

}  // namespace dtrain::kernels
