// Layer: Keras's building block. A layer creates its weights on its first call, from the
// input's shape (shape inference), and checks every later input against that shape.
// Model-level concerns (compile, fit, JSON configs) live in the model layer above.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/autograd/ops.h"
#include "dtrain/autograd/variable.h"
#include "dtrain/core/block_cache.h"
#include "dtrain/nn/policy.h"
#include "dtrain/nn/regularizers.h"

namespace dtrain::nn {

class Layer {
 public:
  // The layer takes the global dtype policy in force when it is created.
  explicit Layer(std::string name)
      : name_(std::move(name)), tag_("layer '" + name_ + "'"), policy_(global_policy()) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Builds on the first call, then runs the layer. `training` switches dropout and the like.
  // An input on another device than the layer's weights is copied to theirs first.
  Tensor operator()(const Tensor& x, bool training = false);
  // Layers that join several inputs (Add, Concatenate) take them as a list; any other layer
  // takes a list of one.
  Tensor operator()(std::span<const Tensor> inputs, bool training = false);
  virtual bool takes_several_inputs() const { return false; }
  // The output shape for a list of input shapes (one, unless takes_several_inputs()).
  virtual Shape compute_output_shape_of(std::span<const Shape> input_shapes) const;
  // A layer of several inputs with weights (MultiHeadAttention) makes them here, for the
  // shapes of its first call; the others have nothing to build.
  virtual void build_several(std::span<const Shape> /*input_shapes*/) {}

  // Keras's masks: beside a sequence [batch, steps, ...] a model may carry a mask [batch,
  // steps] (float32, 1 for a real step, 0 for padding), made by Embedding(mask_zero) and
  // read by the layers that honour it (MultiHeadAttention, GlobalAveragePooling1D, the
  // loss). The mask of this layer's output for its inputs and their masks (an undefined
  // tensor for none): a layer that supports masking passes its first input's on, any other
  // drops it, as Keras's layers do.
  virtual bool supports_masking() const { return false; }
  virtual Tensor compute_mask(std::span<const Tensor> inputs, std::span<const Tensor> masks) const;
  // The layer's call with its inputs' masks (masks[i] for inputs[i], undefined for none).
  Tensor operator()(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training);

  // Creates the weights for inputs of `input_shape` (its first axis is the batch and is
  // not fixed). Calling it twice with a different shape is an error naming the layer.
  void build(const Shape& input_shape);
  // Whether a layer built for `built` takes inputs of `given`: any batch, every other axis
  // the same (a layer whose weights fit other shapes too says so).
  virtual bool takes_shape_once_built(const Shape& built, const Shape& given) const;
  bool built() const { return input_shape_.has_value(); }
  // The output shape for an input shape; throws InvalidArgument naming the layer.
  virtual Shape compute_output_shape(const Shape& input_shape) const = 0;
  virtual std::string class_name() const = 0;

  const std::string& name() const { return name_; }
  void set_name(std::string name);
  // The same for a built layer: its weights are renamed with it ("conv2d_1/kernel").
  void rename(const std::string& name);
  std::vector<Variable*> variables();
  std::vector<Variable*> trainable_variables();
  // The first of variables(), or null, without gathering them (for a step's device lookup).
  Variable* first_variable() const;
  // Freezes (false) or unfreezes the layer's weights, now and when they are created.
  void set_trainable(bool trainable);
  bool trainable() const { return trainable_; }
  const DTypePolicy& dtype_policy() const { return policy_; }
  // Before the layer is built; afterwards it is an error naming the layer.
  void set_dtype_policy(std::string_view name);
  std::int64_t count_params() const;
  std::optional<Shape> input_shape() const { return input_shape_; }

  // Keras's layer.losses: each weight regularizer's penalty on the weight's current value
  // (recorded by live tapes), then the activity regularizer's penalty on the last call's
  // output (its mean over the batch's rows, as tf.keras takes it).
  std::vector<Tensor> losses() const;
  // The penalty on the layer's output (every layer takes one, as in Keras); before or after
  // it is built.
  void set_activity_regularizer(std::optional<Regularizer> r) { activity_regularizer_ = std::move(r); }
  const std::optional<Regularizer>& activity_regularizer() const { return activity_regularizer_; }
  // The regularizer of weight `v` of this layer (none: nullopt).
  std::optional<Regularizer> regularizer_of(const Variable& v) const;

  // The position of every random stream the layer draws from while training (Dropout's
  // masks), as integers a checkpoint saves; set_rng_state puts a saved one back, so that a
  // resumed run draws the masks the uninterrupted one would have. Empty for most layers.
  virtual std::vector<std::uint64_t> rng_state() const { return {}; }
  virtual void set_rng_state(std::span<const std::uint64_t> state);

 protected:
  virtual void build_weights(const Shape& /*input_shape*/) {}
  virtual Tensor call(const Tensor& x, bool training) = 0;
  // Layers that take several inputs override this (their call() of one input is not used).
  virtual Tensor call_several(std::span<const Tensor> inputs, bool training);
  // What operator() does around a layer's own work, and a layer's public call of its own
  // (MultiHeadAttention's attend): `work` runs with the layer named as who asks for memory,
  // and its output's activity penalty is recorded. A template: a step's call allocates
  // nothing for the closure.
  template <typename Work>
  Tensor run_as_call(Work&& work) {
    const AllocationTag tag(&tag_);
    Tensor y = work();
    regularize_activity(y);
    return y;
  }
  // Layers that read their inputs' masks override this; it is called only where a mask is
  // given (the others take call() or call_several()).
  virtual Tensor call_masked(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training);
  // A weight of this layer, with the regularizer whose penalty joins losses() and the
  // constraint optimizers apply after each update, where given.
  Variable& add_weight(const std::string& name, Tensor initial, bool trainable = true,
                       std::optional<Regularizer> regularizer = std::nullopt,
                       std::optional<Constraint> constraint = std::nullopt);
  // An InvalidArgument that starts with "layer '<name>' (<class>): ".
  [[noreturn]] void fail(const std::string& message) const;
  // A layer this one calls (a layer written in Python calls built-in ones): its weights,
  // penalties and trainability count as this layer's. Tracked once however often given.
  void track_sublayer(std::shared_ptr<Layer> sublayer);
  const std::vector<std::shared_ptr<Layer>>& sublayers() const { return sublayers_; }

 private:
  std::string name_;
  std::string tag_;  // "layer 'name'": who asks for memory while the layer runs (AllocationTag)
  bool trainable_ = true;
  DTypePolicy policy_;
  std::optional<Shape> input_shape_;
  std::vector<std::unique_ptr<Variable>> weights_;
  std::vector<std::optional<Regularizer>> regularizers_;  // [weight]
  std::vector<std::shared_ptr<Layer>> sublayers_;
  std::optional<Regularizer> activity_regularizer_;
  // The last call's activity penalties, per replica of the strategy running (replicas
  // share the layer and call it at once).
  mutable std::mutex activity_mutex_;
  std::vector<std::vector<Tensor>> activity_losses_;  // [replica id]
  // The last call's activity penalty on `y`, kept for losses().
  void regularize_activity(const Tensor& y);
};

}  // namespace dtrain::nn
