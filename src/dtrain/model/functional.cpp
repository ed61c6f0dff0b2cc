// The functional API's symbolic side: Inputs, layer calls recorded as graph nodes.
#include "dtrain/model/functional.h"

namespace dtrain {

const Shape& KerasTensor::shape() const {
  if (!node_) DTRAIN_THROW(InvalidArgument, "an undefined KerasTensor has no shape");
  return node_->shape;
}

DType KerasTensor::dtype() const { return node_ ? node_->dtype : DType::f32; }

const std::shared_ptr<nn::Layer>& KerasTensor::layer() const {
  static const std::shared_ptr<nn::Layer> none;
  return node_ ? node_->layer : none;
}

const std::string& KerasTensor::name() const {
  static const std::string none;
  if (!node_) return none;
  return node_->layer ? node_->layer->name() : node_->name;
}

KerasTensor Input(const Shape& shape, std::string name, DType dtype) {
  std::vector<std::int64_t> dims{1};
  for (std::int64_t d : shape.dims()) {
    if (d <= 0)
      DTRAIN_THROW(InvalidArgument, "Input '", name, "': shape ", shape.to_string(),
                   " must have positive extents (without the batch axis)");
    dims.push_back(d);
  }
  if (dtype != DType::f32 && dtype != DType::u8)
    DTRAIN_THROW(InvalidArgument, "Input '", name, "': takes float32 or uint8 rows, not ", dtype_name(dtype));
  auto node = std::make_shared<GraphNode>();
  node->shape = Shape(dims);
  node->dtype = dtype;
  node->name = std::move(name);
  return KerasTensor(std::move(node));
}

KerasTensor call_layer(const std::shared_ptr<nn::Layer>& layer, const std::vector<KerasTensor>& inputs) {
  if (!layer) DTRAIN_THROW(InvalidArgument, "a null layer was called on symbolic tensors");
  if (inputs.empty()) DTRAIN_THROW(InvalidArgument, "layer '", layer->name(), "' was called on no tensors");
  std::vector<Shape> shapes;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined())
      DTRAIN_THROW(InvalidArgument, "layer '", layer->name(), "' was called on an undefined KerasTensor (input ", i, ")");
    shapes.push_back(inputs[i].shape());
  }
  auto node = std::make_shared<GraphNode>();
  node->shape = layer->compute_output_shape_of(shapes);  // checks the inputs, naming the layer
  // Keras builds a layer on its first call, symbolic or not: the weights exist from here.
  if (!layer->takes_several_inputs()) layer->build(shapes.front());
  else if (!layer->built()) layer->build_several(shapes);
  node->layer = layer;
  node->inputs = inputs;
  return KerasTensor(std::move(node));
}

KerasTensor call_attention(const std::shared_ptr<nn::MultiHeadAttention>& layer, const KerasTensor& query,
                           const KerasTensor& value, const KerasTensor& key, const KerasTensor& attention_mask) {
  if (!layer) DTRAIN_THROW(InvalidArgument, "a null MultiHeadAttention was called on symbolic tensors");
  std::vector<KerasTensor> inputs{query, value};
  if (key.defined()) inputs.push_back(key);
  KerasTensor out = call_layer(layer, inputs);  // checks and builds for query, value and key
  if (!attention_mask.defined()) return out;
  const Shape& m = attention_mask.shape();
  const std::int64_t t = query.shape()[1], s = value.shape()[1];
  if (m.rank() != 3 || m[1] != t || m[2] != s)
    DTRAIN_THROW(InvalidArgument, "layer '", layer->name(), "' (MultiHeadAttention): attention_mask '",
                 attention_mask.name(), "' must be [batch, ", t, " queries, ", s, " keys], got ", m.to_string());
  auto node = std::make_shared<GraphNode>(*out.node());
  node->inputs.push_back(attention_mask);
  node->attention_mask = true;
  return KerasTensor(std::move(node));
}

}  // namespace dtrain
