// Model: layer stack or graph, compile, the fit loop, evaluation, prediction and summary.
#include "dtrain/model/sequential.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "dtrain/core/clock.h"
#include "dtrain/core/files.h"
#include "dtrain/core/threads.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/model/batch_sources.h"
#include "dtrain/model/device_batches.h"
#include "dtrain/model/progress.h"
#include "dtrain/model/safetensors.h"
#include "dtrain/model/saving.h"
#include "dtrain/model/trainer.h"

namespace dtrain {
namespace {

std::string shape_with_batch(const Shape& s) {
  std::string out = "(None";
  for (int i = 1; i < s.rank(); ++i) out += ", " + std::to_string(s[i]);
  return out + (s.rank() == 1 ? ",)" : ")");
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string with_commas(std::int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace

Model::Model(std::string name) : name_(std::move(name)) {}

Model::Model(std::vector<KerasTensor> inputs, std::vector<KerasTensor> outputs, std::string name)
    : name_(std::move(name)), inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
  if (inputs_.empty() || outputs_.empty())
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': a functional model needs at least one input and one output");
  std::set<const GraphNode*> input_nodes;
  std::set<std::string> names;
  for (const KerasTensor& t : inputs_) {
    if (t.defined() && !t.node()->layer && !names.insert(t.name()).second)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': two Inputs are named '", t.name(), "'");
    if (!t.defined() || t.node()->layer)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': its inputs must be Input() tensors, got ",
                   t.defined() ? "the output of layer '" + t.name() + "'" : std::string("an undefined tensor"));
    if (!input_nodes.insert(t.node().get()).second)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': Input '", t.name(), "' is given twice");
  }
  // Depth-first from the outputs: every node after the nodes it reads.
  std::set<const GraphNode*> done;
  std::function<void(const std::shared_ptr<const GraphNode>&)> visit = [&](const std::shared_ptr<const GraphNode>& n) {
    if (done.count(n.get())) return;
    if (!n->layer && !input_nodes.count(n.get()))
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': its outputs depend on Input '", n->name,
                   "', which is not among the model's inputs");
    for (const KerasTensor& in : n->inputs) visit(in.node());
    done.insert(n.get());
    graph_.push_back(n);
  };
  for (const KerasTensor& t : outputs_) {
    if (!t.defined()) DTRAIN_THROW(InvalidArgument, "model '", name_, "': an output is an undefined tensor");
    visit(t.node());
  }
  for (const KerasTensor& t : inputs_)
    if (!done.count(t.node().get()))
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': no output depends on Input '", t.name(), "'");
  std::set<const nn::Layer*> seen;
  for (const auto& n : graph_) {
    if (!n->layer || !seen.insert(n->layer.get()).second) continue;
    // Keras names layers uniquely as it makes them (conv2d, conv2d_1, ...); here a name
    // already taken in the model gets the next free suffix, weights included.
    if (names.count(n->layer->name())) {
      const std::string base = n->layer->name();
      int k = 1;
      while (names.count(base + "_" + std::to_string(k))) ++k;
      n->layer->rename(base + "_" + std::to_string(k));
    }
    names.insert(n->layer->name());
    layers_.push_back(n->layer);
  }
  const Shape& first = inputs_.front().shape();
  input_shape_ = Shape(std::vector<std::int64_t>(first.dims().begin() + 1, first.dims().end()));
  // Batch norms followed by a relu and nothing else run the relu in their own pass.
  std::unordered_map<const GraphNode*, int> readers;
  for (const auto& n : graph_)
    for (const KerasTensor& in : n->inputs) ++readers[in.node().get()];
  for (const KerasTensor& t : outputs_) ++readers[t.node().get()];
  std::unordered_map<const GraphNode*, std::size_t> index;
  for (std::size_t i = 0; i < graph_.size(); ++i) index[graph_[i].get()] = i;
  fused_relu_.assign(graph_.size(), 0);
  runs_relu_.assign(graph_.size(), 0);
  for (std::size_t i = 0; i < graph_.size(); ++i) {
    const GraphNode& n = *graph_[i];
    if (n.inputs.size() != 1 || !is_relu(n.layer.get())) continue;
    const GraphNode* from = n.inputs[0].node().get();
    if (readers[from] == 1 && dynamic_cast<const nn::BatchNormalization*>(from->layer.get())) {
      fused_relu_[i] = 1;
      runs_relu_[index.at(from)] = 1;
    }
  }
}

int Model::calls_of(const nn::Layer* layer) const {
  if (!functional()) return static_cast<int>(std::count_if(layers_.begin(), layers_.end(),
                                                           [&](const auto& l) { return l.get() == layer; }));
  return static_cast<int>(std::count_if(graph_.begin(), graph_.end(), [&](const auto& n) { return n->layer.get() == layer; }));
}

bool Model::is_relu(const nn::Layer* layer) {
  const auto* a = dynamic_cast<const nn::Activation*>(layer);
  return a != nullptr && a->activation() == "relu";
}

void Model::refuse_strings(const Tensor& x, const std::string& which) const {
  if (x.dtype() == DType::string)
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': ", which, " got strings ", x.shape().to_string(),
                 "; a model takes numbers: turn the text into token ids first (a TextVectorization or a tokenizer, ",
                 "applied to the data or mapped over the dataset)");
}

std::vector<Tensor> Model::operator()(std::span<const Tensor> inputs, bool training) {
  return (*this)(inputs, training, nullptr);
}

std::vector<Tensor> Model::operator()(std::span<const Tensor> inputs, bool training, std::vector<Tensor>* output_masks) {
  if (!functional()) {
    if (inputs.size() != 1)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "' takes one input, got ", inputs.size());
    Tensor mask;
    std::vector<Tensor> out{sequential_forward(inputs[0], training, output_masks ? &mask : nullptr)};
    if (output_masks) output_masks->assign(1, mask);
    return out;
  }
  if (inputs.size() != inputs_.size())
    DTRAIN_THROW(InvalidArgument, "model '", name_, "' takes ", inputs_.size(), " inputs, got ", inputs.size());
  std::unordered_map<const GraphNode*, Tensor> values;
  const Device where = device();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    inputs[i].check_defined(name_.c_str());
    refuse_strings(inputs[i], "input '" + inputs_[i].name() + "'");
    const Tensor x = inputs[i].to(where);
    const Shape& want = inputs_[i].shape();
    bool fits = x.rank() == want.rank();
    for (int d = 1; fits && d < want.rank(); ++d) fits = x.dim(d) == want[d];
    if (!fits)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': input '", inputs_[i].name(), "' takes rows shaped ",
                   Shape(std::vector<std::int64_t>(want.dims().begin() + 1, want.dims().end())).to_string(),
                   ", got a batch ", x.shape().to_string());
    values[inputs_[i].node().get()] = x;
  }
  // Keras's implicit masks, beside the values: a node's mask from its layer's compute_mask.
  std::unordered_map<const GraphNode*, Tensor> masks;
  auto mask_of = [&](const GraphNode* n) {
    const auto it = masks.find(n);
    return it == masks.end() ? Tensor() : it->second;
  };
  std::vector<Tensor> args, arg_masks;
  for (std::size_t i = 0; i < graph_.size(); ++i) {
    const auto& n = graph_[i];
    if (!n->layer) continue;
    args.clear();
    arg_masks.clear();
    bool masked = false;
    for (const KerasTensor& in : n->inputs) {
      args.push_back(values.at(in.node().get()));
      arg_masks.push_back(mask_of(in.node().get()));
      masked = masked || arg_masks.back().defined();
    }
    Tensor& value = values[n.get()];
    if (n->attention_mask) {
      // MultiHeadAttention called with attention_mask=: the node's last input.
      auto& mha = static_cast<nn::MultiHeadAttention&>(*n->layer);
      const std::size_t given = args.size() - 1;  // query, value and maybe key
      const std::array<Tensor, 3> m{arg_masks[0], arg_masks[1], given > 2 ? arg_masks[2] : Tensor()};
      value = mha.attend(args[0], args[1], given > 2 ? args[2] : Tensor(), args.back(), mha.options().use_causal_mask,
                         training, m);
      if (arg_masks[0].defined()) masks[n.get()] = arg_masks[0];
      continue;
    }
    if (fused_relu_[i] && !(masked && training)) {
      value = args[0];  // the batch norm before it applied the relu
    } else if (runs_relu_[i] && !(masked && training)) {
      value = static_cast<nn::BatchNormalization&>(*n->layer).call_then_relu(args[0], training);
    } else if (masked) {
      value = (*n->layer)(std::span<const Tensor>(args), std::span<const Tensor>(arg_masks), training);
    } else {
      value = (*n->layer)(std::span<const Tensor>(args), training);
    }
    if (masked || n->layer->supports_masking())
      if (Tensor m = n->layer->compute_mask(args, arg_masks); m.defined()) masks[n.get()] = std::move(m);
  }
  std::vector<Tensor> out;
  if (output_masks) output_masks->clear();
  for (const KerasTensor& t : outputs_) {
    out.push_back(values.at(t.node().get()));
    if (output_masks) output_masks->push_back(mask_of(t.node().get()));
  }
  return out;
}

