// The rendezvous store in Redis, with a deadline on every wait.
#include "dtrain/comm/redis_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <optional>
#include <cerrno>
#include <cstring>
#include <thread>

#include "dtrain/comm/socket.h"
#include "dtrain/comm/store_keys.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using detail::timeval_of;

// hiredis reports a socket timeout as an I/O error whose text is strerror's.
bool timed_out(const redisContext* c) {
#ifdef REDIS_ERR_TIMEOUT
  if (c->err == REDIS_ERR_TIMEOUT) return true;
#endif
  return c->err == REDIS_ERR_IO &&
         (std::strcmp(c->errstr, std::strerror(EAGAIN)) == 0 || std::strcmp(c->errstr, std::strerror(ETIMEDOUT)) == 0);
}

}  // namespace

RedisStore::RedisStore(const std::string& host, int port, std::chrono::milliseconds timeout, std::string who,
                       std::string prefix)
    : where_("redis server " + host + ":" + std::to_string(port)),
      who_(who.empty() ? "" : who + ": "),
      prefix_(std::move(prefix)),
      timeout_(timeout) {
  redis_ = redisConnectWithTimeout(host.c_str(), port, timeval_of(timeout));
  if (redis_ == nullptr) DTRAIN_THROW(IoError, who_, where_, ": cannot allocate a connection");
  if (redis_->err) {
    const std::string why = redis_->errstr;
    const bool late = timed_out(redis_);
    redisFree(redis_);
    redis_ = nullptr;
    if (late)
      DTRAIN_THROW(Timeout, who_, where_, " could not be reached within ", timeout.count() / 1000.0,
                   " s (connect: no answer)");
    DTRAIN_THROW(IoError, who_, "cannot reach the ", where_, ": ", why);
  }
}

RedisStore::~RedisStore() {
  if (redis_) redisFree(redis_);
}

redisReply* RedisStore::command(const std::vector<std::string>& args, std::chrono::milliseconds limit) {
  std::lock_guard lock(mutex_);
  const std::string& op = args.front();
  if (broken_) DTRAIN_THROW(PeerFailure, who_, where_, ": the connection failed earlier (", op, ")");
  limit = std::max(limit, std::chrono::milliseconds(1));
  if (redisSetTimeout(redis_, timeval_of(limit)) != REDIS_OK)
    DTRAIN_THROW(IoError, who_, where_, ": cannot set the connection's timeout (", op, ")");
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(
      redisCommandArgv(redis_, static_cast<int>(argv.size()), argv.data(), lengths.data()));
  if (reply == nullptr) {
    // hiredis leaves the connection unusable after an error.
    broken_ = true;
    if (timed_out(redis_))
      DTRAIN_THROW(Timeout, who_, where_, " did not answer ", op, " within ", limit.count() / 1000.0, " s");
    DTRAIN_THROW(PeerFailure, who_, where_, ": ", op, " failed: ", redis_->errstr);
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string why(reply->str, reply->len);
    freeReplyObject(reply);
    DTRAIN_THROW(IoError, who_, where_, ": ", op, ": ", why);
  }
  return reply;
}

void RedisStore::set(const std::string& key, const std::vector<char>& data) {
  set(key, data, detail::patience(timeout_));
}

void RedisStore::set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) {
  freeReplyObject(command({"SET", stored(key), std::string(data.begin(), data.end())}, limit));
}

bool RedisStore::set_while_connected(const std::string& key, const std::vector<char>& data) {
  set(key, data);
  return false;
}

std::int64_t RedisStore::add(const std::string& key, std::int64_t delta) {
  redisReply* reply = command({"INCRBY", stored(key), std::to_string(delta)}, detail::patience(timeout_));
  const std::optional<std::int64_t> sum =
      reply->type == REDIS_REPLY_INTEGER ? std::optional<std::int64_t>(reply->integer) : std::nullopt;
  freeReplyObject(reply);
  if (!sum) DTRAIN_THROW(IoError, who_, where_, ": INCRBY of '", key, "' did not answer a number");
  return *sum;
}

std::vector<char> RedisStore::get(const std::string& key) {
  wait({key}, timeout_);
  redisReply* reply = command({"GET", stored(key)}, detail::patience(timeout_));
  std::vector<char> value;
  if (reply->type == REDIS_REPLY_STRING) value.assign(reply->str, reply->str + reply->len);
  const bool found = reply->type == REDIS_REPLY_STRING;
  freeReplyObject(reply);
  if (!found) DTRAIN_THROW(IoError, who_, where_, ": key '", key, "' vanished after it was set");
  return value;
}

std::vector<bool> RedisStore::check(const std::vector<std::string>& keys) {
  return check(keys, detail::patience(timeout_));
}

std::vector<bool> RedisStore::check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) {
  // EXISTS counts the keys found without saying which; MGET answers for each (the values
  // of a rendezvous are short: names, addresses).
  std::vector<std::string> args{"MGET"};
  for (const std::string& k : keys) args.push_back(stored(k));
  redisReply* reply = command(args, limit);
  std::vector<bool> present(keys.size(), false);
  if (reply->type == REDIS_REPLY_ARRAY)
    for (std::size_t i = 0; i < keys.size() && i < reply->elements; ++i)
      present[i] = reply->element[i]->type != REDIS_REPLY_NIL;
  freeReplyObject(reply);
  return present;
}

void RedisStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Redis has no blocking wait for a key: ask every 10 ms until the deadline.
  const auto deadline = Clock::now() + timeout;
  for (std::vector<bool> present = check(keys); std::find(present.begin(), present.end(), false) != present.end();
       present = check(keys)) {
    if (Clock::now() >= deadline) {
      std::string missing;
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (!present[i]) missing += (missing.empty() ? "" : ", ") + keys[i];
      DTRAIN_THROW(Timeout, who_, where_, ": still missing after ", timeout.count() / 1000.0, " s: ", missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10, milliseconds_left(deadline) + 1)));
  }
}

}  // namespace dtrain::comm
