// Losses composed from autograd ops; cross-entropy from logits uses the fused kernel.
#include "dtrain/losses/losses.h"

#include <algorithm>

#include <cmath>
#include <vector>

namespace dtrain::losses {
namespace {

// Class ids as int32 [batch]; accepts [batch, 1] and float-typed integer labels (Keras does).
Tensor sparse_labels(const Tensor& y_true, const Tensor& y_pred, const std::string& loss) {
  y_true.check_defined(loss.c_str());
  Tensor labels = y_true;
  if (labels.rank() == 2 && labels.dim(1) == 1) labels = labels.reshape({labels.dim(0)});
  if (labels.rank() != 1 || y_pred.rank() != 2 || labels.dim(0) != y_pred.dim(0))
    DTRAIN_THROW(InvalidArgument, loss, ": labels ", y_true.shape().to_string(), " do not match predictions ",
                 y_pred.shape().to_string(), " (expected labels [batch] and predictions [batch, classes])");
  if (labels.dtype() != DType::i32) {
    const std::vector<float> v = labels.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      if (!(v[i] >= 0.0f && v[i] < 2147483648.0f) || v[i] != std::floor(v[i]))
        DTRAIN_THROW(InvalidArgument, loss, ": label ", v[i], " at row ", i, " is not an integer class id");
    labels = labels.astype(DType::i32);
  }
  return labels;
}

}  // namespace

Reduction reduction_from_name(const std::string& name) {
  if (name == "sum_over_batch_size" || name == "auto") return Reduction::sum_over_batch_size;
  if (name == "sum") return Reduction::sum;
  if (name == "none") return Reduction::none;
  DTRAIN_THROW(InvalidArgument, "unknown loss reduction '", name, "'; expected sum_over_batch_size, sum or none");
}

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::sum_over_batch_size: return "sum_over_batch_size";
    case Reduction::sum: return "sum";
    case Reduction::none: return "none";
  }
  return "?";
}

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred) const {
  y_pred.check_defined(name_.c_str());
  return reduced(call(y_true, y_pred));
}

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) const {
  y_pred.check_defined(name_.c_str());
  sample_weight.check_defined(name_.c_str());
  const Tensor per_example = call(y_true, y_pred);
  // The weights join the losses' device (given from the host for a model on a GPU).
  Tensor weight = (sample_weight.dtype() == DType::f32 ? sample_weight : sample_weight.astype(DType::f32))
                      .to(per_example.device());
  if (weight.numel() == 1) return reduced(mul(per_example, weight.rank() > 0 ? reshape(weight, Shape{}) : weight));
  std::vector<std::int64_t> dims = weight.shape().to_vector();
  if (weight.rank() == per_example.rank() + 1 && dims.back() == 1) dims.pop_back();  // [batch, 1] for [batch]
  // As in Keras, a weight per example weighs every loss value of it (losses [batch, steps]
  // and a weight [batch] or [batch, 1]); or a weight per loss value.
  const auto losses = per_example.shape().dims();
  bool fits = dims.size() <= losses.size();
  dims.resize(losses.size(), 1);
  for (std::size_t i = 0; fits && i < dims.size(); ++i) fits = dims[i] == losses[i] || dims[i] == 1;
  if (!fits)
    DTRAIN_THROW(InvalidArgument, name_, ": sample_weight of shape ", sample_weight.shape().to_string(),
                 " does not fit the batch's ", per_example.shape().to_string(), " losses (give one weight per example, ",
                 "one per loss value, or one for all)");
  return reduced(mul(per_example, reshape(weight, Shape(dims))));
}

Tensor Loss::reduced(const Tensor& per_example) const {
  switch (reduction_) {
    case Reduction::none: return per_example;
    case Reduction::sum: return reduce_sum(per_example);
    case Reduction::sum_over_batch_size:
      // An empty batch has loss 0, not NaN.
      if (per_example.numel() == 0) return Tensor::scalar(0.0f).to(per_example.device());
      return reduce_mean(per_example);
  }
  return per_example;
}

SparseCategoricalCrossentropy::SparseCategoricalCrossentropy(bool from_logits, Reduction reduction, std::string name)
    : Loss(reduction, std::move(name)), from_logits_(from_logits) {}

