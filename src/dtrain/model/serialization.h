// JSON entry points that take a parsed document, for tools that embed a model's JSON in a
// larger config (the dtrain command). `path` prefixes every error's JSON path.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/model/sequential.h"

namespace dtrain {

// A non-empty `dtype_policy` is every layer's policy, over what the layers' configs say.
std::unique_ptr<Sequential> model_from_json(const nlohmann::json& value, const std::string& path,
                                            const std::string& dtype_policy = "");

}  // namespace dtrain
