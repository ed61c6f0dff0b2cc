// --fault-slow: a slow worker made by a callback.
#include "dtrain/cli/fault.h"

#include <cstdio>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::cli {

FaultSlow parse_fault_slow(const std::string& text) {
  if (text.empty()) return {};
  int worker = -1, used = 0;
  double factor = 0;
  char x = 0;
  if (std::sscanf(text.c_str(), "worker:%d:%lf%c%n", &worker, &factor, &x, &used) != 3 || x != 'x' ||
      static_cast<std::size_t>(used) != text.size() || worker < 0 || !(factor >= 1.0 && factor <= 1000.0))
    DTRAIN_THROW(InvalidArgument, "--fault-slow '", text,
                 "': expected worker:INDEX:FACTORx with a factor from 1 to 1000, e.g. worker:1:3x");
  return {worker, factor};
}

SlowWorker::SlowWorker(double factor) : factor_(factor) {
  if (!(factor >= 1.0 && factor <= 1000.0))
    DTRAIN_THROW(InvalidArgument, "SlowWorker: the factor must be from 1 to 1000, got ", factor);
}

void SlowWorker::on_train_batch_begin(std::int64_t, const Logs&) { batch_start_ = Clock::now(); }

void SlowWorker::on_train_batch_end(std::int64_t, const Logs&) {
  // The injected fault itself, not a wait for anything: a worker with slower cores.
  const Clock::duration extra = std::chrono::duration_cast<Clock::duration>((factor_ - 1.0) * (Clock::now() - batch_start_));
  std::this_thread::sleep_for(extra);
  ++batches_;
  seconds_ += std::chrono::duration<double>(extra).count();
}

}  // namespace dtrain::cli