Sequential::Sequential(std::vector<std::shared_ptr<nn::Layer>> layers, std::string name) : Model(std::move(name)) {
  for (auto& l : layers) add(std::move(l));
}

void Sequential::add(std::shared_ptr<nn::Layer> layer) {
  if (!layer) DTRAIN_THROW(InvalidArgument, "model '", name_, "': add() got a null layer");
  if (built()) DTRAIN_THROW(InvalidArgument, "model '", name_, "': cannot add layer '", layer->name(), "' after the model is built");
  for (const auto& l : layers_)
    if (l == layer)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': layer '", layer->name(),
                   "' is already in the model; add a new layer object instead of the same one twice");
  std::set<std::string> taken;
  for (const auto& l : layers_) taken.insert(l->name());
  if (taken.count(layer->name())) {
    if (layer->built())
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': a built layer named '", layer->name(), "' is already in the model");
    const std::string base = layer->name();
    int k = 1;
    while (taken.count(base + "_" + std::to_string(k))) ++k;
    layer->set_name(base + "_" + std::to_string(k));
  }
  layers_.push_back(std::move(layer));
}

void Model::build(const Shape& input_shape) {
  if (functional()) {
    // Built by its graph, for the inputs its Input declares.
    if (!(*input_shape_ == input_shape))
      DTRAIN_THROW(InvalidArgument, "model '", name_, "' takes inputs ", input_shape_->to_string(),
                   " (without the batch axis; its Input), not ", input_shape.to_string());
    return;
  }
  if (layers_.empty()) DTRAIN_THROW(InvalidArgument, "model '", name_, "' has no layers");
  std::vector<std::int64_t> dims{1};
  for (auto d : input_shape.dims()) dims.push_back(d);
  Shape s(dims);
  if (input_shape_) {
    if (!(*input_shape_ == input_shape))
      DTRAIN_THROW(InvalidArgument, "model '", name_, "' was built for inputs ", input_shape_->to_string(),
                   " (without the batch axis), not ", input_shape.to_string());
    return;
  }
  // Check every layer's shapes before building any, so a bad input shape leaves the
  // model unbuilt instead of half built.
  Shape probe = s;
  for (const auto& l : layers_) probe = l->compute_output_shape(probe);
  for (const auto& l : layers_) {
    l->build(s);
    s = l->compute_output_shape(s);
  }
  input_shape_ = input_shape;
}

Shape Model::output_shape() const {
  if (functional()) return outputs_.front().shape();
  if (!input_shape_) DTRAIN_THROW(InvalidArgument, "model '", name_, "' is not built yet: call build(input_shape) or fit()");
  std::vector<std::int64_t> dims{1};
  for (auto d : input_shape_->dims()) dims.push_back(d);
  Shape s(dims);
  for (const auto& l : layers_) s = l->compute_output_shape(s);
  return s;
}

Tensor Model::operator()(const Tensor& x, bool training) {
  if (functional()) {
    if (inputs_.size() != 1 || outputs_.size() != 1)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "' has ", inputs_.size(), " inputs and ", outputs_.size(),
                   " outputs; call it with a list of inputs");
    return (*this)(std::span<const Tensor>(&x, 1), training).front();
  }
  return sequential_forward(x, training, nullptr);
}

Tensor Model::sequential_forward(const Tensor& x, bool training, Tensor* output_mask) {
  x.check_defined(name_.c_str());
  refuse_strings(x, "its input");
  if (!input_shape_) {
    std::vector<std::int64_t> dims(x.shape().dims().begin() + (x.rank() > 0 ? 1 : 0), x.shape().dims().end());
    build(Shape(dims));
  }
  Tensor h = x.to(device());
  Tensor mask;  // Keras's implicit mask, from an Embedding(mask_zero) on
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    nn::Layer& layer = *layers_[i];
    // A batch norm and the relu after it run as one pass.
    auto* bn = dynamic_cast<nn::BatchNormalization*>(&layer);
    if (bn && i + 1 < layers_.size() && is_relu(layers_[i + 1].get()) && !(mask.defined() && training)) {
      h = bn->call_then_relu(h, training);
      layers_[i + 1]->build(h.shape());
      ++i;
      continue;
    }
    if (!mask.defined() && !layer.supports_masking()) {
      h = layer(h, training);
      continue;
    }
    const Tensor in = h;
    h = layer(std::span<const Tensor>(&in, 1), std::span<const Tensor>(&mask, 1), training);
    mask = layer.compute_mask(std::span<const Tensor>(&in, 1), std::span<const Tensor>(&mask, 1));
  }
  if (output_mask) *output_mask = mask;
  return h;
}

void Model::compile(std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<losses::Loss> loss,
                    const std::vector<std::string>& metric_names) {
  compile(std::move(optimizer), std::vector<std::shared_ptr<losses::Loss>>{std::move(loss)}, {metric_names});
}

