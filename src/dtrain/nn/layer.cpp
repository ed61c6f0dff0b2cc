// Layer building, input checks and weight bookkeeping.
#include "dtrain/nn/layer.h"

#include <algorithm>

#include "dtrain/core/block_cache.h"
#include "dtrain/core/replica.h"

namespace dtrain::nn {

void Layer::fail(const std::string& message) const {
  DTRAIN_THROW(InvalidArgument, "layer '", name_, "' (", class_name(), "): ", message);
}

void Layer::build(const Shape& input_shape) {
  if (input_shape_) {
    if (!takes_shape_once_built(*input_shape_, input_shape))
      fail("expected inputs shaped like " + input_shape_->to_string() + " (any batch size), got " +
           input_shape.to_string());
    return;
  }
  // Replicas share one copy of the weights, so they cannot each create them.
  if (replica_context().num_replicas > 1)
    fail("is built inside strategy.run() by replica " + std::to_string(replica_context().replica_id) +
         "; build the model inside strategy.scope() before running replicas (model.build(input_shape), or one call)");
  compute_output_shape(input_shape);  // validates the shape before any weight exists
  build_weights(input_shape);
  input_shape_ = input_shape;
}

Tensor Layer::operator()(const Tensor& x, bool training) {
  x.check_defined(name_.c_str());
  build(x.shape());
  try {
    // An input from another device joins the weights (as Keras copies NumPy inputs to the
    // GPU); the ops inside never copy.
    return run_as_call([&] {
      const bool moved = !weights_.empty() && !(x.device() == weights_.front()->value_device());
      return call(moved ? x.to(weights_.front()->value_device()) : x, training);
    });
  } catch (const Unsupported&) {  // oneDNN refused the layer's settings: say which layer
    rethrow_with_context(std::current_exception(),
                         "layer '" + name_ + "' (" + class_name() + ") on " + x.shape().to_string());
  }
}

Tensor Layer::operator()(std::span<const Tensor> inputs, bool training) {
  if (!takes_several_inputs()) {
    if (inputs.size() != 1) fail("takes one input, got " + std::to_string(inputs.size()));
    return (*this)(inputs[0], training);
  }
  std::vector<Shape> shapes;
  for (const Tensor& x : inputs) {
    x.check_defined(name_.c_str());
    shapes.push_back(x.shape());
  }
  compute_output_shape_of(shapes);  // checks the inputs against each other
  if (!built()) build_several(shapes);
  return run_as_call([&] { return call_several(inputs, training); });
}

Tensor Layer::operator()(std::span<const Tensor> inputs, std::span<const Tensor> masks, bool training) {
  if (std::none_of(masks.begin(), masks.end(), [](const Tensor& m) { return m.defined(); }))
    return inputs.size() == 1 ? (*this)(inputs[0], training) : (*this)(inputs, training);
  if (masks.size() != inputs.size())
    fail("got " + std::to_string(masks.size()) + " masks for " + std::to_string(inputs.size()) + " inputs");
  std::vector<Shape> shapes;
  for (const Tensor& x : inputs) {
    x.check_defined(name_.c_str());
    shapes.push_back(x.shape());
  }
  if (!takes_several_inputs() || inputs.size() == 1) {  // one input (a layer of several called on one: itself)
    if (inputs.size() != 1) fail("takes one input, got " + std::to_string(inputs.size()));
    build(shapes[0]);
  } else {
    compute_output_shape_of(shapes);
    if (!built()) build_several(shapes);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& m = masks[i];
    if (!m.defined()) continue;
    // A mask covers the leading axes of its tensor: [batch, steps] for [batch, steps, features].
    bool fits = m.rank() >= 1 && m.rank() < inputs[i].rank();
    for (int d = 0; fits && d < m.rank(); ++d) fits = m.dim(d) == inputs[i].dim(d);
    if (!fits)
      fail("got a mask " + m.shape().to_string() + " for its input " + inputs[i].shape().to_string() +
           " (a mask covers the batch and step axes of its tensor)");
  }
  return run_as_call([&] {
    // Inputs and masks from another device join the weights, as in the unmasked call.
    std::vector<Tensor> xs(inputs.begin(), inputs.end()), ms(masks.begin(), masks.end());
    if (!weights_.empty()) {
      const Device where = weights_.front()->value_device();
      for (Tensor& x : xs) x = x.to(where);
      for (Tensor& m : ms)
        if (m.defined()) m = m.to(where);
    }
    return call_masked(xs, ms, training);
  });
}

bool Layer::takes_shape_once_built(const Shape& built, const Shape& given) const {
  // The batch axis may differ between calls; every other axis must match.
  bool same = given.rank() == built.rank();
  for (int i = 1; same && i < given.rank(); ++i) same = given[i] == built[i];
  return same;
}

Tensor Layer::call_masked(std::span<const Tensor> inputs, std::span<const Tensor> /*masks*/, bool training) {
  return inputs.size() == 1 ? call(inputs[0], training) : call_several(inputs, training);
}

Tensor Layer::compute_mask(std::span<const Tensor> /*inputs*/, std::span<const Tensor> masks) const {
  if (!supports_masking() || masks.empty()) return Tensor();
  return masks[0];
}

Shape Layer::compute_output_shape_of(std::span<const Shape> input_shapes) const {
  if (input_shapes.size() != 1) fail("takes one input, got " + std::to_string(input_shapes.size()));
  return compute_output_shape(input_shapes[0]);
}

Tensor Layer::call_several(std::span<const Tensor> inputs, bool training) {
  if (inputs.size() != 1) fail("takes one input, got " + std::to_string(inputs.size()));
  return call(inputs[0], training);
}

void Layer::set_name(std::string name) {
  if (built()) fail("cannot be renamed after it is built");
  name_ = std::move(name);
  tag_ = "layer '" + name_ + "'";
}

void Layer::rename(const std::string& name) {
  for (auto& w : weights_) {
    const std::string& old = w->name();
    w->set_name(name + old.substr(name_.size()));  // "<layer>/<weight>"
  }
  name_ = name;
  tag_ = "layer '" + name_ + "'";
}

Variable& Layer::add_weight(const std::string& name, Tensor initial, bool trainable,
                            std::optional<Regularizer> regularizer, std::optional<Constraint> constraint) {
  // Created on the host by the initializers, the weights live where the placement says
  // (TensorFlow's `with tf.device(...)`, a GPU by default where fit or Python ran "auto").
  auto v = std::make_unique<Variable>(name_ + "/" + name, initial.to(placement()), trainable && trainable_);
  try {
    v->set_constraint(std::move(constraint));
  } catch (const InvalidArgument& e) {
    fail(e.what());
  }
  weights_.push_back(std::move(v));
  regularizers_.push_back(std::move(regularizer));
  return *weights_.back();
}

void Layer::regularize_activity(const Tensor& y) {
  if (!activity_regularizer_) return;
  // tf.keras divides the penalty by the batch's rows, so it does not grow with the batch.
  const float rows = y.rank() > 0 ? static_cast<float>(std::max<std::int64_t>(1, y.dim(0))) : 1.0f;
  Tensor penalty = scale(regularization(*activity_regularizer_, y), 1.0f / rows);
  const auto replica = static_cast<std::size_t>(replica_context().replica_id);
  const std::lock_guard lock(activity_mutex_);
  if (activity_losses_.size() <= replica) activity_losses_.resize(replica + 1);
  activity_losses_[replica].assign(1, std::move(penalty));
}

std::vector<Tensor> Layer::losses() const {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < weights_.size(); ++i)
    if (regularizers_[i]) out.push_back(regularization(*regularizers_[i], weights_[i]->value()));
  const auto replica = static_cast<std::size_t>(replica_context().replica_id);
  {
    const std::lock_guard lock(activity_mutex_);
    if (replica < activity_losses_.size())
      out.insert(out.end(), activity_losses_[replica].begin(), activity_losses_[replica].end());
  }
  for (const auto& l : sublayers_)
    for (Tensor& t : l->losses()) out.push_back(std::move(t));
  return out;
}

