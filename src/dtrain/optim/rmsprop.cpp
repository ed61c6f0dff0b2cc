// RMSprop and Adagrad: one fused kernel pass (the backends' rmsprop_update, which takes
// Adagrad as rho 1 with a whole g² added), over all of a step's variables at once.
#include "dtrain/kernels/backend.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {

RMSprop::RMSprop(float learning_rate, RMSpropOptions rmsprop, OptimizerOptions options)
    : RMSprop(std::make_shared<Constant>(learning_rate), rmsprop, options) {}

RMSprop::RMSprop(std::shared_ptr<LearningRateSchedule> learning_rate, RMSpropOptions rmsprop, OptimizerOptions options)
    : Optimizer("RMSprop", std::move(learning_rate), options), rmsprop_(rmsprop) {
  if (!(rmsprop.rho >= 0.0f && rmsprop.rho < 1.0f))
    DTRAIN_THROW(InvalidArgument, "RMSprop: rho must be in [0, 1), got ", rmsprop.rho);
  if (!(rmsprop.momentum >= 0.0f && rmsprop.momentum < 1.0f))
    DTRAIN_THROW(InvalidArgument, "RMSprop: momentum must be in [0, 1), got ", rmsprop.momentum);
  if (!(rmsprop.epsilon > 0.0f)) DTRAIN_THROW(InvalidArgument, "RMSprop: epsilon must be positive, got ", rmsprop.epsilon);
}

std::vector<std::string> RMSprop::slot_names() const {
  std::vector<std::string> names{"velocity"};
  if (rmsprop_.momentum > 0.0f) names.emplace_back("momentum");
  if (rmsprop_.centered) names.emplace_back("average_gradient");
  return names;
}

kernels::RmspropUpdate RMSprop::hyper(float lr, float grad_scale) const {
  kernels::RmspropUpdate p;
  p.learning_rate = lr;
  p.rho = rmsprop_.rho;
  p.square_weight = 1.0f - rmsprop_.rho;
  p.momentum = rmsprop_.momentum;
  p.epsilon = rmsprop_.epsilon;
  p.weight_decay = options().weight_decay;
  p.gradient_scale = grad_scale;
  return p;
}

bool RMSprop::update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) {
  Tensor* momentum = rmsprop_.momentum > 0.0f ? &slots[1] : nullptr;
  Tensor* average = rmsprop_.centered ? &slots[momentum ? 2 : 1] : nullptr;
  return kernels::backend(value.device()).rmsprop_update(value, g, slots[0], momentum, average, hyper(lr, grad_scale));
}

std::optional<bool> RMSprop::update_all(std::span<const kernels::UpdateItem> items, float lr) {
  // The slots come in slot_names()' order: without momentum, a centered average is the second.
  remapped_.assign(items.begin(), items.end());
  for (kernels::UpdateItem& item : remapped_) {
    Tensor* second = item.slot1;
    item.slot1 = rmsprop_.momentum > 0.0f ? second : nullptr;
    item.slot2 = rmsprop_.centered ? (rmsprop_.momentum > 0.0f ? item.slot2 : second) : nullptr;
  }
  return kernels::backend(items.front().w->device()).rmsprop_update_many(remapped_, hyper(lr, 1.0f));
}

Adagrad::Adagrad(float learning_rate, float initial_accumulator_value, float epsilon, OptimizerOptions options)
    : Adagrad(std::make_shared<Constant>(learning_rate), initial_accumulator_value, epsilon, options) {}

Adagrad::Adagrad(std::shared_ptr<LearningRateSchedule> learning_rate, float initial_accumulator_value, float epsilon,
                 OptimizerOptions options)
    : Optimizer("Adagrad", std::move(learning_rate), options), initial_(initial_accumulator_value), epsilon_(epsilon) {
  if (!(initial_accumulator_value >= 0.0f))
    DTRAIN_THROW(InvalidArgument, "Adagrad: initial_accumulator_value must be >= 0, got ", initial_accumulator_value);
  if (!(epsilon > 0.0f)) DTRAIN_THROW(InvalidArgument, "Adagrad: epsilon must be positive, got ", epsilon);
}

kernels::RmspropUpdate Adagrad::hyper(float lr, float grad_scale) const {
  kernels::RmspropUpdate p;
  p.learning_rate = lr;
  p.rho = 1.0f;
  p.square_weight = 1.0f;
  p.epsilon = epsilon_;
  p.weight_decay = options().weight_decay;
  p.gradient_scale = grad_scale;
  return p;
}

bool Adagrad::update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) {
  return kernels::backend(value.device()).rmsprop_update(value, g, slots[0], nullptr, nullptr, hyper(lr, grad_scale));
}

std::optional<bool> Adagrad::update_all(std::span<const kernels::UpdateItem> items, float lr) {
  return kernels::backend(items.front().w->device()).rmsprop_update_many(items, hyper(lr, 1.0f));
}

}  // namespace dtrain::optim