void Model::compile(std::shared_ptr<optim::Optimizer> optimizer, std::vector<std::shared_ptr<losses::Loss>> losses,
                    const std::vector<std::vector<std::string>>& metric_names, std::vector<double> loss_weights) {
  const std::size_t outputs = num_outputs();
  if (!optimizer || losses.empty() || std::any_of(losses.begin(), losses.end(), [](const auto& l) { return !l; }))
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': compile() needs an optimizer and a loss");
  const std::vector<std::string> names = output_names();
  auto counted = [&](std::size_t given, const char* what) {
    if (given != 1 && given != outputs)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': compile() got ", given, " ", what, " for the model's ",
                   outputs, " output(s) (", joined(names), "); give one for each output, or one for all");
  };
  counted(losses.size(), "losses");
  if (!metric_names.empty()) counted(metric_names.size(), "metric lists");
  if (!loss_weights.empty()) counted(loss_weights.size(), "loss weights");
  // One loss, metric list or weight given for a model of several outputs is every output's.
  losses.resize(outputs, losses.front());
  std::vector<std::vector<std::string>> per_output = metric_names;
  if (per_output.empty()) per_output.emplace_back();
  per_output.resize(outputs, per_output.front());
  loss_weights.resize(outputs, loss_weights.empty() ? 1.0 : loss_weights.front());
  for (std::size_t o = 0; o < outputs; ++o) {
    if (!std::isfinite(loss_weights[o]))
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': compile()'s loss weight for output '", names[o], "' is ",
                   loss_weights[o], ", not a number");
    // The replicas' and workers' shares of a loss follow its reduction, one for the whole sum.
    if (losses[o]->reduction() != losses[0]->reduction())
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': output '", names[o], "'s loss ", losses[o]->name(),
                   " reduces ", losses[o]->reduction() == losses::Reduction::sum ? "by a sum" : "by a mean",
                   " and output '", names[0], "'s ", losses[0]->name(), " the other way; give every output's loss ",
                   "the same reduction");
  }
  std::vector<std::unique_ptr<metrics::Metric>> ms;
  std::vector<MetricRole> roles;
  std::set<std::string> taken{"loss"};
  auto add = [&](std::unique_ptr<metrics::Metric> m, MetricRole role) {
    if (outputs > 1) m->set_name(names[role.output] + "_" + m->name());
    if (!taken.insert(m->name()).second)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': compile() would log '", m->name(), "' twice; give each output's ",
                   "metrics once");
    ms.push_back(std::move(m));
    roles.push_back(role);
  };
  // Keras logs each output's own loss before the metrics, when there are several.
  if (outputs > 1)
    for (std::size_t o = 0; o < outputs; ++o) add(std::make_unique<metrics::Mean>("loss"), MetricRole{o, true});
  for (std::size_t o = 0; o < outputs; ++o) {
    const bool sparse = dynamic_cast<losses::SparseCategoricalCrossentropy*>(losses[o].get()) != nullptr;
    for (const auto& m : per_output[o]) add(metrics::get(m, sparse), MetricRole{o, false});
  }
  // As Keras's compile wraps the optimizer in a LossScaleOptimizer under mixed_float16:
  // float16's gradients need a loss scale, and the model gets Keras's dynamic one.
  if (!optimizer->loss_scale_options() && computes_in(DType::f16)) optimizer->set_loss_scale(optim::LossScale{});
  optimizer_ = std::move(optimizer);
  loss_ = losses.front();
  losses_ = std::move(losses);
  loss_weights_ = std::move(loss_weights);
  compiled_metrics_ = metric_names.empty() ? std::vector<std::vector<std::string>>{{}} : metric_names;
  metrics_ = std::move(ms);
  metric_roles_ = std::move(roles);
}

std::vector<std::string> Model::output_names() const {
  if (!functional()) return {layers_.empty() ? name_ : layers_.back()->name()};
  std::vector<std::string> out;
  for (const KerasTensor& t : outputs_) out.push_back(t.layer() ? t.layer()->name() : t.name());
  return out;
}

namespace {

// Keras's weights for an output's mask: a mean loss is the mean over the real steps (each
// weighs steps / real ones; padding 0); a summed one, their sum.
Tensor mask_weights(const Tensor& mask, losses::Reduction reduction) {
  if (reduction != losses::Reduction::sum_over_batch_size) return mask;
  double real = 0.0;
  for (float v : mask.to_vector()) real += v;
  const float each = real > 0.0 ? static_cast<float>(static_cast<double>(mask.numel()) / real) : 0.0f;
  return scale(mask, each);
}

}  // namespace

Tensor Model::compute_loss(std::span<const Tensor> y, std::span<const Tensor> y_pred, std::vector<Tensor>* each,
                           std::span<const Tensor> masks) const {
  if (y.size() != y_pred.size())
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': ", y.size(), " target(s) for its ", y_pred.size(), " output(s)");
  auto loss_of = [&](std::size_t o) {
    const losses::Loss& loss = *losses_[o];
    const Tensor target = y[o].to(y_pred[o].device());
    if (o < masks.size() && masks[o].defined()) return loss(target, y_pred[o], mask_weights(masks[o], loss.reduction()));
    return loss(target, y_pred[o]);
  };
  if (y.size() == 1 && loss_weights_.front() == 1.0) return loss_of(0);
  Tensor total;
  if (each) each->clear();
  for (std::size_t o = 0; o < y.size(); ++o) {
    Tensor own = loss_of(o);
    const Tensor weighted = loss_weights_[o] == 1.0 ? own : scale(own, static_cast<float>(loss_weights_[o]));
    total = total.defined() ? add(total, weighted) : weighted;
    if (each) each->push_back(std::move(own));
  }
  return total;
}

void Model::update_metrics(std::span<const Tensor> y, std::span<const Tensor> y_pred, std::span<const Tensor> masks) {
  for (std::size_t i = 0; i < metrics_.size(); ++i) {
    if (metric_roles_[i].loss) continue;
    const std::size_t o = metric_roles_[i].output;
    // As Keras's metrics: an output's mask weighs its steps (padding counts nothing).
    if (o < masks.size() && masks[o].defined()) metrics_[i]->update_state(y[o], y_pred[o], masks[o]);
    else metrics_[i]->update_state(y[o], y_pred[o]);
  }
}

void Model::update_output_losses(std::span<const double> output_losses, double rows) {
  for (std::size_t i = 0; i < metrics_.size(); ++i)
    if (metric_roles_[i].loss)
      static_cast<metrics::Mean&>(*metrics_[i]).update_state(output_losses[metric_roles_[i].output], rows);
}

void Model::check_data(const TensorData& data, const char* who) const {
  const std::size_t inputs = num_inputs(), outputs = num_outputs();
  const std::vector<std::string> names = output_names();
  if (data.x.size() != inputs || data.y.size() != outputs)
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': ", who, "() got ", data.x.size(), " input(s) and ", data.y.size(),
                 " target(s); the model takes ", inputs, " input(s) and has ", outputs, " output(s) (", joined(names),
                 ")");
  auto what = [&](std::size_t i) {
    if (i < inputs) return inputs == 1 ? std::string("x") : "input " + std::to_string(i) + (functional() ? " ('" + inputs_[i].name() + "')" : "");
    return outputs == 1 ? std::string("y") : "the target of output '" + names[i - inputs] + "'";
  };
  for (std::size_t i = 0; i < inputs + outputs; ++i) {
    const Tensor& t = i < inputs ? data.x[i] : data.y[i - inputs];
    t.check_defined((std::string(who) + " (" + what(i) + ")").c_str());
    if (t.rank() < 1 || t.dim(0) != data.x[0].dim(0) || data.x[0].rank() < 1)
      DTRAIN_THROW(InvalidArgument, "model '", name_, "': ", who, "() needs ", inputs + outputs == 2 ? "x and y" : "every input and target",
                   " with the same number of samples, got ", what(0), " ", data.x[0].shape().to_string(), " and ", what(i),
                   " ", t.shape().to_string());
  }
}

void Model::compile(const std::string& optimizer, const std::string& loss,
                         const std::vector<std::string>& metric_names, bool from_logits) {
  compile(std::shared_ptr<optim::Optimizer>(optim::get(optimizer)),
          std::shared_ptr<losses::Loss>(losses::get(loss, from_logits)), metric_names);
}

bool Model::computes_in(DType dtype) const {
  // A layer's own layers take its policy when it makes them.
  return std::any_of(layers_.begin(), layers_.end(),
                     [&](const auto& l) { return l->dtype_policy().compute_dtype == dtype; });
}

void Model::check_compiled(const char* what) const {
  if (!compiled()) DTRAIN_THROW(InvalidArgument, "model '", name_, "': call compile() before ", what, "()");
}

optim::Optimizer& Model::optimizer() const {
  check_compiled("optimizer");
  return *optimizer_;
}

losses::Loss& Model::loss() const {
  check_compiled("loss");
  return *loss_;
}

std::vector<metrics::Metric*> Model::metrics() const {
  std::vector<metrics::Metric*> out;
  for (const auto& m : metrics_) out.push_back(m.get());
  return out;
}

