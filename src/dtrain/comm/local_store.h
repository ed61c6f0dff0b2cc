// A rendezvous store inside one process: the keys of ranks that are threads of this
// process (MirroredStrategy's replicas as the ranks of one NCCL communicator). Every wait
// is bounded by its caller's limit; a key set while connected lasts as long as the store.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "dtrain/comm/rendezvous_store.h"

namespace dtrain::comm {

class LocalStore final : public RendezvousStore {
 public:
  // `name` is what a Timeout calls the store ("the replicas' store").
  explicit LocalStore(std::string name) : name_(std::move(name)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) override;
  // Waits for the key as long as kDefaultTimeout (gloo's contract has no limit of its own).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) override;
  bool set_while_connected(const std::string& key, const std::vector<char>& data) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;

 private:
  std::string name_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
};

}  // namespace dtrain::comm
