// Recording and replaying operations for reverse-mode differentiation.
#include "dtrain/autograd/tape.h"

#include <algorithm>

#include "dtrain/autograd/variable.h"
#include "dtrain/kernels/backend.h"

namespace dtrain {
namespace {

std::vector<GradientTape*>& live_tapes() {
  thread_local std::vector<GradientTape*> tapes;
  return tapes;
}

// The gradient of a target with respect to itself, on the target's device.
Tensor ones_like(const Tensor& target) {
  Tensor ones = Tensor::empty(target.shape(), DType::f32, target.device());
  kernels::backend(target.device()).fill(ones, 1.0f);
  return ones;
}

}  // namespace

void BackwardContext::add(int input, const Tensor& grad) {
  if (!needs(input)) return;
  if (!(grad.shape() == shapes_[input]))
    DTRAIN_THROW(InternalError, "backward produced a gradient of shape ", grad.shape().to_string(),
                 " for an input of shape ", shapes_[input].to_string());
  tape_.accumulate(inputs_[input], grad);
}

GradientTape::GradientTape(bool persistent) : persistent_(persistent) {
  watched_.reserve(64);
  entries_.reserve(64);
  live_tapes().push_back(this);
}

GradientTape::~GradientTape() {
  if (!stopped_) leave_live_tapes();
}

bool GradientTape::leave_live_tapes() {
  auto& tapes = live_tapes();
  // Usually the last one; a tape destroyed or stopped out of order is still removed.
  auto it = std::find(tapes.rbegin(), tapes.rend(), this);
  if (it == tapes.rend()) return false;
  tapes.erase(std::next(it).base());
  return true;
}

void GradientTape::stop() {
  if (stopped_) return;
  if (!leave_live_tapes())
    DTRAIN_THROW(InvalidArgument, "GradientTape::stop: called on a thread other than the one that made the tape");
  recording_ = false;
  stopped_ = true;
}

void GradientTape::watch(const Tensor& t) {
  t.check_defined("GradientTape::watch");
  watched_.insert(t.id());
}

void GradientTape::watch(const Variable& v) { watched_.insert(v.id()); }

bool GradientTape::should_record(std::span<const Tensor* const> inputs) {
  for (GradientTape* tape : live_tapes()) {
    if (!tape->recording_) continue;
    for (const Tensor* t : inputs)
      if (t && tape->watched_.contains(t->id())) return true;
  }
  return false;
}

void GradientTape::record(std::span<const Tensor* const> inputs, const Tensor& output, BackwardFn backward) {
  DTRAIN_CHECK_LE(inputs.size(), static_cast<size_t>(kMaxInputs));
  for (GradientTape* tape : live_tapes()) {
    if (!tape->recording_) continue;
    std::uint32_t mask = 0;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] && tape->watched_.contains(inputs[i]->id())) mask |= 1u << i;
    if (mask == 0) continue;
    Entry e;
    e.num_inputs = static_cast<int>(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      e.inputs[i] = inputs[i] ? inputs[i]->id() : 0;
      if (inputs[i]) e.shapes[i] = inputs[i]->shape();
    }
    e.needs_mask = mask;
    e.output = output.id();
    e.backward = backward;  // copied: each tape owns its record
    tape->entries_.push_back(std::move(e));
    tape->watched_.insert(output.id());
  }
}

void GradientTape::variable_read(const Tensor& value) {
  for (GradientTape* tape : live_tapes())
    if (tape->recording_) tape->watched_.insert(value.id());
}

void GradientTape::accumulate(std::uint64_t id, const Tensor& grad) {
  auto [it, inserted] = grads_.try_emplace(id, grad);
  if (inserted) return;
  // Out of place: a backward function may hand the same tensor to several inputs.
  Tensor sum = Tensor::empty(grad.shape(), DType::f32, grad.device());
  kernels::backend(grad.device()).binary(kernels::Binary::add, it->second, grad, sum);
  it->second = sum;
}

namespace {

std::vector<std::uint64_t> tensor_ids(std::span<const Tensor> sources) {
  std::vector<std::uint64_t> ids;
  ids.reserve(sources.size());
  for (const Tensor& t : sources) ids.push_back(t.id());
  return ids;
}

std::vector<std::uint64_t> variable_ids(std::span<Variable* const> sources) {
  std::vector<std::uint64_t> ids;
  ids.reserve(sources.size());
  for (Variable* v : sources) {
    if (v == nullptr) DTRAIN_THROW(InvalidArgument, "GradientTape::gradient: a source variable is null");
    ids.push_back(v->id());
  }
  return ids;
}

}  // namespace

std::vector<Tensor> GradientTape::gradient(const Tensor& target, std::span<Variable* const> sources,
                                           const Tensor& output_gradient) {
  return run_backward({&target, 1}, variable_ids(sources), {&output_gradient, 1});
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target, std::span<Variable* const> sources,
                                           const GradientReadyFn& on_ready, const Tensor& output_gradient) {
  return run_backward({&target, 1}, variable_ids(sources), {&output_gradient, 1}, on_ready ? &on_ready : nullptr);
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target, std::span<const Tensor> sources,
                                           const Tensor& output_gradient) {
  return run_backward({&target, 1}, tensor_ids(sources), {&output_gradient, 1});
}

