// Elastic rounds over a rendezvous store. A round's keys: an arrival counter (the store's
// atomic add hands out arrival numbers 1, 2, ...), one key per arrival holding its id for
// as long as its connection lasts (so a dead worker's key goes, and the closer can tell it
// from a slow one), and the members, written once by arrival 1.
#include "dtrain/comm/elastic_rendezvous.h"

#include <algorithm>
#include <sstream>

#include "dtrain/comm/store_keys.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {

namespace elastic_keys {
std::string arrivals(std::int64_t round) { return "elastic/" + std::to_string(round) + "/arrivals"; }
std::string slot(std::int64_t round, std::int64_t arrival) {
  return "elastic/" + std::to_string(round) + "/slot/" + std::to_string(arrival);
}
std::string members(std::int64_t round) { return "elastic/" + std::to_string(round) + "/members"; }
std::string latest() { return "elastic/latest"; }
}  // namespace elastic_keys

namespace {

using detail::bytes_of;
using detail::string_of;

// "slot id" lines, or "!reason".
Membership parse_members(std::int64_t round, const std::string& text) {
  if (!text.empty() && text.front() == '!') DTRAIN_THROW(Timeout, text.substr(1));
  Membership m;
  m.round = round;
  std::istringstream lines(text);
  std::int64_t slot = 0;
  std::string id;
  while (lines >> slot >> id) {
    m.slots.push_back(slot);
    m.members.push_back(id);
  }
  return m;
}

std::string join_ids(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ", ") + id;
  return out.empty() ? "none" : out;
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<RendezvousStore> store, std::string id, ElasticOptions options)
    : store_(std::move(store)), id_(std::move(id)), options_(options) {
  if (options_.min_workers < 1 || options_.max_workers < options_.min_workers)
    DTRAIN_THROW(InvalidArgument, "elastic: --workers MIN:MAX needs 1 <= MIN <= MAX, got ", options_.min_workers, ":",
                 options_.max_workers);
  if (id_.empty() || id_.find_first_of(" \n") != std::string::npos)
    DTRAIN_THROW(InvalidArgument, "elastic: a worker's id must be one word, got '", id_, "'");
}

Membership ElasticRendezvous::join() {
  if (!store_->check({elastic_keys::latest()}, detail::patience(options_.join_timeout)).front()) return round(0, nullptr);
  const std::int64_t latest = std::stoll(string_of(store_->get(elastic_keys::latest())));
  const Membership running = parse_members(latest, string_of(store_->get(elastic_keys::members(latest))));
  return round(latest + 1, &running);
}

Membership ElasticRendezvous::next(const Membership& current) { return round(current.round + 1, &current); }

bool ElasticRendezvous::joiner_waiting(const Membership& current) {
  return store_->check({elastic_keys::slot(current.round + 1, 1)}, detail::patience(options_.join_timeout)).front();
}

