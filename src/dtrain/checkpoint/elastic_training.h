// Elastic training in fit(), as Horovod Elastic and TorchElastic users know it: every
// worker commits its state in memory at step boundaries (ElasticState); when a worker dies
// or stops answering, the others meet in a new round, take the latest commit among them,
// reconnect and go on with fewer workers, and a worker that (re)starts joins at the next
// step boundary, receiving the commit from a member. Each global batch keeps its size and
// is split over the workers there are, so the run is the computation a fixed-size run of
// the same membership history makes (up to the order of the gradient sums).
// MultiWorkerMirroredStrategy adds it to every fit of an elastic job; users do not make it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/checkpoint/elastic_state.h"
#include "dtrain/core/clock.h"
#include "dtrain/model/callbacks.h"

namespace dtrain::train {

struct ElasticTrainingOptions {
  // Commit every this many training batches (and at each epoch's end): a failure loses the
  // batches since the last commit, which are trained again. Newcomers are let in at
  // commits. 0: as often as costs at most `commit_share` of the training time (the
  // members agree on the interval at each commit, from what the last commit and the
  // batches before it took), and after every batch where that is cheap enough.
  std::int64_t commit_every = 0;
  double commit_share = 0.05;
  std::ostream* out = nullptr;  // a line per change of the workers, on the first member; null: std::cout
};

class ElasticTraining : public Callback {
 public:
  explicit ElasticTraining(ElasticMembership& workers, ElasticTrainingOptions options = {});
  ~ElasticTraining() override;

  void on_train_begin(const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  bool recover(const std::exception& failure) override;

  // One change of the workers, in its parts (seconds; times are steady-clock readings, as
  // CLOCK_MONOTONIC, comparable between the processes of a host).
  struct Change {
    ElasticMembership::Change workers;  // the round, who left and joined, agreeing and connecting
    std::vector<std::string> members;
    std::string cause;              // the failure's message ("" for a newcomer)
    double noticed_at = 0;          // the failure reached fit (or the newcomer was seen)
    double settle_seconds = 0;      // the latest commit agreed on and sent where lacking
    double restore_seconds = 0;     // put back into the model and optimizer
    double first_step_at = 0;       // the first batch after it ended (0: none yet)
    std::int64_t resumed_after = 0;  // training batches done, as in the commit gone back to
    std::vector<std::string> receivers;  // the members the commit was sent to
    std::size_t bytes_sent = 0;
  };
  const std::vector<Change>& changes() const { return changes_; }
  // Training batches done over the whole fit, as committed (batches redone after a failure
  // count once).
  std::int64_t steps_done() const { return steps_done_; }

 private:
  // After the workers changed: the latest commit everywhere, put back where `restore` (or
  // where it came from another member); records the parts in `change` and says them.
  void settle(Change& change, bool restore);
  void commit();
  // The workers meet again (after a failure, or to let a newcomer in), take the latest
  // commit, and say what it took.
  void change_workers(bool after_failure, std::string cause);
  // At the start and after a change: when to commit next.
  void restart_interval();
  void say(const Change& change) const;

  ElasticMembership& workers_;
  ElasticTrainingOptions options_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<ElasticState> state_;
  FitPosition committing_;               // the position the commit under way records
  std::vector<double> committed_totals_;  // this worker's metric totals at the last commit
  std::int64_t steps_done_ = 0;
  std::int64_t next_commit_ = 1;  // steps_done_ at which the members commit next
  std::int64_t interval_ = 1;     // batches between commits, agreed at each
  Clock::time_point last_commit_end_{};
  BatchesSeen seen_;
  std::vector<Change> changes_;
  std::int64_t settled_round_ = -1, settles_in_round_ = 0;
  bool first_step_pending_ = false;
};

}  // namespace dtrain::train
