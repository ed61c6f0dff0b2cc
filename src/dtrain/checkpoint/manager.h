// tf.train.CheckpointManager: numbered checkpoints in one folder, the oldest deleted past
// max_to_keep, an index file ("checkpoint", JSON) written after each checkpoint is
// complete, restore of the newest checkpoint that verifies, and saves that do not stall
// training (the state is copied at the step, written on a background thread).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"

namespace dtrain::train {

struct CheckpointManagerOptions {
  int max_to_keep = 5;                      // 0: keep every checkpoint
  double keep_checkpoint_every_n_hours = 0;  // also keep one per this many hours (0: none)
  std::string checkpoint_name = "ckpt";     // files are <name>-<number>.safetensors
  // save() copies the state and returns; a background thread writes it. One save is in
  // flight at a time: the next save() (or sync()) waits for it, and rethrows its failure.
  bool async = false;
  std::ostream* log = nullptr;  // where restore_latest says what it skipped (null: nowhere)
  // Seconds since the Unix epoch, for keep_checkpoint_every_n_hours and the index's times
  // (null: the system clock). Tests give their own.
  std::function<double()> clock;
};

// A checkpoint the manager skipped while restoring, and why.
struct SkippedCheckpoint {
  std::string path;
  std::string reason;
};

// Where the saves' time went, for a user who asks what checkpointing costs training.
struct SaveStatistics {
  std::int64_t saves = 0;
  // On the thread that called save(): taking the snapshot, and waiting for the previous
  // save's write, of which `seconds_waiting`. Async saves only.
  double seconds_in_save = 0;
  double seconds_waiting = 0;
  // The background writer, over the saves whose write has ended: its CPU time (header,
  // the write's system time, fsync, rename, index) and its wall time (mostly the disk).
  double writer_cpu_seconds = 0;
  double writer_seconds = 0;
};

struct RestoredCheckpoint {
  std::optional<std::string> path;  // empty: there was none to restore (a fresh start)
  std::int64_t number = 0;
  std::vector<SkippedCheckpoint> skipped;  // newer ones that failed to verify or to fit
};

class CheckpointManager {
 public:
  CheckpointManager(Checkpoint& checkpoint, std::string directory, CheckpointManagerOptions options = {});
  ~CheckpointManager();  // waits for a save in flight (its failure is then only logged)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves checkpoint number `checkpoint_number` (default: the checkpoint's save counter
  // plus one) and returns its path. Multi-worker: a collective; the chief writes.
  std::string save(std::optional<std::int64_t> checkpoint_number = std::nullopt);
  // Waits for the save in flight; rethrows its failure. Multi-worker: a collective.
  void sync();
  // Waits for the save in flight without the workers' comparison (no collective): for a
  // job that is failing, where the other workers may be gone. Rethrows the write's failure.
  void sync_quietly() { wait_for_writer(); }

  // The newest checkpoint the index lists (as written by completed saves).
  std::optional<std::string> latest_checkpoint() const;
  // Every checkpoint kept, oldest first.
  std::vector<std::string> checkpoints() const;
  const std::string& directory() const { return directory_; }

  // Restores the newest checkpoint that verifies and fits (the index's, then any complete
  // file the folder holds), skipping and reporting the ones that do not (an IoError). An
  // InvalidArgument (the program refuses what the newest one holds) is thrown as it is.
  RestoredCheckpoint restore_latest(RestoreOptions options = {});
  // Deletes every checkpoint and the index (BackupAndRestore's delete_checkpoint).
  void delete_all();
  // Read on the thread that calls save().
  const SaveStatistics& statistics() const { return statistics_; }

 private:
  struct Entry {
    std::string file;  // within directory_
    std::int64_t number;
    double time;  // seconds since the epoch, when saved
  };
  std::string path_of(const std::string& file) const { return directory_ + "/" + file; }
  void read_index();
  void write_index() const;
  // After a checkpoint is complete: the index, then deleting what is no longer kept.
  void commit(Entry entry);
  // Every checkpoint file in the folder, newest first (including ones the index lacks).
  std::vector<Entry> candidates() const;
  void wait_for_writer();  // rethrows the writer's failure
  // wait_for_writer(), then, under several workers, the comparison of the written save's
  // digest with the other workers' (`what` names that save in a mismatch's error).
  void finish_writer(const char* what);

  Checkpoint& checkpoint_;
  std::string directory_;
  CheckpointManagerOptions options_;
  std::vector<Entry> kept_;  // oldest first
  double last_preserved_ = 0;

  // The background writer (async saves).
  Snapshot snapshot_;
  std::exception_ptr failure_;
  std::uint64_t pending_digest_check_ = 0;  // multi-worker: the digest of the save last written
  bool digest_pending_ = false;
  std::thread writer_;
  SaveStatistics statistics_;
  double writer_cpu_seconds_ = 0, writer_seconds_ = 0;  // the writer's, taken into statistics_ when joined
};

}  // namespace dtrain::train