std::vector<Tensor> GradientTape::gradient(std::span<const Tensor> targets, std::span<const Tensor> sources,
                                           std::span<const Tensor> output_gradients) {
  if (!output_gradients.empty() && output_gradients.size() != targets.size())
    DTRAIN_THROW(InvalidArgument, "GradientTape::gradient: ", output_gradients.size(), " output gradients for ",
                 targets.size(), " targets");
  return run_backward(targets, tensor_ids(sources), output_gradients);
}

std::vector<Tensor> GradientTape::run_backward(std::span<const Tensor> targets, std::span<const std::uint64_t> sources,
                                               std::span<const Tensor> output_gradients,
                                               const GradientReadyFn* on_ready) {
  if (targets.empty()) DTRAIN_THROW(InvalidArgument, "GradientTape::gradient: no target");
  for (std::size_t i = 0; i < targets.size(); ++i) {
    targets[i].check_defined("GradientTape::gradient (target)");
    if (i < output_gradients.size() && output_gradients[i].defined()) {
      check_same_shape(output_gradients[i], targets[i], "GradientTape::gradient (output_gradient)");
      output_gradients[i].check_dtype(targets[i].dtype(), "GradientTape::gradient (output_gradient)");
    }
  }
  if (used_ && !persistent_)
    DTRAIN_THROW(InvalidArgument,
                 "GradientTape::gradient: a non-persistent tape computes gradients only once; "
                 "construct it with GradientTape(/*persistent=*/true) to call gradient() again");
  used_ = true;
  // Partial sums never survive a failed call (a persistent tape may be asked again).
  grads_.clear();
  struct ClearOnExit {
    std::unordered_map<std::uint64_t, Tensor>& grads;
    ~ClearOnExit() { grads.clear(); }
  } clear_on_exit{grads_};
  std::vector<Tensor> result(sources.size());
  // Several targets are summed: one that is also another's input, or given twice, adds up.
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const bool given = i < output_gradients.size() && output_gradients[i].defined();
    accumulate(targets[i].id(), given ? output_gradients[i] : ones_like(targets[i]));
  }
  // For on_ready: a source's gradient is final once the earliest recorded op reading it
  // has run its backward. `pending` holds (that op's index, source) latest op first;
  // sources no op reads come last, with no gradient.
  constexpr std::size_t kUnread = static_cast<std::size_t>(-1);
  std::vector<std::pair<std::size_t, std::size_t>> pending;
  std::size_t next = 0;
  // Reports the sources whose earliest reader is op first_op or later (0: all left).
  auto report_read_from = [&](std::size_t first_op) {
    for (; next < pending.size(); ++next) {
      const std::size_t first = pending[next].first;
      if (first_op > 0 && (first == kUnread || first < first_op)) break;
      auto g = grads_.find(sources[pending[next].second]);
      (*on_ready)(pending[next].second, g != grads_.end() ? g->second : Tensor());
    }
  };
  if (on_ready) {
    for (std::size_t i = 0; i < sources.size(); ++i) {
      std::size_t first = kUnread;
      for (std::size_t e = 0; e < entries_.size() && first == kUnread; ++e)
        if (std::find(entries_[e].inputs, entries_[e].inputs + entries_[e].num_inputs, sources[i]) !=
            entries_[e].inputs + entries_[e].num_inputs)
          first = e;
      pending.emplace_back(first, i);
    }
    std::sort(pending.begin(), pending.end(), [&](const auto& a, const auto& b) {
      if ((a.first == kUnread) != (b.first == kUnread)) return b.first == kUnread;
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
  }
  // Walking in reverse record order visits each op after every consumer of its output.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    // The ops after this one have run: sources they were the earliest readers of are final.
    if (on_ready) report_read_from(static_cast<std::size_t>(entries_.rend() - it));
    auto g = grads_.find(it->output);
    if (g == grads_.end()) continue;
    const Tensor grad_output = g->second;
    // No longer needed unless asked for: frees memory early.
    if (!persistent_ && std::find(sources.begin(), sources.end(), it->output) == sources.end()) grads_.erase(g);
    BackwardContext ctx(*this, std::span<const std::uint64_t>(it->inputs, it->num_inputs),
                        std::span<const Shape>(it->shapes, it->num_inputs), it->needs_mask);
    it->backward(grad_output, ctx);
    if (!persistent_) it->backward = nullptr;  // drops the saved tensors
  }
  if (on_ready) report_read_from(0);  // the first op's sources, then the unread ones
  for (size_t i = 0; i < sources.size(); ++i) {
    auto g = grads_.find(sources[i]);
    if (g != grads_.end()) result[i] = g->second;
  }
  if (!persistent_) {
    entries_.clear();
    watched_.clear();
  }
  return result;
}

}  // namespace dtrain
