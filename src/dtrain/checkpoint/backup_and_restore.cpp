// BackupAndRestore: what fit saves, when, and how it resumes.
#include "dtrain/checkpoint/backup_and_restore.h"

#include <array>
#include <cstring>
#include <fstream>

#include "dtrain/core/error.h"

namespace dtrain::train {

SaveFreq::SaveFreq(const char* epoch) {
  if (epoch == nullptr || std::strcmp(epoch, "epoch") != 0)
    DTRAIN_THROW(InvalidArgument, "save_freq must be \"epoch\" or a number of batches, got \"",
                 epoch ? epoch : "(null)", "\"");
}

SaveFreq::SaveFreq(std::int64_t batches) : batches_(batches) {
  if (batches <= 0) DTRAIN_THROW(InvalidArgument, "save_freq must be \"epoch\" or a number of batches > 0, got ", batches);
}

std::string SaveFreq::to_string() const { return per_epoch() ? "epoch" : std::to_string(batches_) + " batches"; }

BackupAndRestore::BackupAndRestore(std::string backup_dir, BackupAndRestoreOptions options)
    : dir_(std::move(backup_dir)), options_(std::move(options)) {
  if (dir_.empty()) DTRAIN_THROW(InvalidArgument, "BackupAndRestore: backup_dir is empty");
  if (options_.max_to_keep < 1)
    DTRAIN_THROW(InvalidArgument, "BackupAndRestore: max_to_keep must be >= 1, got ", options_.max_to_keep);
}

BackupAndRestore::~BackupAndRestore() = default;

void BackupAndRestore::on_train_begin(const Logs& /*logs*/) {
  if (!model_) DTRAIN_THROW(InvalidArgument, "BackupAndRestore: not attached to a model");
  Model& model = *model_;
  StrategyBackend* strategy = model.distribute_strategy().get();
  const int workers = strategy ? strategy->num_workers() : 1;
  const int worker = strategy ? strategy->worker_index() : 0;
  const int in_sync = strategy ? strategy->num_replicas_in_sync() : 1;
  preempted_ = false;
  steps_done_ = 0;
  seen_.restart();
  resumed_from_.reset();
  // What fit itself keeps: the position to resume at and the batches done in all. Each
  // worker's metric totals are summed into the saved ones; on restore the chief takes the
  // sum and the others start from zero, so that the epoch's merged figures come out alike.
  JsonState fit_state;
  fit_state.save = [this, strategy, workers] {
    FitPosition p = saving_;
    if (workers > 1 && !p.totals.empty()) strategy->sum_over_workers(p.totals);
    return nlohmann::json{{"epoch", p.epoch},
                          {"batch", p.batch},
                          {"totals", p.totals},
                          {"steps_done", steps_done_},
                          {"steps_per_epoch", p.steps},
                          {"num_workers", workers},
                          {"num_replicas_in_sync", strategy ? strategy->num_replicas_in_sync() : 1}};
  };
  fit_state.check = [this, workers, in_sync](const nlohmann::json& j) {
    const int saved_workers = j.at("num_workers").get<int>();
    const int saved_in_sync = j.at("num_replicas_in_sync").get<int>();
    if (saved_in_sync != in_sync || saved_workers != workers)
      DTRAIN_THROW(InvalidArgument, "BackupAndRestore: the backup in ", dir_, " was made by ", saved_workers,
                   " worker(s) with ", saved_in_sync, " replicas in sync; this job has ", workers, " with ", in_sync,
                   ". A resumed run must split each batch the same way; start it as before, or use another backup_dir");
  };
  fit_state.restore = [this, &model, worker](const nlohmann::json& j) {
    FitPosition p;
    p.epoch = j.at("epoch").get<int>();
    p.batch = j.at("batch").get<std::int64_t>();
    p.totals = j.at("totals").get<std::vector<double>>();
    p.steps = j.value("steps_per_epoch", std::int64_t{0});  // 0 in backups from before it was saved
    if (worker != 0) std::fill(p.totals.begin(), p.totals.end(), 0.0);
    steps_done_ = j.at("steps_done").get<std::int64_t>();
    seen_.restart(p.batch - 1);
    model.resume_fit_at(std::move(p));
  };
  // "fit" first: restore checks the objects in order, and the job's shape (workers,
  // replicas) is the first thing a backup must agree with.
  std::vector<std::pair<std::string, Trackable>> objects;
  objects.emplace_back("fit", std::move(fit_state));
  objects.emplace_back("model", model);
  if (model.compiled()) objects.emplace_back("optimizer", model.optimizer());
  checkpoint_ = std::make_unique<Checkpoint>(std::move(objects));
  CheckpointManagerOptions manager;
  manager.max_to_keep = options_.max_to_keep;
  manager.checkpoint_name = "backup";
  manager.async = options_.async;
  manager.log = worker == 0 ? options_.out : nullptr;
  manager_ = std::make_unique<CheckpointManager>(*checkpoint_, dir_, manager);
  const bool any = manager_->latest_checkpoint().has_value() || !manager_->checkpoints().empty();
  if (!model.built()) {
    // Weights are made at the first batch; there is nothing to restore into before.
    std::ifstream probe(dir_ + "/checkpoint");
    if (any || probe)
      DTRAIN_THROW(InvalidArgument, "BackupAndRestore: ", dir_, " holds a backup, but model '", model.name(),
                   "' is not built yet; build it (model.build(input_shape)) before fit() so the backup can be restored");
  } else {
    const RestoredCheckpoint restored = manager_->restore_latest();
    // Backups none of which this model resumes from (another model's, or all damaged) are
    // kept: this job would write over them and delete them at its end.
    if (!restored.path && !restored.skipped.empty())
      DTRAIN_THROW(InvalidArgument, "BackupAndRestore: ", dir_, " holds ", restored.skipped.size(),
                   " backup(s), none of which model '", model.name(), "' can resume from (", restored.skipped.front().path,
                   ": ", restored.skipped.front().reason,
                   "); they are left as they are: give another backup folder, or remove them to start afresh");
    if (restored.path) {
      resumed_from_ = restored.path;
      if (options_.out && worker == 0)
        *options_.out << "BackupAndRestore: resuming from " << *restored.path << " (" << steps_done_
                      << " training batches done)\n";
    }
  }
  watcher_.reset();
  if (options_.save_before_preemption) watcher_ = std::make_unique<PreemptionWatcher>();
}

std::string BackupAndRestore::save(const FitPosition& position) {
  saving_ = position;
  model_->gather_remote_state();
  const std::string path = manager_->save(steps_done_);
  ++saves_;
  if (options_.on_save) options_.on_save(path, steps_done_);
  return path;
}

void BackupAndRestore::on_train_batch_end(std::int64_t batch, const Logs& /*logs*/) {
  const std::int64_t before = steps_done_;
  steps_done_ += seen_.after(batch);
  StrategyBackend* strategy = model_->distribute_strategy().get();
  const int workers = strategy ? strategy->num_workers() : 1;
  if (watcher_ && !preempted_) {
    // Every worker learns, at the same step, whether any of them was asked to stop.
    std::array<double, 1> asked{PreemptionWatcher::requested() ? 1.0 : 0.0};
    if (workers > 1) strategy->sum_over_workers(asked);
    preempted_ = asked[0] > 0.0;
  }
  if (model_->fit_pending_batches() != 0) return;  // mid-accumulation: not a state one can resume
  if (preempted_) {
    // The path every worker names (only the chief's manager lists the files it wrote).
    const std::string path = save(model_->fit_position());
    manager_->sync();
    DTRAIN_THROW(Preempted, "training was asked to stop (SIGTERM on this or another worker); saved ",
                 path, " after ", steps_done_,
                 " training batches; run the same job again to resume there");
  }
  if (!options_.save_freq.per_epoch() && steps_done_ / options_.save_freq.batches() > before / options_.save_freq.batches())
    save(model_->fit_position());
}

void BackupAndRestore::on_epoch_end(int epoch, const Logs& /*logs*/) {
  if (!options_.save_freq.per_epoch()) return;
  if (model_->fit_pending_batches() != 0) return;
  save(FitPosition{epoch + 1, 0, {}, 0, model_->fit_position().steps});
}

void BackupAndRestore::on_train_error() noexcept {
  // SIGTERM kills again, and a save in flight finishes (its file is complete or absent).
  watcher_.reset();
  try {
    if (manager_) manager_->sync_quietly();
  } catch (...) {
  }
}

void BackupAndRestore::on_train_end(const Logs& /*logs*/) {
  manager_->sync();
  if (options_.delete_checkpoint) {
    StrategyBackend* strategy = model_->distribute_strategy().get();
    if (!strategy || strategy->worker_index() == 0) manager_->delete_all();
  }
  watcher_.reset();
}

}  // namespace dtrain::train
