// Keras callbacks: hooks that fit() calls at the begin and end of training, of each epoch
// and of each training batch. A callback sees the model it is attached to
// (set_model) and can stop training (model.stop_training = true).
#pragma once

#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/model/logs.h"
#include "dtrain/profile/diagnosis.h"
#include "dtrain/profile/summary.h"

namespace dtrain {

class Model;
class ProfilerCallback;

// The first training step at which fit() saw a loss that was not finite, or weights that
// an update had made non-finite (a NaN or Inf gradient, or a step that overflowed).
// Indexes are 0-based, as callbacks get them.
struct NonFinite {
  int epoch = 0;
  std::int64_t batch = 0;
  std::string what;  // "loss" or "weights"
  double loss = 0;   // the running mean of the epoch's loss at that step
  std::string to_string() const;  // "the loss was nan at epoch 2, batch 8" (1-based, as printed)
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void set_model(Model* model) { model_ = model; }
  virtual void on_train_begin(const Logs& /*logs*/) {}
  virtual void on_train_end(const Logs& /*logs*/) {}
  virtual void on_epoch_begin(int /*epoch*/, const Logs& /*logs*/) {}
  virtual void on_epoch_end(int /*epoch*/, const Logs& /*logs*/) {}
  virtual void on_train_batch_begin(std::int64_t /*batch*/, const Logs& /*logs*/) {}
  virtual void on_train_batch_end(std::int64_t /*batch*/, const Logs& /*logs*/) {}
  // fit() is leaving with an exception instead of reaching on_train_end: release what
  // on_train_begin took (a signal handler, a thread). Must not throw.
  virtual void on_train_error() noexcept {}
  // Elastic training: a step (or an epoch's end) failed with `failure`, a PeerFailure or a
  // Timeout of the workers. A callback that brought the workers together again and put the
  // last consistent state back (resume_fit_at) returns true, and fit goes on from there;
  // false leaves the failure to end fit. It may throw a failure of its own instead.
  virtual bool recover(const std::exception& /*failure*/) { return false; }
  // Under a strategy whose steps run in other processes (ParameterServerStrategy), fit's
  // callbacks run on the coordinator, after each closure. A callback that answers true
  // here runs on every worker instead, around each step the worker trains (batch numbers
  // count that worker's steps), and never on the coordinator.
  virtual bool runs_on_workers() const { return false; }
  // A callback that wants a trace of fit's phases (ProfilerCallback, TensorBoard's
  // profile_batch) says where, as a ProfilerCallback.
  virtual const ProfilerCallback* tracer() const { return nullptr; }

 protected:
  Model* model_ = nullptr;
};

// The training batches a batch callback's calls stand for, counted as Keras counts them:
// one call may end several batches (under ParameterServerStrategy a closure of
// steps_per_execution steps ends with its last), and the index starts again each epoch.
class BatchesSeen {
 public:
  // The batches that ended with batch `batch` (0-based within its epoch) since the last call.
  std::int64_t after(std::int64_t batch) {
    const std::int64_t n = batch > last_ ? batch - last_ : batch + 1;
    last_ = batch;
    return n;
  }
  // The next call's batches count from batch `last` + 1 (a fit resumed mid-epoch).
  void restart(std::int64_t last = -1) { last_ = last; }

