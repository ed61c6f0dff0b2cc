// Joining a multi-worker cluster, and the communication thread.
#include "dtrain/distribute/worker_comm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "dtrain/comm/redis_store.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/error.h"
#include "dtrain/core/rng.h"

namespace dtrain::distribute::detail {
namespace {

// The store's keys of an exchange: this, then each worker's rank.
std::string exchange_prefix(const std::string& key) { return "dtrain/exchange/" + key + "/"; }

}  // namespace

std::string token_for(const cluster::ClusterSpec& cluster) {
  if (const char* given = std::getenv("DTRAIN_CLUSTER_TOKEN"); given && *given) return given;
  std::string spec;
  for (const cluster::TaskId& t : cluster.tasks()) spec += t.to_string() + "=" + cluster.address(t).to_string() + ";";
  std::ostringstream o;
  o << "cluster-" << std::hex << fnv1a(spec);
  return o.str();
}

WorkerComm::WorkerComm(WorkerCommOptions options) : options_(std::move(options)) {
  if (options_.elastic) {
    const WorkerCommOptions::Elastic& e = *options_.elastic;
    const cluster::Address at = cluster::parse_address(e.store, "DTRAIN_ELASTIC_STORE");
    store_ = std::make_shared<comm::TcpStore>(at.host, at.port, options_.token, options_.timeout, e.id);
    mesh_store_ = std::make_shared<comm::TcpStore>(at.host, at.port, options_.token, options_.timeout, e.id);
    rendezvous_ = std::make_unique<comm::ElasticRendezvous>(store_, e.id, e.rounds);
    membership_ = rendezvous_->join();
    connect();
    thread_ = std::thread([this] { loop(); });
    return;
  }
  const cluster::TfConfig& config = options_.config;
  const std::vector<cluster::TaskId> training = config.cluster.training_tasks();
  for (std::size_t r = 0; r < training.size(); ++r) {
    tasks_.push_back(training[r].to_string());
    if (training[r] == config.task) rank_ = static_cast<int>(r);
  }
  if (options_.redis.empty())
    if (const char* redis = std::getenv("DTRAIN_REDIS"); redis && *redis) options_.redis = redis;
  const cluster::Address& me = config.cluster.address(config.task);
  if (!options_.redis.empty()) {
    // Redis checks no token, and its keys outlive the job: every key lives under the
    // job's own token, which must therefore be given, and be new for every job.
    const char* token = std::getenv("DTRAIN_CLUSTER_TOKEN");
    if (options_.token.empty() && (!token || !*token))
      DTRAIN_THROW(InvalidArgument, "MultiWorkerMirroredStrategy: rendezvous through Redis (", options_.redis,
                   ") needs DTRAIN_CLUSTER_TOKEN set to a value new for this job (keys in Redis outlive the job); "
                   "`dtrain launch` sets one");
    if (options_.token.empty()) options_.token = token;
    const cluster::Address at = cluster::parse_address(options_.redis, "DTRAIN_REDIS");
    store_ = std::make_shared<comm::RedisStore>(at.host, at.port, options_.timeout, tasks_[static_cast<std::size_t>(rank_)],
                                                "dtrain-job/" + options_.token);
  } else {
    if (options_.token.empty()) options_.token = token_for(config.cluster);
    const cluster::Address& chief = config.cluster.address(training.front());
    if (rank_ == 0) server_ = std::make_unique<comm::TcpStoreServer>(chief.host, chief.port, options_.token);
    store_ = std::make_shared<comm::TcpStore>(chief.host, chief.port, options_.token, options_.timeout,
                                              tasks_[static_cast<std::size_t>(rank_)]);
  }
  comm::GlooGroupOptions g;
  g.rank = rank_;
  g.size = size();
  g.task_names = tasks_;
  g.host = me.host;
  g.timeout = options_.timeout;
  g.check_collectives = options_.check_collectives;
  g.shared_memory = options_.shared_memory;
  group_ = std::make_unique<comm::GlooGroup>(store_, std::move(g));
  thread_ = std::thread([this] { loop(); });
}

void WorkerComm::connect() {
  tasks_ = membership_.members;
  rank_ = membership_.rank;
  round_store_ = comm::round_store(store_, membership_.round);
  comm::GlooGroupOptions g;
  g.rank = rank_;
  g.size = size();
  g.task_names = tasks_;
  g.host = options_.elastic->host;
  g.timeout = options_.timeout;
  g.check_collectives = options_.check_collectives;
  g.shared_memory = options_.shared_memory;
  // A new group forms while the others wait: Gloo's mesh connects alongside the rest.
  g.mesh_store = comm::round_store(mesh_store_, membership_.round);
  group_ = std::make_unique<comm::GlooGroup>(round_store_, std::move(g));
  ++generation_;
}

ElasticMembership::Change WorkerComm::reform(bool after_failure) {
  if (!is_elastic()) DTRAIN_THROW(InternalError, "WorkerComm::reform: not an elastic job");
  {
    // What was submitted over the old connections has run (or been skipped) first.
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return completed_ >= submitted_; });
  }
  const std::vector<std::string> before = tasks_;
  // The others still waiting on this worker in the old group hear at once that it left.
  if (group_ && after_failure) group_->abandon();
  group_.reset();
  Change change;
  Clock::time_point start = Clock::now();
  membership_ = rendezvous_->next(membership_);
  change.agree_seconds = seconds_since(start);
  start = Clock::now();
  connect();
  change.ring_seconds = seconds_since(start);
  {
    std::lock_guard lock(mutex_);
    failure_ = Failure::none;
    failure_message_.clear();
  }
  change.round = membership_.round;
  auto in = [](const std::vector<std::string>& ids, const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (const std::string& id : before)
    if (!in(tasks_, id)) change.left.push_back(id);
  for (const std::string& id : tasks_)
    if (!in(before, id)) change.joined.push_back(id);
  return change;
}

