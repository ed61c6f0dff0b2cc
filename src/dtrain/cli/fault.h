// The CLI's one fault-injection facility, for tests of the diagnosis and for trying the
// doctor by hand: `--fault-slow worker:K:Fx` makes worker K a straggler. It is a callback
// the CLI installs, so nothing inside the library's training step knows about faults.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/core/clock.h"
#include "dtrain/model/callbacks.h"

namespace dtrain::cli {

struct FaultSlow {
  int worker = -1;      // -1: no fault
  double factor = 1.0;  // the worker's steps take this many times as long
};

// "worker:K:Fx" with K >= 0 and F in [1, 1000]; "" is no fault. The error names the flag.
FaultSlow parse_fault_slow(const std::string& text);

// On the worker it is installed on, after every training batch: sleeps (factor - 1) times
// the time the batch took (from on_train_batch_begin to on_train_batch_end), so that its
// steps take `factor` times as long and the other workers wait for it in their next
// collective. The sleep shows in the step profile as callback time (the metrics phase),
// not as compute. It counts what it did, so that tests assert on counts, not durations.
class SlowWorker : public Callback {
 public:
  explicit SlowWorker(double factor);
  void on_train_batch_begin(std::int64_t batch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  double factor() const { return factor_; }
  std::int64_t batches_slowed() const { return batches_; }
  double seconds_added() const { return seconds_; }

 private:
  double factor_;
  Clock::time_point batch_start_{};
  std::int64_t batches_ = 0;
  double seconds_ = 0;
};

}  // namespace dtrain::cli
