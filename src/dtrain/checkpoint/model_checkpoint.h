// Keras's ModelCheckpoint: fit() saves the model (model.save) or its weights
// (save_weights) at the end of each epoch or every N batches, to a path made from a
// pattern ("ckpt/model-{epoch:02d}-{val_loss:.4f}.safetensors"), optionally only when a
// monitored log improves. It keeps files for a user to pick from; resuming an interrupted
// fit is BackupAndRestore's job, not this one's.
#pragma once

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dtrain/checkpoint/backup_and_restore.h"
#include "dtrain/model/callbacks.h"

namespace dtrain::train {

struct ModelCheckpointOptions {
  // The log that save_best_only compares ("val_loss", "accuracy", ...).
  std::string monitor = "val_loss";
  int verbose = 0;  // 1: a line on `out` for each save (and each epoch that did not improve)
  // Save only when `monitor` is better than at every earlier save; the file at a pattern
  // without placeholders then always holds the best model so far.
  bool save_best_only = false;
  bool save_weights_only = false;  // save_weights (the variables only) instead of save
  std::string mode = "auto";       // "min", "max", or "auto" (as EarlyStopping decides)
  SaveFreq save_freq = "epoch";    // "epoch", or every this many training batches
  // save_best_only saves the first value better than this one (none: any first value).
  std::optional<double> initial_value_threshold;
  std::ostream* out = &std::cout;  // verbose lines and warnings (null: silent)
};

class ModelCheckpoint : public Callback {
 public:
  // Python's str.format placeholders, a subset: {epoch} (1-based), {batch} (1-based; only
  // with save_freq in batches) and any log name ({loss}, {val_accuracy}); a spec of d with
  // a width and zero padding ({epoch:03d}, integers only), .Nf with an optional width
  // ({val_loss:.4f}), or none (an integer in decimal; a log value as Python prints a float,
  // 0.25 or 1e-05). {{ and }} are braces. A pattern that is not of this form is an
  // InvalidArgument here; a log name the logs lack, at the save.
  explicit ModelCheckpoint(std::string filepath, ModelCheckpointOptions options = {});

  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;

  const std::string& filepath() const { return filepath_; }
  // The best value of `monitor` seen at a save (save_best_only), or the threshold or ±inf
  // before any. Kept across fit() calls, as in Keras.
  double best() const { return best_; }
  // The path the last save wrote (on worker 0; other workers write nothing).
  const std::optional<std::string>& last_saved() const { return last_saved_; }

  // The path for a save at `epoch` (as substituted: 1-based), after batch `batch` (1-based;
  // none at an epoch's end), with `logs`.
  std::string path_for(int epoch, std::optional<std::int64_t> batch, const Logs& logs) const;

 private:
  // One piece of the pattern: literal text, or a placeholder.
  struct Field {
    std::string name;
    bool zero_pad = false;
    int width = 0;
    std::optional<int> precision;  // .Nf
    char type = 0;                 // 'd', 'f' or 0 (none)
  };
  using Piece = std::variant<std::string, Field>;

  void save(int epoch, std::optional<std::int64_t> batch, const Logs& logs);
  void say(const std::string& line) const;

  std::string filepath_;
  ModelCheckpointOptions options_;
  std::vector<Piece> pattern_;
  bool maximize_ = false;
  double best_;
  int epoch_ = 0;                    // the epoch under way (0-based)
  std::int64_t batches_since_save_ = 0;
  BatchesSeen seen_;
  bool warned_missing_monitor_ = false;
  std::optional<std::string> last_saved_;
};

}  // namespace dtrain::train