void Model::reset_metrics() {
  for (auto& m : metrics_) m->reset_state();
}

Device Model::device() const {
  // Looked up on each call, not cached: replicas call the model from their own threads.
  for (const auto& l : layers_)
    if (const Variable* v = l->first_variable()) return v->value_device();  // weights stay where made
  return placement();
}

std::vector<Variable*> Model::variables() const {
  std::vector<Variable*> out;
  for (const auto& l : layers_)
    for (Variable* v : l->variables()) out.push_back(v);
  return out;
}

std::vector<Tensor> Model::losses() const {
  std::vector<Tensor> out;
  for (const auto& l : layers_)
    for (Tensor& t : l->losses()) out.push_back(std::move(t));
  return out;
}

std::vector<Variable*> Model::trainable_variables() const {
  std::vector<Variable*> out;
  for (const auto& l : layers_)
    for (Variable* v : l->trainable_variables()) out.push_back(v);
  return out;
}

std::int64_t Model::count_params() const {
  std::int64_t n = 0;
  for (const auto& l : layers_) n += l->count_params();
  return n;
}

namespace {

using detail::DatasetBatches;
using detail::mean_value;
using detail::shard_plan;
using detail::TensorBatches;
using detail::worker_shard;

void check_fit_options(const FitOptions& opt) {
  if (opt.gradient_accumulation_steps < 1)
    DTRAIN_THROW(InvalidArgument, "fit: gradient_accumulation_steps must be >= 1, got ", opt.gradient_accumulation_steps);
  if (opt.batch_size <= 0) DTRAIN_THROW(InvalidArgument, "fit: batch_size must be positive, got ", opt.batch_size);
  if (opt.epochs < 0 || opt.initial_epoch < 0)
    DTRAIN_THROW(InvalidArgument, "fit: epochs and initial_epoch must be >= 0, got ", opt.epochs, " and ", opt.initial_epoch);
  if (!(opt.validation_split >= 0.0 && opt.validation_split < 1.0))
    DTRAIN_THROW(InvalidArgument, "fit: validation_split must be in [0, 1), got ", opt.validation_split);
  if (opt.steps_per_epoch < 0) DTRAIN_THROW(InvalidArgument, "fit: steps_per_epoch must be >= 0, got ", opt.steps_per_epoch);
}

}  // namespace

History Model::fit(const Tensor& x, const Tensor& y, const FitOptions& opt) { return fit(TensorData(x, y), opt); }

History Model::fit(const TensorData& all, const FitOptions& opt) {
  check_compiled("fit");
  check_fit_options(opt);
  check_data(all, "fit");
  if (opt.validation_data) check_data(*opt.validation_data, "fit (validation_data)");
  // Keras holds out the last fraction of the data, before shuffling.
  const std::int64_t n = all.rows();
  TensorData data = all;
  FitOptions o = opt;
  // Given validation data (either form) overrides validation_split, as in Keras.
  if (!opt.validation_data && !opt.validation_dataset && opt.validation_split > 0.0) {
    const auto split = static_cast<std::int64_t>(static_cast<double>(n) * (1.0 - opt.validation_split));
    data = all.slice(0, split);
    o.validation_data = all.slice(split, n);
  }
  if (data.rows() == 0 && n > 0)
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': fit()'s validation_split ", opt.validation_split, " of ", n,
                 " samples leaves no training samples");
  if (data.rows() == 0) DTRAIN_THROW(InvalidArgument, "model '", name_, "': fit() got no training samples");
  // Under several replicas, the training thread's compute threads would still be spinning
  // (OpenMP's wait policy) on the cores the replica threads are about to wake up on,
  // delaying their start by milliseconds; the gather stays on the training thread there.
  if (RemoteTraining* remote = strategy_ ? strategy_->remote_training() : nullptr) {
    build_for(data.x.front());
    // An epoch is one pass over the data, shared out among the workers' closures; each
    // worker draws its batches from its own contiguous share of the rows.
    if (remote->coordinates()) return coordinate_remote_fit(*remote, (data.rows() + opt.batch_size - 1) / opt.batch_size, o);
    std::unique_ptr<BatchSource> mine;
    if (const int w = remote->remote_worker_index(); w >= 0) {
      const std::int64_t rows = data.rows(), workers = remote->num_remote_workers();
      const std::int64_t begin = rows * w / workers, end = rows * (w + 1) / workers;
      if (begin == end)
        DTRAIN_THROW(InvalidArgument, "fit: ", rows, " training samples leave worker ", w, " of ", workers, " none");
      mine = std::make_unique<TensorBatches>(data.slice(begin, end), opt.batch_size, opt.shuffle, opt.seed);
    }
    return serve_remote_fit(*remote, mine.get(), o);
  }
  const bool replicas_here = strategy_ && strategy_->num_replicas() > 1;
  // On a GPU the batches are drawn and copied a step ahead, on a thread of their own.
  const Device where = device();
  TensorBatches source(std::move(data), opt.batch_size, opt.shuffle, opt.seed,
                       /*on_compute_pool=*/!replicas_here && where.is_cpu());
  if (!where.is_cpu()) {
    detail::DeviceBatches staged(source, where);
    return run_fit(staged, o);
  }
  return run_fit(source, o);
}

History Model::fit(const data::Dataset& dataset, const FitOptions& opt) {
  check_compiled("fit");
  check_fit_options(opt);
  if (opt.validation_split > 0.0)
    DTRAIN_THROW(InvalidArgument, "fit: validation_split needs tensors; give a Dataset as validation_dataset instead");
  if (RemoteTraining* remote = strategy_ ? strategy_->remote_training() : nullptr) {
    if (!built()) {
      // Every task builds the same model before the coordinator compares them.
      std::optional<data::Element> first = dataset.make_iterator(0).next();
      if (!first) DTRAIN_THROW(InvalidArgument, "fit: the dataset is empty");
      TensorData batch;
      detail::split_element(*first, num_inputs(), num_outputs(), batch, "fit");
      build_for(batch.x.front());
    }
    if (remote->coordinates()) {
      const std::int64_t steps = opt.steps_per_epoch > 0 ? opt.steps_per_epoch : dataset.cardinality();
      if (steps <= 0)
        DTRAIN_THROW(InvalidArgument, "fit under ", strategy_->name(), ": the dataset's length is unknown; give ",
                     "steps_per_epoch (the steps the workers run between two epochs' ends)");
      return coordinate_remote_fit(*remote, steps, opt);
    }
    // A worker starts a new pass over its share whenever it runs out.
    std::unique_ptr<BatchSource> mine;
    if (const int w = remote->remote_worker_index(); w >= 0)
      mine = std::make_unique<DatasetBatches>(*this, data::auto_shard(dataset, remote->num_remote_workers(), w), 0);
    return serve_remote_fit(*remote, mine.get(), opt);
  }
  DatasetBatches source(*this, worker_shard(strategy_.get(), dataset), opt.steps_per_epoch);
  return run_fit(source, opt);
}

