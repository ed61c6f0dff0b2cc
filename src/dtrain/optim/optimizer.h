// Optimizers with Keras's names, defaults and update formulas. apply_gradients() clips
// (clipnorm per variable, global_clipnorm over all) by folding a scale into the update,
// then runs one fused, multithreaded pass per variable over its value, gradient and slots,
// and applies the variable's constraint after it, as Keras does.
// Slots are created on the first update and reused: a steady-state step allocates nothing.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/scoped.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/optim/schedules.h"

namespace dtrain::optim {

struct OptimizerOptions {
  std::optional<float> clipnorm;         // clip each gradient to this L2 norm
  std::optional<float> global_clipnorm;  // clip all gradients together to this L2 norm
  float weight_decay = 0.0f;             // decoupled: w -= lr * weight_decay * w
};

// Dynamic loss scaling, as keras.mixed_precision.LossScaleOptimizer: the loss is multiplied
// by a scale before backward, so that small gradients survive float16 (whose smallest
// value is 2^-24), and the gradients divided by it before the update. A step whose
// gradients are not all finite (the scale made them overflow) is skipped: no variable,
// slot or iteration count changes, and the scale halves (not below 1). After
// dynamic_growth_steps finite steps in a row it doubles. A fixed scale (dynamic false)
// neither checks nor changes.
struct LossScale {
  bool dynamic = true;
  float initial_scale = 32768.0f;  // 2^15, Keras's
  std::int64_t dynamic_growth_steps = 2000;
};

// Throws InvalidArgument naming what is wrong where `settings`, or the state (scale, good
// steps) a LossScale reaches, could not be: the one check of set_loss_scale(),
// set_loss_scale_state() and the readers of saved ones.
void check_loss_scale(const LossScale& settings, float scale, std::int64_t good_steps);

class Optimizer {
 public:
  Optimizer(std::string name, std::shared_ptr<LearningRateSchedule> learning_rate, OptimizerOptions options);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Applies one update. grads[i] belongs to vars[i]; an undefined gradient (the variable
  // did not affect the loss) skips that variable, as Keras does. Called by every replica
  // inside strategy.run(), it sums the replicas' gradients and updates once.
  void apply_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars);
  void apply_gradients(const std::vector<std::pair<Tensor, Variable*>>& grads_and_vars);

  const std::string& name() const { return name_; }
  std::int64_t iterations() const { return iterations_; }
  void set_iterations(std::int64_t n) {
    settle_loss_scale();
    iterations_ = n;
  }
  // The learning rate the next update will use: the schedule's, times the scale.
  float learning_rate() const { return (*learning_rate_)(iterations_) * learning_rate_scale_; }
  // A factor on the schedule's rate (1 unless set): an elastic job that keeps each
  // worker's batch scales the rate with the global batch (the linear scaling rule).
  void set_learning_rate_scale(float scale) { learning_rate_scale_ = scale; }
  float learning_rate_scale() const { return learning_rate_scale_; }
  void set_learning_rate(std::shared_ptr<LearningRateSchedule> schedule);
  // The schedule itself (what set_learning_rate last set), for saving the optimizer.
  const LearningRateSchedule& learning_rate_schedule() const { return *learning_rate_; }
  const OptimizerOptions& options() const { return options_; }
  // The norm of the last gradients before clipping (all variables together); computed
  // only when clipnorm or global_clipnorm is set, 0 otherwise.
  double last_global_norm() const { return last_global_norm_; }

  // One update applied by several threads at once (a strategy's replicas), each over its
  // own share of every variable's elements: begin_shared_update() on one thread, then
  // apply_share(grads, vars, share, shares) on each of `shares` threads, then
  // end_shared_update() on one thread. The same update as apply_gradients(grads, vars).
  // Clipping needs norms over every share first, and a loss scale a check of every
  // gradient: with clipnorm, global_clipnorm or a loss scale set, begin_shared_update()
  // returns false and the caller uses apply_gradients().
  bool begin_shared_update(std::span<Variable* const> vars);
  void apply_share(std::span<const Tensor> grads, std::span<Variable* const> vars, int share, int shares);
  // Also applies the variables' constraints (which need each whole variable).
  void end_shared_update();

