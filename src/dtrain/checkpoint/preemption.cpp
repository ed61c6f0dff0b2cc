// The SIGTERM flag and its handler.
#include "dtrain/checkpoint/preemption.h"

#include <atomic>
#include <mutex>

namespace dtrain::train {
namespace {

// Written by the signal handler: a lock-free atomic is async-signal-safe.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::mutex g_mutex;
int g_watchers = 0;

extern "C" void on_terminate(int signo) { g_signal.store(signo, std::memory_order_relaxed); }

}  // namespace

PreemptionWatcher::PreemptionWatcher() {
  std::lock_guard lock(g_mutex);
  if (g_watchers++ > 0) return;
  outermost_ = true;
  g_signal.store(0, std::memory_order_relaxed);
  struct sigaction action{};
  action.sa_handler = on_terminate;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, &previous_);
}

PreemptionWatcher::~PreemptionWatcher() {
  std::lock_guard lock(g_mutex);
  --g_watchers;
  if (outermost_) ::sigaction(SIGTERM, &previous_, nullptr);
}

bool PreemptionWatcher::requested() { return g_signal.load(std::memory_order_relaxed) != 0; }
int PreemptionWatcher::signal_number() { return g_signal.load(std::memory_order_relaxed); }

}  // namespace dtrain::train
