// The optimizer step: validation, clipping scales, slots, and the per-variable update.
#include "dtrain/optim/optimizer.h"

#include <algorithm>
#include <exception>
#include <utility>
#include <cmath>

#include "dtrain/core/replica.h"
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

namespace {
thread_local detail::GradientSink* gradient_sink = nullptr;
}

detail::ScopedGradientSink::ScopedGradientSink(GradientSink* sink) : ScopedAssign(gradient_sink, sink) {}

void check_loss_scale(const LossScale& settings, float scale, std::int64_t good_steps) {
  if (!(settings.initial_scale >= 1.0f) || !std::isfinite(settings.initial_scale))
    DTRAIN_THROW(InvalidArgument, "the loss scale's initial_scale must be a finite number >= 1, got ",
                 settings.initial_scale);
  if (settings.dynamic_growth_steps < 1)
    DTRAIN_THROW(InvalidArgument, "the loss scale's dynamic_growth_steps must be >= 1, got ",
                 settings.dynamic_growth_steps);
  if (!(scale >= 1.0f) || !std::isfinite(scale) || good_steps < 0)
    DTRAIN_THROW(InvalidArgument, "a loss scale of ", scale, " after ", good_steps,
                 " good steps is not one a LossScaleOptimizer reaches");
}

// A check left to settle would keep the device's updates reading its answer.
Optimizer::~Optimizer() { abandon_check(); }

void Optimizer::set_loss_scale(std::optional<LossScale> options) {
  settle_loss_scale();
  if (options) {
    try {
      check_loss_scale(*options, options->initial_scale, 0);
    } catch (const InvalidArgument& e) {
      DTRAIN_THROW(InvalidArgument, name_, ": ", e.what());
    }
  }
  loss_scale_options_ = options;
  loss_scale_ = options ? options->initial_scale : 1.0f;
  good_steps_ = 0;
  skipped_ = false;
}

void Optimizer::set_loss_scale_state(float scale, std::int64_t good_steps) {
  settle_loss_scale();
  if (!loss_scale_options_) DTRAIN_THROW(InvalidArgument, name_, ": has no loss scale to set");
  try {
    check_loss_scale(*loss_scale_options_, scale, good_steps);
  } catch (const InvalidArgument& e) {
    DTRAIN_THROW(InvalidArgument, name_, ": ", e.what());
  }
  loss_scale_ = scale;
  good_steps_ = good_steps;
}

void Optimizer::apply_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars) {
  apply(grads, vars, 1.0f, false);
}

void Optimizer::apply_scaled_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars,
                                       bool settle_later) {
  settle_loss_scale();  // one left by the step before
  apply(grads, vars, loss_scale_options_ ? 1.0f / loss_scale_ : 1.0f, loss_scale_options_.has_value(), settle_later);
}

bool Optimizer::take_check() {
  const bool finite = std::exchange(unsettled_, nullptr)->finite_check_passed();
  count_check(finite);
  return finite;
}

void Optimizer::settle_loss_scale() {
  if (unsettled_ != nullptr && !take_check()) --iterations_;  // the update skipped itself on the device
}

void Optimizer::abandon_check() noexcept {
  if (unsettled_ == nullptr) return;
  try {
    take_check();
  } catch (...) {  // the device failed: the error that made this call throw says so
  }
}

bool Optimizer::queue_check(std::span<const Tensor> grads, std::span<Variable* const> vars) {
  if (options_.clipnorm || options_.global_clipnorm ||
      std::any_of(vars.begin(), vars.end(), [](const Variable* v) { return v->constraint().has_value(); }))
    return false;
  find_check_devices(grads);
  if (check_devices_.size() != 1 || check_devices_.front().is_cpu()) return false;
  check_list_.clear();
  for (const Tensor& g : grads)
    if (g.defined()) check_list_.push_back(&g);
  kernels::Backend& b = kernels::backend(check_devices_.front());
  if (!b.begin_finite_check(check_list_)) return false;
  unsettled_ = &b;
  return true;
}

void Optimizer::apply_unscaled_gradients(std::span<const Tensor> grads, std::span<Variable* const> vars) {
  apply(grads, vars, 1.0f, loss_scale_options_.has_value());
}

void Optimizer::find_check_devices(std::span<const Tensor> grads) {
  check_devices_.clear();
  for (const Tensor& g : grads)
    if (g.defined() && std::find(check_devices_.begin(), check_devices_.end(), g.device()) == check_devices_.end())
      check_devices_.push_back(g.device());
}

