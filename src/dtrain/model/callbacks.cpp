// The built-in callbacks.
#include "dtrain/model/callbacks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "dtrain/model/monitor.h"
#include "dtrain/model/model.h"

namespace dtrain {

void History::on_epoch_end(int e, const Logs& logs) {
  epoch.push_back(e);
  for (const auto& [k, v] : logs.items()) history[k].push_back(v);
}

void History::keep_epochs(std::size_t epochs) {
  auto keep = [epochs](auto& v) { v.resize(std::min(v.size(), epochs)); };
  keep(epoch);
  for (auto& [key, values] : history) keep(values);
  keep(epoch_seconds);
  keep(samples_per_second);
  keep(input_wait_seconds);
  keep(profile);
  keep(gradient_noise_per_epoch);
}

namespace {

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

std::string NonFinite::to_string() const {
  const std::string when = batch < 0 ? "at the end of epoch " + std::to_string(epoch + 1)
                                     : "at epoch " + std::to_string(epoch + 1) + ", batch " + std::to_string(batch + 1);
  if (what == "weights") return "the weights became non-finite " + when + " (a NaN or Inf gradient), with the loss " + number(loss);
  return "the loss was " + number(loss) + " " + when;
}

void TerminateOnNaN::on_train_begin(const Logs&) { stopped_.reset(); }

void TerminateOnNaN::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  if (stopped_) return;
  if (model_ && model_->non_finite()) return stop(*model_->non_finite());
  if (logs.contains("loss") && !std::isfinite(logs.at("loss"))) stop({epoch_, batch, "loss", logs.at("loss")});
}

// Under several workers a worker's own batches may all be finite while the merged
// epoch loss is not; every worker sees that here and stops with the others.
void TerminateOnNaN::on_epoch_end(int epoch, const Logs& logs) {
  if (stopped_) return;
  if (model_ && model_->non_finite()) return stop(*model_->non_finite());
  if (logs.contains("loss") && !std::isfinite(logs.at("loss"))) stop({epoch, -1, "loss", logs.at("loss")});
}

void TerminateOnNaN::stop(const NonFinite& at) {
  stopped_ = at;
  if (model_) model_->stop_training = true;
  if (out_) *out_ << "TerminateOnNaN: " << at.to_string() << "; terminating training\n" << std::flush;
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.patience < 0) DTRAIN_THROW(InvalidArgument, "EarlyStopping: patience must be >= 0");
  options_.min_delta = std::fabs(options_.min_delta);  // as Keras: the sign follows the mode
  maximize_ = monitor_maximizes("EarlyStopping", options_.monitor, options_.mode);
}

bool EarlyStopping::better(double value, double reference) const {
  return maximize_ ? value - options_.min_delta > reference : value + options_.min_delta < reference;
}

void EarlyStopping::on_train_begin(const Logs&) {
  best_epoch_ = -1;
  wait_ = 0;
  stopped_epoch_ = -1;
  best_weights_.clear();
}

// Keras 3's rule: the best value so far is tracked from the first epoch; the waiting count
// restarts only when the value also beats the baseline (when one is given).
void EarlyStopping::on_epoch_end(int epoch, const Logs& logs) {
  if (!logs.contains(options_.monitor))
    DTRAIN_THROW(InvalidArgument, "EarlyStopping: monitors '", options_.monitor,
                 "', which this fit does not log (no validation data?)");
  if (epoch < options_.start_from_epoch) return;
  const double value = logs.at(options_.monitor);
  ++wait_;
  if (best_epoch_ < 0 || better(value, best_)) {
    best_ = value;
    best_epoch_ = epoch;
    if (options_.restore_best_weights && model_) {
      best_weights_.clear();
      for (Variable* v : model_->variables()) best_weights_.push_back(v->value().clone());
    }
    if (!options_.baseline || better(value, *options_.baseline)) wait_ = 0;
    return;
  }
  if (wait_ >= options_.patience && epoch > 0) {
    stopped_epoch_ = epoch;
    if (model_) model_->stop_training = true;
  }
}

void EarlyStopping::on_train_end(const Logs&) {
  // Keras 3 puts the best weights back whether or not training stopped early.
  if (options_.restore_best_weights && model_ && !best_weights_.empty()) {
    auto vars = model_->variables();
    for (size_t i = 0; i < vars.size() && i < best_weights_.size(); ++i) vars[i]->assign(best_weights_[i]);
  }
}

ReduceLROnPlateau::ReduceLROnPlateau(ReduceLROnPlateauOptions options, std::ostream* out)
    : options_(std::move(options)), out_(out) {
  if (!(options_.factor < 1.0) || !(options_.factor >= 0.0))
    DTRAIN_THROW(InvalidArgument, "ReduceLROnPlateau: factor must be in [0, 1) (the rate is multiplied by it), got ",
                 options_.factor);
  if (options_.patience < 0 || options_.cooldown < 0)
    DTRAIN_THROW(InvalidArgument, "ReduceLROnPlateau: patience and cooldown must be >= 0");
  if (options_.min_lr < 0) DTRAIN_THROW(InvalidArgument, "ReduceLROnPlateau: min_lr must be >= 0, got ", options_.min_lr);
  options_.min_delta = std::fabs(options_.min_delta);
  maximize_ = monitor_maximizes("ReduceLROnPlateau", options_.monitor, options_.mode);
}

