// Comparing two models' weights in tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/model/sequential.h"

namespace dtrain::testing {

// max over variables of |a - b| / |b| (L2 norms); the models must have the same variables.
inline double relative_difference(const Model& a, const Model& b) {
  const auto va = a.variables(), vb = b.variables();
  if (va.size() != vb.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const std::vector<float> x = va[i]->value().to_vector(), y = vb[i]->value().to_vector();
    if (x.size() != y.size()) return INFINITY;
    double diff = 0, norm = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      diff += (double(x[j]) - y[j]) * (double(x[j]) - y[j]);
      norm += double(y[j]) * y[j];
    }
    worst = std::max(worst, std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30));
  }
  return worst;
}

}  // namespace dtrain::testing