bool Optimizer::update_loss_scale(std::span<const Tensor> grads) {
  // One pass (one wait, on a GPU) for each device the gradients are on: usually one.
  bool finite = true;
  find_check_devices(grads);
  for (const Device& d : check_devices_) {
    check_list_.clear();
    for (const Tensor& g : grads)
      if (g.defined() && g.device() == d) check_list_.push_back(&g);
    if (!(finite = kernels::backend(d).all_finite(check_list_))) break;
  }
  count_check(finite);
  return finite;
}

void Optimizer::count_check(bool finite) {
  skipped_ = !finite;
  if (!finite) {
    ++skipped_updates_;
    loss_scale_ = std::max(1.0f, loss_scale_ / 2.0f);
    good_steps_ = 0;
  } else if (++good_steps_ >= loss_scale_options_->dynamic_growth_steps) {
    if (std::isfinite(loss_scale_ * 2.0f)) loss_scale_ *= 2.0f;
    good_steps_ = 0;
  }
}

void Optimizer::apply(std::span<const Tensor> grads, std::span<Variable* const> vars, float factor, bool checked,
                      bool settle_later) {
  settle_loss_scale();  // one left by the step before
  if (grads.size() != vars.size())
    DTRAIN_THROW(InvalidArgument, name_, ": ", grads.size(), " gradients given for ", vars.size(), " variables");
  // A check begun below and left to settle ends here if this call throws before its update
  // is queued (the device's updates would otherwise go on reading its answer).
  struct AbandonOnThrow {
    Optimizer& o;
    int exceptions = std::uncaught_exceptions();
    ~AbandonOnThrow() {
      if (std::uncaught_exceptions() > exceptions) o.abandon_check();
    }
  } abandon_on_throw{*this};
  if (gradient_sink) {
    if (checked)
      DTRAIN_THROW(InvalidArgument, name_,
                   ": loss scaling (a LossScaleOptimizer, or the one the mixed_float16 policy adds) is not supported "
                   "under ParameterServerStrategy, whose parameter servers apply the gradients; train with "
                   "\"mixed_bfloat16\" or \"float32\" there");
    gradient_sink->push(*this, grads, vars);
    return;
  }
  // Inside strategy.run(): as in TensorFlow, the replicas' gradients are summed and the
  // shared variables updated once.
  if (CrossReplica* cross = replica_context().cross) {
    const std::vector<Tensor> summed = cross->all_reduce_sum(grads);
    cross->merge_call([&] { apply(summed, vars, factor, checked); });
    return;
  }
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
                   grads[i].shape().to_string(), " on ", grads[i].device().to_string(), " does not match variable '",
                   vars[i]->name(), "' ", dtype_name(vars[i]->dtype()), " ", vars[i]->shape().to_string(), " on ",
                   vars[i]->value_device().to_string());
  }
  // A loss scale's skipped step changes nothing, the iteration count included. Left to
  // settle, the check is queued on the gradients' one device, which skips the update
  // itself; a constraint would still act on the weights, and clipping reads the norms.
  if (checked && loss_scale_options_->dynamic && !(settle_later && queue_check(grads, vars)) &&
      !update_loss_scale(grads))
    return;
  // Norms cost a pass over every gradient, so they are computed only when clipping needs them.
  if (options_.clipnorm || options_.global_clipnorm) {
    norms_.assign(vars.size(), 0.0);  // the member keeps its capacity: no allocation per step
    double total = 0.0;
    for (size_t i = 0; i < vars.size(); ++i) {
      if (!grads[i].defined()) continue;
      norms_[i] = kernels::backend(grads[i].device()).sum_squares(grads[i]) * double{factor} * double{factor};
      total += norms_[i];
    }
    last_global_norm_ = std::sqrt(total);
  }
  float global_scale = factor;
  if (options_.global_clipnorm && last_global_norm_ > *options_.global_clipnorm)
    global_scale = static_cast<float>(*options_.global_clipnorm / last_global_norm_ * factor);

  const float lr = learning_rate();
  items_.clear();
  bool one_device = true;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!grads[i].defined()) continue;
    float scale = global_scale;
    if (options_.clipnorm) {
      const double norm = std::sqrt(norms_[i]);
      if (norm > *options_.clipnorm) scale = static_cast<float>(*options_.clipnorm / norm * factor);
    }
    std::vector<Tensor>& slots = slots_of(*vars[i]);
    items_.push_back({&vars[i]->value_for_update(), &grads[i], slots.empty() ? nullptr : &slots[0],
                      slots.size() > 1 ? &slots[1] : nullptr, scale, slots.size() > 2 ? &slots[2] : nullptr});
    one_device &= items_.back().w->device() == items_.front().w->device();
  }
  // All at once where the optimizer can (one launch on a GPU), else one by one.
  std::optional<bool> finite = one_device && !items_.empty() ? update_all(items_, lr) : std::nullopt;
  if (!finite) {
    // The updates one by one do not read a check under way: its answer first.
    if (unsettled_ != nullptr && !take_check()) return;
    finite = true;
    std::size_t k = 0;
    for (size_t i = 0; i < vars.size(); ++i)
      if (grads[i].defined()) {
        const kernels::UpdateItem& item = items_[k++];
        *finite &= update(*item.w, *item.g, slots_of(*vars[i]), lr, item.gradient_scale);
      }
  }
  if (!*finite) wrote_non_finite_.store(true, std::memory_order_relaxed);
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!grads[i].defined()) continue;
    vars[i]->apply_constraint();
    note_device(vars[i]->value_device());
  }
  ++iterations_;
}

