// ModelCheckpoint: the filepath pattern, when a save happens, and which worker writes.
#include "dtrain/checkpoint/model_checkpoint.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "dtrain/core/error.h"
#include "dtrain/model/monitor.h"
#include "dtrain/model/model.h"

namespace dtrain::train {
namespace {

// A float as Python's repr (and so str.format with no spec) writes it: the shortest digits
// that read back as the same double, in fixed notation for exponents from -4 to 15
// ("0.0001", "123.0") and in scientific notation otherwise ("1e-05", "1.5e+16").
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[64];
  const auto written = std::to_chars(text, text + sizeof text, v, std::chars_format::scientific);
  std::string s(text, written.ptr);  // "-1.2345e-05": shortest digits
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const std::size_t e = s.find('e');
  int exponent = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), exponent);
  std::string digits;
  for (std::size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  std::string out;
  const auto n = static_cast<int>(digits.size());
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    else if (n <= exponent + 1) out = digits + std::string(static_cast<std::size_t>(exponent + 1 - n), '0') + ".0";
    else out = digits.substr(0, static_cast<std::size_t>(exponent + 1)) + "." + digits.substr(static_cast<std::size_t>(exponent + 1));
  } else {
    out = digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "");
    const int a = std::abs(exponent);
    out += std::string(exponent < 0 ? "e-" : "e+") + (a < 10 ? "0" : "") + std::to_string(a);
  }
  return (negative ? "-" : "") + out;
}

// Pads `text` on the left to `width`: with spaces, or with zeros after any sign.
std::string padded(std::string text, int width, bool zeros) {
  const auto w = static_cast<std::size_t>(std::max(width, 0));
  if (text.size() >= w) return text;
  const std::size_t fill = w - text.size();
  if (!zeros) return std::string(fill, ' ') + text;
  const std::size_t at = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  text.insert(at, fill, '0');
  return text;
}

std::string fixed(double v, int precision) {
  char text[512];
  const int n = std::snprintf(text, sizeof text, "%.*f", precision, v);
  if (n < 0 || n >= static_cast<int>(sizeof text)) return python_float(v);  // beyond any file name
  return text;
}

std::string log_names(const Logs& logs) {
  std::string names;
  for (const auto& [k, v] : logs.items()) names += (names.empty() ? "" : ", ") + k;
  return names.empty() ? "none" : names;
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(std::string filepath, ModelCheckpointOptions options)
    : filepath_(std::move(filepath)), options_(std::move(options)) {
  const auto fail = [&](const std::string& why) {
    DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: filepath '", filepath_, "': ", why);
  };
  if (filepath_.empty()) DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: filepath is empty");
  if (options_.verbose < 0) DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: verbose must be >= 0, got ", options_.verbose);
  // The direction matters only to save_best_only; a mode that is no mode is an error anyway.
  if (options_.save_best_only) maximize_ = monitor_maximizes("ModelCheckpoint", options_.monitor, options_.mode);
  else if (options_.mode != "auto" && options_.mode != "min" && options_.mode != "max")
    DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: mode '", options_.mode, "' is not min, max or auto");
  best_ = options_.initial_value_threshold.value_or(maximize_ ? -std::numeric_limits<double>::infinity()
                                                              : std::numeric_limits<double>::infinity());

  std::string literal;
  for (std::size_t i = 0; i < filepath_.size(); ++i) {
    const char c = filepath_[i];
    if (c == '}') {
      if (i + 1 < filepath_.size() && filepath_[i + 1] == '}') {
        literal += '}';
        ++i;
        continue;
      }
      fail("a single '}' at character " + std::to_string(i) + " (write }} for a brace)");
    }
    if (c != '{') {
      literal += c;
      continue;
    }
    if (i + 1 < filepath_.size() && filepath_[i + 1] == '{') {
      literal += '{';
      ++i;
      continue;
    }
    const std::size_t close = filepath_.find('}', i + 1);
    if (close == std::string::npos) fail("the '{' at character " + std::to_string(i) + " is not closed");
    const std::string text = filepath_.substr(i + 1, close - i - 1);
    const std::size_t colon = text.find(':');
    Field f;
    f.name = text.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : text.substr(colon + 1);
    const std::string placeholder = "{" + text + "}";
    if (f.name.empty()) fail("the placeholder " + placeholder + " names no key (expected {epoch}, {batch} or a log name)");
    if (f.name.find_first_of("{!.[") != std::string::npos)
      fail("the placeholder " + placeholder + " is not a plain key (conversions, attributes and indexes are not supported)");
    std::size_t p = 0;
    const auto number = [&] {
      int v = 0;
      const auto r = std::from_chars(spec.data() + p, spec.data() + spec.size(), v);
      const bool read = r.ptr != spec.data() + p;
      p = static_cast<std::size_t>(r.ptr - spec.data());
      return read && r.ec == std::errc() && v <= 4096 ? std::optional<int>(v) : std::nullopt;
    };
    if (p < spec.size() && spec[p] == '0') {
      f.zero_pad = true;
      ++p;
    }
    if (p < spec.size() && spec[p] >= '0' && spec[p] <= '9') {
      const auto w = number();
      if (!w) fail("the width in " + placeholder + " is too large");
      f.width = *w;
    }
    if (p < spec.size() && spec[p] == '.') {
      ++p;
      f.precision = number();
      if (!f.precision) fail("the precision in " + placeholder + " is not a number up to 4096");
    }
    if (p < spec.size()) f.type = spec[p++];
    const bool known = f.type == 0 || f.type == 'd' || f.type == 'f';
    if (p != spec.size() || !known || (f.type == 'd' && f.precision) || (f.type == 0 && f.precision))
      fail("the format in " + placeholder +
           " is not supported (expected none, d with a width and 0 padding as in {epoch:02d}, or .Nf with an optional "
           "width as in {val_loss:.4f})");
    if (f.name == "batch" && options_.save_freq.per_epoch())
      fail("{batch} is known only when saving every N batches (save_freq), not at the end of each epoch");
    if (!literal.empty()) pattern_.emplace_back(std::move(literal));
    literal.clear();
    pattern_.emplace_back(std::move(f));
    i = close;
  }
  if (!literal.empty()) pattern_.emplace_back(std::move(literal));
}

std::string ModelCheckpoint::path_for(int epoch, std::optional<std::int64_t> batch, const Logs& logs) const {
  std::string out;
  for (const Piece& piece : pattern_) {
    if (const auto* text = std::get_if<std::string>(&piece)) {
      out += *text;
      continue;
    }
    const Field& f = std::get<Field>(piece);
    std::optional<std::int64_t> integer;
    double value = 0;
    if (f.name == "epoch") {
      integer = epoch;
    } else if (f.name == "batch" && batch) {
      integer = *batch;
    } else if (logs.contains(f.name)) {
      value = logs.at(f.name);
    } else {
      const std::string when = batch ? "after batch " + std::to_string(*batch) + " of epoch " + std::to_string(epoch)
                                     : "at the end of epoch " + std::to_string(epoch);
      DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: filepath '", filepath_, "' names {", f.name, "}, which the logs ",
                   when, " do not have (they have: ", log_names(logs), ")");
    }
    std::string text;
    if (f.type == 'd') {
      if (!integer)
        DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: filepath '", filepath_, "' formats {", f.name,
                     "}, a log value (a float), with d, which is for {epoch} and {batch}; use .0f");
      text = std::to_string(*integer);
    } else if (f.type == 'f') {
      text = fixed(integer ? static_cast<double>(*integer) : value, f.precision.value_or(6));
    } else {
      text = integer ? std::to_string(*integer) : python_float(value);
    }
    out += padded(std::move(text), f.width, f.zero_pad);
  }
  return out;
}

