// Metric accumulation through the backend's argmax.
#include "dtrain/metrics/metrics.h"

#include <algorithm>

#include <vector>

#include "dtrain/kernels/backend.h"

namespace dtrain::metrics {
namespace {

void check_predictions(const Tensor& y_pred, const std::string& metric) {
  y_pred.check_dtype(DType::f32, metric.c_str());
  if (y_pred.rank() != 2)
    DTRAIN_THROW(InvalidArgument, metric, ": predictions must be [batch, classes], got ", y_pred.shape().to_string());
}

// Each row's class, computed on the predictions' device and read on the host.
Tensor argmax_of(const Tensor& y_pred, const std::string& metric) {
  check_predictions(y_pred, metric);
  Tensor idx = Tensor::empty({y_pred.dim(0)}, DType::i32, y_pred.device());
  kernels::backend(y_pred.device()).argmax(y_pred, idx);
  return idx.to(Device::cpu());
}

// On a GPU: each row's class of y_pred [n, classes] in row 0 and `second` in row 1, on the
// host, read with one copy (one wait for the GPU where two reads would wait twice).
// `second` is int32 labels of n values, or (distribution) targets like y_pred whose
// classes are taken too; both on y_pred's device.
Tensor classes_beside(const Tensor& y_pred, const Tensor& second, bool distribution, const std::string& metric) {
  check_predictions(y_pred, metric);
  if (distribution) check_predictions(second, metric);
  const std::int64_t n = y_pred.dim(0);
  Tensor both = Tensor::empty({2, n}, DType::i32, y_pred.device());
  Tensor top = both.slice(0, 1).reshape({n}), bottom = both.slice(1, 2).reshape({n});
  kernels::Backend& b = kernels::backend(y_pred.device());
  b.argmax(y_pred, top);
  if (distribution) b.argmax(second, bottom);
  else bottom.copy_from(second.reshape({n}));
  return both.to(Device::cpu());
}

// Each row's weight as doubles on the host (n rows), or empty for none; a weight of another
// count is an error naming the metric.
std::vector<double> row_weights(const Tensor& sample_weight, std::int64_t n, const std::string& metric) {
  if (!sample_weight.defined()) return {};
  if (sample_weight.numel() != n)
    DTRAIN_THROW(InvalidArgument, metric, ": ", sample_weight.numel(), " weights ", sample_weight.shape().to_string(),
                 " for ", n, " predictions (give one per row or step)");
  const std::vector<float> w = sample_weight.to_vector();
  return {w.begin(), w.end()};
}

}  // namespace

void Metric::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  if (sample_weight.defined())
    DTRAIN_THROW(InvalidArgument, name(), ": this metric takes no weights (a masked output's steps); ",
                 "use accuracy, or no mask");
  update_state(y_true, y_pred);
}

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
  update_state(y_true, y_pred, Tensor());
}

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  // A sequence's predictions [batch, steps, ..., classes]: every step counts.
  if (y_pred.rank() >= 3) {
    const std::int64_t classes = y_pred.dim(-1), steps = y_pred.numel() / std::max<std::int64_t>(classes, 1);
    if (!y_true.defined() || y_true.numel() != steps)
      DTRAIN_THROW(InvalidArgument, name(), ": labels ", y_true.defined() ? y_true.shape().to_string() : "undefined",
                   " do not match predictions ", y_pred.shape().to_string());
    update_state(y_true.reshape({steps}), y_pred.reshape({steps, classes}),
                 sample_weight.defined() ? sample_weight.reshape({sample_weight.numel()}) : Tensor());
    return;
  }
  check_predictions(y_pred, name());
  y_true.check_defined(name().c_str());
  if (y_true.numel() != y_pred.dim(0) || (y_true.rank() == 2 && y_true.dim(1) != 1) || y_true.rank() > 2)
    DTRAIN_THROW(InvalidArgument, name(), ": labels ", y_true.shape().to_string(), " do not match predictions ",
                 y_pred.shape().to_string());
  // Labels beside the predictions on a GPU: both read with one copy.
  const bool beside = !y_pred.device().is_cpu() && y_true.device() == y_pred.device() && y_true.dtype() == DType::i32;
  const Tensor pred = beside ? classes_beside(y_pred, y_true, false, name()) : argmax_of(y_pred, name());
  const std::int64_t n = y_pred.dim(0);
  const std::int32_t* p = pred.data<std::int32_t>();
  const std::vector<double> w = row_weights(sample_weight, n, name());
  auto weight = [&](std::int64_t i) { return w.empty() ? 1.0 : w[static_cast<std::size_t>(i)]; };
  double correct = 0, count = 0;
  if (y_true.dtype() == DType::i32) {  // the usual case, without a conversion
    const Tensor on_host = beside ? pred : y_true.to(Device::cpu());
    const std::int32_t* labels = beside ? p + n : on_host.data<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) correct += p[i] == labels[i] ? weight(i) : 0.0;
  } else {
    const std::vector<float> labels = y_true.to_vector();
    for (std::int64_t i = 0; i < n; ++i) correct += static_cast<float>(p[i]) == labels[i] ? weight(i) : 0.0;
  }
  for (std::int64_t i = 0; i < n; ++i) count += weight(i);
  total_ += correct;
  count_ += count;
}

void CategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred) {
  update_state(y_true, y_pred, Tensor());
}

void CategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  if (!(y_true.shape() == y_pred.shape()))
    DTRAIN_THROW(InvalidArgument, name(), ": targets ", y_true.shape().to_string(), " and predictions ",
                 y_pred.shape().to_string(), " differ in shape");
  if (y_pred.rank() >= 3) {  // a sequence's: every step counts
    const std::int64_t classes = y_pred.dim(-1), steps = y_pred.numel() / std::max<std::int64_t>(classes, 1);
    update_state(y_true.reshape({steps, classes}), y_pred.reshape({steps, classes}),
                 sample_weight.defined() ? sample_weight.reshape({sample_weight.numel()}) : Tensor());
    return;
  }
  // Both classes on a GPU read with one copy.
  const bool beside = !y_pred.device().is_cpu() && y_true.device() == y_pred.device();
  const Tensor pred = beside ? classes_beside(y_pred, y_true, true, name()) : argmax_of(y_pred, name());
  const Tensor want = beside ? pred : argmax_of(y_true, name());
  const std::int64_t n = y_pred.dim(0);
  const std::int32_t* p = pred.data<std::int32_t>();
  const std::int32_t* t = beside ? p + n : want.data<std::int32_t>();
  const std::vector<double> w = row_weights(sample_weight, n, name());
  double correct = 0, count = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double weight = w.empty() ? 1.0 : w[static_cast<std::size_t>(i)];
    correct += p[i] == t[i] ? weight : 0.0;
    count += weight;
  }
  total_ += correct;
  count_ += count;
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
