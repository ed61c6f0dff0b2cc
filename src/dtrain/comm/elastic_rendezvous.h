// The membership of an elastic job, agreed through a rendezvous store that outlives the
// workers and removes a dead worker's keys (the TCP store, served by a process that is
// not a worker): numbered rounds, each closed by its first arrival
// once every live member of the round before (and any newcomer) has come, or MAX have.
// It says who the members are and in which order; re-forming the collectives and
// restoring state over them is its users' work, not this file's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/comm/rendezvous_store.h"
#include "dtrain/core/clock.h"

namespace dtrain::comm {

struct ElasticOptions {
  int min_workers = 1;  // a round closes with no fewer
  int max_workers = 1;  // a round closes as soon as this many came
  // How long a round waits to reach min_workers, and for a member of the round before
  // that is still connected but has not come (stopped, not dead); the round then closes
  // without it, or fails below min_workers.
  std::chrono::milliseconds join_timeout = kDefaultTimeout;
  // The first round: once min_workers came, how long it waits for one more before it
  // closes. (A later round closes once every live member of the round before came.)
  std::chrono::milliseconds settle = std::chrono::milliseconds(500);
};

// One round's outcome.
struct Membership {
  std::int64_t round = -1;
  std::vector<std::string> members;  // rank order: the round before's survivors in their order, then newcomers by id
  std::vector<std::int64_t> slots;   // each member's arrival number in the round (its liveness key)
  int rank = -1;                     // this worker's
  int size() const { return static_cast<int>(members.size()); }
  double seconds = 0;  // this worker's time from joining to knowing the members
  // This worker was the round's first arrival, and closed it.
  bool closed_it() const { return rank >= 0 && slots[static_cast<std::size_t>(rank)] == 1; }
};

class ElasticRendezvous {
 public:
  // `id` names this worker ("worker:1"), unique in the job; a worker that starts again
  // comes back under the same id.
  ElasticRendezvous(std::shared_ptr<RendezvousStore> store, std::string id, ElasticOptions options);

  // The first membership of this process: the job's first round, or, where the job runs
  // already, the next one (its members come at their next step boundary, joiner_waiting).
  Membership join();
  // After `current` broke (a member failed): the next round, with whoever is alive.
  Membership next(const Membership& current);
  // Whether a worker arrived for the round after `current` (one request): the members
  // should then meet it there at an agreed step boundary with next().
  bool joiner_waiting(const Membership& current);
  // The members finished training: a worker waiting to join gives up with PeerFailure
  // saying so. (Until then a newcomer waits as long as members of the running round are
  // connected.)
  void end_job();

  const std::string& id() const { return id_; }

 private:
  // Rounds from `number` on, until this worker is a member of one; the time counts from
  // `start`.
  Membership rounds(std::int64_t number, std::optional<Membership> before, Clock::time_point start);
  // The first arrival's part: waits for the others as the options say, writes the members.
  void close(std::int64_t number, const Membership* before);

  std::shared_ptr<RendezvousStore> store_;
  std::string id_;
  ElasticOptions options_;
};

// The store as a round's group sees it: every key under "elastic/<round>/group/", so that
// a group formed over the members of one round (a GlooGroup with their ranks) meets
// nothing of the round before's.
std::shared_ptr<RendezvousStore> round_store(std::shared_ptr<RendezvousStore> store, std::int64_t round);

// The store's keys of a round (internal; tests read them).
namespace elastic_keys {
std::string round(std::int64_t round);                       // "elastic/<round>/": every key of it
std::string arrivals(std::int64_t round);                    // the arrival counter
std::string slot(std::int64_t round, std::int64_t arrival);  // the arrival's id, while it is connected
std::string members(std::int64_t round);                     // "slot id" lines, rank order; "!reason" when it failed
std::string latest();                                        // the last round closed
std::string ended();                                         // set by end_job()
}  // namespace elastic_keys

}  // namespace dtrain::comm
