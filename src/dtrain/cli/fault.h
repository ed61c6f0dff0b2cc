// The CLI's one fault-injection facility, for tests and for trying things by hand:
// `--fault-slow worker:K:Fx` makes worker K a straggler and `--fault-slow input:Dms` delays
// every batch's input (both for the doctor), `--fault-kill`
// and `--fault-term worker:K:S` make worker K send itself SIGKILL or SIGTERM at batch S
// (for checkpoints and restarts). Each is a callback the CLI installs, so nothing inside
// the library's training step knows about faults.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/model/callbacks.h"

namespace dtrain::cli {

struct FaultSlow {
  int worker = -1;      // -1: no straggler
  double factor = 1.0;  // the worker's steps take this many times as long
  // "input:Dms": every worker's batches reach its training step D ms late (the input
  // pipeline, at its end, sleeps that long per batch), for the doctor to find input-bound.
  double input_delay_ms = 0;
};

// "worker:K:Fx" with K >= 0 and F in [1, 1000], or "input:Dms" with D in (0, 10000];
// "" is no fault. The error names the flag.
FaultSlow parse_fault_slow(const std::string& text);

// On the worker it is installed on, after every training batch: sleeps (factor - 1) times
// the CPU time the training thread spent on the batch (from on_train_batch_begin to
// on_train_batch_end), so that its computing takes `factor` times as long, as on slower
// cores, and the other workers wait for it in their next collective. Time the thread
// spent blocked (on the other workers, the ps, the link) is not made longer. The sleep
// shows in the step profile as callback time (the metrics phase), not as compute. It
// counts what it did, so that tests assert on counts, not durations.
class SlowWorker : public Callback {
 public:
  explicit SlowWorker(double factor);
  void on_train_batch_begin(std::int64_t batch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  bool runs_on_workers() const override { return true; }
  double factor() const { return factor_; }
  std::int64_t batches_slowed() const { return batches_; }
  double seconds_added() const { return seconds_; }

 private:
  double factor_;
  double batch_cpu_start_ = 0;
  std::int64_t batches_ = 0;
  double seconds_ = 0;
};

// --fault-kill / --fault-term: a signal this process sends itself at one training batch.
struct FaultSignal {
  int worker = -1;         // -1: no fault
  std::int64_t step = -1;  // 0-based count of the batches this process trained, over all epochs
  int signal = 0;          // SIGKILL, SIGTERM or SIGSTOP
  // --fault-kill ps:K:N: parameter server K (not a worker) kills itself once it has applied
  // N updates (`step` holds N).
  bool ps = false;
};

// "worker:K:S" with K >= 0 and S >= 0 (with `allow_ps`, also "ps:K:N"); "" is no fault.
// The error names `flag`.
FaultSignal parse_fault_signal(const std::string& flag, const std::string& text, int signal, bool allow_ps = false);

// Sends `signal` to this process at the start of the training batch `step` (counted from
// 0 over every epoch of this process's fit), with raise(): SIGKILL is a real, uncatchable
// death; SIGTERM is a preemption notice (BackupAndRestore saves and stops; without it the
// process dies); SIGSTOP is a hung process (alive, its sockets open, answering nothing until
// continued). It says so on stdout first, flushed. `armed` is the CLI's decision whether
// this start of the job is the one to fault (a job that `dtrain launch --max-restarts`
// started again is not killed again): unarmed, it only counts batches.
class SignalAtStep : public Callback {
 public:
  SignalAtStep(int signal, std::int64_t step, bool armed);
  void on_train_batch_begin(std::int64_t batch, const Logs& logs) override;
  bool runs_on_workers() const override { return true; }
  int signal() const { return signal_; }
  const char* signal_name() const;  // "SIGKILL", "SIGTERM" or "SIGSTOP"
  const char* summary_key() const;  // "fault_kill", "fault_term" or "fault_stop": the flag's, in --summary
  std::int64_t step() const { return step_; }
  bool armed() const { return armed_; }
  std::int64_t batches_seen() const { return batches_; }
  // Times the signal was sent (0 or 1; a SIGTERM that is caught lets the process go on).
  std::int64_t fired() const { return fired_; }

 private:
  int signal_;
  std::int64_t step_;
  bool armed_;
  std::int64_t batches_ = 0;
  std::int64_t fired_ = 0;
};

}  // namespace dtrain::cli