void Optimizer::end_shared_update() {
  for (Variable* v : shared_vars_) v->apply_constraint();
  shared_vars_.clear();
  ++iterations_;
}

void Optimizer::note_device(Device device) {
  if (device.is_cpu()) return;
  for (const Device& d : deferred_devices_)
    if (d == device) return;
  deferred_devices_.push_back(device);
}

bool Optimizer::take_non_finite() {
  bool bad = wrote_non_finite_.exchange(false, std::memory_order_relaxed);
  for (const Device& d : deferred_devices_) bad |= kernels::backend(d).take_deferred_non_finite();
  return bad;
}

std::vector<Tensor>& Optimizer::slots_of(const Variable& v) {
  if (slot_count_ < 0) slot_count_ = static_cast<int>(slot_names().size());  // fixed at construction
  auto& slots = slots_[v.id()];
  if (slots.empty())  // first update of this variable
    for (int s = 0; s < slot_count_; ++s) {
      const float initial = slot_initial_value(static_cast<std::size_t>(s));
      slots.push_back(initial == 0.0f ? Tensor::zeros(v.shape(), DType::f32, v.value_device())
                                      : Tensor::full(v.shape(), initial).to(v.value_device()));
    }
  return slots;
}

bool Optimizer::begin_shared_update(std::span<Variable* const> vars) {
  if (options_.clipnorm || options_.global_clipnorm || loss_scale_options_) return false;
  for (Variable* v : vars) {
    if (v == nullptr) DTRAIN_THROW(InvalidArgument, name_, ": a variable is null");
    if (v->dtype() != DType::f32)
      DTRAIN_THROW(InvalidArgument, name_, ": variable '", v->name(), "' is ", dtype_name(v->dtype()),
                   "; optimizers update float32 variables");
    slots_of(*v);  // created here, on one thread, before the shares run
    v->value_for_update();  // and the value, where a tape's record holds it, copied here
  }
  shared_vars_.assign(vars.begin(), vars.end());
  shared_lr_ = learning_rate();
  return true;
}

void Optimizer::apply_share(std::span<const Tensor> grads, std::span<Variable* const> vars, int share, int shares) {
  // Shares start on 64-byte boundaries so each thread's vector loops stay aligned.
  constexpr std::int64_t kAlign = 16;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!grads[i].defined()) continue;
    const std::int64_t n = vars[i]->numel();
    const std::int64_t blocks = (n + kAlign - 1) / kAlign;
    const std::int64_t begin = std::min(n, blocks * share / shares * kAlign);
    const std::int64_t end = std::min(n, blocks * (share + 1) / shares * kAlign);
    if (begin >= end) continue;
    const Shape flat{n};
    auto piece = [&](const Tensor& t) { return t.reshape(flat).slice(begin, end); };
    // In place: begin_shared_update left no other tensor holding the value's storage.
    Tensor value = piece(vars[i]->mutable_value());
    // find(), not [], so concurrent shares only read the map (begin_shared_update filled it).
    const auto found = slots_.find(vars[i]->id());
    DTRAIN_CHECK(found != slots_.end(), "apply_share before begin_shared_update");
    const std::vector<Tensor>& all = found->second;
    DTRAIN_CHECK_LE(all.size(), size_t{3});
    Tensor slots[3];
    for (size_t s = 0; s < all.size(); ++s) slots[s] = piece(all[s]);
    if (!update(value, piece(grads[i]), std::span<Tensor>(slots, all.size()), shared_lr_, 1.0f))
      wrote_non_finite_.store(true, std::memory_order_relaxed);
  }
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::slots(const Variable& v, bool create) {
  std::vector<std::pair<std::string, Tensor*>> out;
  if (create) slots_of(v);
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
  if (name == "rmsprop") return std::make_unique<RMSprop>();
  if (name == "adagrad") return std::make_unique<Adagrad>();
  DTRAIN_THROW(InvalidArgument, "unknown optimizer '", name, "'; expected sgd, adam, adamw, rmsprop or adagrad");
}

}  // namespace dtrain::optim