void ElasticRendezvous::close(std::int64_t number, const Membership* before, std::int64_t& requests) {
  const auto deadline = Clock::now() + options_.join_timeout;
  std::vector<std::int64_t> slots{0};  // [0] unused: arrival numbers are 1-based
  std::vector<std::string> ids{""};
  slots.push_back(1);
  ids.push_back(id_);
  auto came = [&](const std::string& id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); };
  // The members of the round before still connected that have not come yet: read once, and
  // again only when a while passed with no arrival (one of them may have died meanwhile).
  auto still_awaited = [&] {
    std::vector<std::string> keys, who, awaited;
    if (!before) return awaited;
    for (std::size_t i = 0; i < before->members.size(); ++i)
      if (!came(before->members[i])) {
        keys.push_back(elastic_keys::slot(before->round, before->slots[i]));
        who.push_back(before->members[i]);
      }
    if (keys.empty()) return awaited;
    const std::vector<bool> alive = store_->check(keys, detail::patience(options_.join_timeout));
    ++requests;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (alive[i]) awaited.push_back(who[i]);
    return awaited;
  };
  std::vector<std::string> awaited = still_awaited();
  for (;;) {
    const int n = static_cast<int>(ids.size()) - 1;
    if (n >= options_.max_workers) break;
    if (before && awaited.empty() && n >= options_.min_workers) break;  // every live member came
    if (Clock::now() >= deadline) {
      if (n >= options_.min_workers) break;  // those awaited are connected but do not come: stopped
      std::vector<std::string> arrived(ids.begin() + 1, ids.end());
      const std::string why = "elastic round " + std::to_string(number) + ": " + std::to_string(n) + " of the at least " +
                              std::to_string(options_.min_workers) + " workers came within " +
                              std::to_string(options_.join_timeout.count() / 1000.0) + " s (came: " +
                              join_ids(arrived) + "; still connected but not come: " + join_ids(awaited) + ")";
      store_->set(elastic_keys::members(number), bytes_of("!" + why));
      ++requests;
      DTRAIN_THROW(Timeout, why);
    }
    // Wait for the next arrival: a settle where enough came and nobody alive is awaited; a
    // short while where someone is, to see again whether it is still connected.
    std::chrono::milliseconds wait = time_left(deadline);
    if (!awaited.empty()) wait = std::min(wait, std::chrono::milliseconds(50));
    else if (n >= options_.min_workers) wait = std::min(wait, options_.settle);
    const std::string next = elastic_keys::slot(number, n + 1);
    bool arrived = false;
    try {
      ++requests;
      store_->wait({next}, std::max(wait, std::chrono::milliseconds(1)));
      arrived = true;
    } catch (const PeerFailure&) {
      throw;
    } catch (const std::exception&) {
      // Nobody came in that while.
    }
    if (!arrived) {
      if (!before && n >= options_.min_workers) break;  // settled
      awaited = still_awaited();
      continue;
    }
    ++requests;
    ids.push_back(string_of(store_->get(next)));
    slots.push_back(n + 1);
    awaited.erase(std::remove(awaited.begin(), awaited.end(), ids.back()), awaited.end());
  }
  // Rank order: the round before's members in their order, then the newcomers as they came.
  std::string text;
  std::vector<bool> placed(ids.size(), false);
  if (before)
    for (const std::string& member : before->members)
      for (std::size_t i = 1; i < ids.size(); ++i)
        if (!placed[i] && ids[i] == member) {
          text += std::to_string(slots[i]) + " " + ids[i] + "\n";
          placed[i] = true;
        }
  for (std::size_t i = 1; i < ids.size(); ++i)
    if (!placed[i]) text += std::to_string(slots[i]) + " " + ids[i] + "\n";
  store_->set(elastic_keys::members(number), bytes_of(text));
  store_->set(elastic_keys::latest(), bytes_of(std::to_string(number)));
  requests += 2;
}

Membership ElasticRendezvous::round(std::int64_t number, const Membership* before) {
  const auto start = Clock::now();
  std::int64_t requests = 0;
  const std::int64_t slot = store_->add(elastic_keys::arrivals(number), 1);
  store_->set_while_connected(elastic_keys::slot(number, slot), bytes_of(id_));
  requests += 2;
  if (slot == 1) close(number, before, requests);
  const std::string key = elastic_keys::members(number);
  try {
    ++requests;
    store_->wait({key}, options_.join_timeout + detail::patience(options_.join_timeout));
  } catch (const PeerFailure&) {
    throw;
  } catch (const std::exception&) {
    // The round's first arrival closes it; where that one is gone, the next round goes on.
    ++requests;
    if (!store_->check({elastic_keys::slot(number, 1)}, detail::patience(options_.join_timeout)).front())
      return round(number + 1, before);
    DTRAIN_THROW(Timeout, "elastic round ", number, ": ", id_, " waited ",
                 (options_.join_timeout + detail::patience(options_.join_timeout)).count() / 1000.0,
                 " s for the members, and its first arrival (still connected) did not close it");
  }
  ++requests;
  Membership m = parse_members(number, string_of(store_->get(key)));
  for (std::size_t i = 0; i < m.members.size(); ++i)
    if (m.members[i] == id_ && m.slots[i] == slot) m.rank = static_cast<int>(i);
  if (m.rank < 0) {
    // Came after the round closed: the members will meet this worker in the next one.
    Membership later = round(number + 1, &m);
    later.requests += requests;
    return later;
  }
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  m.requests = requests;
  m.closed_it = slot == 1;
  return m;
}

}  // namespace dtrain::comm
