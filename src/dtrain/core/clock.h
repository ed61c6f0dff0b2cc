// Wall-clock intervals, as every layer that times its work measures them.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace dtrain {

using Clock = std::chrono::steady_clock;

// How long a thread or process waits for another that should answer (a replica at a
// barrier, a worker in a collective, a background stage pausing for save()) before the
// wait fails with Timeout naming who never answered. Options that take a timeout read 0
// as this; a strategy's CommunicationOptions::timeout_seconds overrides it for its waits.
inline constexpr std::chrono::milliseconds kDefaultTimeout{60000};

// A timeout option given in seconds (>= 0; the caller checks): 0 is kDefaultTimeout,
// anything else the nearest millisecond, at least 1 ms.
inline std::chrono::milliseconds timeout_from_seconds(double seconds) {
  if (seconds == 0.0) return kDefaultTimeout;
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000.0)));
}

inline double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}
inline double seconds_since(Clock::time_point t) { return seconds_between(t, Clock::now()); }
// CPU time the calling thread has used, in seconds (user and system).
inline double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
// A span of `s` seconds in the clock's units (a deadline's offset).
inline Clock::duration clock_seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
// Whole milliseconds until `deadline`, 0 once it has passed (a poll() timeout).
inline int milliseconds_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}
// The time left until `deadline`, at least 1 ms even once it has passed: for a wait
// whose 0 would mean "no limit" (a socket's timeout) or "do not wait at all".
inline std::chrono::milliseconds time_left(Clock::time_point deadline) {
  return std::chrono::milliseconds(std::max(1, milliseconds_left(deadline)));
}

}  // namespace dtrain