  // Loss scaling (nullopt: none, the default); compile() turns it on for mixed_float16. It
  // acts through the two calls below (fit's steps make the first); apply_gradients() stays
  // the plain update, as a LossScaleOptimizer's inner optimizer is.
  void set_loss_scale(std::optional<LossScale> options);
  const std::optional<LossScale>& loss_scale_options() const { return loss_scale_options_; }
  // The factor on the loss: 1 without loss scaling.
  float loss_scale() const { return loss_scale_; }
  // Finite steps in a row since the scale last changed.
  std::int64_t loss_scale_good_steps() const { return good_steps_; }
  // For checkpoints: the scale and its count of good steps as saved.
  void set_loss_scale_state(float scale, std::int64_t good_steps);
  // Whether the last update was skipped for gradients that were not all finite.
  bool last_update_skipped() const { return skipped_; }
  // Steps skipped so far (loss scaling: gradients not all finite).
  std::int64_t skipped_updates() const { return skipped_updates_; }
  // The gradients of the loss times loss_scale(): checked, divided by the scale and
  // applied, or the step skipped (Keras 3's LossScaleOptimizer.apply). Without a loss scale,
  // apply_gradients().
  // `settle_later` (fit's steps on a GPU): the host does not wait for the check. The update
  // is queued behind it and skips itself on the device where the check fails; the step
  // counts as applied until settle_loss_scale(), which takes it back then and moves the
  // scale on. Where the device cannot check so (a CPU, gradients on several devices,
  // clipping, a constrained variable), the check is made at once, as without it.
  void apply_scaled_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars,
                              bool settle_later = false);
  // Takes the answer of a check left to settle (fit calls it once it has waited for the
  // step's loss, when the answer is there already). Nothing where none is left. Every
  // update and every setter of the state settles first; the getters give the state as
  // the last settled check left it. One check at a time on a device (fit's thread's).
  void settle_loss_scale();
  // Gradients divided by the scale already (TensorFlow 2's get_unscaled_gradients): checked
  // and applied, or the step skipped.
  void apply_unscaled_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars);

  // Whether some update has written a NaN or an infinity into a variable since the last
  // call (checked in the update's own pass, so it costs no extra read); the call clears it.
  // On a GPU it waits for the updates queued so far.
  bool take_non_finite();

  // Per-variable state ("m", "v", "momentum"), for checkpoints. Empty before the first
  // update, unless `create` (a checkpoint being restored): then made as zeros.
  std::vector<std::pair<std::string, Tensor*>> slots(const Variable& v, bool create = false);
  // The slot names every variable gets, in order.
  std::vector<std::string> slot_names_in_order() const { return slot_names(); }

 protected:
  virtual std::vector<std::string> slot_names() const = 0;
  // The value slot `slot` starts from (Adagrad's accumulator: 0.1).
  virtual float slot_initial_value(std::size_t /*slot*/) const { return 0.0f; }
  // One fused update of `value` (a variable, or a share of its elements) with gradient g
  // scaled by grad_scale; slots are the same share of the variable's slots. Returns
  // whether every value written is finite.
  virtual bool update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) = 0;
  // The updates of every variable of a step at once, all on one device (items' w, g, slots
  // and gradient scales filled in): optimizers whose backends update many variables in one
  // pass (all of dtrain's: one launch on a GPU) override it; nullopt, the default, has the
  // caller call update() for each. Otherwise whether every value written is finite.
  virtual std::optional<bool> update_all(std::span<const kernels::UpdateItem> /*items*/, float /*lr*/) {
    return std::nullopt;
  }

 private:
  // apply_gradients() with every gradient multiplied by `factor` (1 / the loss scale),
  // after the loss scale's check where `checked` (left to settle where `settle_later`).
  void apply(std::span<const Tensor> grads, std::span<Variable* const> vars, float factor, bool checked,
             bool settle_later = false);
  // Under dynamic loss scaling: whether the gradients are all finite, the scale moved on.
  bool update_loss_scale(std::span<const Tensor> grads);
  // The devices the defined gradients are on, into check_devices_.
  void find_check_devices(std::span<const Tensor> grads);
  // The scale moved on for a check's answer.
  void count_check(bool finite);
  // Where the device can (one GPU; no clipping or constraint), queues the check of `grads`
  // for the updates to read, left to settle; whether it did.
  bool queue_check(std::span<const Tensor> grads, std::span<Variable* const> vars);
  // The answer of the check left to settle, counted (the check closed).
  bool take_check();
  // Ends a check left to settle whose update was not queued (the call applying it threw):
  // counted as the check that waits would have counted it. Never throws.
  void abandon_check() noexcept;
  // The backend whose check is left to settle (null: none).
  kernels::Backend* unsettled_ = nullptr;

  std::string name_;
  std::shared_ptr<LearningRateSchedule> learning_rate_;
  std::optional<LossScale> loss_scale_options_;
  float loss_scale_ = 1.0f;
  std::int64_t good_steps_ = 0;
  bool skipped_ = false;
  std::int64_t skipped_updates_ = 0;
  std::vector<const Tensor*> check_list_;  // the gradients all_finite() reads (kept)
  std::vector<Device> check_devices_;     // the devices they are on (kept)
  float learning_rate_scale_ = 1.0f;
  OptimizerOptions options_;
  std::int64_t iterations_ = 0;
  double last_global_norm_ = 0.0;
  std::vector<double> norms_;  // squared gradient norms of the step, when clipping
  std::vector<kernels::UpdateItem> items_;  // the step's updates (kept: no allocation per step)
  int slot_count_ = -1;  // slot_names().size(), read once (virtual: not in the constructor)
  float shared_lr_ = 0.0f;  // the learning rate of the shared update under way
  std::atomic<bool> wrote_non_finite_{false};  // set by any share's update
  std::vector<Variable*> shared_vars_;  // of the shared update under way, for their constraints
  // Devices whose updates report non-finite weights later (GPUs: kernels run after the call).
  std::vector<Device> deferred_devices_;
  void note_device(Device device);
  std::vector<Tensor>& slots_of(const Variable& v);
  // Keyed by the variable's value identity (tensor ids are never reused), not its address.
  std::unordered_map<std::uint64_t, std::vector<Tensor>> slots_;
};

