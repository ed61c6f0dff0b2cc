// One training step of fit(), on one device or on a strategy's replicas. Internal to the
// model layer (sequential.cpp, remote_fit.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/autograd/tape.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/replica.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/model/model.h"
#include "dtrain/profile/profiler.h"

namespace dtrain {
namespace detail {

// A loss tensor's mean, as a number.
double mean_value(const Tensor& loss);

// What workers compare before training together: each variable's name, dtype and shape,
// then the model's configuration (hashed), so a mismatch names a variable where it can.
std::vector<std::string> describe(const Model& model);

// Tells fit's callbacks when fit leaves with an exception (on_train_end is not called then).
class TrainErrorGuard {
 public:
  explicit TrainErrorGuard(const std::vector<std::shared_ptr<Callback>>& callbacks) : callbacks_(callbacks) {}
  ~TrainErrorGuard() {
    if (std::uncaught_exceptions() > exceptions_)
      for (const auto& c : callbacks_) c->on_train_error();
  }
  TrainErrorGuard(const TrainErrorGuard&) = delete;
  TrainErrorGuard& operator=(const TrainErrorGuard&) = delete;

 private:
  const std::vector<std::shared_ptr<Callback>>& callbacks_;
  int exceptions_ = std::uncaught_exceptions();
};

// Sets a pointer into fit's loop back to null when fit ends, however it ends.
template <typename T>
class ClearOnExit {
 public:
  explicit ClearOnExit(T*& p) : p_(p) {}
  ~ClearOnExit() { p_ = nullptr; }
  ClearOnExit(const ClearOnExit&) = delete;
  ClearOnExit& operator=(const ClearOnExit&) = delete;

 private:
  T*& p_;
};

// Puts an optimizer's learning-rate scale back to 1 when fit leaves (an elastic job scaled
// it with its workers).
class ResetLearningRateScale {
 public:
  explicit ResetLearningRateScale(optim::Optimizer* optimizer) : optimizer_(optimizer) {}
  ~ResetLearningRateScale() {
    if (optimizer_) optimizer_->set_learning_rate_scale(1.0f);
  }
  ResetLearningRateScale(const ResetLearningRateScale&) = delete;
  ResetLearningRateScale& operator=(const ResetLearningRateScale&) = delete;

 private:
  optim::Optimizer* optimizer_;
};

// The GPU's own time in a one-device step's phases: a timed event on the device's compute
// stream where each phase starts, and one where the last ends, read after the step's loss
// has waited for the GPU (so reading them waits for nothing more). Each phase goes to the
// profile's GPU track at its GPU time, placed on the host's clock from the first mark: the
// GPU had nothing else queued then (the step before ended waiting for it). The events are
// made at the first step and recorded again at each. While steps are traced it also
// times each kernel (time_kernels) and the transfer stream's copies (time_copies).
class GpuPhaseClock {
 public:
  // The step's first phase starts (the host's clock `now`); nothing on the CPU. A traced
  // step (`trace_kernels`) times its kernels from here to its finish().
  void start(Device device, profile::Phase phase, Clock::time_point now, bool trace_kernels) {
    if (!(device == device_)) {
      time_kernels(false);  // on the device before, if it was
      time_copies(false);
      marks_.clear();  // events belong to their device
    }
    used_ = 0;
    device_ = device;
    if (device.is_cpu()) return;
    time_kernels(trace_kernels);
    time_copies(trace_kernels);
    anchor_ = now;
    mark(phase);
  }
  // The phase before ends and `phase` starts (finish() reads the last mark as an end).
  void mark(profile::Phase phase) {
    if (device_.is_cpu()) return;
    if (used_ == marks_.size()) marks_.emplace_back();
    Mark& m = marks_[used_++];
    m.phase = phase;
    m.event = device_runtime(device_.type)->record_timed(device_.index, m.event);
    // Which kernels the phase queued, by their order: times alone could put a kernel that
    // starts as its phase does in the phase before.
    m.kernel_mark = timing_kernels_ ? kernels::backend(device_).kernel_marks() : 0;
  }
  // Once the step's work has run: each phase's GPU time into `track`, and, while kernels
  // are timed, each kernel into the trace inside the phase that queued it.
  void finish(profile::Track& track) {
    if (device_.is_cpu() || used_ < 2) return;
    DeviceRuntime& runtime = *device_runtime(device_.type);
    double at = 0;
    for (std::size_t i = 0; i + 1 < used_; ++i) {
      const double s = runtime.seconds_between(device_.index, marks_[i].event, marks_[i + 1].event);
      track.add(marks_[i].phase, anchor_ + clock_seconds(at), anchor_ + clock_seconds(at + s));
      at += s;
    }
    if (timing_kernels_) {
      kernels::backend(device_).take_kernel_spans(marks_[0].event, spans_);
      std::size_t phase = 0;
      for (const kernels::KernelSpan& k : spans_) {
        // Queued before the step's first mark or after its last (the loss's read): no phase's.
        if (k.mark < marks_[0].kernel_mark || k.mark >= marks_[used_ - 1].kernel_mark) continue;
        while (phase + 2 < used_ && k.mark >= marks_[phase + 1].kernel_mark) ++phase;
        track.add_to_trace(marks_[phase].phase, anchor_ + clock_seconds(k.begin), anchor_ + clock_seconds(k.end), k.name);
      }
    }
    used_ = 0;
  }
  // Kernels are timed for the trace while `on` (a GPU's; a few microseconds a kernel).
  void time_kernels(bool on) {
    if (device_.is_cpu() || on == timing_kernels_) return;
    kernels::backend(device_).trace_kernels(on);
    timing_kernels_ = on;
  }
  // The transfer stream's copies (an input pipeline's, made on its own thread, often
  // before the step that uses them starts) are timed while `on`: the steps are traced.
  void time_copies(bool on) {
    if (device_.is_cpu() || on == timing_copies_) return;
    device_runtime(device_.type)->trace_copies(device_.index, on);
    timing_copies_ = on;
  }
  // The copies seen to end since the last call, while they are timed.
  const std::vector<CopySpan>& take_copies() {
    copies_.clear();
    if (timing_copies_) device_runtime(device_.type)->take_copy_spans(device_.index, copies_);
    return copies_;
  }

