// The cross-process side of MultiWorkerMirroredStrategy: where this process stands in
// the cluster (TF_CONFIG), the rendezvous store the chief serves on its own address, the
// Gloo group, and the communication thread. Every collective between workers runs on
// that one thread, in the order it was submitted, so that every worker issues the same
// collectives in the same order while its replicas go on computing.
// Internal to the distribute layer; users see MultiWorkerMirroredStrategy.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <optional>

#include "dtrain/cluster/tf_config.h"
#include "dtrain/comm/elastic_rendezvous.h"
#include "dtrain/comm/gloo_group.h"
#include "dtrain/core/clock.h"
#include "dtrain/model/strategy_backend.h"

namespace dtrain::comm {
class RendezvousStore;
class TcpStoreServer;
}  // namespace dtrain::comm

namespace dtrain::distribute::detail {

// DTRAIN_CLUSTER_TOKEN, else a token derived from the cluster's addresses: it keeps out
// processes of another job that reach the same port; it is not a secret.
std::string token_for(const cluster::ClusterSpec& cluster);

struct WorkerCommOptions {
  cluster::TfConfig config;
  // Joining processes must present it; empty: DTRAIN_CLUSTER_TOKEN, else one derived
  // from the cluster spec.
  std::string token;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  bool check_collectives = false;  // compare every collective's fingerprint first
  // "host:port" of a Redis server to meet through instead of the chief's store; empty:
  // DTRAIN_REDIS, else the chief's store.
  std::string redis;
  // Workers that all share this host sum through shared memory (false: always TCP).
  bool shared_memory = true;
  // An elastic job (`dtrain launch --workers MIN:MAX`): the workers meet in rounds through
  // a store the launcher serves, not the chief's; `config` is not read.
  struct Elastic {
    std::string store;  // "host:port"
    std::string id;     // this worker's, "worker:2"
    comm::ElasticOptions rounds;
    std::string host = "127.0.0.1";  // where the others reach this process
    std::int64_t commit_every = 0;   // training batches between commits in fit (0: by cost)
    bool keep_worker_batch = false;  // ElasticMembership::keeps_worker_batch
  };
  std::optional<Elastic> elastic;
};

class WorkerComm final : public ElasticMembership {
 public:
  // Joins the cluster: the chief serves the store, everyone meets there and connects.
  // The task must be the chief or a worker (MultiWorkerMirroredStrategy checks it). An
  // elastic worker joins the job's first round, or where the job runs already, the next.
  explicit WorkerComm(WorkerCommOptions options);
  ~WorkerComm() override;
  WorkerComm(const WorkerComm&) = delete;
  WorkerComm& operator=(const WorkerComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(tasks_.size()); }
  const std::string& task_name(int rank) const { return tasks_[static_cast<std::size_t>(rank)]; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // The rendezvous store the workers met through (an NCCL group meets there too).
  std::shared_ptr<comm::RendezvousStore> store() const { return store_; }
  // How the gradient all-reduces travel (GlooGroup::transport).
  const std::string& transport() const { return group_->transport(); }
  bool shares_memory() const { return group_->shares_memory(); }

  // Runs fn(group) on the communication thread after everything submitted before it, and
  // returns at once. Once a job failed, later jobs are skipped.
  void submit(std::function<void(comm::GlooGroup&)> fn);
  // Waits until everything submitted so far has run; throws the first failure (Timeout,
  // PeerFailure, InvalidArgument as raised; anything else as InternalError), and so does
  // every later call.
  void wait();
  // submit(fn) then wait().
  void run(std::function<void(comm::GlooGroup&)> fn);

  // Values every worker publishes under `key` (one per worker, rank order), through the
  // rendezvous store; waits at most the timeout, naming the workers that never published.
  // Keys must be unique per exchange (in an elastic job, per round).
  std::vector<std::string> exchange(const std::string& key, const std::string& mine) override;

  // ElasticMembership, for an elastic job (is_elastic()).
  bool is_elastic() const { return options_.elastic.has_value(); }
  const WorkerCommOptions::Elastic& elastic_options() const { return *options_.elastic; }
  const std::string& id() const override { return options_.elastic->id; }
  std::int64_t round() const override { return membership_.round; }
  const std::vector<std::string>& members() const override { return tasks_; }
  Change reform(bool after_failure) override;
  bool newcomer_waiting(double& value) override;
  void end_job() override;
  bool keeps_worker_batch() const override { return options_.elastic->keep_worker_batch; }
  int max_workers() const override { return options_.elastic->rounds.max_workers; }
  void broadcast(void* data, std::size_t bytes, int root) override;
  // Changes with every reform().
  std::uint64_t generation() const { return generation_; }
  // Elastic: what the first round's first member published under `key` with exchange(),
  // for a worker that joins later; nothing where it published none.
  std::optional<std::string> first_round_value(const std::string& key);

 private:
  void loop();
  // The Gloo group over this round's members.
  void connect();

  WorkerCommOptions options_;
  std::vector<std::string> tasks_;  // [rank] "chief:0", "worker:1"
  int rank_ = 0;
  std::unique_ptr<comm::TcpStoreServer> server_;  // the chief's
  std::shared_ptr<comm::RendezvousStore> store_;  // the chief's, or a Redis server's, or the launcher's
  std::unique_ptr<comm::GlooGroup> group_;
  // Elastic: the rounds, the current one, and the store as its group sees it.
  std::unique_ptr<comm::ElasticRendezvous> rendezvous_;
  comm::Membership membership_;
  std::shared_ptr<comm::RendezvousStore> round_store_;
  std::shared_ptr<comm::RendezvousStore> mesh_store_;  // a second connection, for Gloo's mesh (GlooGroupOptions)
  std::uint64_t generation_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  // Jobs waiting, from queue_[head_]; emptied (keeping its capacity) once all have run,
  // so a training step's job allocates nothing.
  std::vector<std::function<void(comm::GlooGroup&)>> queue_;
  std::size_t head_ = 0;
  std::uint64_t submitted_ = 0, completed_ = 0;
  bool stop_ = false;
  enum class Failure { none, timeout, peer, invalid, internal };
  Failure failure_ = Failure::none;
  std::string failure_message_;
  std::thread thread_;
};

}  // namespace dtrain::distribute::detail
