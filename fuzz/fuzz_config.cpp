// The CLI's JSON config through load_config, which reads and validates all of it: the
// model (its layers made, and their shapes checked for the input shape it declares, with no
// weights built), loss, optimizer, metrics, data and run settings.
//
// A model's size is the config's to choose: {"units": 100000} is a valid config that asks
// for gigabytes, not a fault in reading it. Inputs whose model section could ask for more
// than 2^20 weights (the product of every number in it, an upper bound on any layer's
// weights) are therefore skipped, so that the allocation limit catches the reader and not
// a model the config legitimately describes.
#include <cmath>

#include <nlohmann/json.hpp>

#include "dtrain/cli/config.h"
#include "fuzz_input.h"

namespace {

// The product of the numbers in `j` that are at least 1, saturating at `cap`.
double product_of_numbers(const nlohmann::json& j, double cap) {
  if (j.is_number()) {
    const double v = j.get<double>();
    return std::isfinite(v) && v >= 1 ? std::min(v, cap) : (std::isfinite(v) ? 1 : cap);
  }
  double p = 1;
  if (j.is_structured())
    for (const auto& e : j) p = std::min(cap, p * product_of_numbers(e, cap));
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr double kMaxWeights = 1 << 20;
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("model") && product_of_numbers(doc["model"], 2 * kMaxWeights) > kMaxWeights)
    return 0;
  const std::string& path = dtrain::fuzz::write_input(data, size);
  dtrain::fuzz::expect_only_dtrain_errors([&] { dtrain::cli::load_config(path); });
  return 0;
}
