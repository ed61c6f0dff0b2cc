// The training state kept in memory for an elastic job, as Horovod's State: commit() at a
// step boundary copies every tracked object (a Checkpoint's: model, optimizer, input
// position, counters) into one block reused from commit to commit; after a failure,
// restore() puts the last commit back, so that no work past it is lost and none is applied
// twice. It keeps one commit, in this process's memory; it writes no file. Once the
// workers changed, settle() makes the commit the same on each of them: the latest one
// among them goes from the worker that holds it to those that lack it (a newcomer) or
// hold an older one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

  // What settle() did.
  struct Settled {
    std::int64_t step = -1;              // the commit every member now holds
    int source = 0;                      // the member it came from (the first that held it)
    std::vector<std::string> receivers;  // the members it was sent to (none: all held it)
    bool received = false;               // this member is one of them
    std::size_t bytes = 0;               // sent to each receiver
  };
  // Every member of `workers` calls it at the same point, each with a commit (or one whose
  // last receipt failed part way, which receives): afterwards
  // each holds the latest commit among them (equal steps but another digest than the
  // first member's that has it count as older). Members whose states differ in layout
  // (variables, shapes) fail with InvalidArgument naming the members. `key` names this
  // settle among the round's (each must be new in the round, and the same on every member).
  Settled settle(ElasticMembership& workers, const std::string& key);

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