 private:
  std::int64_t last_ = -1;
};

// The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
// Training"), measured where several workers train: each sampled step gives the squared
// norm of this worker's mean gradient (its `small_batch` rows) and of the all-reduced one
// (the `big_batch` rows of the global batch), from which the true gradient's squared norm
// and the trace of the per-example gradients' covariance follow without bias:
//   |G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b),   tr(S) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B).
// Their means over the sampled steps give B_noise = tr(S) / |G|^2, the critical batch:
// a step on B rows makes the progress of 1 / (1 + B_noise / B) steps on a noiseless
// gradient, and a sample 1 / (1 + B / B_noise) of a sample's best.
struct GradientNoise {
  std::int64_t steps = 0;               // steps sampled
  double small_batch = 0, big_batch = 0;  // rows: one worker's, the global batch's (last sampled)
  double gradient_sq = 0;  // mean estimate of |G|^2
  double trace = 0;        // mean estimate of tr(S)
  // B_noise, in samples (0 when not measured or the estimate is not positive).
  double noise_scale() const { return steps > 0 && gradient_sq > 0 && trace > 0 ? trace / gradient_sq : 0.0; }
  // The share of a sample's best progress a sample makes in a batch of `batch` rows.
  double efficiency(double batch) const { return profile::statistical_efficiency(noise_scale(), batch); }
  // The steps sampled since `earlier` (this measurement as it was then), with their own means.
  GradientNoise since(const GradientNoise& earlier) const {
    GradientNoise out = *this;
    out.steps = steps - earlier.steps;
    if (out.steps <= 0) return {0, small_batch, big_batch, 0, 0};
    const double n = static_cast<double>(out.steps), was = static_cast<double>(earlier.steps);
    out.gradient_sq = (gradient_sq * static_cast<double>(steps) - earlier.gradient_sq * was) / n;
    out.trace = (trace * static_cast<double>(steps) - earlier.trace * was) / n;
    return out;
  }
};

// How fit's steps on a GPU used a CUDA graph (FitOptions::cuda_graph).
struct CudaGraphUse {
  int captures = 0;          // graphs recorded: the first, then one per new batch shape or loss scale
  std::int64_t replays = 0;  // steps that ran as one graph launch
  // Why the steps ran kernel by kernel after all, in one line ("" where they did not).
  std::string not_used;
};

// Records every epoch's logs: history["loss"][epoch], ... fit() returns one.
class History : public Callback {
 public:
  void on_epoch_end(int epoch, const Logs& logs) override;
  // Only the first `epochs` epochs' entries (an elastic job went back to a commit made
  // before the others' ends were recorded).
  void keep_epochs(std::size_t epochs);
  std::map<std::string, std::vector<double>> history;
  std::vector<int> epoch;
  // Filled by fit(): wall time of each epoch (training and validation), and training
  // samples per second of each epoch (validation excluded).
  std::vector<double> epoch_seconds;
  std::vector<double> samples_per_second;
  // Seconds each epoch's training loop waited for its input batches (under
  // ParameterServerStrategy, the chief's history sums every worker's).
  std::vector<double> input_wait_seconds;
  // Where each epoch's training steps spent their time, on this worker (phases, bytes;
  // under ParameterServerStrategy, the chief's sums the workers' steps).
  std::vector<profile::Totals> profile;
  // Over the epochs after the first (all of training when there was one), a row per
  // worker (every worker gets every row): what fit's end-of-training table shows.
  std::vector<profile::WorkerSummary> profile_summary;
  // The first step whose loss or weights were not finite; empty when every one was.
  std::optional<NonFinite> non_finite;
  // Measured every GradientNoise-sampled step where several workers all-reduce (steps 0
  // where it was not: one process, or gradient accumulation), over the whole fit and each
  // epoch's own (the noise scale grows as the loss falls).
  GradientNoise gradient_noise;
  std::vector<GradientNoise> gradient_noise_per_epoch;
  // One device on a GPU: the steps replayed as a CUDA graph, or why none were.
  CudaGraphUse cuda_graph;
};

// Keeps a trace of every phase of fit's first `max_steps` steps on every thread
// (training loop, replicas, communication) and writes it when training ends, as Chrome
// trace-event JSON: open it in https://ui.perfetto.dev or chrome://tracing. Under
// MultiWorkerMirroredStrategy each worker writes its own file, worker 0 `path` and worker
// k `path` with ".worker-k" before the extension; workers on one host share a clock, so
// their files line up.
class ProfilerCallback : public Callback {
 public:
  explicit ProfilerCallback(std::string path, std::int64_t max_steps = 1000);
  const ProfilerCallback* tracer() const override { return this; }
  const std::string& path() const { return path_; }
  std::int64_t max_steps() const { return max_steps_; }
  std::string path_for_worker(int worker) const;
  // A parameter server's trace of the pushes it took: PATH.ps-N.json.
  std::string path_for_ps(int ps) const;

 private:
  std::string path_;
  std::int64_t max_steps_;
};

// Stops training when `monitor` has not improved by more than min_delta for `patience`
// epochs; optionally puts back the best epoch's weights at the end of training (Keras 3).
// mode "auto" is min for names ending in "loss", max for accuracy, AUC, precision and
// recall, and an error otherwise.
struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  double min_delta = 0.0;
  int patience = 0;
  std::string mode = "auto";  // "min", "max", or "auto" (max for accuracy-like names)
  std::optional<double> baseline;
  bool restore_best_weights = false;
  int start_from_epoch = 0;
};