Tensor SparseCategoricalCrossentropy::call(const Tensor& y_true, const Tensor& y_pred) const {
  // A sequence's predictions [batch, steps, ..., classes] with labels [batch, steps, ...]:
  // a loss per step ([batch, steps, ...]), as Keras gives it, which the reduction averages.
  if (y_pred.rank() >= 3) {
    y_true.check_defined(name().c_str());
    const std::int64_t classes = y_pred.dim(-1), steps = y_pred.numel() / std::max<std::int64_t>(classes, 1);
    Shape per_step(std::vector<std::int64_t>(y_pred.shape().dims().begin(), y_pred.shape().dims().end() - 1));
    if (y_true.numel() != steps || (!(y_true.shape() == per_step) && !(y_true.shape() == y_pred.shape().with_dim(-1, 1))))
      DTRAIN_THROW(InvalidArgument, name(), ": labels ", y_true.shape().to_string(), " do not match predictions ",
                   y_pred.shape().to_string(), " (expected labels ", per_step.to_string(), ")");
    const Tensor flat = call(y_true.reshape({steps}), reshape(y_pred, {steps, classes}));
    return reshape(flat, per_step);
  }
  const Tensor labels = sparse_labels(y_true, y_pred, name());
  if (from_logits_) return softmax_cross_entropy_with_logits(labels, y_pred);
  // Keras: log of the clipped probabilities, used as logits (which renormalises them).
  return softmax_cross_entropy_with_logits(labels, log(clip_by_value(y_pred, kEpsilon, 1.0f - kEpsilon)));
}

CategoricalCrossentropy::CategoricalCrossentropy(bool from_logits, float label_smoothing, Reduction reduction,
                                                 std::string name)
    : Loss(reduction, std::move(name)), from_logits_(from_logits), label_smoothing_(label_smoothing) {
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    DTRAIN_THROW(InvalidArgument, this->name(), ": label_smoothing ", label_smoothing, " must be in [0, 1]");
}

Tensor CategoricalCrossentropy::call(const Tensor& y_true, const Tensor& y_pred) const {
  y_true.check_defined(name().c_str());
  if (y_true.dtype() != DType::f32 && y_pred.rank() == 2 &&
      (y_true.rank() == 1 || (y_true.rank() == 2 && y_true.dim(1) == 1 && y_pred.dim(1) != 1)))
    DTRAIN_THROW(InvalidArgument, name(), ": the targets are class numbers (", dtype_name(y_true.dtype()), " ",
                 y_true.shape().to_string(), ") where it needs one-hot rows like the predictions ",
                 y_pred.shape().to_string(), "; sparse_categorical_crossentropy takes class numbers");
  y_true.check_dtype(DType::f32, name().c_str());
  if (y_pred.rank() != 2 || !(y_true.shape() == y_pred.shape()))
    DTRAIN_THROW(InvalidArgument, name(), ": targets ", y_true.shape().to_string(), " do not match predictions ",
                 y_pred.shape().to_string(), " (both must be [batch, classes])");
  Tensor target = y_true;
  if (label_smoothing_ > 0.0f)
    target = affine(y_true, 1.0f - label_smoothing_, label_smoothing_ / static_cast<float>(y_pred.dim(1)));
  if (from_logits_) return softmax_cross_entropy_with_logits(target, y_pred);
  // Keras: normalise each row to sum 1, clip, then -sum(target * log(p)).
  Tensor p = div(y_pred, reduce_sum(y_pred, {-1}, true));
  p = clip_by_value(p, kEpsilon, 1.0f - kEpsilon);
  return -reduce_sum(mul(target, log(p)), {-1});
}

MeanSquaredError::MeanSquaredError(Reduction reduction, std::string name) : Loss(reduction, std::move(name)) {}

Tensor MeanSquaredError::call(const Tensor& y_true, const Tensor& y_pred) const {
  y_true.check_dtype(DType::f32, name().c_str());
  if (!(y_true.shape() == y_pred.shape()))
    DTRAIN_THROW(InvalidArgument, name(), ": targets ", y_true.shape().to_string(), " and predictions ",
                 y_pred.shape().to_string(), " differ in shape");
  Tensor sq = square(sub(y_pred, y_true));
  if (sq.rank() <= 1) return sq;  // one value per example already
  return reduce_mean(sq, {-1});
}

std::unique_ptr<Loss> get(const std::string& name, bool from_logits) {
  if (name == "sparse_categorical_crossentropy") return std::make_unique<SparseCategoricalCrossentropy>(from_logits);
  if (name == "categorical_crossentropy") return std::make_unique<CategoricalCrossentropy>(from_logits);
  if (name == "mse" || name == "mean_squared_error") return std::make_unique<MeanSquaredError>();
  DTRAIN_THROW(InvalidArgument, "unknown loss '", name,
               "'; expected sparse_categorical_crossentropy, categorical_crossentropy or mean_squared_error");
}

}  // namespace dtrain::losses