void ReduceLROnPlateau::on_train_begin(const Logs&) {
  best_ = maximize_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  wait_ = 0;
  cooldown_left_ = 0;
}

// Keras's rule: a cooling-down epoch resets the wait; an improvement resets it too;
// otherwise, out of cooldown, the wait grows and at `patience` the rate is cut.
void ReduceLROnPlateau::on_epoch_end(int epoch, const Logs& logs) {
  if (!logs.contains(options_.monitor))
    DTRAIN_THROW(InvalidArgument, "ReduceLROnPlateau: monitors '", options_.monitor,
                 "', which this fit does not log (no validation data?)");
  const double value = logs.at(options_.monitor);
  if (cooldown_left_ > 0) {
    --cooldown_left_;
    wait_ = 0;
  }
  const bool improved = maximize_ ? value > best_ + options_.min_delta : value < best_ - options_.min_delta;
  if (improved) {
    best_ = value;
    wait_ = 0;
    return;
  }
  if (cooldown_left_ > 0 || ++wait_ < options_.patience || !model_) return;
  const double lr = model_->optimizer().learning_rate();
  if (lr > options_.min_lr) {
    const double reduced = std::max(lr * options_.factor, options_.min_lr);
    model_->optimizer().set_learning_rate(std::make_shared<optim::Constant>(static_cast<float>(reduced)));
    if (options_.verbose > 0 && out_)
      *out_ << "\nEpoch " << epoch + 1 << ": ReduceLROnPlateau reducing learning rate to " << reduced << ".\n";
    cooldown_left_ = options_.cooldown;
    wait_ = 0;
  }
}

LearningRateScheduler::LearningRateScheduler(std::function<double(int, double)> schedule)
    : schedule_(std::move(schedule)) {
  if (!schedule_) DTRAIN_THROW(InvalidArgument, "LearningRateScheduler: schedule is empty");
}

void LearningRateScheduler::on_epoch_begin(int epoch, const Logs&) {
  if (!model_) return;
  const double lr = schedule_(epoch, model_->optimizer().learning_rate());
  if (!std::isfinite(lr) || lr < 0)
    DTRAIN_THROW(InvalidArgument, "LearningRateScheduler: schedule returned ", lr, " for epoch ", epoch);
  model_->optimizer().set_learning_rate(std::make_shared<optim::Constant>(static_cast<float>(lr)));
}

CSVLogger::CSVLogger(std::string filename, char separator, bool append)
    : filename_(std::move(filename)), separator_(separator), append_(append) {}

void CSVLogger::on_train_begin(const Logs&) {
  std::error_code ec;
  const bool has_rows = append_ && std::filesystem::exists(filename_, ec) && std::filesystem::file_size(filename_, ec) > 0;
  out_.open(filename_, append_ ? std::ios::app : std::ios::trunc);
  if (!out_) DTRAIN_THROW(IoError, filename_, ": cannot open for writing");
  out_ << std::setprecision(10);
  columns_.clear();
  write_header_ = !has_rows;
}

void CSVLogger::on_epoch_end(int epoch, const Logs& logs) {
  if (columns_.empty()) {
    for (const auto& [k, v] : logs.items()) columns_.push_back(k);
    if (write_header_) {
      out_ << "epoch";
      for (const auto& c : columns_) out_ << separator_ << c;
      out_ << '\n';
    }
  }
  out_ << epoch;
  for (const auto& c : columns_) {
    out_ << separator_;
    if (logs.contains(c)) out_ << logs.at(c);
  }
  out_ << '\n';
  out_.flush();
  if (!out_) DTRAIN_THROW(IoError, filename_, ": write failed at epoch ", epoch);
}

void CSVLogger::on_train_end(const Logs&) { out_.close(); }

ProfilerCallback::ProfilerCallback(std::string path, std::int64_t max_steps)
    : path_(std::move(path)), max_steps_(max_steps) {
  if (path_.empty()) DTRAIN_THROW(InvalidArgument, "ProfilerCallback: the trace file path is empty");
  if (max_steps_ < 1) DTRAIN_THROW(InvalidArgument, "ProfilerCallback: max_steps must be >= 1, got ", max_steps_);
}

namespace {
// `path` with `.tag` before its extension: t.json -> t.worker-1.json.
std::string tagged(const std::string& path, const std::string& tag) {
  const std::size_t slash = path.find_last_of('/');
  std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = path.size();
  return path.substr(0, dot) + "." + tag + path.substr(dot);
}
}  // namespace

std::string ProfilerCallback::path_for_worker(int worker) const {
  return worker == 0 ? path_ : tagged(path_, "worker-" + std::to_string(worker));
}

std::string ProfilerCallback::path_for_ps(int ps) const { return tagged(path_, "ps-" + std::to_string(ps)); }

}  // namespace dtrain
