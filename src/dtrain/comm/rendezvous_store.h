// What dtrain asks of a rendezvous store beyond Gloo's Store (TcpStore and RedisStore
// give it): requests with a bound of the caller's, one flag per key for a check, keys
// that last only as long as their process, and an atomic add. The roll call after a failed collective needs
// all three. An interface only; no store of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace dtrain::comm {

class RendezvousStore : public gloo::rendezvous::Store {
 public:
  using gloo::rendezvous::Store::set;

  // set(), the store's reply within `limit` (Timeout otherwise).
  virtual void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) = 0;
  // Which of `keys` are set now, one flag per key, waiting for none of them; the reply
  // within `limit` (Timeout otherwise).
  virtual std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) = 0;
  // Sets `key` for as long as this process's connection lasts, where the store can tell:
  // true then (the key goes when the process ends, so that the others can tell a dead
  // process from a slow one); elsewhere a plain set, and false.
  virtual bool set_while_connected(const std::string& key, const std::vector<char>& data) = 0;
  // Adds `delta` to the decimal number under `key` (0 where unset) and returns the sum, as
  // one step no other request interleaves with: arrival numbers for an elastic round.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

}  // namespace dtrain::comm