 private:
  struct Mark {
    profile::Phase phase = profile::Phase::forward;
    DeviceEvent event;
    std::size_t kernel_mark = 0;  // the kernel timeline's marks made before this one
  };
  Device device_;
  Clock::time_point anchor_{};
  std::vector<Mark> marks_;  // kept across steps, with their events
  std::size_t used_ = 0;     // this step's marks
  bool timing_kernels_ = false, timing_copies_ = false;
  std::vector<kernels::KernelSpan> spans_;  // kept: no allocation per step
  std::vector<CopySpan> copies_;
};

}  // namespace detail

// One training step: forward, backward and, at the end of each group of
// gradient_accumulation_steps batches, the update. On one device the step is the plain
// GradientTape step; under a strategy with several replicas, each replica takes its rows
// of the global batch, its gradients go to the strategy's bucket reducer as backward
// produces them, and the replicas then update their shares of the shared variables.
class Model::Trainer {
 public:
  Trainer(Model& model, int accumulation_steps, profile::Profiler& profiler)
      : model_(model), k_(accumulation_steps), profiler_(profiler) {}
  ~Trainer() {
    gpu_clock_.time_kernels(false);
    gpu_clock_.time_copies(false);
    // A step that threw after queuing its update left the loss scale's check to settle.
    try {
      if (model_.optimizer_) model_.optimizer_->settle_loss_scale();
    } catch (...) {  // the device failed: the step's own error says so
    }
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Adds the batch's loss and metrics to loss_mean and the model's metrics. Multi-worker:
  // x is the global batch (every worker takes its rows), or with global_rows >= 0 this
  // worker's own part of a global batch of that many rows (undefined when it has none).
  // Batches accumulated since the last update.
  int pending() const { return static_cast<int>(micro_ % k_); }
  // A ParameterServerStrategy worker's update is the push of its gradients to the
  // parameter servers (which apply them): profiled as such.
  void updates_are_pushes() { update_phase_ = profile::Phase::push; }
  // The gradient noise scale's measurements so far (steps 0 where none were made).
  const GradientNoise& gradient_noise() const { return noise_; }
  // Every this many reducing steps between workers (0: never), the reducer measures the
  // two norms: two passes over the gradients on the communication thread.
  void measure_noise_every(int steps) { noise_every_ = steps; }

  // The workers changed (an elastic job) and the state was put back to a commit, taken
  // where no batch was pending: the gradient buckets are made again, over the new
  // workers' connections, at the next step.
  void members_changed() {
    reducer_.reset();
    micro_ = 0;
    std::fill(group_.begin(), group_.end(), Tensor());
  }

  void step(const TensorData& batch, metrics::Mean& loss_mean, std::int64_t global_rows = -1) {
    const bool update = ++micro_ % k_ == 0;
    if (model_.strategy_ && model_.strategy_->num_replicas_in_sync() > 1) {
      step_replicas(batch, update, loss_mean, global_rows);
      return;
    }
    profile::Track& loop = profiler_.loop();
    Clock::time_point start = Clock::now();
    const Device device = model_.device();
    if (graph_ready(device, batch, loop.tracing())) {
      replay_step(batch, loss_mean, start);
      return;
    }
    // On a GPU the batch goes to the weights' device first: an explicit copy, its own phase.
    on_device_.x.resize(batch.x.size());
    on_device_.y.resize(batch.y.size());
    for (std::size_t i = 0; i < batch.x.size(); ++i) on_device_.x[i] = batch.x[i].to(device);
    for (std::size_t i = 0; i < batch.y.size(); ++i) on_device_.y[i] = batch.y[i].to(device);
    if (!device.is_cpu()) {
      const Clock::time_point copied = Clock::now();
      loop.add(profile::Phase::to_device, start, copied);
      start = copied;
      if (update && k_ == 1) ++gpu_steps_;
    }
    gpu_clock_.start(device, profile::Phase::forward, start, loop.tracing());
    GradientTape tape;
    std::vector<Tensor> y_pred;
    Tensor loss = forward(on_device_, y_pred, output_masks_, output_losses_);
    if (vars_.empty()) vars_ = model_.trainable_variables();
    Clock::time_point forward_end = Clock::now(), backward_end;
    loop.add(profile::Phase::forward, start, forward_end);
    gpu_clock_.mark(profile::Phase::backward);
    // Under a loss scale (mixed_float16) backward starts from the loss times the scale,
    // and the optimizer divides it out of the gradients.
    const float loss_scale = model_.optimizer_->loss_scale();
    if (k_ == 1) {
      std::vector<Tensor> grads = tape.gradient(scaled(loss, loss_scale), vars_);
      backward_end = Clock::now();
      gpu_clock_.mark(update_phase_);
      model_.optimizer_->apply_scaled_gradients(grads, vars_, /*settle_later=*/!device.is_cpu());
    } else {
      // The update uses the mean of the group's gradients, summed in buffers made once.
      const std::vector<Tensor> grads = tape.gradient(scale(loss, loss_scale / static_cast<float>(k_)), vars_);
      if (buffers_.empty()) buffers_.resize(grads.size());
      if (group_.empty()) group_.resize(grads.size());
      for (std::size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined()) continue;
        if (!buffers_[i].defined()) buffers_[i] = Tensor::empty(grads[i].shape(), DType::f32, grads[i].device());
        if (group_[i].defined())
          kernels::backend(grads[i].device()).binary(kernels::Binary::add, buffers_[i], grads[i], buffers_[i]);
        else buffers_[i].copy_from(grads[i]);
        group_[i] = buffers_[i];
      }
      backward_end = Clock::now();
      gpu_clock_.mark(update_phase_);
      if (update) {
        model_.optimizer_->apply_scaled_gradients(group_, vars_, /*settle_later=*/!device.is_cpu());
        std::fill(group_.begin(), group_.end(), Tensor());
      }
    }
    const Clock::time_point optimizer_end = Clock::now();
    gpu_clock_.mark(update_phase_);  // the end of the last phase
    loop.add(profile::Phase::backward, forward_end, backward_end);
    loop.add(update_phase_, backward_end, optimizer_end);
    end_step(batch, device, loss, y_pred, output_masks_, output_losses_, optimizer_end, loss_mean);
    on_device_.x.clear();  // the batch is not held until the next step
    on_device_.y.clear();
  }

