// Wall-clock intervals, as every layer that times its work measures them.
#pragma once

#include <chrono>

namespace dtrain {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace dtrain
