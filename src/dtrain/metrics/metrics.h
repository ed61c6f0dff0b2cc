// Keras metrics: stateful accumulators with update_state / result / reset_state.
// They read predictions and never record on a tape.
#pragma once

#include <memory>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::metrics {

class Metric {
 public:
  explicit Metric(std::string name) : name_(std::move(name)) {}
  virtual ~Metric() = default;
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred) = 0;
  // The same with a weight for each row or step (an output's mask: padding weighs 0), as
  // Keras's sample_weight; the accuracies take one, the others refuse a defined one.
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight);
  virtual double result() const { return count_ == 0 ? 0.0 : total_ / count_; }
  virtual void reset_state() { total_ = count_ = 0.0; }
  const std::string& name() const { return name_; }
  // A model of several outputs names each output's metrics after it ("score_accuracy").
  void set_name(std::string name) { name_ = std::move(name); }
  // Raw accumulators, so distributed runs can sum them across replicas before result().
  double total() const { return total_; }
  double count() const { return count_; }
  void merge(double total, double count) { total_ += total; count_ += count; }

 protected:
  double total_ = 0.0;
  double count_ = 0.0;

 private:
  std::string name_;
};

// Share of rows whose arg-max equals the integer label (labels [batch] or [batch, 1]).
class SparseCategoricalAccuracy : public Metric {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy") : Metric(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override;
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
};

// Share of rows whose arg-max equals the arg-max of the one-hot target.
class CategoricalAccuracy : public Metric {
 public:
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy") : Metric(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override;
  void update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) override;
};

// The (weighted) mean of the values given: update_state(values) or update_state(value, weight).
class Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean") : Metric(std::move(name)) {}
  using Metric::update_state;
  void update_state(const Tensor& values, const Tensor& /*unused*/ = Tensor()) override;
  void update_state(double value, double weight = 1.0);
};

// "accuracy" resolves as Keras does for the loss in use: sparse labels -> sparse accuracy.
std::unique_ptr<Metric> get(const std::string& name, bool sparse_labels = true);

}  // namespace dtrain::metrics
