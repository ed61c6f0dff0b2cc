// Model: Keras's model, with compile / fit / evaluate / predict / summary, JSON configs
// and safetensors weights, built either as a Sequential stack (sequential.h) or as a
// functional graph (functional.h: Model(inputs, outputs)). The training step inside fit()
// is the same GradientTape step a custom loop writes.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/data/dataset.h"
#include "dtrain/losses/losses.h"
#include "dtrain/metrics/metrics.h"
#include "dtrain/model/callbacks.h"
#include "dtrain/model/functional.h"
#include "dtrain/model/strategy_backend.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain {

// Tensors for a model: one per model input (x) and one target per model output (y), in
// the model's order, every one with the same rows. A model of one input and one output
// takes a plain (x, y) pair.
struct TensorData {
  TensorData() = default;
  TensorData(Tensor x_, Tensor y_) : x{std::move(x_)}, y{std::move(y_)} {}
  TensorData(std::pair<Tensor, Tensor> xy) : TensorData(std::move(xy.first), std::move(xy.second)) {}  // NOLINT
  TensorData(std::vector<Tensor> x_, std::vector<Tensor> y_) : x(std::move(x_)), y(std::move(y_)) {}
  std::vector<Tensor> x, y;
  // The first input's rows (0 when there is none, or it is undefined).
  std::int64_t rows() const { return !x.empty() && x[0].defined() && x[0].rank() > 0 ? x[0].dim(0) : 0; }
  // Rows [begin, end) of every input and target (views, no copy).
  TensorData slice(std::int64_t begin, std::int64_t end) const {
    TensorData out;
    slice_into(x, begin, end, out.x);
    slice_into(y, begin, end, out.y);
    return out;
  }
  // Rows [begin, end) of each of `from` into `into`, whose storage is reused.
  static void slice_into(std::span<const Tensor> from, std::int64_t begin, std::int64_t end, std::vector<Tensor>& into) {
    into.resize(from.size());
    for (std::size_t i = 0; i < from.size(); ++i) into[i] = from[i].slice(begin, end);
  }
};

struct FitOptions {
  int epochs = 1;
  std::int64_t batch_size = 32;
  // Evaluated at the end of every epoch; takes precedence over validation_split.
  std::optional<TensorData> validation_data;
  // The same, as a Dataset of (x, y) batches (for fit on a Dataset).
  std::optional<data::Dataset> validation_dataset;
  // fit on a Dataset: batches per epoch, drawn from one iterator across epochs (0: one
  // full pass per epoch).
  std::int64_t steps_per_epoch = 0;
  // The last fraction of x and y (before any shuffling) is held out for validation.
  double validation_split = 0.0;
  bool shuffle = true;
  std::uint64_t seed = 0;  // shuffling order: a pure function of (seed, epoch)
  // Gradients of this many consecutive batches are averaged into one update (Keras 3's
  // gradient_accumulation_steps; the effective batch is this times batch_size). Under a
  // strategy, replicas sum them only once per update. Groups carry across epochs; an
  // incomplete group at the end of fit is not applied (as in Keras).
  int gradient_accumulation_steps = 1;
  int initial_epoch = 0;
  // Under ParameterServerStrategy: the steps a worker runs in one closure (Keras passes
  // steps_per_execution to compile()), amortising the coordinator's scheduling; each step
  // still pulls the weights and pushes its gradients. Several need async consistency.
  // Other strategies train the same steps either way and ignore it.
  int steps_per_execution = 1;
  // Where several workers all-reduce: every this many updates, the squared norms of a
  // worker's gradient and of the all-reduced one, for the gradient noise scale
  // (History::gradient_noise); 0 measures nothing.
  int gradient_noise_every = 10;
  // On a GPU, one device: after its first two steps, the step's forward, loss and backward
  // are captured as one CUDA graph and replayed at each step (docs/gpu.md says when
  // they cannot be, and History::cuda_graph why); false runs every step kernel by kernel.
  bool cuda_graph = true;
  std::vector<std::shared_ptr<Callback>> callbacks;
  // 0 silent, 1 a live progress bar, 2 one line per epoch; -1 ("auto") is 1 on a terminal
  // and 2 otherwise, so logs get no carriage-return spam. Above 0, each epoch's line is
  // followed by its step-phase shares, and training ends with the profile's table
  // (docs/profiling.md).
  int verbose = -1;
  std::ostream* out = nullptr;  // defaults to std::cout
};

