// Timing helpers shared by the benchmarks: medians of repeated samples, each sample long
// enough (>= min_seconds) that the clock's resolution does not matter.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "dtrain/core/percentile.h"

namespace dtrain::bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using dtrain::median;

// Median seconds per call of fn() over `samples` samples.
template <typename Fn>
double seconds_per_call(Fn&& fn, int samples = 7, double min_seconds = 0.2) {
  fn();  // warm-up: builds and caches primitives
  int reps = 1;
  for (;;) {
    const double t0 = now();
    for (int i = 0; i < reps; ++i) fn();
    if (now() - t0 >= min_seconds / 4 || reps > (1 << 20)) break;
    reps *= 2;
  }
  std::vector<double> per_call;
  for (int s = 0; s < samples; ++s) {
    const double t0 = now();
    int done = 0;
    do {
      for (int i = 0; i < reps; ++i) fn();
      done += reps;
    } while (now() - t0 < min_seconds);
    per_call.push_back((now() - t0) / done);
  }
  return median(per_call);
}

// Read+write bandwidth of memcpy over two 512 MiB buffers (bytes read + bytes written),
// split over the OpenMP threads, the way the machine's figures were measured.
inline double memcpy_bandwidth() {
  const size_t bytes = size_t{512} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const double t = seconds_per_call(
      [&] {
#pragma omp parallel
        {
          const size_t t_id = static_cast<size_t>(omp_get_thread_num()), nt = static_cast<size_t>(omp_get_num_threads());
          const size_t begin = bytes * t_id / nt, end = bytes * (t_id + 1) / nt;
          std::memcpy(b.data() + begin, a.data() + begin, end - begin);
        }
      },
      5, 0.3);
  return 2.0 * static_cast<double>(bytes) / t;
}

inline bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == flag) return true;
  return false;
}

// The integer after `flag`, or `fallback` when the flag is absent.
inline int int_flag(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == flag) return std::stoi(argv[i + 1]);
  return fallback;
}

// The median seconds of `steps` calls of step(), each timed alone, after `warmup` untimed ones.
template <typename Fn>
double median_step_seconds(Fn&& step, int warmup, int steps) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const double t0 = now();
    step();
    times.push_back(now() - t0);
  }
  return median(times);
}

}  // namespace dtrain::bench
