// Device -> backend dispatch.
#include "dtrain/kernels/backend.h"

#include <array>
#include <atomic>

#include "dtrain/kernels/cpu_backend.h"

#if DTRAIN_CUDA
#include "dtrain/kernels/cuda/cuda_backend.h"
#endif

namespace dtrain::kernels {
namespace {

constexpr int kMaxOverrides = 8;
std::array<std::atomic<Backend*>, kMaxOverrides>& overrides() {
  static std::array<std::atomic<Backend*>, kMaxOverrides> backends{};
  return backends;
}

std::atomic<bool>& tf32() {
  static std::atomic<bool> enabled{false};
  return enabled;
}

// Each item updated in turn by `update(item, p)`, p with the item's gradient scale.
template <typename Params, typename Fn>
bool each_item(std::span<const UpdateItem> items, const Params& p, Fn update) {
  bool finite = true;
  for (const UpdateItem& item : items) {
    Params one = p;
    one.gradient_scale = item.gradient_scale;
    finite &= update(item, one);
  }
  return finite;
}

}  // namespace

bool Backend::sgd_update_many(std::span<const UpdateItem> items, const SgdUpdate& p) {
  return each_item(items, p, [&](const UpdateItem& i, const SgdUpdate& one) { return sgd_update(*i.w, *i.g, i.slot0, one); });
}

bool Backend::adam_update_many(std::span<const UpdateItem> items, const AdamUpdate& p) {
  return each_item(items, p, [&](const UpdateItem& i, const AdamUpdate& one) {
    return adam_update(*i.w, *i.g, *i.slot0, *i.slot1, one);
  });
}

bool Backend::rmsprop_update_many(std::span<const UpdateItem> items, const RmspropUpdate& p) {
  return each_item(items, p, [&](const UpdateItem& i, const RmspropUpdate& one) {
    return rmsprop_update(*i.w, *i.g, *i.slot0, i.slot1, i.slot2, one);
  });
}

Backend& backend(Device device) {
  if (device.type == DeviceType::cpu) return cpu_backend();
  if (device.index >= 0 && device.index < kMaxOverrides)
    if (Backend* b = overrides()[static_cast<std::size_t>(device.index)].load(std::memory_order_acquire)) return *b;
#if DTRAIN_CUDA
  return cuda_backend(device.index);
#else
  check_device(device);  // names what was found: no CUDA in this build
  DTRAIN_THROW(Unsupported, "no compute backend for device ", device.to_string(), " in this build");
#endif
}

void set_backend(Device device, Backend* b) {
  if (device.is_cpu() || device.index < 0 || device.index >= kMaxOverrides)
    DTRAIN_THROW(InvalidArgument, "set_backend: only the backends of cuda:0 to cuda:", kMaxOverrides - 1,
                 " can be replaced, not ", device.to_string());
  overrides()[static_cast<std::size_t>(device.index)].store(b, std::memory_order_release);
}

void set_tensor_float_32_execution(bool enabled) { tf32().store(enabled, std::memory_order_relaxed); }
bool tensor_float_32_execution() { return tf32().load(std::memory_order_relaxed); }

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
    case Primitive::all_finite: return "all_finite";
    case Primitive::softmax_cross_entropy: return "softmax_cross_entropy";
    case Primitive::softmax_cross_entropy_backward: return "softmax_cross_entropy_backward";
    case Primitive::dropout: return "dropout";
    case Primitive::argmax: return "argmax";
    case Primitive::one_hot: return "one_hot";
    case Primitive::sgd_update: return "sgd_update";
    case Primitive::adam_update: return "adam_update";
    case Primitive::rmsprop_update: return "rmsprop_update";
    case Primitive::sgd_update_many: return "sgd_update_many";
    case Primitive::adam_update_many: return "adam_update_many";
    case Primitive::rmsprop_update_many: return "rmsprop_update_many";
    case Primitive::conv2d: return "conv2d";
    case Primitive::conv2d_backward_data: return "conv2d_backward_data";
    case Primitive::conv2d_backward_weights: return "conv2d_backward_weights";
    case Primitive::pool2d: return "pool2d";
    case Primitive::pool2d_backward: return "pool2d_backward";
    case Primitive::channel_sums: return "channel_sums";
    case Primitive::channel_affine: return "channel_affine";
    case Primitive::batch_norm_coefficients: return "batch_norm_coefficients";
    case Primitive::batch_norm_gradient_coefficients: return "batch_norm_gradient_coefficients";
    case Primitive::layer_norm: return "layer_norm";
    case Primitive::layer_norm_backward: return "layer_norm_backward";
    case Primitive::copy_block: return "copy_block";
    case Primitive::attention: return "attention";
    case Primitive::attention_backward: return "attention_backward";
    case Primitive::gather_rows: return "gather_rows";
    case Primitive::scatter_add_rows: return "scatter_add_rows";
  }
  return "?";
}

}  // namespace dtrain::kernels
