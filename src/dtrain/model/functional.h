// The functional API, as Keras's: Input() makes a symbolic tensor, calling a layer on
// symbolic tensors records a node of the graph (and builds the layer for their shapes),
// and Model(inputs, outputs) trains, evaluates and saves the graph between them.
//
//   KerasTensor inputs = Input({28, 28, 1});
//   KerasTensor x = layer<nn::Conv2D>(16, 3, nn::Conv2DOptions{.padding = "same"})(inputs);
//   KerasTensor y = layer<nn::BatchNormalization>()(x);
//   x = layer<nn::Add>()({x, layer<nn::Activation>("relu")(y)});
//   Model model(inputs, layer<nn::Dense>(10)(layer<nn::GlobalAveragePooling2D>()(x)));
//
// A layer called twice (a shared layer) is one set of weights in two nodes.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/nn/layers.h"

namespace dtrain {

struct GraphNode;

// A symbolic tensor: one output of a node of a functional graph. Its shape has the batch
// axis first, unknown (shown as None; held as 1).
class KerasTensor {
 public:
  KerasTensor() = default;
  const Shape& shape() const;
  DType dtype() const;
  // The layer that made it (null for an Input), and the Input's name.
  const std::shared_ptr<nn::Layer>& layer() const;
  const std::string& name() const;
  const std::shared_ptr<const GraphNode>& node() const { return node_; }
  bool defined() const { return node_ != nullptr; }

 private:
  friend KerasTensor Input(const Shape&, std::string, DType);
  friend KerasTensor call_layer(const std::shared_ptr<nn::Layer>&, const std::vector<KerasTensor>&);
  friend KerasTensor call_attention(const std::shared_ptr<nn::MultiHeadAttention>&, const KerasTensor&,
                                    const KerasTensor&, const KerasTensor&, const KerasTensor&);
  explicit KerasTensor(std::shared_ptr<const GraphNode> node) : node_(std::move(node)) {}
  std::shared_ptr<const GraphNode> node_;
};

// One call of a layer on symbolic inputs (or, with no layer, an Input).
struct GraphNode {
  std::shared_ptr<nn::Layer> layer;  // null: an Input
  std::vector<KerasTensor> inputs;
  Shape shape;                       // the output's, batch axis 1
  DType dtype = DType::f32;
  std::string name;                  // an Input's name
  // A MultiHeadAttention called with attention_mask=: the last input is that mask.
  bool attention_mask = false;
};

// A model input of rows shaped `shape` (without the batch axis), as keras.Input.
KerasTensor Input(const Shape& shape, std::string name = "input", DType dtype = DType::f32);

// `layer` called on `inputs` (one, or several for Add and Concatenate): checks their
// shapes, builds the layer for them if it is not built, and returns its output.
KerasTensor call_layer(const std::shared_ptr<nn::Layer>& layer, const std::vector<KerasTensor>& inputs);

// Keras's mha(query, value, key, attention_mask=mask) on symbolic tensors: `attention_mask`
// [batch, queries, keys] is a tensor of the graph (a model input, nonzero where a query may
// attend to a key); `key` may be undefined (the value).
KerasTensor call_attention(const std::shared_ptr<nn::MultiHeadAttention>& layer, const KerasTensor& query,
                           const KerasTensor& value, const KerasTensor& key, const KerasTensor& attention_mask);

// A layer held for calling on symbolic tensors, as Keras code writes layers.Dense(10)(x).
template <typename L>
class LayerCall {
 public:
  explicit LayerCall(std::shared_ptr<L> layer) : layer_(std::move(layer)) {}
  KerasTensor operator()(const KerasTensor& x) const { return call_layer(layer_, {x}); }
  KerasTensor operator()(std::initializer_list<KerasTensor> xs) const { return call_layer(layer_, xs); }
  KerasTensor operator()(const std::vector<KerasTensor>& xs) const { return call_layer(layer_, xs); }
  L* operator->() const { return layer_.get(); }
  L& operator*() const { return *layer_; }
  const std::shared_ptr<L>& get() const { return layer_; }

 private:
  std::shared_ptr<L> layer_;
};

// A new layer of type L for the functional API: layer<nn::Dense>(10)(x).
template <typename L, typename... Args>
LayerCall<L> layer(Args&&... args) {
  return LayerCall<L>(std::make_shared<L>(std::forward<Args>(args)...));
}

}  // namespace dtrain
