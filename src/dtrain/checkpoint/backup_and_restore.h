// Keras's BackupAndRestore: fit() saves its whole state (weights, optimizer slots and
// iteration count, random streams, the epoch, the batch and the epoch's running metrics)
// into a folder as it trains, and a fit() started again with the same callback continues
// from the last save, at the next batch: the resumed run is the run left alone, bit for
// bit, for every strategy. SIGTERM (a preemption notice) makes every worker save at the
// next step boundary they agree on and stop with Preempted.
#pragma once

#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/checkpoint/manager.h"
#include "dtrain/checkpoint/preemption.h"
#include "dtrain/model/callbacks.h"

namespace dtrain::train {

// Keras's save_freq: "epoch" (at the end of every epoch) or a number of batches.
class SaveFreq {
 public:
  SaveFreq(const char* epoch);  // NOLINT: "epoch", as Keras writes it
  SaveFreq(std::int64_t batches);  // NOLINT: save every `batches` training batches (> 0)
  SaveFreq(int batches) : SaveFreq(static_cast<std::int64_t>(batches)) {}  // NOLINT
  bool per_epoch() const { return batches_ == 0; }
  std::int64_t batches() const { return batches_; }
  std::string to_string() const;

 private:
  std::int64_t batches_ = 0;
};

struct BackupAndRestoreOptions {
  SaveFreq save_freq = "epoch";
  // Delete the backups when fit() ends normally (Keras's default); false keeps them.
  bool delete_checkpoint = true;
  // Watch for SIGTERM during fit(): save at the next step boundary, then throw Preempted.
  bool save_before_preemption = true;
  // Write on a background thread; the step pays only for a copy of the state.
  bool async = true;
  // Backups kept; more than one lets a damaged newest one fall back to the one before.
  int max_to_keep = 2;
  std::ostream* out = &std::cout;  // one line when fit resumes, and skipped backups (null: silent)
  // Called after each save has started, on the training thread, with the backup's path and
  // the training batches done in all: the dtrain command reports progress to its launcher.
  std::function<void(const std::string& path, std::int64_t steps)> on_save;
};

class BackupAndRestore : public Callback {
 public:
  explicit BackupAndRestore(std::string backup_dir, BackupAndRestoreOptions options = {});
  ~BackupAndRestore() override;

  void on_train_begin(const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  void on_train_error() noexcept override;

  const std::string& backup_dir() const { return dir_; }
  // The backup the last fit() resumed from; empty when it started fresh.
  const std::optional<std::string>& resumed_from() const { return resumed_from_; }
  // Training batches done over every run of this fit (restored with the backup).
  std::int64_t steps_done() const { return steps_done_; }
  // Backups saved by this process.
  std::int64_t saves() const { return saves_; }
  // What they cost: time on the training thread and the writer's (complete once fit returns).
  SaveStatistics save_statistics() const { return manager_ ? manager_->statistics() : SaveStatistics{}; }

 private:
  std::string save(const FitPosition& position);  // the backup's path
  std::string dir_;
  BackupAndRestoreOptions options_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<CheckpointManager> manager_;
  std::unique_ptr<PreemptionWatcher> watcher_;
  FitPosition saving_;  // the position the save under way records
  std::int64_t steps_done_ = 0;
  BatchesSeen seen_;
  std::int64_t saves_ = 0;
  bool preempted_ = false;
  std::optional<std::string> resumed_from_;
};

}  // namespace dtrain::train
