// A thread's setting for a scope: ScopedAssign sets a (thread_local) variable for the
// guard's lifetime and puts back what it held, so that guards nest. The settings a
// strategy hands the code below it (a gradient sink, a row reader, dense gradients
// computed together) are each one of these over their own thread_local.
#pragma once

#include <utility>

namespace dtrain {

template <typename T>
class ScopedAssign {
 public:
  ScopedAssign(T& slot, T value) : slot_(slot), saved_(std::exchange(slot, std::move(value))) {}
  ~ScopedAssign() { slot_ = std::move(saved_); }
  ScopedAssign(const ScopedAssign&) = delete;
  ScopedAssign& operator=(const ScopedAssign&) = delete;

 private:
  T& slot_;
  T saved_;
};

}  // namespace dtrain
