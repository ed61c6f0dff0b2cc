// Schedule formulas (the same as tf.keras.optimizers.schedules).
#include "dtrain/optim/schedules.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "dtrain/core/error.h"

namespace dtrain::optim {
namespace {

// Every rate a schedule gives is one of these, or between two of them: a negative one
// would climb the loss, and a NaN would make every weight NaN.
void check_rate(const char* schedule, const char* what, float rate) {
  if (!(rate >= 0.0f) || !std::isfinite(rate))
    DTRAIN_THROW(InvalidArgument, schedule, ": ", what, " must be a finite number >= 0, got ", rate);
}

}  // namespace

Constant::Constant(float learning_rate) : learning_rate_(learning_rate) {
  check_rate("Constant", "learning rate", learning_rate);
}
std::string Constant::describe() const { return dtrain::detail::concat("Constant(", learning_rate_, ")"); }

ExponentialDecay::ExponentialDecay(float initial, std::int64_t decay_steps, float decay_rate, bool staircase)
    : initial_(initial), decay_steps_(decay_steps), decay_rate_(decay_rate), staircase_(staircase) {
  if (decay_steps <= 0) DTRAIN_THROW(InvalidArgument, "ExponentialDecay: decay_steps must be positive, got ", decay_steps);
  if (!(decay_rate > 0.0f) || !std::isfinite(decay_rate))
    DTRAIN_THROW(InvalidArgument, "ExponentialDecay: decay_rate must be a finite number > 0, got ", decay_rate);
  check_rate("ExponentialDecay", "initial_learning_rate", initial);
}

float ExponentialDecay::operator()(std::int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(decay_steps_);
  if (staircase_) p = std::floor(p);
  return static_cast<float>(initial_ * std::pow(static_cast<double>(decay_rate_), p));
}

std::string ExponentialDecay::describe() const {
  return dtrain::detail::concat("ExponentialDecay(", initial_, ", ", decay_steps_, ", ", decay_rate_,
                        staircase_ ? ", staircase)" : ")");
}

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<float> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  if (values_.size() != boundaries_.size() + 1)
    DTRAIN_THROW(InvalidArgument, "PiecewiseConstantDecay: needs one more value than boundaries, got ",
                 boundaries_.size(), " boundaries and ", values_.size(), " values");
  if (!std::is_sorted(boundaries_.begin(), boundaries_.end()))
    DTRAIN_THROW(InvalidArgument, "PiecewiseConstantDecay: boundaries must be increasing");
  for (const float v : values_) check_rate("PiecewiseConstantDecay", "each of values", v);
}

float PiecewiseConstantDecay::operator()(std::int64_t step) const {
  for (size_t i = 0; i < boundaries_.size(); ++i)
    if (step <= boundaries_[i]) return values_[i];
  return values_.back();
}

std::string PiecewiseConstantDecay::describe() const {
  std::ostringstream o;
  o << "PiecewiseConstantDecay(" << boundaries_.size() << " boundaries)";
  return o.str();
}

CosineDecay::CosineDecay(float initial, std::int64_t decay_steps, float alpha)
    : initial_(initial), decay_steps_(decay_steps), alpha_(alpha) {
  if (decay_steps <= 0) DTRAIN_THROW(InvalidArgument, "CosineDecay: decay_steps must be positive, got ", decay_steps);
  check_rate("CosineDecay", "initial_learning_rate", initial);
  check_rate("CosineDecay", "alpha", alpha);  // its last rate's fraction of the first
}

float CosineDecay::operator()(std::int64_t step) const {
  const double t = static_cast<double>(std::min(step, decay_steps_)) / static_cast<double>(decay_steps_);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  return static_cast<float>(initial_ * ((1.0 - alpha_) * cosine + alpha_));
}

std::string CosineDecay::describe() const {
  return dtrain::detail::concat("CosineDecay(", initial_, ", ", decay_steps_, ", alpha=", alpha_, ")");
}

LinearWarmup::LinearWarmup(std::shared_ptr<LearningRateSchedule> after, std::int64_t warmup_steps, float initial)
    : after_(std::move(after)), warmup_steps_(warmup_steps), initial_(initial) {
  if (!after_) DTRAIN_THROW(InvalidArgument, "LinearWarmup: needs a schedule to warm up to");
  if (warmup_steps < 0) DTRAIN_THROW(InvalidArgument, "LinearWarmup: warmup_steps must be >= 0, got ", warmup_steps);
  check_rate("LinearWarmup", "initial_learning_rate", initial);
}

float LinearWarmup::operator()(std::int64_t step) const {
  if (step >= warmup_steps_) return (*after_)(step - warmup_steps_);
  const float target = (*after_)(0);
  const float f = static_cast<float>(step) / static_cast<float>(warmup_steps_);
  return initial_ + (target - initial_) * f;
}

std::string LinearWarmup::describe() const {
  return dtrain::detail::concat("LinearWarmup(", warmup_steps_, " steps, then ", after_->describe(), ")");
}

float linear_scaling_rule(float learning_rate, int replicas) {
  if (replicas < 1) DTRAIN_THROW(InvalidArgument, "linear_scaling_rule: replicas must be >= 1, got ", replicas);
  return learning_rate * static_cast<float>(replicas);
}

std::shared_ptr<LearningRateSchedule> gradual_warmup(float learning_rate, int replicas, std::int64_t warmup_steps) {
  return std::make_shared<LinearWarmup>(std::make_shared<Constant>(linear_scaling_rule(learning_rate, replicas)),
                                        warmup_steps, learning_rate);
}

}  // namespace dtrain::optim