void ModelCheckpoint::on_train_begin(const Logs& /*logs*/) {
  if (!model_) DTRAIN_THROW(InvalidArgument, "ModelCheckpoint: not attached to a model");
  batches_since_save_ = 0;
  seen_.restart();
  warned_missing_monitor_ = false;
}

void ModelCheckpoint::on_epoch_begin(int epoch, const Logs& /*logs*/) { epoch_ = epoch; }

void ModelCheckpoint::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  if (options_.save_freq.per_epoch()) return;
  // Counted across epochs, as Keras counts them: every N-th training batch of the fit.
  batches_since_save_ += seen_.after(batch);
  if (batches_since_save_ < options_.save_freq.batches()) return;
  batches_since_save_ = 0;
  save(epoch_, batch, logs);
}

void ModelCheckpoint::on_epoch_end(int epoch, const Logs& logs) {
  if (options_.save_freq.per_epoch()) save(epoch, std::nullopt, logs);
}

void ModelCheckpoint::say(const std::string& line) const {
  const StrategyBackend* strategy = model_ ? model_->distribute_strategy().get() : nullptr;
  if (options_.out && (!strategy || strategy->worker_index() == 0)) *options_.out << line << '\n' << std::flush;
}

// Every worker decides alike (at an epoch's end their logs are merged); only worker 0
// writes, so that workers sharing a folder never write one file at once.
void ModelCheckpoint::save(int epoch, std::optional<std::int64_t> batch, const Logs& logs) {
  const std::string path = path_for(epoch + 1, batch ? std::optional<std::int64_t>(*batch + 1) : std::nullopt, logs);
  const std::string head = "Epoch " + std::to_string(epoch + 1) + ": ";
  if (options_.save_best_only) {
    if (!logs.contains(options_.monitor)) {
      if (!warned_missing_monitor_)
        say("ModelCheckpoint: can save the best model only with '" + options_.monitor +
            "' in the logs, which have: " + log_names(logs) + "; skipping");
      warned_missing_monitor_ = true;
      return;
    }
    const double current = logs.at(options_.monitor);
    // A NaN is never better (as Keras's comparison says).
    const bool better = maximize_ ? current > best_ : current < best_;
    if (!better) {
      if (options_.verbose > 0) say(head + options_.monitor + " did not improve from " + fixed(best_, 5));
      return;
    }
    if (options_.verbose > 0)
      say(head + options_.monitor + " improved from " + fixed(best_, 5) + " to " + fixed(current, 5) +
          ", saving model to " + path);
    best_ = current;
  } else if (options_.verbose > 0) {
    say(head + "saving model to " + path);
  }
  const StrategyBackend* strategy = model_->distribute_strategy().get();
  if (strategy && strategy->worker_index() != 0) return;
  model_->gather_remote_state();
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) DTRAIN_THROW(IoError, path, ": cannot make the folder ", parent.string(), " (", ec.message(), ")");
  }
  if (options_.save_weights_only) model_->save_weights(path);
  else model_->save(path);
  last_saved_ = path;
}

}  // namespace dtrain::train
