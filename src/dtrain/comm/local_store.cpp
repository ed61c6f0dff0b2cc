// The store of ranks that are threads of one process.
#include "dtrain/comm/local_store.h"

#include <string>

#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {

void LocalStore::set(const std::string& key, const std::vector<char>& data) {
  {
    std::lock_guard lock(mutex_);
    values_[key] = data;
  }
  changed_.notify_all();
}

void LocalStore::set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds) {
  set(key, data);
}

std::vector<char> LocalStore::get(const std::string& key) {
  wait({key});
  std::lock_guard lock(mutex_);
  return values_.at(key);
}

void LocalStore::wait(const std::vector<std::string>& keys) { wait(keys, kDefaultTimeout); }

void LocalStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::unique_lock lock(mutex_);
  auto all_there = [&] {
    for (const std::string& k : keys)
      if (!values_.contains(k)) return false;
    return true;
  };
  if (changed_.wait_for(lock, timeout, all_there)) return;
  std::string missing;
  for (const std::string& k : keys)
    if (!values_.contains(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
  DTRAIN_THROW(Timeout, name_, ": waited ", std::chrono::duration<double>(timeout).count(), " s for ", missing);
}

std::vector<bool> LocalStore::check(const std::vector<std::string>& keys, std::chrono::milliseconds) {
  std::lock_guard lock(mutex_);
  std::vector<bool> present;
  for (const std::string& k : keys) present.push_back(values_.contains(k));
  return present;
}

bool LocalStore::set_while_connected(const std::string& key, const std::vector<char>& data) {
  set(key, data);
  return true;  // the ranks are this process's threads: they end with it
}

std::int64_t LocalStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t sum = 0;
  {
    std::lock_guard lock(mutex_);
    std::vector<char>& v = values_[key];
    if (!v.empty()) sum = std::stoll(std::string(v.begin(), v.end()));
    sum += delta;
    const std::string text = std::to_string(sum);
    v.assign(text.begin(), text.end());
  }
  changed_.notify_all();
  return sum;
}

}  // namespace dtrain::comm
