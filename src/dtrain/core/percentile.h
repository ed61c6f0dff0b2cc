// Order statistics of timings, as the benchmarks, the profile and the link probe take them.
#pragma once

#include <algorithm>
#include <vector>

namespace dtrain {

// The value at rank round(q * (n - 1)) of `values` in ascending order (q in [0, 1]; 0.5:
// the median, the upper middle one of an even count); 0 when empty.
inline double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  const auto at = static_cast<std::ptrdiff_t>(std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1) + 0.5);
  std::nth_element(values.begin(), values.begin() + at, values.end());
  return values[static_cast<std::size_t>(at)];
}

// The middle value, or the mean of the two middle ones of an even count; 0 when empty.
inline double median(std::vector<double> values) {
  const std::size_t n = values.size();
  if (n == 0) return 0.0;
  std::sort(values.begin(), values.end());
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace dtrain
