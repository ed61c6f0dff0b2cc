// A GPU backend's kernels on its compute stream, timed by the device for the trace: an event
// where each primitive starts and one after each kernel (or library call) it queues; once
// they have run, each kernel is the span from the event before it to its own. A training
// step turns it on for its traced steps only (a few microseconds of the host's time an
// event); events are reused across steps.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "dtrain/core/device.h"

namespace dtrain::kernels {

// One kernel's span of the device's time, in seconds after a reference event; `mark` is
// where its end lies among the marks made since the last take (count() before and after a
// point of the host's code tells which kernels it queued).
struct KernelSpan {
  const char* name = nullptr;  // static text: the kernel's or library call's name
  double begin = 0, end = 0;
  std::size_t mark = 0;
};

class KernelTimeline {
 public:
  // Marks kept at most between two takes: a step of more kernels keeps its first ones.
  static constexpr std::size_t kMaxMarks = 1 << 16;

  explicit KernelTimeline(Device device) : device_(device) {}

  // A primitive starts: its first kernel starts no earlier than this.
  void start_primitive() { mark(nullptr); }
  // `name` (static text) was queued just before: it ends here.
  void end_kernel(const char* name) { mark(name); }
  // Marks made since the last take.
  std::size_t count() {
    std::lock_guard lock(mutex_);
    return used_;
  }
  // Forgets the marks made since the last take (kernels no step will ask for).
  void clear() {
    std::lock_guard lock(mutex_);
    used_ = 0;
  }

  // The kernels marked since the last call, timed from `since` (a record_timed event on the
  // same stream); waits for the last of them to run.
  void take(const DeviceEvent& since, std::vector<KernelSpan>& out) {
    std::lock_guard lock(mutex_);
    out.clear();
    DeviceRuntime& runtime = *device_runtime(device_.type);
    double previous = 0;
    for (std::size_t i = 0; i < used_; ++i) {
      const double at = runtime.seconds_between(device_.index, since, events_[i]);
      if (names_[i] != nullptr && i > 0) out.push_back({names_[i], previous, at, i});
      previous = at;
    }
    used_ = 0;
  }

 private:
  void mark(const char* name) {
    std::lock_guard lock(mutex_);
    if (used_ == kMaxMarks) return;
    if (used_ == events_.size()) {
      events_.emplace_back();
      names_.push_back(nullptr);
    }
    events_[used_] = device_runtime(device_.type)->record_timed(device_.index, events_[used_]);
    names_[used_] = name;
    ++used_;
  }

  Device device_;
  std::mutex mutex_;
  std::vector<DeviceEvent> events_;  // kept across steps, recorded again
  std::vector<const char*> names_;   // null: a primitive's start
  std::size_t used_ = 0;
};

}  // namespace dtrain::kernels
