// Metric accumulation through the backend's argmax.
#include "dtrain/metrics/metrics.h"

#include <algorithm>

#include <vector>

#include "dtrain/kernels/backend.h"

namespace dtrain::metrics {
namespace {

// Each row's class, computed on the predictions' device and read on the host.
Tensor argmax_of(const Tensor& y_pred, const std::string& metric) {
  y_pred.check_dtype(DType::f32, metric.c_str());
  if (y_pred.rank() != 2)
    DTRAIN_THROW(InvalidArgument, metric, ": predictions must be [batch, classes], got ", y_pred.shape().to_string());
  Tensor idx = Tensor::empty({y_pred.dim(0)}, DType::i32, y_pred.device());
  kernels::backend(y_pred.device()).argmax(y_pred, idx);
  return idx.to(Device::cpu());
}

}  // namespace

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
  // A sequence's predictions [batch, steps, ..., classes]: every step counts.
  if (y_pred.rank() >= 3) {
    const std::int64_t classes = y_pred.dim(-1), steps = y_pred.numel() / std::max<std::int64_t>(classes, 1);
    if (!y_true.defined() || y_true.numel() != steps)
      DTRAIN_THROW(InvalidArgument, name(), ": labels ", y_true.defined() ? y_true.shape().to_string() : "undefined",
                   " do not match predictions ", y_pred.shape().to_string());
    update_state(y_true.reshape({steps}), y_pred.reshape({steps, classes}));
    return;
  }
  const Tensor pred = argmax_of(y_pred, name());
  y_true.check_defined(name().c_str());
  if (y_true.numel() != y_pred.dim(0) || (y_true.rank() == 2 && y_true.dim(1) != 1) || y_true.rank() > 2)
    DTRAIN_THROW(InvalidArgument, name(), ": labels ", y_true.shape().to_string(), " do not match predictions ",
                 y_pred.shape().to_string());
  const std::int32_t* p = pred.data<std::int32_t>();
  const std::int64_t n = pred.numel();
  double correct = 0;
  if (y_true.dtype() == DType::i32) {  // the usual case, without a conversion
    const Tensor on_host = y_true.to(Device::cpu());
    const std::int32_t* labels = on_host.data<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) correct += p[i] == labels[i] ? 1 : 0;
  } else {
    const std::vector<float> labels = y_true.to_vector();
    for (std::int64_t i = 0; i < n; ++i) correct += static_cast<float>(p[i]) == labels[i] ? 1 : 0;
  }
  total_ += correct;
  count_ += static_cast<double>(n);
}

void CategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
  if (!(y_true.shape() == y_pred.shape()))
    DTRAIN_THROW(InvalidArgument, name(), ": targets ", y_true.shape().to_string(), " and predictions ",
                 y_pred.shape().to_string(), " differ in shape");
  const Tensor pred = argmax_of(y_pred, name());
  const Tensor want = argmax_of(y_true, name());
  const std::int32_t* p = pred.data<std::int32_t>();
  const std::int32_t* w = want.data<std::int32_t>();
  double correct = 0;
  for (std::int64_t i = 0; i < pred.numel(); ++i) correct += p[i] == w[i] ? 1 : 0;
  total_ += correct;
  count_ += static_cast<double>(pred.numel());
}

void Mean::update_state(const Tensor& values, const Tensor&) {
  for (float v : values.to_vector()) update_state(static_cast<double>(v));
}

void Mean::update_state(double value, double weight) {
  total_ += value * weight;
  count_ += weight;
}

std::unique_ptr<Metric> get(const std::string& name, bool sparse_labels) {
  if (name == "accuracy" || name == "acc")
    return sparse_labels ? std::unique_ptr<Metric>(std::make_unique<SparseCategoricalAccuracy>("accuracy"))
                         : std::make_unique<CategoricalAccuracy>("accuracy");
  if (name == "sparse_categorical_accuracy") return std::make_unique<SparseCategoricalAccuracy>();
  if (name == "categorical_accuracy") return std::make_unique<CategoricalAccuracy>();
  if (name == "mean") return std::make_unique<Mean>();
  DTRAIN_THROW(InvalidArgument, "unknown metric '", name,
               "'; expected accuracy, sparse_categorical_accuracy, categorical_accuracy or mean");
}

}  // namespace dtrain::metrics
