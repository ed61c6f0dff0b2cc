// Initializers: uniform limits and truncated-normal scales as in Keras.
#include "dtrain/nn/initializers.h"

#include <cmath>

namespace dtrain::nn {
namespace {

void fans(const Shape& s, double& fan_in, double& fan_out) {
  if (s.rank() == 0) {
    fan_in = fan_out = 1;
  } else if (s.rank() == 1) {
    fan_in = fan_out = static_cast<double>(s[0]);
  } else {
    double receptive = 1;
    for (int i = 0; i < s.rank() - 2; ++i) receptive *= static_cast<double>(s[i]);
    fan_in = static_cast<double>(s[s.rank() - 2]) * receptive;
    fan_out = static_cast<double>(s[s.rank() - 1]) * receptive;
  }
}

void fill_uniform(Tensor& t, float limit, Generator& g) {
  float* p = t.data<float>();
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = g.uniform(-limit, limit);
}

// Normal truncated at two standard deviations, rescaled as Keras does (0.8796... is the
// stddev of a unit normal truncated to [-2, 2]).
void fill_truncated_normal(Tensor& t, float stddev, Generator& g) {
  const float scale = stddev / 0.87962566103423978f;
  float* p = t.data<float>();
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i) {
    float z;
    do z = g.normal(); while (std::fabs(z) > 2.0f);
    p[i] = z * scale;
  }
}

}  // namespace

void check_initializer_name(const std::string& name) {
  for (const char* k : {"glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "zeros", "ones", "random_normal",
                        "random_uniform", "uniform", "truncated_normal"})
    if (name == k) return;
  DTRAIN_THROW(InvalidArgument, "unknown initializer '", name,
               "'; expected one of glorot_uniform, glorot_normal, he_uniform, he_normal, zeros, ones, "
               "random_normal, random_uniform (or uniform), truncated_normal");
}

Tensor initialize(const std::string& name, const Shape& shape, Generator& g) {
  check_initializer_name(name);
  if (name == "zeros") return Tensor::zeros(shape);
  if (name == "ones") return Tensor::full(shape, 1.0f);
  Tensor t = Tensor::empty(shape);
  // Keras's RandomNormal, RandomUniform and TruncatedNormal at their defaults (0.05).
  if (name == "random_normal" || name == "truncated_normal") {
    const bool truncated = name == "truncated_normal";
    float* p = t.data<float>();
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) {
      float z;
      do z = g.normal(); while (truncated && std::fabs(z) > 2.0f);
      p[i] = 0.05f * z;
    }
    return t;
  }
  if (name == "random_uniform" || name == "uniform") {  // Keras's "uniform": RandomUniform
    fill_uniform(t, 0.05f, g);
    return t;
  }
  double fan_in = 1, fan_out = 1;
  fans(shape, fan_in, fan_out);
  if (name == "glorot_uniform") fill_uniform(t, static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out))), g);
  else if (name == "he_uniform") fill_uniform(t, static_cast<float>(std::sqrt(6.0 / fan_in)), g);
  else if (name == "glorot_normal") fill_truncated_normal(t, static_cast<float>(std::sqrt(2.0 / (fan_in + fan_out))), g);
  else fill_truncated_normal(t, static_cast<float>(std::sqrt(2.0 / fan_in)), g);
  return t;
}

}  // namespace dtrain::nn
