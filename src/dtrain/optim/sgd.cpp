// SGD with optional (Nesterov) momentum: one fused kernel pass (of each variable, or of all
// of them at once: sgd_update_many).
#include "dtrain/kernels/backend.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {

SGD::SGD(float learning_rate, float momentum, bool nesterov, OptimizerOptions options)
    : SGD(std::make_shared<Constant>(learning_rate), momentum, nesterov, options) {}

SGD::SGD(std::shared_ptr<LearningRateSchedule> learning_rate, float momentum, bool nesterov, OptimizerOptions options)
    : Optimizer("SGD", std::move(learning_rate), options), momentum_(momentum), nesterov_(nesterov) {
  if (!(momentum >= 0.0f && momentum <= 1.0f))
    DTRAIN_THROW(InvalidArgument, "SGD: momentum must be in [0, 1], got ", momentum);
}

std::vector<std::string> SGD::slot_names() const {
  if (momentum_ == 0.0f) return {};
  return {"momentum"};
}

kernels::SgdUpdate SGD::hyper(float lr, float grad_scale) const {
  kernels::SgdUpdate p;
  p.learning_rate = lr;
  p.momentum = momentum_;
  p.nesterov = nesterov_;
  p.weight_decay = options().weight_decay;
  p.gradient_scale = grad_scale;
  return p;
}

bool SGD::update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) {
  return kernels::backend(value.device()).sgd_update(value, g, slots.empty() ? nullptr : &slots[0], hyper(lr, grad_scale));
}

std::optional<bool> SGD::update_all(std::span<const kernels::UpdateItem> items, float lr) {
  return kernels::backend(items.front().w->device()).sgd_update_many(items, hyper(lr, 1.0f));
}

}  // namespace dtrain::optim
