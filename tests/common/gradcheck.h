// Gradients against central finite differences. The function under test runs in float32
// (the kernels' type); the scalar it is reduced to, sum(f(x) ⊙ r) with a fixed random r,
// and the differences are taken in double. Tolerances are per op; inputs should be drawn
// away from kinks (relu at 0, clip at its bounds).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "dtrain/autograd/ops.h"

namespace dtrain::testing {

struct GradcheckOptions {
  double eps = 1e-2;    // step of the central difference
  double atol = 2e-3;
  double rtol = 2e-2;
};

inline Tensor random_tensor(const Shape& shape, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Generator g(seed);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = g.uniform(lo, hi);
  return t;
}

// Values in [lo, hi] kept at least `gap` away from every point in `kinks`.
inline Tensor random_away_from(const Shape& shape, std::uint64_t seed, float lo, float hi,
                               std::vector<float> kinks, float gap = 0.05f) {
  Tensor t = random_tensor(shape, seed, lo, hi);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    for (float k : kinks)
      if (std::fabs(p[i] - k) < gap) p[i] = p[i] < k ? k - gap : k + gap;
  return t;
}

inline double weighted_sum(const Tensor& y, const std::vector<double>& r) {
  const std::vector<float> v = y.to_vector();
  double s = 0.0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * r[i];
  return s;
}

// Checks the tape's gradient of sum(f(inputs) ⊙ r) with respect to every input in
// `wrt` (indices into inputs) against central differences.
inline void expect_gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   std::vector<Tensor> inputs, std::vector<int> wrt,
                                   GradcheckOptions opt = {}) {
  // Fixed weights so every output element contributes differently.
  Tensor probe = f(inputs);
  std::vector<double> r(static_cast<size_t>(probe.numel()));
  Generator g(1234);
  for (auto& x : r) x = g.uniform(0.5f, 1.5f);
  Tensor r_tensor = Tensor::empty(probe.shape());
  for (size_t i = 0; i < r.size(); ++i) r_tensor.data<float>()[i] = static_cast<float>(r[i]);

  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    std::vector<Tensor> sources;
    for (int i : wrt) {
      tape.watch(inputs[i]);
      sources.push_back(inputs[i]);
    }
    Tensor y = f(inputs);
    analytic = tape.gradient(y, sources, r_tensor);
  }
  for (size_t k = 0; k < wrt.size(); ++k) {
    Tensor& x = inputs[wrt[k]];
    ASSERT_TRUE(analytic[k].defined()) << "no gradient for input " << wrt[k];
    ASSERT_EQ(analytic[k].shape(), x.shape());
    const std::vector<float> a = analytic[k].to_vector();
    float* p = x.data<float>();
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      const float saved = p[j];
      p[j] = static_cast<float>(saved + opt.eps);
      const double plus = weighted_sum(f(inputs), r);
      p[j] = static_cast<float>(saved - opt.eps);
      const double minus = weighted_sum(f(inputs), r);
      p[j] = saved;
      const double numeric = (plus - minus) / (2.0 * opt.eps);
      const double tol = opt.atol + opt.rtol * std::max(std::fabs(numeric), std::fabs(static_cast<double>(a[j])));
      ASSERT_NEAR(a[j], numeric, tol) << "input " << wrt[k] << " element " << j << " of shape "
                                      << x.shape().to_string();
    }
  }
}

}  // namespace dtrain::testing