struct EvaluateOptions {
  std::int64_t batch_size = 32;
  int verbose = 0;
  std::ostream* out = nullptr;
};

// Where fit() stands, for checkpoints (BackupAndRestore): after the batch that training
// last finished, `batch` batches of `epoch` are trained (0-based epoch; at the end of an
// epoch, the next epoch with batch 0).
struct FitPosition {
  int epoch = 0;
  std::int64_t batch = 0;
  // The epoch's running loss (total, count), then each compiled metric's (total, count):
  // this worker's own until the epoch's end, where the workers' are summed.
  std::vector<double> totals;
  // Batches whose gradients are accumulated (gradient_accumulation_steps) but not yet
  // applied; a checkpoint is only consistent where this is 0.
  int pending_batches = 0;
  // The epoch's batches (0: not known): a run resumed with another batch size or data
  // would put the position in another epoch than the one saved.
  std::int64_t steps = 0;
  // The epoch's rows trained (-1: not kept; `batch` whole batches then): where batches
  // changed size within the epoch (an elastic job that keeps each worker's batch).
  std::int64_t rows = -1;
};

// A model belongs to the strategy whose scope() was open when it was created
// (distribute::Strategy); fit() then splits each global batch across its replicas.
class Model {
 public:
  // The functional graph from `inputs` to `outputs` (Keras's Model(inputs, outputs)). Every
  // output must depend on the inputs only; layer names must be unique in the model.
  Model(std::vector<KerasTensor> inputs, std::vector<KerasTensor> outputs, std::string name = "model");
  Model(const KerasTensor& input, const KerasTensor& output, std::string name = "model")
      : Model(std::vector<KerasTensor>{input}, std::vector<KerasTensor>{output}, std::move(name)) {}
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Builds every layer for inputs of `input_shape` (without the batch axis), like
  // Keras's input_shape argument; summary() needs it.
  void build(const Shape& input_shape);
  bool built() const { return input_shape_.has_value(); }
  std::optional<Shape> input_shape() const { return input_shape_; }
  Shape output_shape() const;

  // Inputs on another device than the model's weights are copied to theirs first (as
  // Keras copies NumPy arrays to the GPU); inside the model nothing is copied.
  Tensor operator()(const Tensor& x, bool training = false);
  // A functional model of several inputs or outputs: one tensor per input, in order.
  std::vector<Tensor> operator()(std::span<const Tensor> inputs, bool training = false);
  // The same, with each output's mask (Keras's implicit masks: nn::Layer::compute_mask;
  // undefined where an output has none) in `output_masks`, which the loss and metrics honour.
  std::vector<Tensor> operator()(std::span<const Tensor> inputs, bool training, std::vector<Tensor>* output_masks);
  // Where the model's weights are (its first variable's device); before they exist, where
  // they would be made: the calling thread's placement (core/device.h).
  Device device() const;
  // Whether the model is a functional graph (else a Sequential stack).
  bool functional() const { return !graph_.empty(); }
  const std::vector<KerasTensor>& inputs() const { return inputs_; }
  const std::vector<KerasTensor>& outputs() const { return outputs_; }
  std::size_t num_inputs() const { return functional() ? inputs_.size() : 1; }
  std::size_t num_outputs() const { return functional() ? outputs_.size() : 1; }
  // Each output's name, as Keras's model.output_names: the layer that makes it.
  std::vector<std::string> output_names() const;
  // How many times the model calls `layer` in one forward pass (a shared layer: more than once).
  int calls_of(const nn::Layer* layer) const;