  // How the steps used a CUDA graph so far.
  const CudaGraphUse& graph_use() const { return graph_use_; }
  // Whether steps may be captured as a CUDA graph (FitOptions::cuda_graph).
  void use_cuda_graph(bool on) { graphs_wanted_ = on; }

 private:
  // The model's outputs and its loss (penalties included) for `batch`, on the tape.
  Tensor forward(const TensorData& batch, std::vector<Tensor>& y_pred, std::vector<Tensor>& masks,
                 std::vector<Tensor>& output_losses) {
    y_pred = model_(batch.x, /*training=*/true, &masks);
    return with_penalties(model_.compute_loss(batch.y, y_pred, &output_losses, masks), 1.0f);
  }
  // Where backward starts under a loss scale (mixed_float16): the loss times the scale.
  static Tensor scaled(const Tensor& loss, float loss_scale) { return loss_scale == 1.0f ? loss : scale(loss, loss_scale); }

  // The step's end, once its work is queued: the loss's value (a GPU's wait for the
  // step), the loss scale's settling, the GPU's phases and copies into the profile, then
  // the loss and metrics.
  void end_step(const TensorData& batch, Device device, const Tensor& loss, const std::vector<Tensor>& y_pred,
                const std::vector<Tensor>& masks, const std::vector<Tensor>& output_losses,
                Clock::time_point optimizer_end, metrics::Mean& loss_mean) {
    profile::Track& loop = profiler_.loop();
    // The loss's value waits for the GPU's queued work: on a GPU, the host's forward,
    // backward and optimizer phases were launches, and this wait is the rest of the work.
    // A loss scale's check of the gradients (mixed_float16) was queued before the update
    // without a wait of its own; its answer is here now.
    const double loss_value = detail::mean_value(loss);
    model_.optimizer_->settle_loss_scale();
    Clock::time_point metrics_start = optimizer_end;
    if (!device.is_cpu()) {
      metrics_start = Clock::now();
      loop.add(profile::Phase::device_wait, optimizer_end, metrics_start);
      if (!gpu_track_) gpu_track_ = &profiler_.add_track(device.to_string() + " compute stream", profile::TrackKind::device);
      gpu_clock_.finish(*gpu_track_);
      gpu_clock_.time_kernels(false);
      // The input pipeline's copies on the transfer stream: a row of their own.
      for (const CopySpan& c : gpu_clock_.take_copies()) {
        if (!transfer_track_)
          transfer_track_ = &profiler_.add_track(device.to_string() + " transfer stream", profile::TrackKind::device);
        transfer_track_->add_to_trace(profile::Phase::to_device, c.begin, c.end, "host-to-device copy");
      }
    }
    const double rows = static_cast<double>(batch.rows());
    loss_mean.update_state(loss_value, rows);
    model_.update_metrics(batch.y, y_pred, masks);
    model_.update_output_losses(loss_values(output_losses), rows);
    loop.add(profile::Phase::metrics, metrics_start, Clock::now());
  }

