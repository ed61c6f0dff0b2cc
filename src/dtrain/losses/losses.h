// Keras losses: a Loss computes a per-example loss with call() and reduces it as its
// Reduction says. The strategies need "none" (per-example) so that they can divide by
// the global batch instead of the per-replica one.
#pragma once

#include <memory>
#include <string>

#include "dtrain/autograd/ops.h"

namespace dtrain::losses {

enum class Reduction { sum_over_batch_size, sum, none };
Reduction reduction_from_name(const std::string& name);  // "sum_over_batch_size", "sum", "none", "auto"
const char* reduction_name(Reduction r);

class Loss {
 public:
  Loss(Reduction reduction, std::string name) : reduction_(reduction), name_(std::move(name)) {}
  virtual ~Loss() = default;

  // The reduced loss: a scalar, or [batch] with Reduction::none.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const;
  // The same with each example's loss weighted by `sample_weight` (a scalar, [batch] or
  // [batch, 1], or a weight per loss value where an example has several) before the
  // reduction, as Keras weighs them: sum_over_batch_size divides the weighted sum by the
  // number of loss values, not by the weights' sum.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) const;
  // Per-example losses [batch].
  virtual Tensor call(const Tensor& y_true, const Tensor& y_pred) const = 0;

  Reduction reduction() const { return reduction_; }
  const std::string& name() const { return name_; }

 private:
  Tensor reduced(const Tensor& per_example) const;

  Reduction reduction_;
  std::string name_;
};

// y_true: integer class ids [batch] (int32, or float holding integers, or [batch, 1]);
// y_pred: [batch, classes] logits or probabilities.
class SparseCategoricalCrossentropy : public Loss {
 public:
  explicit SparseCategoricalCrossentropy(bool from_logits = false,
                                         Reduction reduction = Reduction::sum_over_batch_size,
                                         std::string name = "sparse_categorical_crossentropy");
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  bool from_logits() const { return from_logits_; }

 private:
  bool from_logits_;
};

// y_true: one-hot or distributions [batch, classes].
class CategoricalCrossentropy : public Loss {
 public:
  explicit CategoricalCrossentropy(bool from_logits = false, float label_smoothing = 0.0f,
                                   Reduction reduction = Reduction::sum_over_batch_size,
                                   std::string name = "categorical_crossentropy");
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
  bool from_logits() const { return from_logits_; }
  float label_smoothing() const { return label_smoothing_; }

 private:
  bool from_logits_;
  float label_smoothing_;
};

// mean((y_pred - y_true)^2) over the last axis.
class MeanSquaredError : public Loss {
 public:
  explicit MeanSquaredError(Reduction reduction = Reduction::sum_over_batch_size,
                            std::string name = "mean_squared_error");
  Tensor call(const Tensor& y_true, const Tensor& y_pred) const override;
};

// Keras names and aliases: "sparse_categorical_crossentropy", "categorical_crossentropy",
// "mse" / "mean_squared_error".
std::unique_ptr<Loss> get(const std::string& name, bool from_logits = false);

// Keras's epsilon for clipping probabilities.
inline constexpr float kEpsilon = 1e-7f;

}  // namespace dtrain::losses
