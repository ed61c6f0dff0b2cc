// Keras-like progress output for fit() and evaluate(). verbose 1 redraws one line with a
// bar, ETA and running logs (at most ten times a second); verbose 2 prints one line per
// epoch. Internal to the model layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "dtrain/model/logs.h"

namespace dtrain::detail {

// 1 on a terminal, 2 otherwise (no carriage returns in log files).
int resolve_verbose(int verbose, std::ostream& out);

class Progress {
 public:
  // steps per epoch; -1 when unknown (a dataset of unknown cardinality).
  Progress(std::ostream& out, int verbose, std::int64_t steps);
  void epoch_begin(int epoch, int epochs);
  void update(std::int64_t step, const Logs& logs);  // step is 1-based
  void epoch_end(const Logs& logs, double seconds, std::int64_t steps_done);
  // Appended to every later line, e.g. that the weights are no longer finite.
  void set_note(std::string note) { note_ = " - " + std::move(note); }

 private:
  void bar_line(std::int64_t step, const Logs& logs, bool final, double seconds);
  std::ostream& out_;
  int verbose_;
  std::int64_t steps_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::string note_;
};

// " - loss: 0.1234 - accuracy: 0.9000"; a value that is not finite as nan, inf or -inf.
std::string format_logs(const Logs& logs);
std::string format_duration(double seconds);

}  // namespace dtrain::detail