std::optional<std::string> WorkerComm::first_round_value(const std::string& key) {
  const std::shared_ptr<comm::RendezvousStore> first = comm::round_store(store_, 0);
  const std::string name = exchange_prefix(key) + "0";
  if (!first->check({name}, options_.timeout).front()) return std::nullopt;
  const std::vector<char> v = first->get(name);
  return std::string(v.begin(), v.end());
}

void WorkerComm::end_job() {
  if (rank_ == 0) rendezvous_->end_job();
}

bool WorkerComm::newcomer_waiting(double& value) {
  double both[2] = {rank_ == 0 && rendezvous_->joiner_waiting(membership_) ? 1.0 : 0.0, value};
  run([&](comm::GlooGroup& group) { group.allreduce(both, 2); });
  value = both[1] / size();
  return both[0] > 0;
}

void WorkerComm::broadcast(void* data, std::size_t bytes, int root) {
  if (bytes == 0) return;
  // Whole floats in place where the buffer is aligned and its size a multiple of 4 (a
  // snapshot's block is: ElasticState rounds its bytes up within the block).
  if (bytes % sizeof(float) == 0 && reinterpret_cast<std::uintptr_t>(data) % alignof(float) == 0) {
    run([&](comm::GlooGroup& group) { group.broadcast(static_cast<float*>(data), bytes / sizeof(float), root); });
    return;
  }
  std::vector<float> words((bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
  std::memcpy(words.data(), data, bytes);
  run([&](comm::GlooGroup& group) { group.broadcast(words.data(), words.size(), root); });
  std::memcpy(data, words.data(), bytes);
}

WorkerComm::~WorkerComm() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void WorkerComm::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || head_ < queue_.size(); });
    if (head_ == queue_.size()) return;  // stopping, and nothing left to run
    std::function<void(comm::GlooGroup&)> job = std::move(queue_[head_++]);
    if (head_ == queue_.size()) {
      queue_.clear();
      head_ = 0;
    }
    const bool skip = failure_ != Failure::none;
    lock.unlock();
    Failure failure = Failure::none;
    std::string why;
    if (!skip) {
      try {
        // An elastic job whose last change failed has no connections left.
        if (!group_) DTRAIN_THROW(PeerFailure, "the workers are not connected: their last change failed");
        job(*group_);
      } catch (const Timeout& e) {
        failure = Failure::timeout;
        why = e.what();
      } catch (const InvalidArgument& e) {
        failure = Failure::invalid;
        why = e.what();
      } catch (const PeerFailure& e) {
        failure = Failure::peer;
        why = e.what();
      } catch (const std::exception& e) {  // a fault of this process, not of a peer
        failure = Failure::internal;
        why = e.what();
      }
      // The peers waiting on this worker hear of it now, not at their timeout.
      if (failure != Failure::none && group_) group_->abandon();
    }
    job = nullptr;  // its captures are released before anyone is told it ran
    lock.lock();
    if (failure != Failure::none && failure_ == Failure::none) {
      failure_ = failure;
      failure_message_ = std::move(why);
    }
    ++completed_;
    changed_.notify_all();
  }
}

void WorkerComm::submit(std::function<void(comm::GlooGroup&)> fn) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(fn));
    ++submitted_;
  }
  changed_.notify_all();
}

void WorkerComm::wait() {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = submitted_;
  changed_.wait(lock, [&] { return completed_ >= target; });
  switch (failure_) {
    case Failure::none:
      return;
    case Failure::timeout:
      throw Timeout(failure_message_);
    case Failure::invalid:
      throw InvalidArgument(failure_message_);
    case Failure::peer:
      throw PeerFailure(failure_message_);
    case Failure::internal:
      throw InternalError(failure_message_);
  }
}

void WorkerComm::run(std::function<void(comm::GlooGroup&)> fn) {
  submit(std::move(fn));
  wait();
}

std::vector<std::string> WorkerComm::exchange(const std::string& key, const std::string& mine) {
  const std::string prefix = exchange_prefix(key);
  comm::RendezvousStore& store = round_store_ ? *round_store_ : *store_;
  store.set(prefix + std::to_string(rank_), std::vector<char>(mine.begin(), mine.end()));
  const auto deadline = Clock::now() + options_.timeout;
  std::vector<std::string> out(tasks_.size());
  std::string missing;
  for (int r = 0; r < size(); ++r) {
    try {
      store.wait({prefix + std::to_string(r)}, time_left(deadline));
    } catch (const PeerFailure&) {
      throw;  // the chief's store is gone: reported as it is
    } catch (const std::exception&) {  // a timeout
      missing += (missing.empty() ? "" : ", ") + task_name(r);
      continue;
    }
    const std::vector<char> v = store.get(prefix + std::to_string(r));
    out[static_cast<std::size_t>(r)].assign(v.begin(), v.end());
  }
  if (!missing.empty())
    DTRAIN_THROW(Timeout, task_name(rank_), ": waited ", options_.timeout.count() / 1000.0, " s for '", key,
                 "' from every worker; never published: ", missing);
  return out;
}

}  // namespace dtrain::distribute::detail
