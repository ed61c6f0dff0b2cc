// JSON entry points that take a parsed document, for tools that embed a model's JSON in a
// larger config (the dtrain command). `path` prefixes every error's JSON path.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dtrain/model/model.h"

namespace dtrain {

// A non-empty `dtype_policy` is every layer's policy, over what the layers' configs say.
// `config_path` names the "config" object in messages (default: path + ".config"), for a
// file that writes it elsewhere (the dtrain command's short form puts it at "model").
std::unique_ptr<Model> model_from_json(const nlohmann::json& value, const std::string& path,
                                            const std::string& dtype_policy = "", const std::string& config_path = "");

// The model with its layers made but not built: no weight is allocated (a layer that
// draws its seed when made, as Dropout does, still draws it). For tools that check the
// model's shapes before building it for training.
struct UnbuiltModel {
  std::string class_name;  // "Sequential" or "Functional"
  std::string name;
  // A Sequential's stack; a functional model's layers in its JSON's order.
  std::vector<std::shared_ptr<nn::Layer>> layers;
  std::vector<std::size_t> json_index;  // [layer] its index in the JSON's "layers", for messages
  std::optional<Shape> input_shape;  // the one the JSON declares (input_shape, build_input_shape, its Input), if any
  // A functional model's graph: its calls of layers (and its Inputs, layer -1), each after
  // the calls it reads; the calls that are its inputs and outputs.
  struct Call {
    int layer = -1;
    std::vector<std::size_t> inputs;
    std::optional<Shape> input_shape;  // an Input's
    std::string name;                  // an Input's
    DType dtype = DType::f32;          // an Input's
    bool attention_mask = false;       // a MultiHeadAttention's: the last input is its attention_mask
  };
  std::vector<Call> calls;
  std::vector<std::size_t> inputs, outputs;

  // The (first) output's shape, batch axis 1, for input rows of `row` (the first input's),
  // checked layer by layer without building any.
  Shape output_shape(const Shape& row) const;
  // The index in `layers` of the layer that makes the (first) output.
  std::size_t output_layer() const;
  // The model, built (for its declared input shape, where a Sequential has one).
  std::unique_ptr<Model> build();
};
// One layer from its Keras entry {"class_name", "config"}, not built (for layers called
// outside a model: a Python layer's own sublayers).
std::shared_ptr<nn::Layer> layer_from_json(const nlohmann::json& entry, const std::string& path);
// A regularizer or constraint as a layer's config holds it at `key` (absent or null: none).
std::optional<nn::Regularizer> regularizer_from_json(const nlohmann::json& config, const std::string& key,
                                                     const std::string& path);
std::optional<Constraint> constraint_from_json(const nlohmann::json& config, const std::string& key,
                                               const std::string& path);
// Keras's {"class_name": "MaxNorm", "config": {...}}, or null.
nlohmann::json constraint_to_json(const std::optional<Constraint>& constraint);

UnbuiltModel unbuilt_model_from_json(const nlohmann::json& value, const std::string& path,
                                     const std::string& dtype_policy = "", const std::string& config_path = "");

}  // namespace dtrain