  // On a model of several outputs, the loss and the metrics apply to each output.
  void compile(std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<losses::Loss> loss,
               const std::vector<std::string>& metrics = {});
  // A model of several outputs, as Keras compiles one: a loss for each output (or one for
  // all), each weighted by loss_weights (empty: 1 each) in the loss fit minimizes and
  // reports as "loss"; metrics[i] are output i's (or metrics[0] every output's). Logs then
  // name each output's own loss and metrics after the layer that makes the output
  // ("score_loss", "score_accuracy"), as Keras names them.
  void compile(std::shared_ptr<optim::Optimizer> optimizer, std::vector<std::shared_ptr<losses::Loss>> losses,
               const std::vector<std::vector<std::string>>& metrics, std::vector<double> loss_weights = {});
  // Keras's strings: compile("adam", "sparse_categorical_crossentropy", {"accuracy"}).
  void compile(const std::string& optimizer, const std::string& loss, const std::vector<std::string>& metrics = {},
               bool from_logits = false);
  bool compiled() const { return optimizer_ != nullptr; }

  History fit(const Tensor& x, const Tensor& y, const FitOptions& options = {});
  // Several inputs or outputs: a tensor for each, in the model's order.
  History fit(const TensorData& data, const FitOptions& options = {});
  // A Dataset of (x, y) batches; batch_size, shuffle and seed belong to the pipeline then.
  // Each epoch is a new pass (iteration = epoch), unless steps_per_epoch is set.
  History fit(const data::Dataset& dataset, const FitOptions& options = {});
  // A Dataset's elements hold the model's inputs and then its targets, one component each:
  // (x, y) for one input and one output.
  Logs evaluate(const Tensor& x, const Tensor& y, const EvaluateOptions& options = {});
  Logs evaluate(const TensorData& data, const EvaluateOptions& options = {});
  Logs evaluate(const data::Dataset& dataset, const EvaluateOptions& options = {});
  Tensor predict(const Tensor& x, std::int64_t batch_size = 32);
  // One tensor per output, from one per input.
  std::vector<Tensor> predict(std::span<const Tensor> x, std::int64_t batch_size = 32);

  // The Keras-style table (layer, output shape, parameters; totals).
  std::string summary() const;

  const std::string& name() const { return name_; }
  const std::vector<std::shared_ptr<nn::Layer>>& layers() const { return layers_; }
  std::vector<Variable*> variables() const;
  std::vector<Variable*> trainable_variables() const;
  // Keras's model.losses: every layer's regularization penalties (on the weights' current
  // values, recorded by live tapes) and activity penalties (of the last call). fit adds
  // their sum to the loss it minimizes and reports, once per global batch under a strategy.
  std::vector<Tensor> losses() const;
  std::int64_t count_params() const;
  optim::Optimizer& optimizer() const;
  // Whether some layer computes in `dtype` (its policy's).
  bool computes_in(DType dtype) const;
  losses::Loss& loss() const;  // the first output's
  // Each output's loss and its weight, as compiled.
  const std::vector<std::shared_ptr<losses::Loss>>& output_losses() const { return losses_; }
  const std::vector<double>& loss_weights() const { return loss_weights_; }
  // The metric names compiled for each output (one list for a model of one output).
  const std::vector<std::vector<std::string>>& compiled_metrics() const { return compiled_metrics_; }
  std::vector<metrics::Metric*> metrics() const;

  // Keras's JSON: a Sequential as {"class_name": "Sequential", "config": {"name", "layers",
  // "build_input_shape"}}; a functional model as tf.keras writes it, {"class_name":
  // "Functional", "config": {"name", "layers" (each with its "inbound_nodes"),
  // "input_layers", "output_layers"}}.
  std::string to_json(int indent = 2) const;
  // Weights in the safetensors layout (JSON header + raw little-endian tensors), keyed by
  // variable name ("dense/kernel"). Written to a temporary file and renamed into place, so a
  // failed save never leaves a half-written file where a good one was.
  void save_weights(const std::string& path) const;
  // Every variable must be in the file with its shape; errors name the file and the key.
  void load_weights(const std::string& path);
  // Keras's model.save: the architecture (to_json), every variable, and, when compiled, the
  // optimizer (its class, hyperparameters, schedule, iteration count and slots), the loss
  // and the metric names, in one checksummed safetensors file written durably
  // (save_checked). dtrain::models::load_model (model/saving.h) reads it back without the
  // code that built the model.
  void save(const std::string& path) const;

