// ElasticTraining: commits at step boundaries, and the workers' changes in fit.
#include "dtrain/checkpoint/elastic_training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::train {
namespace {

double steady_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

std::string millis(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f ms", seconds * 1e3);
  return text;
}

std::string ids_text(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ", ") + id;
  return out;
}

}  // namespace

ElasticTraining::ElasticTraining(ElasticMembership& workers, ElasticTrainingOptions options)
    : workers_(workers), options_(options) {
  if (options_.commit_every < 0)
    DTRAIN_THROW(InvalidArgument, "elastic training: commit_every must be >= 0 (0: chosen by cost), got ",
                 options_.commit_every);
  if (!(options_.commit_share > 0 && options_.commit_share <= 1))
    DTRAIN_THROW(InvalidArgument, "elastic training: commit_share must be in (0, 1], got ", options_.commit_share);
}

ElasticTraining::~ElasticTraining() = default;

void ElasticTraining::on_train_begin(const Logs& /*logs*/) {
  if (!model_) DTRAIN_THROW(InvalidArgument, "ElasticTraining: not attached to a model");
  Model& model = *model_;
  if (!model.built())
    DTRAIN_THROW(InvalidArgument, "elastic training: model '", model.name(), "' is not built yet; build it ",
                 "(model.build(input_shape)) before fit(), so that a worker joining later can receive its state ",
                 "before its first batch");
  steps_done_ = 0;
  changes_.clear();
  first_step_pending_ = false;
  // The fit's position goes with the commit; the metric totals stay with each worker (they
  // cover its own rows), so that workers holding the same state hold the same commit.
  JsonState fit_state;
  fit_state.save = [this] {
    return nlohmann::json{{"epoch", committing_.epoch},
                          {"batch", committing_.batch},
                          {"rows", committing_.rows},
                          {"steps_done", steps_done_}};
  };
  fit_state.restore = [this](const nlohmann::json& j) {
    committing_ = FitPosition{};
    committing_.epoch = j.at("epoch").get<int>();
    committing_.batch = j.at("batch").get<std::int64_t>();
    committing_.rows = j.at("rows").get<std::int64_t>();
    steps_done_ = j.at("steps_done").get<std::int64_t>();
  };
  std::vector<std::pair<std::string, Trackable>> objects;
  objects.emplace_back("fit", std::move(fit_state));
  objects.emplace_back("model", model);
  if (model.compiled()) {
    objects.emplace_back("optimizer", model.optimizer());
    // Every worker's commit has one layout, a newcomer's included: the optimizer's slots
    // (zeros, as it would make them at its first update) for every trainable variable.
    for (Variable* v : model.trainable_variables()) model.optimizer().slots(*v, /*create=*/true);
  }
  checkpoint_ = std::make_unique<Checkpoint>(std::move(objects));
  checkpoint_->set_worker_local();
  state_ = std::make_unique<ElasticState>(*checkpoint_);
  // Where this fit starts: a backup's position (BackupAndRestore, before this callback),
  // else its first epoch.
  committing_ = model.resume_position() ? *model.resume_position() : model.fit_position();
  committing_.pending_batches = 0;
  seen_.restart(committing_.batch - 1);
  commit();
  restart_interval();
  // The first round's members start alike; a newcomer receives the members' commit.
  Change change;
  change.workers.round = workers_.round();
  change.members = workers_.members();
  change.noticed_at = steady_seconds();
  settle(change, /*restore=*/false);
  if (!change.receivers.empty()) say(change);
}

void ElasticTraining::settle(Change& change, bool restore) {
  Clock::time_point start = Clock::now();
  // Settles are numbered within a round (a second fit settles again in the same one).
  if (workers_.round() != settled_round_) {
    settled_round_ = workers_.round();
    settles_in_round_ = 0;
  }
  const ElasticState::Settled settled =
      state_->settle(workers_, "elastic-state/" + std::to_string(settles_in_round_++));
  change.settle_seconds = seconds_since(start);
  change.receivers = settled.receivers;
  change.bytes_sent = settled.receivers.empty() ? 0 : settled.bytes;
  change.resumed_after = settled.step;
  if (!restore && !settled.received) return;
  start = Clock::now();
  state_->restore();
  FitPosition position = committing_;
  // A commit from another member comes without this worker's totals: its epoch's figures
  // count from here.
  if (!settled.received) position.totals = committed_totals_;
  committed_totals_ = position.totals;
  seen_.restart(position.batch - 1);
  model_->resume_fit_at(std::move(position));
  change.restore_seconds = seconds_since(start);
}

void ElasticTraining::commit() {
  // An epoch's batches may change in number with the workers (keeping each worker's
  // batch): the position counts rows, not batches of one size.
  committing_.steps = 0;
  committed_totals_ = committing_.totals;
  state_->commit(steps_done_);
}

