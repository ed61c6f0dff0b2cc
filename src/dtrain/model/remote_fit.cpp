// fit() under a strategy whose steps run in other processes (ParameterServerStrategy):
// the coordinator's epochs, callbacks, progress and validation, and the workers' steps.
#include <algorithm>
#include <iostream>

#include "dtrain/core/clock.h"
#include "dtrain/core/files.h"
#include "dtrain/core/percentile.h"
#include "dtrain/core/threads.h"
#include "dtrain/model/batch_sources.h"
#include "dtrain/model/progress.h"
#include "dtrain/model/model.h"
#include "dtrain/model/trainer.h"

namespace dtrain {
namespace {

void check_remote_options(const StrategyBackend& strategy, const FitOptions& opt, const optim::Optimizer* optimizer) {
  if (optimizer && optimizer->loss_scale_options())
    DTRAIN_THROW(InvalidArgument, "fit under ", strategy.name(), ": loss scaling (a LossScaleOptimizer, or the one ",
                 "compile adds for the mixed_float16 policy) is not supported: the parameter servers apply each ",
                 "worker's gradients as they come; train with \"mixed_bfloat16\" or \"float32\" there");
  for (const auto& c : opt.callbacks)
    if (dynamic_cast<const LearningRateScheduler*>(c.get()))
      DTRAIN_THROW(InvalidArgument, "fit under ", strategy.name(), ": LearningRateScheduler changes the optimizer on ",
                   "the coordinator, while the parameter servers apply updates with the workers' optimizer; give ",
                   "the optimizer a learning-rate schedule (optim::ExponentialDecay, ...) instead");
  if (opt.gradient_accumulation_steps != 1)
    DTRAIN_THROW(InvalidArgument, "fit under ", strategy.name(), ": gradient_accumulation_steps ",
                 opt.gradient_accumulation_steps, " is not available (every step pushes its gradients, and the ",
                 "parameter servers apply each push); raise the batch size instead");
  if (opt.steps_per_execution < 1)
    DTRAIN_THROW(InvalidArgument, "fit: steps_per_execution must be >= 1, got ", opt.steps_per_execution);
}

}  // namespace

void Model::build_for(const Tensor& x) {
  if (built()) return;
  const dtrain::detail::ScopedStrategy in_scope(strategy_);
  build(Shape(std::vector<std::int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end())));
}

void Model::gather_remote_state() {
  RemoteTraining* remote = strategy_ ? strategy_->remote_training() : nullptr;
  if (remote && remote->coordinates() && compiled()) remote->gather(optimizer());
}

