// tf.train.Checkpoint for dtrain: named objects (a model, its optimizer, an input
// iterator, variables, generators, counters) saved together into one verified file and
// restored into the same objects. Not a model format of its own: model.save() is that.
// Files are safetensors with checksums (model/safetensors.h: save_checked), so other
// frameworks can read the tensors; what is not a tensor is JSON in the metadata.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/core/rng.h"
#include "dtrain/data/dataset.h"
#include "dtrain/model/safetensors.h"
#include "dtrain/model/sequential.h"

namespace dtrain::train {

// State that is not a tensor: save() returns JSON, restore() takes it back. For a training
// loop's own counters and flags.
struct JsonState {
  std::function<nlohmann::json()> save;
  std::function<void(const nlohmann::json&)> restore;
  // Optional: called with the saved value while restore() checks, before anything changes;
  // what it throws (InvalidArgument to refuse the value) leaves every object as it was.
  std::function<void(const nlohmann::json&)> check;
};

// One object a checkpoint tracks. What each kind saves:
//  - a model: every variable (keyed "<name>/<variable>"), every layer's random streams
//    (Dropout's masks), the global seed sequence (set_random_seed's position);
//  - an optimizer: its iteration count (the learning-rate schedule's position) and every
//    slot ("m", "v", "momentum") of the variables of the checkpoint's models;
//  - an input iterator: its position (Iterator::save), shuffle buffers included;
//  - a variable, a generator (seed and counter), an integer, or JsonState.
// The objects are held by reference: they must outlive the checkpoint.
class Trackable {
 public:
  Trackable(Model& model) : object_(&model) {}
  Trackable(optim::Optimizer& optimizer) : object_(&optimizer) {}
  Trackable(data::Iterator& iterator) : object_(&iterator) {}
  Trackable(Variable& variable) : object_(&variable) {}
  Trackable(Generator& generator) : object_(&generator) {}
  Trackable(std::int64_t& value) : object_(&value) {}
  Trackable(JsonState state) : object_(std::move(state)) {}

  using Object = std::variant<Model*, optim::Optimizer*, data::Iterator*, Variable*, Generator*, std::int64_t*,
                              JsonState>;
  const Object& object() const { return object_; }

 private:
  Object object_;
};

// What restore() found. Restore is strict about what the program tracks: every tracked
// object's state must be in the file, with its shapes and dtypes, or nothing is changed
// and the error names the file and the first missing or mismatched tensor. Values in the
// file that nothing tracks are left out and listed here.
class RestoreStatus {
 public:
  RestoreStatus(std::string path, std::vector<std::string> unused)
      : path_(std::move(path)), unused_(std::move(unused)) {}
  const std::string& path() const { return path_; }
  // Entries of the file that no tracked object took.
  const std::vector<std::string>& unused() const { return unused_; }
  // TensorFlow's assert_consumed: throws InvalidArgument naming the entries nothing took.
  const RestoreStatus& assert_consumed() const;
  // TensorFlow's expect_partial: says that entries left out are expected (a no-op here:
  // restore never complains about them unless asked).
  const RestoreStatus& expect_partial() const { return *this; }

 private:
  std::string path_;
  std::vector<std::string> unused_;
};

struct RestoreOptions {
  // Tracked objects whose state the file lacks keep their values instead of failing (to
  // load a weights-only checkpoint into a model and optimizer, say).
  bool partial = false;
};

// The tracked state taken at one step: the tensors and the JSON state (data.metadata
// "dtrain.state"), and their checksums once computed. A copied snapshot lives in one block
// reused from save to save, laid out as the file will hold it, and can be written later,
// on another thread.
using Snapshot = CheckedTensors;

class Checkpoint {
 public:
  Checkpoint(std::initializer_list<std::pair<std::string, Trackable>> objects);
  explicit Checkpoint(std::vector<std::pair<std::string, Trackable>> objects);
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Writes `<prefix>-<n>.safetensors` with n = ++save_counter() and returns its path.
  std::string save(const std::string& prefix);
  // Writes exactly `path` (no counter). Atomic and durable: a crash leaves the previous
  // file or the complete new one.
  std::string write(const std::string& path);
  // Verifies every checksum, then checks every tracked object against the file, then
  // changes them all (or none).
  RestoreStatus restore(const std::string& path, RestoreOptions options = {});
  // The same from a snapshot in memory (snapshot(into) with copy): its checksums, computed
  // as it was copied, are verified first, so memory that changed since is an IoError
  // naming the tensor; `where` names it in messages ("the commit of step 40").
  RestoreStatus restore(const Snapshot& snapshot, const std::string& where, RestoreOptions options = {});
  // Times save() was called; saved and restored with the checkpoint, as in TensorFlow.
  std::int64_t save_counter() const { return save_counter_; }
  void set_save_counter(std::int64_t n) { save_counter_ = n; }

  // The two halves of a save, for saving without stalling training: snapshot() copies the
  // state (on the training thread) into `into`'s block, reused when large enough;
  // write_snapshot() computes the checksums and writes it (on any thread). Without `copy`
  // the snapshot refers to the live tensors (for writing at once, on this thread).
  void snapshot(Snapshot& into, bool copy = true) const;
  static void write_snapshot(Snapshot& snapshot, const std::string& path, bool sync_folder = true);

  // Multi-worker: the strategy of the first tracked model whose strategy has several
  // workers, else null. Under it only the chief (worker 0) writes, and every worker
  // compares the digest of its state with the others' (a mismatch is a PeerFailure).
  StrategyBackend* multi_worker() const;
  // This worker's own state only, as one process's (an elastic job's commits in memory):
  // a snapshot then holds this worker's random streams, not every worker's gathered (which
  // would be a collective), and restores them into this worker whatever the workers are.
  void set_worker_local() { worker_local_ = true; }

 private:
  // The state as it is, referring to the live tensors.
  NamedTensors capture() const;
  // restore's checks and changes, from tensors read and verified from `where`.
  RestoreStatus restore_from(const NamedTensors& data, const std::string& where, RestoreOptions options);
  std::vector<std::pair<std::string, Trackable>> objects_;
  std::int64_t save_counter_ = 0;
  bool worker_local_ = false;
};

// The digest of a snapshot, as every worker computes it (from its checksums, computing any
// it lacks): equal across workers exactly when they hold the same tensors and agreeing JSON
// state (input positions and models' random streams, each worker's own, left out).
std::uint64_t digest_of(Snapshot& snapshot);

// Every worker's digest compared (a collective: every worker calls it at the same point).
// Throws PeerFailure naming the workers whose state differs from the chief's.
void check_same_state_on_every_worker(StrategyBackend& strategy, std::uint64_t digest, const std::string& what);

}  // namespace dtrain::train