History Model::run_fit(BatchSource& source, const FitOptions& opt) {
  std::ostream& out = opt.out ? *opt.out : std::cout;
  const int verbose = detail::resolve_verbose(opt.verbose, out);
  detail::Progress progress(out, verbose, source.steps());

  auto history = std::make_shared<History>();
  const std::vector<std::shared_ptr<Callback>> callbacks = begin_fit(history, opt);
  // The step profile is always kept; a trace of its phases only for a ProfilerCallback.
  std::vector<const ProfilerCallback*> tracers;
  for (const auto& c : callbacks)
    if (const ProfilerCallback* p = c->tracer()) tracers.push_back(p);
  int workers = strategy_ ? strategy_->num_workers() : 1;
  int worker = strategy_ ? strategy_->worker_index() : 0;
  ElasticMembership* elastic = strategy_ ? strategy_->elastic() : nullptr;
  if (elastic && source.per_worker())
    DTRAIN_THROW(InvalidArgument, "fit: an elastic job re-shards its input whenever the workers change, so every worker ",
                 "must read the whole input (tensors, or a dataset sharded by DATA); this one is each worker's own (",
                 source.input_plan(), ")");
  // A trace that could not be written is found out now, not after training.
  std::vector<std::string> trace_paths;
  for (const ProfilerCallback* p : tracers) {
    trace_paths.push_back(p->path_for_worker(worker));
    check_replaceable(trace_paths.back(), "fit: the trace file");
  }
  profile::ProfilerOptions profile_options;
  profile_options.trace = !tracers.empty();
  for (const ProfilerCallback* p : tracers) profile_options.max_trace_steps = p->max_steps();
  profile::Profiler profiler(profile_options);
  profile::Track& loop = profiler.loop();
  // Variables made by a lazy build belong to the model's strategy, as in Keras.
  dtrain::detail::ScopedStrategy in_scope(strategy_);
  Trainer trainer(*this, opt.gradient_accumulation_steps, profiler);
  if (opt.gradient_noise_every < 0)
    DTRAIN_THROW(InvalidArgument, "fit: gradient_noise_every must be >= 0 (0: not measured), got ",
                 opt.gradient_noise_every);
  trainer.measure_noise_every(opt.gradient_noise_every);
  trainer.use_cuda_graph(opt.cuda_graph);
  non_finite_.reset();
  if (optimizer_) optimizer_->take_non_finite();  // what earlier training wrote is not this run's
  bool own_batches = workers > 1 && source.per_worker();
  // The validation pipeline this worker runs, found out now rather than after an epoch.
  std::optional<data::WorkerShard> validation;
  if (opt.validation_dataset) {
    try {
      validation = worker_shard(strategy_.get(), *opt.validation_dataset);
    } catch (...) {
      rethrow_with_context(std::current_exception(), "fit (validation_dataset): ");
    }
  }
  const detail::TrainErrorGuard on_error(callbacks);
  Logs logs;
  for (auto& c : callbacks) c->on_train_begin(logs);
  if (const std::string how = strategy_ ? strategy_->replicas_note() : ""; !how.empty() && verbose > 0 && worker == 0)
    out << how << "\n";
  std::optional<FitPosition> resume = take_resume(opt, source.steps());
  // An accumulation longer than all the batches left to train would apply no update.
  if (const std::int64_t steps = source.steps(); steps > 0 && steps < opt.gradient_accumulation_steps) {
    const int first = resume ? resume->epoch : opt.initial_epoch;
    const std::int64_t epochs = std::max(0, opt.epochs - first);
    const std::int64_t batches = steps * epochs - (resume ? resume->batch : 0);
    if (batches > 0 && batches < opt.gradient_accumulation_steps)
      DTRAIN_THROW(InvalidArgument, "fit: gradient_accumulation_steps ", opt.gradient_accumulation_steps,
                   " is more than the ", batches, " batch(es) this fit trains (", epochs, " epoch(s) of ", steps,
                   "): no update would be applied; accumulate at most ", batches,
                   " batches, or train more epochs or smaller batches");
  }
  const detail::ClearOnExit clear_loss(fit_loss_);  // fit_loss_ points into the loop

  // An elastic job that keeps each worker's batch: the global batch follows the workers
  // (batch_size being that of the most workers), and the learning rate with it.
  const std::int64_t full_batch = source.batch_size();
  const bool follows_workers = elastic && elastic->keeps_worker_batch();
  if (follows_workers && full_batch <= 0)
    DTRAIN_THROW(InvalidArgument, "fit: an elastic job that keeps each worker's batch makes the global batch follow the ",
                 "workers, which needs tensors as input (a dataset's batches are its own)");
  const detail::ResetLearningRateScale reset_scale(follows_workers ? optimizer_.get() : nullptr);
  const auto follow_workers = [&] {
    if (!follows_workers) return;
    const std::int64_t rows = std::max<std::int64_t>(
        workers, std::llround(static_cast<double>(full_batch) * workers / elastic->max_workers()));
    source.set_batch_size(rows);
    optimizer_->set_learning_rate_scale(static_cast<float>(rows) / static_cast<float>(full_batch));
  };
  follow_workers();
  // The workers fit trains with: an elastic job's change at a step boundary (a worker
  // joined) makes the gradient buckets again; the split of each batch follows by itself.
  std::uint64_t members = strategy_ ? strategy_->membership_generation() : 0;
  const auto members_changed = [&] {
    members = strategy_->membership_generation();
    trainer.members_changed();
    workers = strategy_->num_workers();
    worker = strategy_->worker_index();
    own_batches = workers > 1 && source.per_worker();
    follow_workers();
  };
  int epoch = resume ? resume->epoch : opt.initial_epoch;
  const int first_epoch = epoch;
  while (epoch < opt.epochs && !stop_training) {
    try {
      metrics::Mean loss_mean("loss");
      const GradientNoise noise_before = trainer.gradient_noise();
      begin_epoch(epoch, loss_mean, logs, callbacks);
      progress.epoch_begin(epoch, opt.epochs);
      std::int64_t step = 0, samples = 0;
      if (resume && epoch == resume->epoch) {
        if (resume->rows < 0 || !source.resume_at_rows(epoch, resume->rows))
          source.resume_at(opt.initial_epoch, epoch, resume->batch);
        step = resume_epoch(*resume, loss_mean, logs);
      } else {
        source.begin_epoch(epoch);
      }
      profiler.begin_epoch();
      const auto start = Clock::now();
      TensorData batch;
      // Batch logs hold the same keys all epoch: set() overwrites them in place.
      const Logs no_logs;
      for (;;) {
        profiler.begin_step();
        bool have = false;
        std::exception_ptr input_error;
        const Clock::time_point input_start = Clock::now();
        try {
          have = source.next(batch);
        } catch (...) {
          if (!own_batches) throw;
          input_error = std::current_exception();  // the others hear of it first
        }
        const Clock::time_point input_end = Clock::now();
        loop.add(profile::Phase::input_wait, input_start, input_end);
        std::int64_t global_rows = -1;
        if (own_batches) {
          // Workers with data of their own agree, step by step, on the global batch; those
          // whose data ran out take part with nothing until every worker's has. A worker
          // whose input failed says so here, so that the others stop too.
          if (!have) {
            for (Tensor& t : batch.x) t = Tensor();
            for (Tensor& t : batch.y) t = Tensor();
          }
          std::array<double, 3> agree{have ? 1.0 : 0.0, have ? static_cast<double>(batch.rows()) : 0.0,
                                      input_error ? 1.0 : 0.0};
          strategy_->sum_over_workers(agree);
          if (input_error) std::rethrow_exception(input_error);
          if (agree[2] > 0.0)
            DTRAIN_THROW(PeerFailure, "fit: another worker's input failed at step ", step, " of epoch ", epoch,
                         " (its own error names the cause)");
          loop.add(profile::Phase::communication, input_end, Clock::now(), "agree on the global batch");
          if (agree[0] == 0.0) break;
          global_rows = static_cast<std::int64_t>(agree[1]);
          have = true;
        }
        if (!have) break;
        Clock::time_point phase_start = Clock::now();
        for (auto& c : callbacks) c->on_train_batch_begin(step, no_logs);
        loop.add(profile::Phase::metrics, phase_start, Clock::now(), "callbacks");
        trainer.step(batch, loss_mean, global_rows);
        fit_batch_ = step + 1;
        if (fit_rows_ >= 0) fit_rows_ += global_rows >= 0 ? global_rows : batch.rows();
        fit_pending_ = trainer.pending();
        phase_start = Clock::now();
        const std::int64_t rows = global_rows >= 0 ? global_rows : batch.rows();
        samples += rows;
        if (step == 0 && epoch == opt.initial_epoch && workers > 1 && verbose > 0)
          out << shard_plan(*strategy_, source.input_plan(), samples) << "\n";
        set_epoch_logs(logs, loss_mean);
        const bool was_finite = !non_finite_;
        check_finite(epoch, step, loss_mean.result());
        if (was_finite && non_finite_) {
          history->non_finite = non_finite_;
          if (non_finite_->what == "weights") progress.set_note("weights: not finite since epoch " +
                                                                std::to_string(epoch + 1) + ", batch " + std::to_string(step + 1));
        }
        for (auto& c : callbacks) c->on_train_batch_end(step, logs);
        progress.update(++step, logs);
        loop.add(profile::Phase::metrics, phase_start, Clock::now(), "callbacks");
        profiler.end_step(rows);
        if (strategy_ && strategy_->membership_generation() != members) members_changed();
        // Several workers stop together at the end of the epoch, on figures they share.
        if (stop_training && workers == 1) break;
      }
      if (step == 0)
        DTRAIN_THROW(InvalidArgument, "model '", name_, "': fit() got no training batches in epoch ", epoch + 1);
      if (samples == 0 && verbose > 0 && worker == 0)
        out << "(epoch " << epoch + 1 << " was complete in the checkpoint; only its end runs again)\n";
      if (workers > 1) {
        merge_over_workers(loss_mean);
        set_epoch_logs(logs, loss_mean);
      }
      const double train_seconds = seconds_since(start);
      if (validation) {
        // Per-worker validation data is evaluated by every worker and summed; global data
        // is evaluated whole everywhere, giving every worker the same figures.
        DatasetBatches batches(*this, *validation, 0, "evaluate");
        logs.update(run_evaluation(batches, "val_", workers > 1 && batches.per_worker()));
      } else if (opt.validation_data) {
        logs.update(run_evaluation(*opt.validation_data, opt.batch_size, "val_"));
      }
      const double epoch_seconds = seconds_since(start);
      history->epoch_seconds.push_back(epoch_seconds);
      history->samples_per_second.push_back(static_cast<double>(samples) / train_seconds);
      history->input_wait_seconds.push_back(source.input_wait());
      history->profile.push_back(profiler.epoch());
      history->gradient_noise_per_epoch.push_back(trainer.gradient_noise().since(noise_before));
      progress.epoch_end(logs, epoch_seconds, step);
      if (verbose > 0 && worker == 0) out << "  " << profile::phase_shares(profiler.epoch()) << "\n";
      for (auto& c : callbacks) c->on_epoch_end(epoch, logs);
    } catch (const std::exception& failure) {
      // An elastic job goes on without a worker it lost: the callback that recovers brought
      // the others together again and put the last commit back, a position fit resumes at.
      const bool of_workers = dynamic_cast<const PeerFailure*>(&failure) || dynamic_cast<const Timeout*>(&failure);
      const auto recovers = [&](const std::shared_ptr<Callback>& c) { return c->recover(failure); };
      if (!elastic || !of_workers || !std::any_of(callbacks.begin(), callbacks.end(), recovers)) throw;
      resume = take_resume(opt, source.steps());
      if (!resume)
        DTRAIN_THROW(InternalError, "fit: a callback recovered from '", failure.what(), "' without a position to resume at");
      epoch = resume->epoch;
      // An epoch's end that failed part way is recorded again when it runs again.
      history->keep_epochs(static_cast<std::size_t>(std::max(0, epoch - first_epoch)));
      members_changed();
      continue;
    }
    ++epoch;
  }
  if (profiler.steady().steps > 0) {
    history->profile_summary = gather_profile(profiler);
    if (verbose > 0 && worker == 0) out << "\nWhere the training steps' time went:\n" << profile::summary_table(history->profile_summary);
  }
  history->gradient_noise = trainer.gradient_noise();
  history->cuda_graph = trainer.graph_use();
  if (verbose > 0 && worker == 0 && !history->cuda_graph.not_used.empty())
    out << "The steps ran kernel by kernel, not as a CUDA graph: " << history->cuda_graph.not_used << "\n";
  if (const GradientNoise& g = history->gradient_noise; verbose > 0 && worker == 0 && g.steps > 0) {
    if (g.noise_scale() > 0)
      out << "Gradient noise scale: about " << std::llround(g.noise_scale()) << " samples (the critical batch), from "
          << g.steps << " sampled steps; a sample in this global batch of " << std::llround(g.big_batch)
          << " makes " << std::llround(100 * g.efficiency(g.big_batch)) << "% of a sample's best progress\n";
    else
      out << "Gradient noise scale: not measurable from " << g.steps
          << " sampled steps (the gradients' noise did not show above their mean; train longer)\n";
    if (history->gradient_noise_per_epoch.size() > 1) {
      out << "  by epoch:";
      for (const GradientNoise& e : history->gradient_noise_per_epoch)
        out << " " << (e.noise_scale() > 0 ? std::to_string(std::llround(e.noise_scale())) : std::string("-"));
      out << " samples\n";
    }
  }
  for (const std::string& path : trace_paths)
    profiler.write_trace(path, worker, workers > 1 ? detail::concat("worker ", worker) : std::string("dtrain fit"));
  for (auto& c : callbacks) c->on_train_end(logs);
  return *history;
}