  // The strategy the model was created under (null: the default strategy). TensorFlow's
  // model.distribute_strategy.
  const std::shared_ptr<StrategyBackend>& distribute_strategy() const { return strategy_; }

  // Set by a callback to end fit(): after the current batch on one worker, after the
  // current epoch under several (where every worker has the same figures to decide on).
  bool stop_training = false;

  // Where the fit() under way stands (called from its callbacks).
  FitPosition fit_position() const;
  // Its pending_batches alone, without gathering the metric totals (read every batch).
  int fit_pending_batches() const { return fit_pending_; }
  // Makes the next fit() continue from `position` instead of its first epoch: called by a
  // callback's on_train_begin (BackupAndRestore) with a saved position. fit() then starts
  // at that epoch, skips the batches already trained (in-memory data: by index; a Dataset:
  // by drawing them again from a fresh iterator, so its pipeline must be deterministic, as
  // it is with seeded shuffles) and resumes the epoch's loss and metrics from the totals.
  void resume_fit_at(FitPosition position);
  // The position resume_fit_at gave, until fit takes it (in its first epoch's begin).
  const std::optional<FitPosition>& resume_position() const { return resume_; }
  // Under a strategy that trains in other processes (ParameterServerStrategy's chief): copies
  // the values and the optimizer's state held there into this model and its optimizer, so
  // that a checkpoint taken now holds them. Elsewhere the state is here already: nothing.
  void gather_remote_state();

  // The first step of the current (or last) fit() whose loss or updated weights were not
  // finite; fit checks both after every step. TerminateOnNaN stops training on it.
  const std::optional<NonFinite>& non_finite() const { return non_finite_; }

  class BatchSource;  // where fit() draws batches from (batch_sources.h)

 protected:
  explicit Model(std::string name);
  // The layers of a Sequential stack, in order (functional: the graph's, each once).
  std::vector<std::shared_ptr<nn::Layer>> layers_;
  std::optional<Shape> input_shape_;
  std::string name_;

