// SIGTERM as a preemption notice: while a PreemptionWatcher lives, SIGTERM only sets a
// flag that training reads at its next step boundary (where it saves and stops), instead
// of killing the process. The flag is process-wide because a signal is; nothing else here is.
#pragma once

#include <csignal>

namespace dtrain::train {

class PreemptionWatcher {
 public:
  PreemptionWatcher();   // installs the handler (watchers nest; the outermost restores)
  ~PreemptionWatcher();  // puts back the handler that was there before
  PreemptionWatcher(const PreemptionWatcher&) = delete;
  PreemptionWatcher& operator=(const PreemptionWatcher&) = delete;

  // Whether SIGTERM arrived since the first watcher was made.
  static bool requested();
  // The signal number that arrived (SIGTERM), 0 when none.
  static int signal_number();

 private:
  struct sigaction previous_{};
  bool outermost_ = false;
};

}  // namespace dtrain::train