// Keras: v = momentum * v - lr * g; w += v (nesterov: w += momentum * v - lr * g).
class SGD final : public Optimizer {
 public:
  explicit SGD(float learning_rate = 0.01f, float momentum = 0.0f, bool nesterov = false,
               OptimizerOptions options = {});
  SGD(std::shared_ptr<LearningRateSchedule> learning_rate, float momentum = 0.0f, bool nesterov = false,
      OptimizerOptions options = {});
  float momentum() const { return momentum_; }
  bool nesterov() const { return nesterov_; }

 protected:
  std::vector<std::string> slot_names() const override;
  bool update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) override;
  std::optional<bool> update_all(std::span<const kernels::UpdateItem> items, float lr) override;

 private:
  kernels::SgdUpdate hyper(float lr, float grad_scale) const;
  float momentum_;
  bool nesterov_;
};

struct AdamOptions {
  float beta_1 = 0.9f;
  float beta_2 = 0.999f;
  float epsilon = 1e-7f;
};

// Keras: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
//        w -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + epsilon).
class Adam : public Optimizer {
 public:
  explicit Adam(float learning_rate = 0.001f, AdamOptions adam = {}, OptimizerOptions options = {});
  Adam(std::shared_ptr<LearningRateSchedule> learning_rate, AdamOptions adam = {}, OptimizerOptions options = {});
  const AdamOptions& adam_options() const { return adam_; }