History Model::serve_remote_fit(RemoteTraining& remote, BatchSource* batches, const FitOptions& opt) {
  check_remote_options(*strategy_, opt, optimizer_.get());
  // A ProfilerCallback's trace: each worker writes its own steps' phases (pull, input
  // wait, forward, backward, push), worker 0's at the callback's path.
  const int worker = remote.remote_worker_index(), ps = remote.remote_ps_index();
  std::string trace_path, server_trace_path;
  profile::ProfilerOptions profile_options;
  for (const auto& c : opt.callbacks) {
    const auto* p = dynamic_cast<const ProfilerCallback*>(c.get());
    if (p && worker >= 0) {
      trace_path = p->path_for_worker(worker);
      check_replaceable(trace_path, "fit: the trace file");
      profile_options.trace = true;
      profile_options.max_trace_steps = p->max_steps();
    }
    // A parameter server traces the pushes it takes: each one's queueing and applying.
    if (p && ps >= 0) {
      server_trace_path = p->path_for_ps(ps);
      check_replaceable(server_trace_path, "fit: the parameter server's trace file");
      remote.trace_server(static_cast<std::size_t>(p->max_steps()) *
                          static_cast<std::size_t>(std::max(1, remote.num_remote_workers())));
    }
  }
  profile::Profiler profiler(profile_options);
  profile::Track& loop = profiler.loop();
  Trainer trainer(*this, 1, profiler);
  trainer.updates_are_pushes();
  // The steps run on the server's threads: with this thread's compute threads.
  const int threads = num_threads();
  std::vector<std::shared_ptr<Callback>> here;
  for (const auto& c : opt.callbacks)
    if (c && c->runs_on_workers()) here.push_back(c);
  for (auto& c : here) c->set_model(this);
  std::int64_t step_here = 0;  // this worker's steps, for its callbacks
  const Logs no_logs;
  int pass = 0;
  bool started = false;
  // The figures of each closure: rows, the loss's (total, count), each metric's, then its
  // steps' profile (totals, then each step's wall time) for fit's table on the coordinator.
  std::vector<double> figures;
  std::vector<double> walls;
  remote.serve([&](int steps, const std::function<void(int)>& before_step) {
    if (!batches)
      DTRAIN_THROW(InternalError, "fit: a task that is not a worker (", remote.describe(),
                   ") was given a closure of training steps");
    const ScopedThreads compute(threads);
    const profile::ScopedLoopTrack nested_here(loop);  // rows pulled during forward count as pull
    if (!started) {
      batches->begin_epoch(pass);
      started = true;
    }
    reset_metrics();
    metrics::Mean loss_mean;
    double rows = 0;
    profile::Totals totals;
    walls.clear();
    TensorData batch;
    for (int i = 0; i < steps; ++i) {
      profiler.begin_step();
      const Clock::time_point pull_start = Clock::now();
      before_step(i);
      const Clock::time_point input_start = Clock::now();
      loop.add(profile::Phase::pull, pull_start, input_start);
      if (!batches->next(batch)) {
        batches->begin_epoch(++pass);
        if (!batches->next(batch))
          DTRAIN_THROW(InvalidArgument, "fit: worker ", worker, "'s share of the input has no batch");
      }
      loop.add(profile::Phase::input_wait, input_start, Clock::now());
      for (auto& c : here) c->on_train_batch_begin(step_here, no_logs);
      trainer.step(batch, loss_mean);
      for (auto& c : here) c->on_train_batch_end(step_here, no_logs);
      ++step_here;
      rows += static_cast<double>(batch.rows());
      const profile::StepRecord& record = profiler.end_step(batch.rows());
      totals.add(record);
      walls.push_back(record.wall);
    }
    figures.assign({rows, loss_mean.total(), loss_mean.count()});
    for (const auto& m : metrics_) figures.insert(figures.end(), {m->total(), m->count()});
    const std::size_t at = figures.size();
    figures.resize(at + profile::WorkerSummary::kValues);
    profile::WorkerSummary{totals}.to_values(std::span<double>(figures).subspan(at));
    figures.insert(figures.end(), walls.begin(), walls.end());
    return figures;
  });
  if (!trace_path.empty()) profiler.write_trace(trace_path, worker, "worker " + std::to_string(worker));
  if (!server_trace_path.empty()) remote.write_server_trace(server_trace_path);
  return History();
}