std::vector<std::shared_ptr<Callback>> Model::begin_fit(const std::shared_ptr<History>& history,
                                                             const FitOptions& opt) {
  std::vector<std::shared_ptr<Callback>> callbacks{history};
  for (const auto& c : opt.callbacks) {
    if (!c) DTRAIN_THROW(InvalidArgument, "fit: a callback is null");
    callbacks.push_back(c);
  }
  if (strategy_)
    if (std::shared_ptr<Callback> own = strategy_->fit_callback()) callbacks.push_back(std::move(own));
  for (auto& c : callbacks) c->set_model(this);
  stop_training = false;
  resume_.reset();
  fit_epoch_ = opt.initial_epoch;
  fit_batch_ = fit_pending_ = 0;
  fit_rows_ = 0;
  fit_loss_ = nullptr;
  return callbacks;
}

void Model::begin_epoch(int epoch, const metrics::Mean& loss_mean, Logs& logs,
                             const std::vector<std::shared_ptr<Callback>>& callbacks) {
  reset_metrics();
  fit_loss_ = &loss_mean;
  fit_epoch_ = epoch;
  fit_batch_ = 0;
  fit_rows_ = 0;
  logs.clear();
  for (auto& c : callbacks) c->on_epoch_begin(epoch, logs);
}

void Model::set_epoch_logs(Logs& logs, const metrics::Mean& loss_mean) const {
  logs.set("loss", loss_mean.result());
  for (const auto& m : metrics_) logs.set(m->name(), m->result());
}

FitPosition Model::fit_position() const {
  FitPosition p{fit_epoch_, fit_batch_, {}, fit_pending_, fit_steps_, fit_rows_};
  if (fit_loss_) {
    p.totals = {fit_loss_->total(), fit_loss_->count()};
    for (const auto& m : metrics_) p.totals.insert(p.totals.end(), {m->total(), m->count()});
  }
  return p;
}

void Model::resume_fit_at(FitPosition position) { resume_ = std::move(position); }

