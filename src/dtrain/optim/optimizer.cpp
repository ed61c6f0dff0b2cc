// The optimizer step: validation, clipping scales, slots, and the per-variable update.
#include "dtrain/optim/optimizer.h"

#include <cmath>

#include "dtrain/kernels/backend.h"

namespace dtrain::optim {

Optimizer::Optimizer(std::string name, std::shared_ptr<LearningRateSchedule> learning_rate, OptimizerOptions options)
    : name_(std::move(name)), options_(options) {
  set_learning_rate(std::move(learning_rate));
  if (options_.clipnorm && !(*options_.clipnorm > 0.0f))
    DTRAIN_THROW(InvalidArgument, name_, ": clipnorm must be positive, got ", *options_.clipnorm);
  if (options_.global_clipnorm && !(*options_.global_clipnorm > 0.0f))
    DTRAIN_THROW(InvalidArgument, name_, ": global_clipnorm must be positive, got ", *options_.global_clipnorm);
  if (options_.clipnorm && options_.global_clipnorm)
    DTRAIN_THROW(InvalidArgument, name_, ": set clipnorm or global_clipnorm, not both");
  if (!(options_.weight_decay >= 0.0f))
    DTRAIN_THROW(InvalidArgument, name_, ": weight_decay must be >= 0, got ", options_.weight_decay);
}

void Optimizer::set_learning_rate(std::shared_ptr<LearningRateSchedule> schedule) {
  if (!schedule) DTRAIN_THROW(InvalidArgument, name_, ": learning rate schedule is null");
  learning_rate_ = std::move(schedule);
}

void Optimizer::apply_gradients(const std::vector<std::pair<Tensor, Variable*>>& grads_and_vars) {
  std::vector<Tensor> grads;
  std::vector<Variable*> vars;
  grads.reserve(grads_and_vars.size());
  vars.reserve(grads_and_vars.size());
  for (const auto& [g, v] : grads_and_vars) {
    grads.push_back(g);
    vars.push_back(v);
  }
  apply_gradients(grads, vars);
}

void Optimizer::apply_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars) {
  if (grads.size() != vars.size())
    DTRAIN_THROW(InvalidArgument, name_, ": ", grads.size(), " gradients given for ", vars.size(), " variables");
  // Validate everything before changing anything, so a bad call leaves the model intact.
  for (size_t i = 0; i < vars.size(); ++i) {
    if (vars[i] == nullptr) DTRAIN_THROW(InvalidArgument, name_, ": variable ", i, " is null");
    for (size_t j = 0; j < i; ++j)
      if (vars[j] == vars[i])
        DTRAIN_THROW(InvalidArgument, name_, ": variable '", vars[i]->name(), "' is given twice; it would be updated twice");
    if (!grads[i].defined()) continue;
    if (vars[i]->dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, name_, ": variable '", vars[i]->name(), "' is ", dtype_name(vars[i]->dtype()),
                   "; optimizers update float32 variables");
    if (!(grads[i].shape() == vars[i]->shape()) || grads[i].dtype() != vars[i]->dtype() ||
        !(grads[i].device() == vars[i]->value_device()))
      DTRAIN_THROW(InvalidArgument, name_, ": gradient ", dtype_name(grads[i].dtype()), " ",
                   grads[i].shape().to_string(), " does not match variable '", vars[i]->name(), "' ",
                   dtype_name(vars[i]->dtype()), " ", vars[i]->shape().to_string());
  }
  // Norms cost a pass over every gradient, so they are computed only when clipping needs them.
  if (options_.clipnorm || options_.global_clipnorm) {
    auto& be = kernels::backend();
    norms_.assign(vars.size(), 0.0);  // the member keeps its capacity: no allocation per step
    double total = 0.0;
    for (size_t i = 0; i < vars.size(); ++i) {
      if (!grads[i].defined()) continue;
      norms_[i] = be.sum_squares(grads[i]);
      total += norms_[i];
    }
    last_global_norm_ = std::sqrt(total);
  }
  float global_scale = 1.0f;
  if (options_.global_clipnorm && last_global_norm_ > *options_.global_clipnorm)
    global_scale = static_cast<float>(*options_.global_clipnorm / last_global_norm_);

  const float lr = learning_rate();
  if (slot_count_ < 0) slot_count_ = static_cast<int>(slot_names().size());  // fixed at construction
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!grads[i].defined()) continue;
    float scale = global_scale;
    if (options_.clipnorm) {
      const double norm = std::sqrt(norms_[i]);
      if (norm > *options_.clipnorm) scale = static_cast<float>(*options_.clipnorm / norm);
    }
    auto& slots = slots_[vars[i]->id()];
    if (slots.empty())  // first update of this variable
      for (int s = 0; s < slot_count_; ++s) slots.push_back(Tensor::zeros(vars[i]->shape()));
    update(*vars[i], grads[i], slots, lr, scale);
  }
  ++iterations_;
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::slots(const Variable& v) {
  std::vector<std::pair<std::string, Tensor*>> out;
  auto it = slots_.find(v.id());
  if (it == slots_.end()) return out;
  const std::vector<std::string> names = slot_names();
  for (size_t i = 0; i < names.size() && i < it->second.size(); ++i) out.emplace_back(names[i], &it->second[i]);
  return out;
}

std::unique_ptr<Optimizer> get(const std::string& name) {
  if (name == "sgd") return std::make_unique<SGD>();
  if (name == "adam") return std::make_unique<Adam>();
  if (name == "adamw") return std::make_unique<AdamW>();
  DTRAIN_THROW(InvalidArgument, "unknown optimizer '", name, "'; expected sgd, adam or adamw");
}

}  // namespace dtrain::optim
