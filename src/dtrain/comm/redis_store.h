// A rendezvous store kept in a Redis server, for jobs whose processes meet there instead
// of at the chief's TcpStore. Gloo's own RedisStore connects and waits for replies with
// no deadline (a server that accepts and never answers holds a process forever); this
// one bounds the connection, every command and every wait. It is not a general Redis
// client: set, get, wait and check of string keys, nothing else. Redis cannot tie a key
// to a connection: set_while_connected() is a plain set.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/comm/rendezvous_store.h"

struct redisContext;
struct redisReply;

namespace dtrain::comm {

class RedisStore final : public RendezvousStore {
 public:
  // Connects within `timeout`; a refused connection is an IoError at once (the server
  // must already run), no answer a Timeout. Every command's reply may then take the
  // patience (half the timeout, at most 10 s); a wait, its own wait on top. The errors
  // name `who` (this task, "worker:1"; may be empty), the server and the operation.
  // Every key is kept in Redis as "PREFIX/key" (as Gloo's PrefixStore names them), or as
  // it is where `prefix` is empty.
  RedisStore(const std::string& host, int port, std::chrono::milliseconds timeout, std::string who = {},
             std::string prefix = {});
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the timeout for the key.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // Timeout naming the keys still missing after `timeout`.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // Which of `keys` are set now, the reply within the patience (or `limit`).
  std::vector<bool> check(const std::vector<std::string>& keys);
  std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) override;
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) override;
  bool set_while_connected(const std::string& key, const std::vector<char>& data) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;  // INCRBY

 private:
  // The reply to one command (freed by the caller), within `limit`; throws Timeout when
  // the server does not answer in time, PeerFailure when the connection broke, IoError
  // for Redis's errors.
  redisReply* command(const std::vector<std::string>& args, std::chrono::milliseconds limit);
  std::string stored(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "/" + key; }

  std::string where_;  // "redis server host:port", for messages
  std::string who_;    // "worker:1: " or empty, starting messages
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  redisContext* redis_ = nullptr;
  bool broken_ = false;  // after a failed command the connection is not used again
  std::mutex mutex_;
};

}  // namespace dtrain::comm
