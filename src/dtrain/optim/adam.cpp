// Adam and AdamW: one fused kernel pass over w, g, m and v (of each variable, or of all of
// them at once: adam_update_many).
#include "dtrain/kernels/backend.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {

Adam::Adam(float learning_rate, AdamOptions adam, OptimizerOptions options)
    : Adam("Adam", std::make_shared<Constant>(learning_rate), adam, options) {}

Adam::Adam(std::shared_ptr<LearningRateSchedule> learning_rate, AdamOptions adam, OptimizerOptions options)
    : Adam("Adam", std::move(learning_rate), adam, options) {}

Adam::Adam(std::string name, std::shared_ptr<LearningRateSchedule> learning_rate, AdamOptions adam,
           OptimizerOptions options)
    : Optimizer(std::move(name), std::move(learning_rate), options), adam_(adam) {
  if (!(adam.beta_1 >= 0.0f && adam.beta_1 < 1.0f) || !(adam.beta_2 >= 0.0f && adam.beta_2 < 1.0f))
    DTRAIN_THROW(InvalidArgument, this->name(), ": beta_1 and beta_2 must be in [0, 1), got ", adam.beta_1, " and ",
                 adam.beta_2);
  if (!(adam.epsilon > 0.0f)) DTRAIN_THROW(InvalidArgument, this->name(), ": epsilon must be positive");
}

std::vector<std::string> Adam::slot_names() const { return {"m", "v"}; }

kernels::AdamUpdate Adam::hyper(float lr, float grad_scale) const {
  kernels::AdamUpdate p;
  p.learning_rate = lr;
  p.beta_1 = adam_.beta_1;
  p.beta_2 = adam_.beta_2;
  p.epsilon = adam_.epsilon;
  p.step = iterations() + 1;
  p.weight_decay = options().weight_decay;
  p.gradient_scale = grad_scale;
  return p;
}

bool Adam::update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) {
  return kernels::backend(value.device()).adam_update(value, g, slots[0], slots[1], hyper(lr, grad_scale));
}

std::optional<bool> Adam::update_all(std::span<const kernels::UpdateItem> items, float lr) {
  return kernels::backend(items.front().w->device()).adam_update_many(items, hyper(lr, 1.0f));
}

namespace {
OptimizerOptions with_decay(OptimizerOptions o, float decay) {
  o.weight_decay = decay;
  return o;
}
}  // namespace

AdamW::AdamW(float learning_rate, float weight_decay, AdamOptions adam, OptimizerOptions options)
    : Adam("AdamW", std::make_shared<Constant>(learning_rate), adam, with_decay(options, weight_decay)) {}

AdamW::AdamW(std::shared_ptr<LearningRateSchedule> learning_rate, float weight_decay, AdamOptions adam,
             OptimizerOptions options)
    : Adam("AdamW", std::move(learning_rate), adam, with_decay(options, weight_decay)) {}

}  // namespace dtrain::optim
