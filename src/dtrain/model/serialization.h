// JSON entry points that take a parsed document, for tools that embed a model's JSON in a
// larger config (the dtrain command). `path` prefixes every error's JSON path.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/model/sequential.h"

namespace dtrain {

std::unique_ptr<Sequential> model_from_json(const nlohmann::json& value, const std::string& path);

}  // namespace dtrain
