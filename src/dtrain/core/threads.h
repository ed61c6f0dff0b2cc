// The process's one compute thread pool is OpenMP's: oneDNN runs on it, and so do
// dtrain's own loops (parallel_for below). There is deliberately no second pool, because
// two pools fighting over the same cores is the largest slowdown measured on these machines.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace dtrain {

// Cores this process may run on (its CPU affinity), at least 1.
int available_cores();
// Threads used by kernels started from the calling thread. n <= 0 means all cores.
void set_num_threads(int n);
int num_threads();

// The calling thread's kernels use `n` threads while the guard lives.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ScopedThreads() { set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// Denormal floats (magnitudes below 1.2e-38) take a slow microcode path on x86 CPUs.
// An optimizer's moment estimates drift into that range for weights whose gradients are
// rare or tiny (the pixels at an image's border), and an Adam update over such values ran
// three times slower here. Like TensorFlow, dtrain's kernel loops therefore read and write
// them as zero (the MXCSR's denormals-are-zero and flush-to-zero bits), unless
// set_flush_denormals(false) says otherwise, as torch.set_flush_denormal does. Only the
// loops' threads change, and only while a loop runs: the caller's setting is restored.
// oneDNN's kernels keep the mode of the thread they run on. On other CPUs the setting is
// recorded and denormals keep the CPU's default handling.
void set_flush_denormals(bool on);
bool flush_denormals();

// Sets the calling thread's denormal mode while the guard lives, when `on`.
class FlushDenormals {
 public:
  explicit FlushDenormals(bool on) {
#if defined(__x86_64__) || defined(__i386__)
    if (on) {
      saved_ = _mm_getcsr();
      _mm_setcsr(saved_ | kDenormalsAreZero | kFlushToZero);
      set_ = true;
    }
#else
    (void)on;
#endif
  }
  ~FlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
    // The mode as it was; the exception flags raised meanwhile stay raised.
    if (set_) _mm_setcsr(saved_ | (_mm_getcsr() & kExceptionFlags));
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kDenormalsAreZero = 0x0040;
  static constexpr unsigned kFlushToZero = 0x8000;
  static constexpr unsigned kExceptionFlags = 0x003F;
  unsigned saved_ = 0;
  bool set_ = false;
};

// ThreadSanitizer cannot see the barriers of an uninstrumented libgomp and reports every
// hand-off from a pool thread as a race (often without the writer's stack). Under TSan,
// dtrain's own loops therefore run on the calling thread, so its reports concern dtrain's
// threads (replicas, transports). oneDNN still uses the pool; tsan.supp covers it.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kParallelLoops = false;
#else
inline constexpr bool kParallelLoops = true;
#endif

// Runs body(begin, end) over [0, n) split into contiguous chunks on the OpenMP pool.
// Chunks are at least `grain` long, so small loops stay on the calling thread.
template <typename Body>
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<std::int64_t>(
      omp_get_max_threads(), std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1))));
  const bool flush = flush_denormals();
  if (!kParallelLoops || threads <= 1 || omp_in_parallel()) {
    FlushDenormals mode(flush);
    body(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    FlushDenormals mode(flush);
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t nt = omp_get_num_threads();
    const std::int64_t begin = n * t / nt;
    const std::int64_t end = n * (t + 1) / nt;
    if (begin < end) body(begin, end);
  }
}

// Runs tasks [0, n) of uneven cost on the OpenMP pool, each thread taking the next task as
// it finishes one: body(take) runs once on each thread, and take() gives the next task
// (n and beyond: none left). Where loops run serially, one body takes them all.
template <typename Body>
void parallel_tasks(std::int64_t n, Body&& body) {
  if (n <= 0) return;
  std::atomic<std::int64_t> next{0};
  auto take = [&next] { return next.fetch_add(1, std::memory_order_relaxed); };
  parallel_for(std::min<std::int64_t>(n, omp_get_max_threads()), 1, [&](std::int64_t, std::int64_t) { body(take); });
}

}  // namespace dtrain