class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  int stopped_epoch() const { return stopped_epoch_; }
  int best_epoch() const { return best_epoch_; }

 private:
  bool better(double value, double reference) const;
  EarlyStoppingOptions options_;
  bool maximize_ = false;
  double best_ = 0.0;
  int best_epoch_ = -1;
  int wait_ = 0;
  int stopped_epoch_ = -1;
  std::vector<Tensor> best_weights_;
};

// Keras's TerminateOnNaN: ends fit() at the batch whose loss is NaN or Inf, or after
// which the weights are (fit checks them after every step, so a non-finite gradient that
// a ReLU hides from the loss is caught too). Says so on `out` (null: silent). On one
// worker training stops after that batch; under several workers at the end of that epoch,
// where every worker has the same merged figures, so that they all stop together.
class TerminateOnNaN : public Callback {
 public:
  explicit TerminateOnNaN(std::ostream* out = &std::cout) : out_(out) {}
  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& /*logs*/) override { epoch_ = epoch; }
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  // Where training was stopped; empty when it was not.
  const std::optional<NonFinite>& stopped_at() const { return stopped_; }

 private:
  void stop(const NonFinite& at);
  std::ostream* out_;
  int epoch_ = 0;
  std::optional<NonFinite> stopped_;
};

// Sets the optimizer's learning rate at the start of each epoch to schedule(epoch, lr).
class LearningRateScheduler : public Callback {
 public:
  explicit LearningRateScheduler(std::function<double(int epoch, double lr)> schedule);
  void on_epoch_begin(int epoch, const Logs& logs) override;

 private:
  std::function<double(int, double)> schedule_;
};

// Keras's ReduceLROnPlateau: when `monitor` has not improved by min_delta for `patience`
// epochs, the learning rate is multiplied by `factor` (< 1), not below min_lr, and then
// left alone for `cooldown` epochs. mode "auto" maximizes accuracy-like names. Under a
// strategy every replica and worker sees the same merged logs, so all change together.
struct ReduceLROnPlateauOptions {
  std::string monitor = "val_loss";
  double factor = 0.1;
  int patience = 10;
  int verbose = 0;
  std::string mode = "auto";
  double min_delta = 1e-4;
  int cooldown = 0;
  double min_lr = 0.0;
};

class ReduceLROnPlateau : public Callback {
 public:
  explicit ReduceLROnPlateau(ReduceLROnPlateauOptions options = {}, std::ostream* out = &std::cout);
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;

 private:
  ReduceLROnPlateauOptions options_;
  std::ostream* out_;
  bool maximize_ = false;
  double best_ = 0.0;
  int wait_ = 0, cooldown_left_ = 0;
};

// Writes one CSV row per epoch: epoch, then every log in order. Rows are flushed as
// they are written, so a crash keeps the epochs already logged. Appending to a file that
// has rows writes no second header.
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string filename, char separator = ',', bool append = false);
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;

 private:
  std::string filename_;
  char separator_;
  bool append_;
  std::ofstream out_;
  std::vector<std::string> columns_;
  bool write_header_ = true;
};

// User hooks without a class: set the ones you need.
class LambdaCallback : public Callback {
 public:
  std::function<void(const Logs&)> train_begin, train_end;
  std::function<void(int, const Logs&)> epoch_begin, epoch_end;
  std::function<void(std::int64_t, const Logs&)> batch_begin, batch_end;

  void on_train_begin(const Logs& l) override { if (train_begin) train_begin(l); }
  void on_train_end(const Logs& l) override { if (train_end) train_end(l); }
  void on_epoch_begin(int e, const Logs& l) override { if (epoch_begin) epoch_begin(e, l); }
  void on_epoch_end(int e, const Logs& l) override { if (epoch_end) epoch_end(e, l); }
  void on_train_batch_begin(std::int64_t b, const Logs& l) override { if (batch_begin) batch_begin(b, l); }
  void on_train_batch_end(std::int64_t b, const Logs& l) override { if (batch_end) batch_end(b, l); }
};

}  // namespace dtrain