  // The step as a CUDA graph: one device on a GPU, an update every batch, an untraced
  // step (a traced one times each kernel). After two steps kernel by kernel (the layers'
  // lazy builds, the optimizer's slots, the libraries' choices of algorithm), the forward
  // with the loss, and backward, are recorded once as two graphs (two launches: the
  // profile keeps the two phases' GPU times), into memory of their own, reading the batch
  // from tensors of their own; each step then copies its batch there and launches them.
  // The update runs after them as before: its values change each step (Adam's
  // step, a schedule's rate) and its fused kernels are few launches. A batch of other
  // shapes (an epoch's short last one) runs kernel by kernel; two in a row, or a new loss
  // scale, are captured again. Where capture cannot work (a dropout's seed drawn on the
  // host, a value the host reads mid-step), the steps run kernel by kernel, and
  // graph_use() says why.
  struct StepGraph {
    Device device;
    float loss_scale = 1.0f;
    TensorData inputs;  // the graph's batch
    std::vector<Tensor> y_pred, masks, output_losses, grads;
    Tensor loss;
    // Where each of the model's variables kept its values at the capture, and whether it
    // was trainable: the graphs read and write those addresses, and a layer's mode (a
    // frozen batch norm normalizes by its moving statistics) was recorded with them. A
    // variable whose storage moved since (copied on write while something else held it),
    // or that was frozen or unfrozen, makes the step captured again.
    struct Kept {
      Variable* variable;
      const void* at;
      bool trainable;
    };
    std::vector<Kept> storage;
    DeviceGraph forward, backward;  // backward reads what forward wrote: they go together
  };

  static bool storage_moved(const StepGraph& g) {
    for (const StepGraph::Kept& k : g.storage)
      if (k.variable->mutable_value().raw_device_data() != k.at || k.variable->trainable() != k.trainable) return true;
    return false;
  }

  // Whether this step replays a graph (capturing one first where it is due).
  bool graph_ready(Device device, const TensorData& batch, bool tracing) {
    if (device.is_cpu() || !graphs_wanted_ || tracing || !graph_use_.not_used.empty()) return false;
    if (k_ != 1) {
      graph_use_.not_used = detail::concat("gradient accumulation (an update every ", k_,
                                           " batches) runs its steps kernel by kernel");
      return false;
    }
    const float loss_scale = model_.optimizer_->loss_scale();
    if (graph_ && (!(graph_->device == device) || graph_->loss_scale != loss_scale || storage_moved(*graph_)))
      graph_.reset();
    if (graph_) {
      if (same_shapes(graph_->inputs, batch)) {
        other_shapes_ = 0;
        return true;
      }
      if (++other_shapes_ < 2) return false;
      graph_.reset();  // the batches' shapes changed for good
      gpu_steps_ = 2;  // this shape ran kernel by kernel once already
    }
    if (gpu_steps_ < 2) return false;
    DeviceRuntime& runtime = *device_runtime(device.type);
    if (!runtime.can_capture(device.index)) {
      graph_use_.not_used = detail::concat("the ", runtime.name(), " runtime cannot capture graphs");
      return false;
    }
    capture(runtime, device, batch);
    return graph_ != nullptr;
  }