 private:
  History run_fit(BatchSource& source, const FitOptions& options);
  // A Sequential's forward pass; its output's mask (undefined for none) to `output_mask`.
  Tensor sequential_forward(const Tensor& x, bool training, Tensor* output_mask);
  // fit() under a strategy whose steps run in other processes (remote_fit.cpp): the
  // coordinator hands out `steps` steps an epoch; a worker trains on `batches` (null on a
  // task that runs no steps) as each closure asks.
  History coordinate_remote_fit(RemoteTraining& remote, std::int64_t steps, const FitOptions& options);
  History serve_remote_fit(RemoteTraining& remote, BatchSource* batches, const FitOptions& options);
  // Builds the model for batches like `x` under its strategy's scope, if not built yet.
  void build_for(const Tensor& x);
  // The loss fit minimizes for a batch's predictions (without the penalties): the weighted
  // sum of each output's loss. With several outputs, each one's own loss goes to `each`.
  // An output with a mask (`masks`, where given) counts only its real steps, as Keras's
  // losses do: a mean loss is their mean.
  Tensor compute_loss(std::span<const Tensor> y, std::span<const Tensor> y_pred, std::vector<Tensor>* each,
                      std::span<const Tensor> masks = {}) const;
  // The reduction every output's loss shares (compile checks that they share one).
  losses::Reduction loss_reduction() const { return loss_->reduction(); }
  // Each compiled metric's update for a batch (its rows' targets and predictions); the
  // outputs' own losses (several outputs) take `output_losses`, weighted by `rows`.
  void update_metrics(std::span<const Tensor> y, std::span<const Tensor> y_pred, std::span<const Tensor> masks = {});
  void update_output_losses(std::span<const double> output_losses, double rows);
  // Checks `data` against the model's inputs and outputs: counts, and the same rows throughout.
  void check_data(const TensorData& data, const char* who) const;
  // What every fit() does first: its callbacks (`history` first, then the given ones, none
  // null), each told the model; stop_training cleared; the fit position at initial_epoch.
  std::vector<std::shared_ptr<Callback>> begin_fit(const std::shared_ptr<History>& history, const FitOptions& options);
  // The epoch's loss and metrics so far, into `logs`.
  void set_epoch_logs(Logs& logs, const metrics::Mean& loss_mean) const;
  // The start of each of fit's epochs: metrics cleared, the fit position at the epoch's
  // start (its loss in `loss_mean`), `logs` emptied, the callbacks told.
  void begin_epoch(int epoch, const metrics::Mean& loss_mean, Logs& logs,
                   const std::vector<std::shared_ptr<Callback>>& callbacks);
  // The position a restored backup left (resume_, taken), checked against this fit's first
  // epoch and, where known (> 0), its steps an epoch.
  std::optional<FitPosition> take_resume(const FitOptions& options, std::int64_t steps);
  // The resumed epoch's start: the fit position at the backup's batch (returned), its loss
  // and metric totals merged back, and `logs` as its last trained batch left them.
  std::int64_t resume_epoch(const FitPosition& resume, metrics::Mean& loss_mean, Logs& logs);
  // After a step: records the first non-finite loss or weights in non_finite_.
  void check_finite(int epoch, std::int64_t batch, double loss);
  class Trainer;  // one training step, on one device or on a strategy's replicas
  // across_workers: fit's validation on per-worker data, summed over the workers.
  Logs run_evaluation(BatchSource& source, const std::string& prefix, bool across_workers = false);
  // The loss and metrics over every worker's rows (multi-worker: their totals summed).
  void merge_over_workers(metrics::Mean& loss_mean);
  // This worker's step profile over all of training, and every other worker's.
  std::vector<profile::WorkerSummary> gather_profile(const profile::Profiler& profiler);
  Logs run_evaluation(const data::Dataset& dataset, const std::string& prefix);
  void check_compiled(const char* what) const;
  void reset_metrics();
  Logs run_evaluation(const TensorData& data, std::int64_t batch_size, const std::string& prefix);

  static bool is_relu(const nn::Layer* layer);
  // Refuses a string tensor given as `which` (an input) by name.
  void refuse_strings(const Tensor& x, const std::string& which) const;
  // The functional graph's nodes in an order that computes every input before its use.
  std::vector<std::shared_ptr<const GraphNode>> graph_;
  // [node] a batch norm whose output only an Activation("relu") reads: it runs the relu
  // fused, and that relu node passes its value on (graph_ order).
  std::vector<char> fused_relu_;
  std::vector<char> runs_relu_;  // [node] the batch norms that run such a relu
  std::vector<KerasTensor> inputs_, outputs_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<losses::Loss> loss_;  // losses_[0]
  std::vector<std::shared_ptr<losses::Loss>> losses_;  // [output]
  std::vector<double> loss_weights_;                   // [output]
  std::vector<std::vector<std::string>> compiled_metrics_;
  std::vector<std::unique_ptr<metrics::Metric>> metrics_;
  // What each of metrics_ measures: an output's (index) targets and predictions, or (loss)
  // that output's own loss.
  struct MetricRole {
    std::size_t output = 0;
    bool loss = false;
  };
  std::vector<MetricRole> metric_roles_;  // [metric]
  std::shared_ptr<StrategyBackend> strategy_ = current_strategy();
  std::optional<NonFinite> non_finite_;
  // fit()'s position, kept up to date for fit_position() without allocating per step.
  int fit_epoch_ = 0;
  std::int64_t fit_batch_ = 0;
  std::int64_t fit_rows_ = 0;  // the epoch's rows trained
  int fit_pending_ = 0;
  std::int64_t fit_steps_ = 0;  // the epoch's batches (0: not known)
  const metrics::Mean* fit_loss_ = nullptr;  // the epoch's loss accumulator, during fit()
  std::optional<FitPosition> resume_;
};

// Builds a model from to_json()'s output (or the same structure written by hand).
// Errors name the JSON path of the offending key ("config.layers[1].config.units").
std::unique_ptr<Model> model_from_json(const std::string& json);

}  // namespace dtrain