std::optional<FitPosition> Model::take_resume(const FitOptions& opt, std::int64_t steps) {
  std::optional<FitPosition> resume = std::exchange(resume_, std::nullopt);
  fit_steps_ = steps;  // for fit_position(), which a backup saves
  if (resume && resume->steps > 0 && steps > 0 && resume->steps != steps)
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': the backup was made by a fit of ", resume->steps,
                 " batches an epoch, and this fit has ", steps,
                 ": its position would fall in another epoch than the one saved (were the batch size or the data "
                 "changed?); run it as before, or start afresh with another backup folder");
  const std::size_t totals_expected = 2 + 2 * metrics_.size();
  if (resume && (resume->epoch < opt.initial_epoch || resume->batch < 0 || (steps > 0 && resume->batch > steps) ||
                 (!resume->totals.empty() && resume->totals.size() != totals_expected)))
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': fit cannot resume at epoch ", resume->epoch, ", batch ",
                 resume->batch, " with ", resume->totals.size(), " metric totals (this fit starts at epoch ",
                 opt.initial_epoch, steps > 0 ? ", has " + std::to_string(steps) + " steps an epoch" : std::string(),
                 " and keeps ", totals_expected, ")");
  return resume;
}

std::int64_t Model::resume_epoch(const FitPosition& resume, metrics::Mean& loss_mean, Logs& logs) {
  fit_batch_ = resume.batch;
  fit_rows_ = resume.rows;  // -1 where the position counts whole batches only
  if (!resume.totals.empty()) {
    loss_mean.merge(resume.totals[0], resume.totals[1]);
    for (std::size_t i = 0; i < metrics_.size(); ++i) metrics_[i]->merge(resume.totals[2 + 2 * i], resume.totals[3 + 2 * i]);
    // The epoch's figures so far, as its last trained batch left them: an epoch resumed at
    // its end trains no batch that would set them, and its end reports them.
    if (resume.totals[1] > 0) set_epoch_logs(logs, loss_mean);
  }
  return fit_batch_;
}

void Model::check_finite(int epoch, std::int64_t batch, double loss) {
  if (non_finite_) return;
  if (!std::isfinite(loss)) {
    non_finite_ = NonFinite{epoch, batch, "loss", loss};
    return;
  }
  // The optimizer checks the weights as it writes them, in the update's own pass; a pass
  // of its own would read every weight once more per step.
  if (optimizer_->take_non_finite()) non_finite_ = NonFinite{epoch, batch, "weights", loss};
}

std::vector<profile::WorkerSummary> Model::gather_profile(const profile::Profiler& profiler) {
  profile::WorkerSummary mine{profiler.steady(), profiler.step_percentile(0.5), profiler.step_percentile(0.9),
                              profiler.steady_work(profile::kStepsReplayed)};
  const auto workers = static_cast<std::size_t>(strategy_ ? strategy_->num_workers() : 1);
  if (workers == 1) return {mine};
  // Every worker fills its own slot of `k` values; the sum over workers is then everyone's.
  auto everyones = [&](std::size_t k, const std::function<void(std::span<double>)>& fill) {
    std::vector<double> slots(k * workers, 0.0);
    fill(std::span(slots).subspan(k * static_cast<std::size_t>(strategy_->worker_index()), k));
    strategy_->sum_over_workers(slots);
    return slots;
  };
  const std::size_t k = profile::WorkerSummary::kValues;
  const std::vector<double> values = everyones(k, [&](std::span<double> slot) { mine.to_values(slot); });
  // Each worker's steps' work: a count, then the steps.
  const std::size_t n = 1 + profile::kStepsReplayed;
  const std::vector<double> works = everyones(n, [&](std::span<double> slot) {
    slot[0] = static_cast<double>(mine.step_work.size());
    std::copy(mine.step_work.begin(), mine.step_work.end(), slot.begin() + 1);
  });
  std::vector<profile::WorkerSummary> all;
  for (std::size_t w = 0; w < workers; ++w) {
    all.push_back(profile::WorkerSummary::from_values(std::span<const double>(values).subspan(k * w, k)));
    const auto first = works.begin() + static_cast<std::ptrdiff_t>(n * w + 1);
    all.back().step_work.assign(first, first + static_cast<std::ptrdiff_t>(works[n * w]));
  }
  return all;
}

void Model::merge_over_workers(metrics::Mean& loss_mean) {
  std::vector<double> totals{loss_mean.total(), loss_mean.count()};
  for (auto& m : metrics_) totals.insert(totals.end(), {m->total(), m->count()});
  strategy_->sum_over_workers(totals);
  loss_mean.reset_state();
  loss_mean.merge(totals[0], totals[1]);
  for (std::size_t i = 0; i < metrics_.size(); ++i) {
    metrics_[i]->reset_state();
    metrics_[i]->merge(totals[2 + 2 * i], totals[3 + 2 * i]);
  }
}

Logs Model::run_evaluation(BatchSource& source, const std::string& prefix, bool across_workers) {
  reset_metrics();
  metrics::Mean loss_mean;
  source.begin_epoch(0);
  std::int64_t batches = 0;
  TensorData batch;
  std::vector<Tensor> each, output_masks;
  std::vector<double> values;
  while (source.next(batch)) {
    ++batches;
    const std::vector<Tensor> y_pred = (*this)(batch.x, /*training=*/false, &output_masks);
    Tensor loss = compute_loss(batch.y, y_pred, &each, output_masks);
    // As Keras reports it: with the regularization penalties (model.losses).
    if (const std::vector<Tensor> penalties = losses(); !penalties.empty()) loss = add(loss, add_n(penalties));
    const auto rows = static_cast<double>(batch.rows());
    loss_mean.update_state(mean_value(loss), rows);
    update_metrics(batch.y, y_pred, output_masks);
    values.clear();
    for (const Tensor& l : each) values.push_back(mean_value(l));
    update_output_losses(values, rows);
  }
  if (across_workers) {
    merge_over_workers(loss_mean);
    batches = static_cast<std::int64_t>(loss_mean.count());  // some worker's data had rows
  }
  if (batches == 0) DTRAIN_THROW(InvalidArgument, "model '", name_, "': evaluation got an empty dataset");
  Logs logs;
  logs.set(prefix + "loss", loss_mean.result());
  for (auto& m : metrics_) logs.set(prefix + m->name(), m->result());
  return logs;
}

Logs Model::run_evaluation(const data::Dataset& dataset, const std::string& prefix) {
  DatasetBatches batches(*this, dataset, 0, "evaluate");
  return run_evaluation(batches, prefix);
}

Logs Model::evaluate(const data::Dataset& dataset, const EvaluateOptions& opt) {
  check_compiled("evaluate");
  const auto start = Clock::now();
  Logs logs = run_evaluation(dataset, "");
  std::ostream& out = opt.out ? *opt.out : std::cout;
  if (detail::resolve_verbose(opt.verbose, out) > 0)
    out << "evaluate - " << detail::format_duration(seconds_since(start)) << detail::format_logs(logs) << "\n";
  return logs;
}

Logs Model::run_evaluation(const TensorData& data, std::int64_t batch_size, const std::string& prefix) {
  check_data(data, "evaluate");
  if (batch_size <= 0) DTRAIN_THROW(InvalidArgument, "evaluate: batch_size must be positive, got ", batch_size);
  if (data.rows() == 0) DTRAIN_THROW(InvalidArgument, "model '", name_, "': evaluation got no samples");
  TensorBatches batches(data, batch_size, /*shuffle=*/false, 0);
  if (const Device where = device(); !where.is_cpu()) {  // copied a batch ahead, as fit's
    detail::DeviceBatches staged(batches, where);
    return run_evaluation(staged, prefix);
  }
  return run_evaluation(batches, prefix);
}