History Model::coordinate_remote_fit(RemoteTraining& remote, std::int64_t steps, const FitOptions& opt) {
  check_remote_options(*strategy_, opt, optimizer_.get());
  remote.begin_fit(opt.steps_per_execution);
  std::ostream& out = opt.out ? *opt.out : std::cout;
  const int verbose = detail::resolve_verbose(opt.verbose, out);
  detail::Progress progress(out, verbose, steps);
  auto history = std::make_shared<History>();
  std::vector<std::shared_ptr<Callback>> callbacks = begin_fit(history, opt);
  std::erase_if(callbacks, [](const std::shared_ptr<Callback>& c) { return c->runs_on_workers(); });
  non_finite_.reset();
  const detail::TrainErrorGuard on_error(callbacks);
  const detail::ClearOnExit clear_loss(fit_loss_);
  Logs logs;
  for (auto& c : callbacks) c->on_train_begin(logs);
  // A backup restored by on_train_begin: its values and optimizer state go to the
  // parameter servers now, before any step, and the epoch goes on from its position.
  const std::optional<FitPosition> resume = take_resume(opt, steps);
  remote.place(optimizer(), resume.has_value());
  if (verbose > 0)
    out << strategy_->name() << ": " << remote.describe() << "; " << steps << " steps an epoch, "
        << opt.steps_per_execution << " to a closure\n";
  // A closure's figures: the loss's and metrics' (`expected`), its profile, its walls.
  const std::size_t expected = 3 + 2 * metrics_.size(), profiled = expected + profile::WorkerSummary::kValues;
  // The workers' steps, as fit's table shows them: after the first epoch where there are
  // several (as one process's profile), with each step's wall time for the percentiles.
  struct Steps {
    profile::Totals totals;
    std::vector<double> walls;
    void add(const profile::Totals& t, std::span<const double> w) {
      totals.add(t);
      walls.insert(walls.end(), w.begin(), w.end());
    }
  };
  const int workers = remote.num_remote_workers();
  std::vector<Steps> all(static_cast<std::size_t>(workers)), steady(all.size());
  int epochs_run = 0;
  double training_seconds = 0;  // the epochs' training, validation excluded
  const Logs no_logs;
  for (int epoch = resume ? resume->epoch : opt.initial_epoch; epoch < opt.epochs && !stop_training; ++epoch) {
    metrics::Mean loss_mean("loss");
    begin_epoch(epoch, loss_mean, logs, callbacks);
    progress.epoch_begin(epoch, opt.epochs);
    const std::int64_t first_step = resume && epoch == resume->epoch ? resume_epoch(*resume, loss_mean, logs) : 0;
    const auto start = Clock::now();
    double samples = 0;
    profile::Totals epoch_totals;
    ++epochs_run;
    remote.train(first_step, steps, opt.steps_per_execution, [&](std::int64_t first, int n, int worker,
                                                                  const std::vector<double>& figures) {
      if (figures.size() != profiled + static_cast<std::size_t>(n))
        DTRAIN_THROW(InvalidArgument, "fit: worker ", worker, " returned ", figures.size(),
                     " figures for the closure of steps ", first, " to ", first + n - 1, ", not the ",
                     profiled + static_cast<std::size_t>(n), " of this model's loss, ", metrics_.size(),
                     " metrics and ", n, " steps' profile: every task must compile the same metrics, and run the "
                     "same dtrain");
      const std::span<const double> profiled_part = std::span<const double>(figures).subspan(expected);
      const profile::Totals closure = profile::WorkerSummary::from_values(profiled_part).totals;
      const std::span<const double> closure_walls = profiled_part.subspan(profile::WorkerSummary::kValues);
      epoch_totals.add(closure);
      if (worker >= 0 && worker < workers) {
        const auto w = static_cast<std::size_t>(worker);
        all[w].add(closure, closure_walls);
        if (epochs_run > 1) steady[w].add(closure, closure_walls);
      }
      samples += figures[0];
      loss_mean.merge(figures[1], figures[2]);
      for (std::size_t i = 0; i < metrics_.size(); ++i) metrics_[i]->merge(figures[3 + 2 * i], figures[4 + 2 * i]);
      fit_batch_ = first + n;
      set_epoch_logs(logs, loss_mean);
      if (!non_finite_ && !std::isfinite(loss_mean.result())) {
        non_finite_ = NonFinite{epoch, fit_batch_ - 1, "loss", loss_mean.result()};
        history->non_finite = non_finite_;
      }
      // A closure's batch callbacks run when it ends: its first step begins, its last ends.
      for (auto& c : callbacks) c->on_train_batch_begin(first, no_logs);
      for (auto& c : callbacks) c->on_train_batch_end(fit_batch_ - 1, logs);
      progress.update(fit_batch_, logs);
      return !stop_training;
    });
    const double train_seconds = seconds_since(start);
    training_seconds += train_seconds;
    // The trained values are here now: validation runs once, on the coordinator.
    if (opt.validation_dataset) {
      logs.update(run_evaluation(*opt.validation_dataset, "val_"));
    } else if (opt.validation_data) {
      logs.update(run_evaluation(*opt.validation_data, opt.batch_size, "val_"));
    }
    const double epoch_seconds = seconds_since(start);
    history->epoch_seconds.push_back(epoch_seconds);
    history->samples_per_second.push_back(samples / train_seconds);
    // The workers' input waits and phases, summed over the closures of the epoch.
    history->input_wait_seconds.push_back(epoch_totals.phases[static_cast<std::size_t>(profile::Phase::input_wait)]);
    history->profile.push_back(epoch_totals);
    progress.epoch_end(logs, epoch_seconds, fit_batch_);
    if (verbose > 0 && epoch_totals.steps > 0) out << "  " << profile::phase_shares(epoch_totals) << " (the workers' steps)\n";
    for (auto& c : callbacks) c->on_epoch_end(epoch, logs);
  }
  const std::vector<Steps>& shown = epochs_run > 1 ? steady : all;
  for (const Steps& s : shown)
    history->profile_summary.push_back({s.totals, percentile(s.walls, 0.5), percentile(s.walls, 0.9)});
  if (verbose > 0) {
    out << strategy_->name() << ": " << remote.statistics() << "\n";
    if (std::any_of(shown.begin(), shown.end(), [](const Steps& s) { return s.totals.steps > 0; }))
      out << "\nWhere the workers' steps' time went:\n" << profile::summary_table(history->profile_summary)
          << "\nThe parameter servers:\n" << remote.servers_table(training_seconds);
  }
  // The optimizer here takes the state the parameter servers trained (its iteration count,
  // its slots), as model.optimizer() does after any other fit.
  remote.gather(optimizer());
  for (auto& c : callbacks) c->on_train_end(logs);
  return *history;
}

}  // namespace dtrain
