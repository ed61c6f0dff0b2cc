// SGD with optional (Nesterov) momentum: one fused kernel pass per variable.
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

bool SGD::update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) {
  kernels::SgdUpdate p;
  p.learning_rate = lr;
  p.momentum = momentum_;
  p.nesterov = nesterov_;
  p.weight_decay = options().weight_decay;
  p.gradient_scale = grad_scale;
  return kernels::backend(value.device())
      .sgd_update(value, g, slots.empty() ? nullptr : &slots[0], p);
}

}  // namespace dtrain::optim
