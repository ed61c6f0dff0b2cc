// --fault-slow, --fault-kill, --fault-term, --fault-stop: faults made by callbacks.
#include "dtrain/cli/fault.h"

#include <algorithm>
#include <csignal>
#include <ctime>
#include <cstdio>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::cli {

FaultSlow parse_fault_slow(const std::string& text) {
  if (text.empty()) return {};
  if (text.rfind("input:", 0) == 0) {
    double ms = 0;
    int used = 0;
    if (std::sscanf(text.c_str(), "input:%lfms%n", &ms, &used) != 1 || static_cast<std::size_t>(used) != text.size() ||
        !(ms > 0 && ms <= 10000))
      DTRAIN_THROW(InvalidArgument, "--fault-slow '", text,
                   "': expected input:DELAYms with a delay above 0 and at most 10000 ms, e.g. input:5ms");
    return {.input_delay_ms = ms};
  }
  int worker = -1, used = 0;
  double factor = 0;
  char x = 0;
  if (std::sscanf(text.c_str(), "worker:%d:%lf%c%n", &worker, &factor, &x, &used) != 3 || x != 'x' ||
      static_cast<std::size_t>(used) != text.size() || worker < 0 || !(factor >= 1.0 && factor <= 1000.0))
    DTRAIN_THROW(InvalidArgument, "--fault-slow '", text,
                 "': expected worker:INDEX:FACTORx with a factor from 1 to 1000, e.g. worker:1:3x, or input:DELAYms");
  return {worker, factor};
}

SlowWorker::SlowWorker(double factor) : factor_(factor) {
  if (!(factor >= 1.0 && factor <= 1000.0))
    DTRAIN_THROW(InvalidArgument, "SlowWorker: the factor must be from 1 to 1000, got ", factor);
}

namespace {

// The calling thread's CPU time: what it computed, not what it waited for.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

void SlowWorker::on_train_batch_begin(std::int64_t, const Logs&) { batch_cpu_start_ = thread_cpu_seconds(); }

void SlowWorker::on_train_batch_end(std::int64_t, const Logs&) {
  // The injected fault itself, not a wait for anything: a worker with slower cores. The
  // training thread's CPU time over the batch (its share of forward, backward and the
  // update; blocked waits for the other workers or the ps cost none) made `factor` times
  // as long.
  const double extra = (factor_ - 1.0) * std::max(0.0, thread_cpu_seconds() - batch_cpu_start_);
  std::this_thread::sleep_for(std::chrono::duration<double>(extra));
  ++batches_;
  seconds_ += extra;
}

FaultSignal parse_fault_signal(const std::string& flag, const std::string& text, int signal, bool allow_ps) {
  if (text.empty()) return {};
  const bool ps = allow_ps && text.rfind("ps:", 0) == 0;
  int task = -1, used = 0;
  long long step = -1;
  if (std::sscanf(text.c_str(), ps ? "ps:%d:%lld%n" : "worker:%d:%lld%n", &task, &step, &used) != 2 ||
      static_cast<std::size_t>(used) != text.size() || task < 0 || step < 0 || (ps && step < 1) ||
      text.find_first_of(" +-") != std::string::npos)
    DTRAIN_THROW(InvalidArgument, flag, " '", text,
                 "': expected worker:INDEX:STEP (the 0-based training batch of that worker's process), e.g. worker:1:7",
                 allow_ps ? ", or ps:INDEX:N (that parameter server, once it has applied N >= 1 updates)" : "");
  return {task, static_cast<std::int64_t>(step), signal, ps};
}

SignalAtStep::SignalAtStep(int signal, std::int64_t step, bool armed) : signal_(signal), step_(step), armed_(armed) {
  if (signal != SIGKILL && signal != SIGTERM && signal != SIGSTOP)
    DTRAIN_THROW(InvalidArgument, "SignalAtStep: the signal must be SIGKILL, SIGTERM or SIGSTOP, got ", signal);
  if (step < 0) DTRAIN_THROW(InvalidArgument, "SignalAtStep: the step must be >= 0, got ", step);
}

const char* SignalAtStep::signal_name() const {
  return signal_ == SIGKILL ? "SIGKILL" : signal_ == SIGTERM ? "SIGTERM" : "SIGSTOP";
}

const char* SignalAtStep::summary_key() const {
  return signal_ == SIGKILL ? "fault_kill" : signal_ == SIGTERM ? "fault_term" : "fault_stop";
}

void SignalAtStep::on_train_batch_begin(std::int64_t, const Logs&) {
  if (armed_ && batches_ == step_) {
    std::printf("fault injection: sending %s to this process at the start of training batch %lld\n",
                signal_name(), static_cast<long long>(step_));
    std::fflush(stdout);
    ++fired_;
    std::raise(signal_);
  }
  ++batches_;
}

}  // namespace dtrain::cli
