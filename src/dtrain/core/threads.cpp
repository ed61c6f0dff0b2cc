// Thread-count control over the OpenMP runtime.
#include "dtrain/core/threads.h"

#include <sched.h>

namespace dtrain {

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
