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
  }
  return "?";
}

}  // namespace dtrain::kernels