std::optional<Regularizer> Layer::regularizer_of(const Variable& v) const {
  for (std::size_t i = 0; i < weights_.size(); ++i)
    if (weights_[i].get() == &v) return regularizers_[i];
  return std::nullopt;
}

void Layer::set_dtype_policy(std::string_view name) {
  DTypePolicy p = dtrain::nn::dtype_policy(name);
  if (built() && p.name != policy_.name)
    fail("its dtype policy cannot change after it is built (it is '" + policy_.name + "', asked for '" + p.name + "')");
  policy_ = std::move(p);
}

void Layer::set_rng_state(std::span<const std::uint64_t> state) {
  if (!state.empty()) fail("it draws no random numbers, but a saved random-stream state has " + std::to_string(state.size()) + " values");
}

void Layer::set_trainable(bool trainable) {
  trainable_ = trainable;
  for (auto& w : weights_) w->set_trainable(trainable);
  for (auto& l : sublayers_) l->set_trainable(trainable);
}

void Layer::track_sublayer(std::shared_ptr<Layer> sublayer) {
  if (!sublayer || sublayer.get() == this) fail("cannot track itself or nothing as a sublayer");
  for (const auto& l : sublayers_)
    if (l == sublayer) return;
  if (!trainable_) sublayer->set_trainable(false);
  sublayers_.push_back(std::move(sublayer));
}

std::vector<Variable*> Layer::variables() {
  std::vector<Variable*> out;
  for (auto& w : weights_) out.push_back(w.get());
  for (auto& l : sublayers_)
    for (Variable* v : l->variables()) out.push_back(v);
  return out;
}

Variable* Layer::first_variable() const {
  if (!weights_.empty()) return weights_.front().get();
  for (const auto& l : sublayers_)
    if (Variable* v = l->first_variable()) return v;
  return nullptr;
}

std::vector<Variable*> Layer::trainable_variables() {
  std::vector<Variable*> out;
  for (Variable* v : variables())
    if (v->trainable()) out.push_back(v);
  return out;
}

std::int64_t Layer::count_params() const {
  std::int64_t n = 0;
  for (const auto& w : weights_) n += w->numel();
  for (const auto& l : sublayers_) n += l->count_params();
  return n;
}

}  // namespace dtrain::nn