  static bool same_shapes(const TensorData& a, const TensorData& b) {
    auto same = [](const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i].shape() != y[i].shape() || x[i].dtype() != y[i].dtype()) return false;
      return true;
    };
    return same(a.x, b.x) && same(a.y, b.y);
  }

  void capture(DeviceRuntime& runtime, Device device, const TensorData& batch) {
    auto g = std::make_unique<StepGraph>();
    g->device = device;
    g->loss_scale = model_.optimizer_->loss_scale();
    for (const Tensor& t : batch.x) g->inputs.x.push_back(Tensor::empty(t.shape(), t.dtype(), device));
    for (const Tensor& t : batch.y) g->inputs.y.push_back(Tensor::empty(t.shape(), t.dtype(), device));
    if (vars_.empty()) vars_ = model_.trainable_variables();
    for (Variable* v : model_.variables())
      g->storage.push_back({v, v->mutable_value().raw_device_data(), v->trainable()});
    auto abandon = [&] {
      if (runtime.capturing(device.index)) runtime.end_capture(device.index, /*keep=*/false);
    };
    // Nothing recorded ran: the step runs again kernel by kernel, as every step after it.
    auto fall_back = [&](const Error& e) {
      abandon();
      graph_use_.not_used = e.what();
    };
    try {
      runtime.begin_capture(device.index);
      GradientTape tape;
      g->loss = forward(g->inputs, g->y_pred, g->masks, g->output_losses);
      g->forward = runtime.end_capture(device.index, /*keep=*/true);
      runtime.begin_capture(device.index);
      g->grads = tape.gradient(scaled(g->loss, g->loss_scale), vars_);
      g->backward = runtime.end_capture(device.index, /*keep=*/true);
    } catch (const NotCapturable& e) {
      return fall_back(e);
    } catch (const DeviceError& e) {
      // A library's call that CUDA would not record fails with the library's own status;
      // a failure of the device itself comes back when the step runs kernel by kernel.
      return fall_back(e);
    } catch (...) {
      abandon();
      throw;
    }
    ++graph_use_.captures;
    graph_ = std::move(g);
  }

  // A step as the graph's replay: the batch copied into the graph's, the launch, then the
  // update and the step's end as kernel by kernel.
  void replay_step(const TensorData& batch, metrics::Mean& loss_mean, Clock::time_point start) {
    profile::Track& loop = profiler_.loop();
    StepGraph& g = *graph_;
    for (std::size_t i = 0; i < batch.x.size(); ++i) g.inputs.x[i].copy_from(batch.x[i]);
    for (std::size_t i = 0; i < batch.y.size(); ++i) g.inputs.y[i].copy_from(batch.y[i]);
    const Clock::time_point copied = Clock::now();
    loop.add(profile::Phase::to_device, start, copied);
    DeviceRuntime& runtime = *device_runtime(g.device.type);
    gpu_clock_.start(g.device, profile::Phase::forward, copied, /*trace_kernels=*/false);
    runtime.replay(g.device.index, g.forward);
    const Clock::time_point forward_end = Clock::now();
    loop.add(profile::Phase::forward, copied, forward_end, "a CUDA graph's launch");
    gpu_clock_.mark(profile::Phase::backward);
    runtime.replay(g.device.index, g.backward);
    const Clock::time_point backward_end = Clock::now();
    loop.add(profile::Phase::backward, forward_end, backward_end, "a CUDA graph's launch");
    gpu_clock_.mark(update_phase_);
    model_.optimizer_->apply_scaled_gradients(g.grads, vars_, /*settle_later=*/true);
    const Clock::time_point optimizer_end = Clock::now();
    gpu_clock_.mark(update_phase_);
    loop.add(update_phase_, backward_end, optimizer_end);
    ++graph_use_.replays;
    end_step(batch, g.device, g.loss, g.y_pred, g.masks, g.output_losses, optimizer_end, loss_mean);
  }

  struct Output {
    std::int64_t begin = 0, end = 0;  // the replica's rows of the global batch
    TensorData rows;                  // those rows of every input and target (storage reused)
    std::vector<Tensor> y_pred;       // empty: the replica had no rows
    std::vector<Tensor> masks;        // each output's mask (undefined: none)
    double loss = 0.0;
    std::vector<Tensor> each;           // each output's own loss (several outputs)
    std::vector<double> output_losses;  // their values
    Clock::time_point done{};  // when the replica's work ended
  };

  // Each loss's mean, as numbers (several outputs; nothing for one).
  std::span<const double> loss_values(const std::vector<Tensor>& losses) {
    values_.clear();
    for (const Tensor& l : losses) values_.push_back(detail::mean_value(l));
    return values_;
  }

  // The loss plus `share` of the model's regularization penalties (model.losses), as Keras
  // minimizes and reports it.
  Tensor with_penalties(const Tensor& loss, float share) {
    const std::vector<Tensor> penalties = model_.losses();
    if (penalties.empty()) return loss;
    const Tensor total = add_n(penalties);
    return add(loss, share == 1.0f ? total : scale(total, share));
  }

  void step_replicas(const TensorData& batch, bool update, metrics::Mean& loss_mean, std::int64_t global_rows) {
    StrategyBackend& strategy = *model_.strategy_;
    const int replicas = strategy.num_replicas(), in_sync = strategy.num_replicas_in_sync();
    const bool own = global_rows >= 0;  // x is this worker's part of the global batch
    const std::int64_t local_rows = batch.rows();
    const std::int64_t rows = own ? global_rows : local_rows;
    if (micro_ == 1 && rows < in_sync)
      DTRAIN_THROW(InvalidArgument, "fit: the global batch has ", rows, " rows, fewer than the ", in_sync,
                   " replicas of ", strategy.name(), "; batch_size is the global batch (e.g. 32 * num_replicas_in_sync)");
    const Clock::time_point setup_start = Clock::now();
    if (!model_.built()) {
      // Replicas share the weights, so they are made here, once, before the replicas run.
      if (local_rows == 0)
        DTRAIN_THROW(InvalidArgument, "fit: worker ", strategy.worker_index(),
                     "'s dataset is empty, so it cannot build the model; build it before fit()");
      const Tensor& x = batch.x.front();
      std::vector<std::int64_t> dims(x.shape().dims().begin() + 1, x.shape().dims().end());
      model_.build(Shape(dims));
    }
    if (vars_.empty()) {
      vars_ = model_.trainable_variables();
      // Every worker checks that the others built the same model and takes the chief's weights.
      if (strategy.num_workers() > 1) strategy.synchronize_variables(model_.variables(), detail::describe(model_));
    }
    if (!reducer_) {
      reducer_ = strategy.gradient_reducer(vars_, dense_layers(), synchronizes_batch_norm());
      has_batch_norm_ = has_batch_norm();
      outputs_.resize(static_cast<std::size_t>(replicas));
      // The tracks keep the names of the first workers they were made for (an elastic job
      // makes its reducer again for every new set of workers).
      for (int r = static_cast<int>(tracks_.size()); r < replicas; ++r)
        tracks_.push_back(&profiler_.add_track(
            strategy.num_workers() > 1 ? detail::concat("worker ", strategy.worker_index(), " replica ", r)
                                       : detail::concat("replica ", r),
            profile::TrackKind::replica));
      if (!comm_track_ && strategy.num_workers() > 1)
        comm_track_ = &profiler_.add_track(detail::concat("worker ", strategy.worker_index(), " communication"),
                                           profile::TrackKind::communication);
      reducer_->set_profile(tracks_, strategy.num_workers() > 1 ? comm_track_ : nullptr);
      profiler_.loop().add(profile::Phase::setup, setup_start, Clock::now(), "build the model and gradient buckets");
    }
    // Replicas update their own share of every variable when the optimizer allows it.
    const Clock::time_point prepare_start = Clock::now();
    // On a GPU the update is a few fused launches: one thread queues them.
    const Device device = model_.device();
    const bool shared = update && device.is_cpu() && model_.optimizer_->begin_shared_update(vars_);
    profiler_.loop().add(profile::Phase::optimizer, prepare_start, Clock::now(), "prepare the shared update");
    // As evenly as possible, the first replicas taking one row more: over every worker's
    // replicas for a global batch, over this worker's for its own part.
    const int parts = own ? replicas : in_sync, first = own ? 0 : strategy.worker_index() * replicas;
    std::int64_t next_row = 0;
    for (int g = 0; g < first + replicas; ++g) {
      const std::int64_t begin = next_row;
      next_row += local_rows / parts + (g < local_rows % parts ? 1 : 0);
      if (g >= first) {
        Output& out = outputs_[static_cast<std::size_t>(g - first)];
        out.begin = begin;
        out.end = next_row;
        out.y_pred.clear();
        out.loss = 0.0;
      }
    }
    row_bounds_.assign(1, outputs_.front().begin);
    for (const Output& out : outputs_) row_bounds_.push_back(out.end);
    // A batch norm sums over the replicas inside forward: a replica without rows would
    // leave the others waiting at that sum.
    if (has_batch_norm_)
      for (std::size_t r = 0; r < outputs_.size(); ++r)
        if (outputs_[r].begin == outputs_[r].end)
          DTRAIN_THROW(InvalidArgument, "fit: a batch of ", own ? local_rows : rows, own ? " rows on worker " : " rows",
                       own ? std::to_string(strategy.worker_index()) : std::string(), " leaves replica ", r,
                       " without rows, and the model's BatchNormalization layers sum their statistics over every "
                       "replica; make every global batch at least ", in_sync,
                       " rows (drop_remainder on the dataset, or a sample count the batch size divides)");
    // The noise scale needs one step's gradient over two batch sizes: not accumulated.
    const bool measure_noise =
        update && k_ == 1 && noise_every_ > 0 && reducer_->measures_gradient_norms() && reducer_steps_++ % noise_every_ == 0;
    if (measure_noise) reducer_->measure_gradient_norms();
    reducer_->begin_step(update, row_bounds_);
    // A mean over the batch becomes each replica's share of the global mean; a sum stays a sum.
    const bool mean_loss = model_.loss_reduction() == losses::Reduction::sum_over_batch_size;
    const float scale_by = model_.optimizer_->loss_scale() /
                           ((mean_loss ? static_cast<float>(rows) : 1.0f) * static_cast<float>(k_));
    const Clock::time_point handed_over = Clock::now();
    strategy.run([&](int r) {
      Output& out = outputs_[static_cast<std::size_t>(r)];
      profile::Track& track = *tracks_[static_cast<std::size_t>(r)];
      const std::int64_t begin = out.begin, end = out.end;
      try {
        const Clock::time_point start = Clock::now();
        track.add(profile::Phase::replica_start, handed_over, start);
        timed_cross_replica_calls().clear();  // calls made outside fit's steps are not this step's
        Clock::time_point forward_end = start;
        if (begin == end) {  // a short last batch leaves this replica nothing to do
          for (std::size_t i = 0; i < vars_.size(); ++i) reducer_->gradient_ready(r, i, Tensor());
        } else {
          const ScopedDenseGradientsTogether together(reducer_->dense_gradients_together(r));
          GradientTape tape;
          TensorData::slice_into(batch.x, begin, end, out.rows.x);
          TensorData::slice_into(batch.y, begin, end, out.rows.y);
          if (!device.is_cpu()) {  // the replica's rows go to its GPU (its own, or one it shares)
            const Device here = model_.device();  // on a GPU of its own, where its mirrors are
            for (Tensor& t : out.rows.x) t = t.to(here);
            for (Tensor& t : out.rows.y) t = t.to(here);
          }
          out.y_pred = model_(out.rows.x, /*training=*/true, &out.masks);
          // The penalties count once per global batch: each replica takes its rows' share
          // (for a mean, through the scaling below), which also makes the activity penalties
          // (means over the replica's rows) one mean over the global batch.
          Tensor loss = with_penalties(model_.compute_loss(out.rows.y, out.y_pred, &out.each, out.masks),
                                       mean_loss ? 1.0f : static_cast<float>(end - begin) / static_cast<float>(rows));
          out.loss = detail::mean_value(loss);
          out.output_losses.clear();
          for (const Tensor& l : out.each) out.output_losses.push_back(detail::mean_value(l));
          forward_end = Clock::now();
          track.add(profile::Phase::forward, start, forward_end);
          // The replicas' gradients then add up to the gradient of the global batch's mean.
          tape.gradient(scale(loss, (mean_loss ? static_cast<float>(end - begin) : 1.0f) * scale_by), vars_,
                        [&](std::size_t i, const Tensor& g) { reducer_->gradient_ready(r, i, g); });
        }
        // Buckets summed on the way count as communication (the reducer's own record), and
        // so do the layers' own sums over the replicas (a synchronized batch norm's).
        track.add(profile::Phase::backward, forward_end, Clock::now());
        for (const TimedCrossReplicaCall& call : timed_cross_replica_calls())
          track.add_nested(profile::Phase::communication,
                           call.backward ? profile::Phase::backward : profile::Phase::forward, call.start, call.end,
                           call.what);
        timed_cross_replica_calls().clear();
        reducer_->finish(r);
        out.done = Clock::now();
        if (shared) {
          model_.optimizer_->apply_share(reducer_->reduced(r), vars_, r, replicas);
          const Clock::time_point optimizer_start = out.done;
          out.done = Clock::now();
          track.add(profile::Phase::optimizer, optimizer_start, out.done);
        }
      } catch (...) {
        reducer_->abort(r, message_of(std::current_exception()));
        throw;
      }
    });
    // A replica done before the others waited for the slowest of them.
    const Clock::time_point joined = Clock::now();
    for (std::size_t r = 0; r < outputs_.size(); ++r)
      tracks_[r]->add(profile::Phase::straggler_wait, outputs_[r].done, joined, "waiting for the other replicas");
    profile::Track& loop = profiler_.loop();
    const Clock::time_point optimizer_start = joined;
    // The training thread's small work between the replicas' runs (the end of a shared
    // update, metrics) runs on it alone: on the compute pool it would leave pool threads
    // spinning on the cores the replica threads wake up on next, delaying their start by
    // up to milliseconds. An update that is not shared keeps every core.
    if (measure_noise)
      add_noise_sample(row_bounds_.back() - row_bounds_.front(), rows, model_.optimizer_->loss_scale());
    if (update && !shared) model_.optimizer_->apply_scaled_gradients(reducer_->reduced(0), vars_);
    const ScopedThreads alone(1);
    if (update && shared) model_.optimizer_->end_shared_update();
    const Clock::time_point optimizer_end = Clock::now();
    loop.add(profile::Phase::optimizer, optimizer_start, optimizer_end);
    if (mean_loss) {
      for (const Output& out : outputs_)
        if (!out.y_pred.empty()) {
          const auto n = static_cast<double>(out.end - out.begin);
          loss_mean.update_state(out.loss, n);
          model_.update_metrics(out.rows.y, out.y_pred, out.masks);
          model_.update_output_losses(out.output_losses, n);
        }
    } else {
      // A summed loss is the global batch's sum, as one device reports it: this worker's
      // replicas' sums, weighted so that the workers' means merge into that sum.
      double sum = 0.0;
      values_.assign(model_.num_outputs(), 0.0);
      for (const Output& out : outputs_)
        if (!out.y_pred.empty()) {
          sum += out.loss;
          for (std::size_t o = 0; o < out.output_losses.size(); ++o) values_[o] += out.output_losses[o];
          model_.update_metrics(out.rows.y, out.y_pred, out.masks);
        }
      const std::int64_t mine = row_bounds_.back() - row_bounds_.front();
      if (mine > 0) {
        const double share = static_cast<double>(rows) / static_cast<double>(mine);
        for (double& v : values_) v *= share;
        loss_mean.update_state(sum * share, static_cast<double>(mine));
        model_.update_output_losses(values_, static_cast<double>(mine));
      }
    }
    loop.add(profile::Phase::metrics, optimizer_end, Clock::now());
  }

  // One sampled step: this worker's `small` rows and the global batch's `big`. The
  // gradients summed are each replica's share of the global mean (a mean loss) or plain
  // sums (a summed loss); both become means before the estimate.
  // Under a loss scale the norms are of the scaled gradients; a step that overflowed is
  // left out.
  void add_noise_sample(std::int64_t small, std::int64_t big, float loss_scale) {
    if (small <= 0 || big <= small) return;
    auto [local_sq, global_sq] = reducer_->gradient_norms();
    const double unscale = 1.0 / (double{loss_scale} * double{loss_scale});
    local_sq *= unscale;
    global_sq *= unscale;
    if (!std::isfinite(local_sq) || !std::isfinite(global_sq)) return;
    const double b = static_cast<double>(small), B = static_cast<double>(big);
    const bool mean_loss = model_.loss_reduction() == losses::Reduction::sum_over_batch_size;
    const double small_sq = mean_loss ? local_sq * (B / b) * (B / b) : local_sq / (b * b);
    const double big_sq = mean_loss ? global_sq : global_sq / (B * B);
    const double n = static_cast<double>(noise_.steps);
    noise_.gradient_sq = (noise_.gradient_sq * n + (B * big_sq - b * small_sq) / (B - b)) / (n + 1);
    noise_.trace = (noise_.trace * n + (small_sq - big_sq) / (1 / b - 1 / B)) / (n + 1);
    noise_.small_batch = b;
    noise_.big_batch = B;
    ++noise_.steps;
  }

  bool has_batch_norm() const {
    for (const auto& layer : model_.layers_)
      if (dynamic_cast<const nn::BatchNormalization*>(layer.get())) return true;
    return false;
  }

  // Whether a layer sums over the replicas inside backward (a synchronized batch norm).
  bool synchronizes_batch_norm() const {
    for (const auto& layer : model_.layers_)
      if (auto* bn = dynamic_cast<const nn::BatchNormalization*>(layer.get()); bn && bn->options().synchronized)
        return true;
    return false;
  }

  // The dense layers whose gradients the replicas may compute together: float32 ones,
  // each met once, with a trainable kernel (and bias, when trainable).
  std::vector<DenseVariables> dense_layers() const {
    auto index_of = [&](const Variable* v) {
      const auto it = std::find(vars_.begin(), vars_.end(), v);
      return it == vars_.end() ? DenseVariables::kNone : static_cast<std::size_t>(it - vars_.begin());
    };
    std::vector<DenseVariables> out;
    for (const auto& layer : model_.layers_) {
      auto* dense = dynamic_cast<nn::Dense*>(layer.get());
      // A layer called twice (a shared layer) sums two uses: its gradients go through the buckets.
      if (dense == nullptr || model_.calls_of(layer.get()) != 1 || dense->dtype_policy().compute_dtype != DType::f32)
        continue;
      // So does one whose weights a regularizer reads too (their penalty's gradient).
      if (dense->options().kernel_regularizer || dense->options().bias_regularizer) continue;
      const std::size_t kernel = index_of(&dense->kernel());
      if (kernel == DenseVariables::kNone) continue;
      out.push_back({kernel, dense->bias() ? index_of(dense->bias()) : DenseVariables::kNone});
    }
    return out;
  }

  Model& model_;
  int k_;
  profile::Phase update_phase_ = profile::Phase::optimizer;
  profile::Profiler& profiler_;
  detail::GpuPhaseClock gpu_clock_;          // a GPU's own phase times (one device)
  profile::Track* gpu_track_ = nullptr;      // made at the first step on a GPU
  profile::Track* transfer_track_ = nullptr;  // made at the first copy timed
  std::vector<profile::Track*> tracks_;  // [replica]
  profile::Track* comm_track_ = nullptr;  // multi-worker: the communication thread's
  std::int64_t micro_ = 0;
  std::vector<Variable*> vars_;
  std::vector<Tensor> buffers_;  // one device, accumulating: a sum buffer per variable
  std::vector<Tensor> group_;    // buffers_[i] once the group has a gradient for it, else undefined
  std::unique_ptr<GradientReducer> reducer_;
  bool has_batch_norm_ = false;  // the model's, found with the reducer
  std::vector<Output> outputs_;  // [replica]
  TensorData on_device_;                // one device: the batch on the weights' device
  bool graphs_wanted_ = true;           // FitOptions::cuda_graph
  std::unique_ptr<StepGraph> graph_;    // the step's graph, once captured
  CudaGraphUse graph_use_;
  std::int64_t gpu_steps_ = 0;          // steps with an update run kernel by kernel on a GPU
  int other_shapes_ = 0;                // batches in a row not of the graph's shapes
  std::vector<Tensor> output_losses_;   // one device: each output's own loss (several outputs)
  std::vector<Tensor> output_masks_;    // one device: each output's mask (undefined: none)
  std::vector<double> values_;          // loss values, reused
  std::vector<std::int64_t> row_bounds_;  // replica r's rows: [row_bounds_[r], row_bounds_[r + 1])
  std::int64_t reducer_steps_ = 0;        // reducing steps, for the noise scale's sampling
  int noise_every_ = 10;
  GradientNoise noise_;
};

}  // namespace dtrain