Logs Model::evaluate(const Tensor& x, const Tensor& y, const EvaluateOptions& opt) {
  return evaluate(TensorData(x, y), opt);
}

Logs Model::evaluate(const TensorData& data, const EvaluateOptions& opt) {
  check_compiled("evaluate");
  const auto start = Clock::now();
  Logs logs = run_evaluation(data, opt.batch_size, "");
  std::ostream& out = opt.out ? *opt.out : std::cout;
  if (detail::resolve_verbose(opt.verbose, out) > 0) {
    const std::int64_t steps = (data.rows() + opt.batch_size - 1) / opt.batch_size;
    out << steps << "/" << steps << " - " << detail::format_duration(seconds_since(start)) << detail::format_logs(logs)
        << "\n";
  }
  return logs;
}

Tensor Model::predict(const Tensor& x, std::int64_t batch_size) {
  if (num_outputs() != 1)
    DTRAIN_THROW(InvalidArgument, "model '", name_, "' has ", num_outputs(), " outputs; predict() on a list of inputs ",
                 "gives one tensor for each");
  return predict(std::span<const Tensor>(&x, 1), batch_size).front();
}

std::vector<Tensor> Model::predict(std::span<const Tensor> x, std::int64_t batch_size) {
  if (x.size() != num_inputs())
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': predict() got ", x.size(), " input(s); the model takes ", num_inputs());
  for (const Tensor& t : x) t.check_defined("predict (x)");
  if (batch_size <= 0) DTRAIN_THROW(InvalidArgument, "predict: batch_size must be positive, got ", batch_size);
  for (const Tensor& t : x)
    if (t.rank() < 1 || t.dim(0) != x[0].dim(0))
      DTRAIN_THROW(InvalidArgument, "predict: every input needs a batch axis with the same rows, got ",
                   x[0].shape().to_string(), " and ", t.shape().to_string());
  const std::int64_t n = x[0].dim(0);
  std::vector<Tensor> out(num_outputs()), part(x.size());
  for (std::int64_t begin = 0; begin < n; begin += batch_size) {
    const std::int64_t end = std::min(n, begin + batch_size);
    for (std::size_t i = 0; i < x.size(); ++i) part[i] = x[i].slice(begin, end);
    const std::vector<Tensor> y = (*this)(part, /*training=*/false);
    for (std::size_t o = 0; o < y.size(); ++o) {
      if (!out[o].defined()) out[o] = Tensor::empty(y[o].shape().with_dim(0, n), y[o].dtype());
      out[o].slice(begin, end).copy_from(y[o]);
    }
  }
  if (n == 0) {
    if (functional())
      for (std::size_t o = 0; o < out.size(); ++o) out[o] = Tensor::empty(outputs_[o].shape().with_dim(0, 0), outputs_[o].dtype());
    else
      out[0] = Tensor::empty(output_shape().with_dim(0, 0));
  }
  return out;
}

std::string Model::summary() const {
  if (!input_shape_)
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': summary() needs a built model: call build(input_shape) or fit() first");
  std::ostringstream o;
  // The first column fits the longest "name (Class)" (29 wide at least, as Keras's).
  std::size_t first = 29;
  for (const auto& l : layers_) first = std::max(first, l->name().size() + l->class_name().size() + 5);
  for (const KerasTensor& t : inputs_) first = std::max(first, t.name().size() + 16);
  const int col = static_cast<int>(first);
  const int width = col + (functional() ? 69 : 36);
  const std::string rule(static_cast<std::size_t>(width), '_'), double_rule(static_cast<std::size_t>(width), '=');
  o << "Model: \"" << name_ << "\"\n" << rule << "\n";
  o << std::left << std::setw(col) << " Layer (type)" << std::setw(26) << "Output Shape" << (functional() ? std::setw(12) : std::setw(0))
    << "Param #" << (functional() ? "Connected to" : "") << "\n" << double_rule << "\n";
  auto line = [&](const std::string& what, const Shape& shape, std::int64_t params, const std::string& connected) {
    o << std::left << std::setw(col) << (" " + what) << std::setw(26) << shape_with_batch(shape);
    if (functional()) o << std::setw(12) << with_commas(params) << connected;
    else o << with_commas(params);
    o << "\n";
  };
  if (functional()) {
    std::set<const nn::Layer*> counted;
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      const GraphNode& n = *graph_[i];
      std::string connected;
      for (const KerasTensor& in : n.inputs) connected += (connected.empty() ? "" : ", ") + in.name();
      if (n.layer) {
        const bool new_layer = counted.insert(n.layer.get()).second;
        line(n.layer->name() + " (" + n.layer->class_name() + ")", n.shape, new_layer ? n.layer->count_params() : 0,
             connected);
      } else {
        line(n.name + " (InputLayer)", n.shape, 0, "");
      }
      if (i + 1 < graph_.size()) o << "\n";
    }
  } else {
    std::vector<std::int64_t> dims{1};
    for (auto d : input_shape_->dims()) dims.push_back(d);
    Shape s(dims);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const auto& l = layers_[i];
      s = l->compute_output_shape(s);
      line(l->name() + " (" + l->class_name() + ")", s, l->count_params(), "");
      if (i + 1 < layers_.size()) o << "\n";
    }
  }
  std::int64_t trainable = 0, total = 0;
  for (const auto& l : layers_) {
    total += l->count_params();
    for (Variable* v : l->trainable_variables()) trainable += v->numel();
  }
  o << double_rule << "\n";
  o << "Total params: " << with_commas(total) << "\n";
  o << "Trainable params: " << with_commas(trainable) << "\n";
  o << "Non-trainable params: " << with_commas(total - trainable) << "\n" << rule << "\n";
  return o.str();
}

void Model::save_weights(const std::string& path) const {
  NamedTensors data;
  // Weights on a GPU are written from host copies: the file does not depend on the device.
  for (Variable* v : variables()) data.tensors.emplace_back(v->name(), v->value().to(Device::cpu()));
  data.metadata["format"] = "dtrain";
  data.metadata["model"] = name_;
  save_safetensors(path, data);
}

void Model::load_weights(const std::string& path) {
  const NamedTensors data = load_safetensors(path);
  const std::vector<Variable*> vars = variables();
  if (vars.empty())
    DTRAIN_THROW(InvalidArgument, "model '", name_, "': build the model before load_weights(", path, ")");
  // Check everything first, so a bad file leaves the model as it was.
  for (Variable* v : vars) {
    const Tensor* t = data.find(v->name());
    if (!t) DTRAIN_THROW(IoError, path, ": has no tensor '", v->name(), "' for model '", name_, "'");
    if (!(t->shape() == v->shape()) || t->dtype() != v->dtype())
      DTRAIN_THROW(IoError, path, ": tensor '", v->name(), "' is ", dtype_name(t->dtype()), " ", t->shape().to_string(),
                   ", but the model's variable is ", dtype_name(v->dtype()), " ", v->shape().to_string());
  }
  // A tensor the model has no variable for: the weights of another model, which would
  // leave part of this one as it was.
  std::set<std::string> names;
  for (const Variable* v : vars) names.insert(v->name());
  std::string extra;
  int extras = 0;
  for (const auto& [name, t] : data.tensors)  // (a saved model's optimizer slots are its own)
    if (!names.contains(name) && !models::is_slot_key(name) && ++extras <= 3)
      extra += (extra.empty() ? "'" : ", '") + name + "'";
  if (extras > 0)
    DTRAIN_THROW(IoError, path, ": holds ", extras, " tensor(s) model '", name_, "' has no variable for (", extra,
                 extras > 3 ? ", ..." : "", "): the weights of another model?");
  for (Variable* v : vars) v->assign(*data.find(v->name()));
}

}  // namespace dtrain
