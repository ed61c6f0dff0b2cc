// The rendezvous store of a multi-process job: a small key-value service that one task
// (the chief) serves on its own address, so that processes on different hosts meet
// without a shared filesystem. It is Gloo's Store, so Gloo's full-mesh connection runs
// over it. A cluster token, checked when a process connects, keeps stray processes out.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/comm/rendezvous_store.h"

namespace dtrain::comm {

// Serves the store on host:port (port 0: any free port) until destroyed.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }
  // The requests served so far, every connection's (their hellos left out): the messages a
  // protocol over the store needs.
  std::uint64_t requests() const { return requests_.load(); }

 private:
  void accept_loop();
  void serve(int fd);

  std::string token_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> requests_{0};
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
  std::vector<int> clients_;           // open connections, shut down on destruction
  std::vector<std::thread> threads_;   // one per connection
  std::thread acceptor_;
};

// A connection to a TcpStoreServer.
class TcpStore final : public RendezvousStore {
 public:
  // Retries until `timeout` (the server may start later); each connect is bounded by the
  // time left. Every request waits at most its own wait plus the timeout for the reply.
  // The errors name `who` (this task, "worker:1"; may be empty), the address, that the
  // chief serves it, and the operation.
  TcpStore(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout,
           std::string who = {});
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Set until this connection closes (this process ends): the server then removes the
  // key, so the others can tell a dead process from a slow one. Always true.
  bool set_while_connected(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the store's timeout for the key.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // Which of `keys` are set now (no waiting), the reply within the patience.
  std::vector<bool> check(const std::vector<std::string>& keys);
  // set() and check() waiting at most `limit` for the reply instead: for the roll call
  // after a failure, which has a bound of its own.
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) override;
  std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;

 private:
  // {found, value}; throws when the connection breaks or the token is refused, Timeout
  // when no reply came within `limit` (negative: the request's wait plus the timeout).
  std::pair<bool, std::vector<char>> request(char op, const std::vector<std::string>& fields,
                                             std::chrono::milliseconds wait,
                                             std::chrono::milliseconds limit = std::chrono::milliseconds(-1));

  std::string where_;  // "host:port", for messages
  std::string who_;    // "worker:1: " or empty, starting messages
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
};

}  // namespace dtrain::comm