void ElasticTraining::on_train_batch_end(std::int64_t batch, const Logs& /*logs*/) {
  steps_done_ += seen_.after(batch);
  if (first_step_pending_) {
    first_step_pending_ = false;
    Change& last = changes_.back();
    last.first_step_at = steady_seconds();
    if (workers_.members().front() == workers_.id())
      (options_.out ? *options_.out : std::cout)
          << "elastic: the first batch of round " << last.workers.round << " ended " << millis(last.first_step_at - last.noticed_at)
          << " after the change was noticed" << std::endl;
  }
  if (model_->fit_pending_batches() != 0 || steps_done_ < next_commit_) return;
  const double batches_seconds = seconds_since(last_commit_end_);
  const std::int64_t batches = std::max<std::int64_t>(1, steps_done_ - (next_commit_ - interval_));
  committing_ = model_->fit_position();
  const Clock::time_point start = Clock::now();
  commit();
  last_commit_end_ = Clock::now();
  // The next interval: the members' mean of what each proposes, so that all commit at the
  // same batch; agreed with the question whether a newcomer waits.
  double interval = static_cast<double>(options_.commit_every);
  if (interval == 0) {
    const double step = batches_seconds / static_cast<double>(batches);
    const double cost = seconds_between(start, last_commit_end_);
    interval = std::clamp(std::ceil(cost / (options_.commit_share * std::max(step, 1e-6))), 1.0, 1000.0);
  }
  const bool newcomer = workers_.newcomer_waiting(interval);
  interval_ = std::max<std::int64_t>(1, std::llround(interval));
  next_commit_ = steps_done_ + interval_;
  // Newcomers come in at a commit, which every member holds: they receive it.
  if (newcomer) change_workers(/*after_failure=*/false, "");
}

void ElasticTraining::restart_interval() {
  // Every commit_every batches, counted from the fit's start; chosen by cost, after the
  // next batch (the members of a new round have agreed on nothing yet).
  interval_ = std::max<std::int64_t>(1, options_.commit_every);
  next_commit_ = (steps_done_ / interval_ + 1) * interval_;
  last_commit_end_ = Clock::now();
}

void ElasticTraining::on_train_end(const Logs& /*logs*/) { workers_.end_job(); }

void ElasticTraining::on_epoch_end(int epoch, const Logs& /*logs*/) {
  if (model_->fit_pending_batches() != 0) return;
  committing_ = FitPosition{epoch + 1, 0, {}, 0, model_->fit_position().steps};
  commit();
}

bool ElasticTraining::recover(const std::exception& failure) {
  change_workers(/*after_failure=*/true, failure.what());
  return true;
}

void ElasticTraining::change_workers(bool after_failure, std::string cause) {
  Change change;
  change.noticed_at = steady_seconds();
  change.cause = std::move(cause);
  change.workers = workers_.reform(after_failure);
  change.members = workers_.members();
  // After a failure every member goes back to the commit; a newcomer's members are at it.
  settle(change, /*restore=*/after_failure);
  restart_interval();
  say(change);
  changes_.push_back(std::move(change));
  first_step_pending_ = true;
}

void ElasticTraining::say(const Change& change) const {
  if (workers_.members().front() != workers_.id()) return;  // the first member says it
  std::ostringstream line;
  line << "elastic: round " << change.workers.round << ", " << change.members.size() << " worker(s) (" << ids_text(change.members)
       << ")";
  if (!change.workers.left.empty()) line << "; gone: " << ids_text(change.workers.left);
  if (!change.workers.joined.empty()) line << "; joined: " << ids_text(change.workers.joined);
  if (!change.cause.empty()) {
    std::string cause = change.cause.substr(0, change.cause.find('\n'));
    if (cause.size() > 160) cause = cause.substr(0, 157) + "...";
    line << " (after: " << cause << ")";
  }
  line << "; at the commit after " << change.resumed_after << " batches (epoch " << committing_.epoch + 1 << ", "
       << committing_.batch << " batches in); agreed in " << millis(change.workers.agree_seconds) << ", connected in "
       << millis(change.workers.ring_seconds) << ", commit ";
  if (change.receivers.empty())
    line << "held by every member (" << millis(change.settle_seconds) << ")";
  else
    line << "sent to " << ids_text(change.receivers) << " (" << change.bytes_sent / 1e6 << " MB, "
         << millis(change.settle_seconds) << ")";
  line << ", restored in " << millis(change.restore_seconds);
  if (workers_.keeps_worker_batch())
    line << "; each worker keeps its batch: the global batch and the learning rate are " << change.members.size() << "/"
         << workers_.max_workers() << " of fit's";
  char at[48];
  std::snprintf(at, sizeof at, "; noticed at %.4f s", change.noticed_at);
  line << at;
  (options_.out ? *options_.out : std::cout) << line.str() << std::endl;
}

}  // namespace dtrain::train
