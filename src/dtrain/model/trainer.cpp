// The training step's out-of-line helpers.
#include "dtrain/model/trainer.h"

#include <numeric>
#include <regex>
#include <sstream>

#include "dtrain/core/rng.h"

namespace dtrain::detail {

double mean_value(const Tensor& loss) {
  if (loss.numel() == 1) return loss.item();
  const std::vector<float> v = loss.to_vector();
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

std::vector<std::string> describe(const Model& model) {
  // Initialisers' seeds may differ: every worker starts from the chief's values anyway.
  static const std::regex seed(R"re("seed":\s*(-?[0-9]+|null))re");
  const std::uint64_t hash = fnv1a(std::regex_replace(model.to_json(0), seed, ""));
  std::vector<std::string> out;
  for (const Variable* v : model.variables())
    out.push_back(detail::concat("variable '", v->name(), "' ", dtype_name(v->dtype()), " ", v->shape().to_string()));
  std::ostringstream config;
  config << "model '" << model.name() << "' with configuration hash " << std::hex << hash;
  out.push_back(config.str());
  return out;
}

}  // namespace dtrain::detail
