// Progress bars and epoch lines.
#include "dtrain/model/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace dtrain::detail {

int resolve_verbose(int verbose, std::ostream& out) {
  if (verbose >= 0) return verbose;
  const bool terminal = (&out == &std::cout && isatty(STDOUT_FILENO)) || (&out == &std::cerr && isatty(STDERR_FILENO));
  return terminal ? 1 : 2;
}

std::string format_logs(const Logs& logs) {
  std::string s;
  char buf[64];
  for (const auto& [k, v] : logs.items()) {
    // glibc writes a NaN with its sign bit as "-nan"; a NaN has no sign worth reporting.
    if (std::isnan(v)) std::snprintf(buf, sizeof buf, "nan");
    else std::snprintf(buf, sizeof buf, "%.4f", v);
    s += " - " + k + ": " + buf;
  }
  return s;
}

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds >= 3600) std::snprintf(buf, sizeof buf, "%d:%02d:%02d", int(seconds) / 3600, int(seconds) / 60 % 60, int(seconds) % 60);
  else if (seconds >= 60) std::snprintf(buf, sizeof buf, "%d:%02d", int(seconds) / 60, int(seconds) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", std::ceil(seconds));
  return buf;
}

Progress::Progress(std::ostream& out, int verbose, std::int64_t steps)
    : out_(out), verbose_(verbose), steps_(steps), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void Progress::epoch_begin(int epoch, int epochs) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
  if (verbose_ >= 1) out_ << "Epoch " << epoch + 1 << "/" << epochs << "\n" << std::flush;
}

void Progress::update(std::int64_t step, const Logs& logs) {
  if (verbose_ != 1) return;
  const auto now = std::chrono::steady_clock::now();
  if (step != steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  if (steps_ < 0) {  // unknown length: a counter instead of a bar
    out_ << "\r" << step << "/Unknown - " << format_duration(std::chrono::duration<double>(now - start_).count())
         << format_logs(logs) << note_ << std::flush;
    last_draw_ = now;
    return;
  }
  last_draw_ = now;
  bar_line(step, logs, false, std::chrono::duration<double>(now - start_).count());
}

void Progress::bar_line(std::int64_t step, const Logs& logs, bool final, double seconds) {
  const int width = 30;
  const int digits = static_cast<int>(std::to_string(steps_).size());
  std::ostringstream line;
  char counter[48];
  std::snprintf(counter, sizeof counter, "%*lld/%lld", digits, static_cast<long long>(step), static_cast<long long>(steps_));
  line << "\r" << counter << " [";
  const int filled = steps_ ? static_cast<int>(width * step / steps_) : width;
  for (int i = 0; i < width; ++i) line << (i < filled ? '=' : (i == filled ? '>' : '.'));
  line << "]";
  if (final) {
    line << " - " << format_duration(seconds) << " " << std::lround(steps_ ? seconds * 1000 / steps_ : 0) << "ms/step";
  } else {
    const double eta = step ? seconds / step * (steps_ - step) : 0;
    line << " - ETA: " << format_duration(eta);
  }
  line << format_logs(logs) << note_;
  out_ << line.str() << (final ? "\n" : "") << std::flush;
}

void Progress::epoch_end(const Logs& logs, double seconds, std::int64_t steps_done) {
  if (steps_ < 0) steps_ = steps_done;  // now known: the first epoch counted it
  if (verbose_ == 1) {
    bar_line(steps_done, logs, true, seconds);
  } else if (verbose_ == 2) {
    out_ << steps_done << "/" << steps_ << " - " << format_duration(seconds) << " - "
         << std::lround(steps_done ? seconds * 1000 / steps_done : 0) << "ms/step" << format_logs(logs) << note_ << "\n"
         << std::flush;
  }
}

}  // namespace dtrain::detail
