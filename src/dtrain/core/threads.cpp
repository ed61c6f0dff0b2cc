// Thread-count control over the OpenMP runtime.
#include "dtrain/core/threads.h"

#include <sched.h>

#include <atomic>

namespace dtrain {

namespace {
std::atomic<bool> flush_denormals_{true};
}  // namespace

void set_flush_denormals(bool on) { flush_denormals_.store(on, std::memory_order_relaxed); }

bool flush_denormals() { return flush_denormals_.load(std::memory_order_relaxed); }

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, omp_get_num_procs());
}

void set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : available_cores()); }

int num_threads() { return omp_get_max_threads(); }

}  // namespace dtrain
