// JSON entry points that take a parsed document, for tools that embed a model's JSON in a
// larger config (the dtrain command). `path` prefixes every error's JSON path.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dtrain/model/sequential.h"

namespace dtrain {

// A non-empty `dtype_policy` is every layer's policy, over what the layers' configs say.
// `config_path` names the "config" object in messages (default: path + ".config"), for a
// file that writes it elsewhere (the dtrain command's short form puts it at "model").
std::unique_ptr<Sequential> model_from_json(const nlohmann::json& value, const std::string& path,
                                            const std::string& dtype_policy = "", const std::string& config_path = "");

// The same model with its layers made but not built: no weight is allocated (a layer that
// draws its seed when made, as Dropout does, still draws it). For tools that check the
// model's shapes before building it for training.
struct UnbuiltModel {
  std::unique_ptr<Sequential> model;
  std::optional<Shape> input_shape;  // the one the JSON declares (input_shape or build_input_shape), if any
};
UnbuiltModel unbuilt_model_from_json(const nlohmann::json& value, const std::string& path,
                                     const std::string& dtype_policy = "", const std::string& config_path = "");

}  // namespace dtrain
