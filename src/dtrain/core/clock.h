// Wall-clock intervals, as every layer that times its work measures them.
#pragma once

#include <chrono>

namespace dtrain {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}
inline double seconds_since(Clock::time_point t) { return seconds_between(t, Clock::now()); }

}  // namespace dtrain
