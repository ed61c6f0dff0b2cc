// Numbers as the profile's tables and findings print them (internal to the profile layer).
#pragma once

#include <cstdio>
#include <string>

namespace dtrain::profile::detail {

// v with `digits` decimals: fixed(12.345, 1) is "12.3".
inline std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Seconds as milliseconds: ms(0.01234) is "12.34 ms".
inline std::string ms(double seconds) { return fixed(seconds * 1000, 2) + " ms"; }

// A share as a percentage: percent(0.1234) is "12.3%".
inline std::string percent(double share, int digits = 1) { return fixed(100.0 * share, digits) + "%"; }

}  // namespace dtrain::profile::detail
