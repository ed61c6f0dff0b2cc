// The training state kept in memory for an elastic job, as Horovod's State: commit() at a
// step boundary copies every tracked object (a Checkpoint's: model, optimizer, input
// position, counters) into one block reused from commit to commit; after a failure,
// restore() puts the last commit back, so that no work past it is lost and none is applied
// twice. It keeps one commit, in this process's memory; it writes no file.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtrain/checkpoint/checkpoint.h"

namespace dtrain::train {

class ElasticState {
 public:
  // `checkpoint` names what is committed; it must outlive this.
  explicit ElasticState(Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  // Copies the state as it is now, the state after `step` steps, checksumming as it copies.
  void commit(std::int64_t step);
  // Puts the last commit back into every tracked object (all or none), after verifying
  // its checksums; returns the step it was taken after. InvalidArgument without a commit.
  std::int64_t restore();

  bool committed() const { return step_ >= 0; }
  std::int64_t committed_step() const { return step_; }
  // The commit's digest, equal on workers holding the same state (digest_of), to check
  // that the members of a new round agree before they go on.
  std::uint64_t digest() { return digest_of(snapshot_); }
  std::size_t bytes() const;

 private:
  Checkpoint& checkpoint_;
  Snapshot snapshot_;
  std::int64_t step_ = -1;
};

}  // namespace dtrain::train
