// Learning-rate schedules with Keras's names and formulas; each maps the optimizer's
// step (0-based, the number of updates already applied) to a learning rate.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::optim {

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual float operator()(std::int64_t step) const = 0;
  virtual std::string describe() const = 0;  // "ExponentialDecay(0.1, 1000, 0.96)"
};

class Constant final : public LearningRateSchedule {
 public:
  explicit Constant(float learning_rate);
  float operator()(std::int64_t) const override { return learning_rate_; }
  std::string describe() const override;
  float learning_rate() const { return learning_rate_; }

 private:
  float learning_rate_;
};

// initial * decay_rate ^ (step / decay_steps); with staircase the exponent is floored,
// which is step decay.
class ExponentialDecay final : public LearningRateSchedule {
 public:
  ExponentialDecay(float initial_learning_rate, std::int64_t decay_steps, float decay_rate, bool staircase = false);
  float operator()(std::int64_t step) const override;
  std::string describe() const override;
  float initial_learning_rate() const { return initial_; }
  std::int64_t decay_steps() const { return decay_steps_; }
  float decay_rate() const { return decay_rate_; }
  bool staircase() const { return staircase_; }

 private:
  float initial_;
  std::int64_t decay_steps_;
  float decay_rate_;
  bool staircase_;
};

// values[i] while step <= boundaries[i] (and values.back() after the last boundary).
class PiecewiseConstantDecay final : public LearningRateSchedule {
 public:
  PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<float> values);
  float operator()(std::int64_t step) const override;
  std::string describe() const override;
  const std::vector<std::int64_t>& boundaries() const { return boundaries_; }
  const std::vector<float>& values() const { return values_; }

 private:
  std::vector<std::int64_t> boundaries_;
  std::vector<float> values_;
};

// initial * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps)) + alpha)
class CosineDecay final : public LearningRateSchedule {
 public:
  CosineDecay(float initial_learning_rate, std::int64_t decay_steps, float alpha = 0.0f);
  float operator()(std::int64_t step) const override;
  std::string describe() const override;
  float initial_learning_rate() const { return initial_; }
  std::int64_t decay_steps() const { return decay_steps_; }
  float alpha() const { return alpha_; }

 private:
  float initial_;
  std::int64_t decay_steps_;
  float alpha_;
};

// Gradual warmup (Goyal et al., 2017): the rate rises linearly from `initial` to the
// wrapped schedule's value over warmup_steps, then follows the wrapped schedule, counting
// its steps from the end of the warmup.
class LinearWarmup final : public LearningRateSchedule {
 public:
  LinearWarmup(std::shared_ptr<LearningRateSchedule> after, std::int64_t warmup_steps, float initial = 0.0f);
  float operator()(std::int64_t step) const override;
  std::string describe() const override;
  const LearningRateSchedule& after() const { return *after_; }
  std::int64_t warmup_steps() const { return warmup_steps_; }
  float initial_learning_rate() const { return initial_; }

 private:
  std::shared_ptr<LearningRateSchedule> after_;
  std::int64_t warmup_steps_;
  float initial_;
};

// Learning rates for data parallelism (Goyal et al., 2017, "Accurate, Large Minibatch
// SGD"). With N replicas that each keep the per-replica batch, the global batch is N
// times larger: the linear scaling rule multiplies the learning rate by N, so that an
// epoch's N-fold fewer updates move the weights about as far. Early in training the
// scaled rate can diverge; gradual warmup starts at the single-device rate and rises
// linearly to the scaled one over the first steps (the paper used 5 epochs).
// Use them with SGD and momentum at large global batches; Adam is far less sensitive to
// the batch size, and for it the scaled rate is often too high.
float linear_scaling_rule(float learning_rate, int replicas);
// LinearWarmup from learning_rate to linear_scaling_rule(learning_rate, replicas) over
// warmup_steps, then that constant.
std::shared_ptr<LearningRateSchedule> gradual_warmup(float learning_rate, int replicas, std::int64_t warmup_steps);

}  // namespace dtrain::optim