 protected:
  Adam(std::string name, std::shared_ptr<LearningRateSchedule> learning_rate, AdamOptions adam,
       OptimizerOptions options);
  std::vector<std::string> slot_names() const override;
  bool update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) override;
  std::optional<bool> update_all(std::span<const kernels::UpdateItem> items, float lr) override;

 private:
  kernels::AdamUpdate hyper(float lr, float grad_scale) const;
  AdamOptions adam_;
};

// Adam with decoupled weight decay (Loshchilov & Hutter), Keras's default decay 0.004.
class AdamW final : public Adam {
 public:
  explicit AdamW(float learning_rate = 0.001f, float weight_decay = 0.004f, AdamOptions adam = {},
                 OptimizerOptions options = {});
  AdamW(std::shared_ptr<LearningRateSchedule> learning_rate, float weight_decay = 0.004f, AdamOptions adam = {},
        OptimizerOptions options = {});
};

struct RMSpropOptions {
  float rho = 0.9f;
  float momentum = 0.0f;
  float epsilon = 1e-7f;
  bool centered = false;
};

// Keras 3 (and tf.keras 2.11+): v = rho v + (1-rho) g²; centered: a = rho a + (1-rho) g and
// v - a² below; step = lr * g / sqrt(v + epsilon); with momentum m = momentum m + step,
// w -= m; else w -= step. Slots "velocity", then "momentum" and "average_gradient" where
// used. Keras's default optimizer.
class RMSprop final : public Optimizer {
 public:
  explicit RMSprop(float learning_rate = 0.001f, RMSpropOptions rmsprop = {}, OptimizerOptions options = {});
  RMSprop(std::shared_ptr<LearningRateSchedule> learning_rate, RMSpropOptions rmsprop = {},
          OptimizerOptions options = {});
  const RMSpropOptions& rmsprop_options() const { return rmsprop_; }

 protected:
  std::vector<std::string> slot_names() const override;
  bool update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) override;
  std::optional<bool> update_all(std::span<const kernels::UpdateItem> items, float lr) override;

 private:
  kernels::RmspropUpdate hyper(float lr, float grad_scale) const;
  RMSpropOptions rmsprop_;
  std::vector<kernels::UpdateItem> remapped_;  // items with the average as slot2 (kept)
};

// Keras 3 (and tf.keras 2.11+): acc += g²; w -= lr * g / sqrt(acc + epsilon), the
// accumulator ("accumulator") starting at initial_accumulator_value.
class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(float learning_rate = 0.001f, float initial_accumulator_value = 0.1f, float epsilon = 1e-7f,
                   OptimizerOptions options = {});
  Adagrad(std::shared_ptr<LearningRateSchedule> learning_rate, float initial_accumulator_value = 0.1f,
          float epsilon = 1e-7f, OptimizerOptions options = {});
  float initial_accumulator_value() const { return initial_; }
  float epsilon() const { return epsilon_; }

 protected:
  std::vector<std::string> slot_names() const override { return {"accumulator"}; }
  float slot_initial_value(std::size_t /*slot*/) const override { return initial_; }
  bool update(Tensor& value, const Tensor& g, std::span<Tensor> slots, float lr, float grad_scale) override;
  std::optional<bool> update_all(std::span<const kernels::UpdateItem> items, float lr) override;

 private:
  kernels::RmspropUpdate hyper(float lr, float grad_scale) const;
  float initial_;
  float epsilon_;
};

namespace detail {
// Where apply_gradients() sends the gradients instead of applying them, set on a thread:
// a ParameterServerStrategy worker's closure pushes them to the parameter servers, whose
// copy of the optimizer applies them.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  virtual void push(const Optimizer& optimizer, std::span<const Tensor> grads, std::span<Variable* const> vars) = 0;
};
// Sets the calling thread's sink for the guard's lifetime.
class ScopedGradientSink : ScopedAssign<GradientSink*> {
 public:
  explicit ScopedGradientSink(GradientSink* sink);
};
}  // namespace detail

// "sgd", "adam", "adamw", "rmsprop", "adagrad" with Keras's defaults.
std::unique_ptr<Optimizer> get(const std::string& name);

}  // namespace dtrain::optim
