// GradientTape, as in TensorFlow: while a tape is alive on a thread, every op whose inputs
// it watches is recorded with its backward function, and gradient(target, sources) walks
// the record backwards. Trainable variables are watched when read; other tensors with
// watch(). Tapes are per thread (each replica thread has its own), which is why the
// "current tapes" are a thread-local stack and not an object passed to every op.
// Not supported: gradients of gradients (backward functions are not themselves recorded).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain {

class Variable;

// What a backward function sees: which inputs want a gradient, and where to put it.
class BackwardContext {
 public:
  bool needs(int input) const { return (needs_mask_ >> input) & 1u; }
  // Adds `grad` to the gradient of input `input` (shapes must match that input).
  void add(int input, const Tensor& grad);

 private:
  friend class GradientTape;
  BackwardContext(class GradientTape& tape, std::span<const std::uint64_t> inputs,
                  std::span<const Shape> shapes, std::uint32_t mask)
      : tape_(tape), inputs_(inputs), shapes_(shapes), needs_mask_(mask) {}
  class GradientTape& tape_;
  std::span<const std::uint64_t> inputs_;
  std::span<const Shape> shapes_;
  std::uint32_t needs_mask_;
};

// Receives the gradient of the op's output and adds the inputs' gradients to ctx.
using BackwardFn = std::function<void(const Tensor& grad_output, BackwardContext& ctx)>;

class GradientTape {
 public:
  static constexpr int kMaxInputs = 8;

  explicit GradientTape(bool persistent = false);
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  void watch(const Tensor& t);
  void watch(const Variable& v);
  bool is_watched(const Tensor& t) const { return watched_.contains(t.id()); }

  // d target / d source for each source; an undefined Tensor where target does not depend
  // on it (TensorFlow's None). output_gradient defaults to ones shaped like target.
  // A non-persistent tape can answer once; its record is freed afterwards.
  std::vector<Tensor> gradient(const Tensor& target, std::span<Variable* const> sources,
                               const Tensor& output_gradient = {});
  std::vector<Tensor> gradient(const Tensor& target, std::span<const Tensor> sources,
                               const Tensor& output_gradient = {});
  // The same, calling on_ready(i, gradient of sources[i]) as soon as that gradient is
  // final, while the rest of backward still runs (so a strategy can reduce it early).
  // Sources the target does not depend on are reported last, with an undefined tensor.
  using GradientReadyFn = std::function<void(std::size_t index, const Tensor& grad)>;
  std::vector<Tensor> gradient(const Tensor& target, std::span<Variable* const> sources,
                               const GradientReadyFn& on_ready, const Tensor& output_gradient = {});
  std::vector<Tensor> gradient(const Tensor& target, std::initializer_list<Tensor> sources) {
    return gradient(target, std::span<const Tensor>(sources.begin(), sources.size()));
  }
  // Of several targets, the gradient of their sum, as TensorFlow takes a list of targets:
  // each target starts from its output gradient (ones where that is undefined or not given).
  std::vector<Tensor> gradient(std::span<const Tensor> targets, std::span<const Tensor> sources,
                               std::span<const Tensor> output_gradients = {});

  // Pauses recording on this tape for the lifetime of the returned guard
  // (TensorFlow's `with tape.stop_recording()`).
  class Pause {
   public:
    explicit Pause(GradientTape& tape) : tape_(tape), was_(tape.recording_) { tape.recording_ = false; }
    ~Pause() { tape_.recording_ = was_; }
   private:
    GradientTape& tape_;
    bool was_;
  };
  Pause stop_recording() { return Pause(*this); }
  // Ends recording for good, as leaving TensorFlow's `with GradientTape()` block does: the
  // tape leaves this thread's live tapes, so it may then be destroyed on any thread, and
  // gradient() still answers from its record. Called on the thread that made the tape (an
  // InvalidArgument otherwise); a second call does nothing.
  void stop();
  bool stopped() const { return stopped_; }

  std::size_t num_recorded() const { return entries_.size(); }

  // For ops: true when some live tape on this thread watches one of `inputs`.
  static bool should_record(std::span<const Tensor* const> inputs);
  // For ops: records `backward` for `output` on every live tape that watches an input.
  static void record(std::span<const Tensor* const> inputs, const Tensor& output, BackwardFn backward);
  // For Variable::value(): watches a trainable variable's value on every live tape.
  static void variable_read(const Tensor& value);

 private:
  friend class BackwardContext;
  struct Entry {
    std::uint64_t inputs[kMaxInputs];
    Shape shapes[kMaxInputs];
    int num_inputs;
    std::uint32_t needs_mask;
    std::uint64_t output;
    BackwardFn backward;
  };

  void accumulate(std::uint64_t id, const Tensor& grad);
  // Removes this tape from the calling thread's live tapes; false when it is not among them.
  bool leave_live_tapes();
  std::vector<Tensor> run_backward(std::span<const Tensor> targets, std::span<const std::uint64_t> sources,
                                   std::span<const Tensor> output_gradients, const GradientReadyFn* on_ready = nullptr);

  bool persistent_;
  bool recording_ = true;
  bool stopped_ = false;
  bool used_ = false;
  std::unordered_set<std::uint64_t> watched_;
  std::vector<Entry> entries_;
  std::unordered_map<std::uint64_t, Tensor> grads_;  // live only during gradient()
};

}  // namespace dtrain
