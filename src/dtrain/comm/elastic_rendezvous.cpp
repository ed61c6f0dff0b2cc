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
std::string round(std::int64_t round) { return "elastic/" + std::to_string(round) + "/"; }
std::string arrivals(std::int64_t number) { return round(number) + "arrivals"; }
std::string slot(std::int64_t number, std::int64_t arrival) { return round(number) + "slot/" + std::to_string(arrival); }
std::string members(std::int64_t number) { return round(number) + "members"; }
std::string latest() { return "elastic/latest"; }
std::string ended() { return "elastic/ended"; }
}  // namespace elastic_keys

namespace {

// Every request's keys under one prefix.
class PrefixedStore final : public RendezvousStore {
 public:
  PrefixedStore(std::shared_ptr<RendezvousStore> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_->set(prefix_ + key, data); }
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) override {
    store_->set(prefix_ + key, data, limit);
  }
  std::vector<char> get(const std::string& key) override { return store_->get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { store_->wait(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(prefixed(keys), timeout);
  }
  std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) override {
    return store_->check(prefixed(keys), limit);
  }
  bool set_while_connected(const std::string& key, const std::vector<char>& data) override {
    return store_->set_while_connected(prefix_ + key, data);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return store_->add(prefix_ + key, delta); }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<RendezvousStore> store_;
  std::string prefix_;
};

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

std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000.0;
  return out.str();
}

std::string join_ids(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ", ") + id;
  return out.empty() ? "none" : out;
}

}  // namespace

std::shared_ptr<RendezvousStore> round_store(std::shared_ptr<RendezvousStore> store, std::int64_t round) {
  return std::make_shared<PrefixedStore>(std::move(store), elastic_keys::round(round) + "group/");
}

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<RendezvousStore> store, std::string id, ElasticOptions options)
    : store_(std::move(store)), id_(std::move(id)), options_(options) {
  if (options_.min_workers < 1 || options_.max_workers < options_.min_workers)
    DTRAIN_THROW(InvalidArgument, "elastic: --workers MIN:MAX needs 1 <= MIN <= MAX, got ", options_.min_workers, ":",
                 options_.max_workers);
  if (id_.empty() || id_.find_first_of(" \n") != std::string::npos)
    DTRAIN_THROW(InvalidArgument, "elastic: a worker's id must be one word, got '", id_, "'");
  // A dead worker is told from a slow one by its keys going with its connection.
  if (!store_->set_while_connected("elastic/connected/" + id_, bytes_of("1")))
    DTRAIN_THROW(InvalidArgument, "elastic: ", id_,
                 ": the rendezvous store cannot remove a dead worker's keys (Redis cannot; the TCP store can), so "
                 "the members could not tell who is gone");
}

Membership ElasticRendezvous::join() {
  const auto start = Clock::now();
  if (!store_->check({elastic_keys::latest()}, detail::patience(options_.join_timeout)).front())
    return rounds(0, std::nullopt, start);
  const std::int64_t latest = std::stoll(string_of(store_->get(elastic_keys::latest())));
  Membership running = parse_members(latest, string_of(store_->get(elastic_keys::members(latest))));
  return rounds(latest + 1, std::move(running), start);
}

Membership ElasticRendezvous::next(const Membership& current) {
  return rounds(current.round + 1, current, Clock::now());
}

void ElasticRendezvous::end_job() { store_->set(elastic_keys::ended(), bytes_of("1")); }

bool ElasticRendezvous::joiner_waiting(const Membership& current) {
  return store_->check({elastic_keys::arrivals(current.round + 1)}, detail::patience(options_.join_timeout)).front();
}

void ElasticRendezvous::close(std::int64_t number, const Membership* before) {
  auto deadline = Clock::now() + options_.join_timeout;
  const auto patience = detail::patience(options_.join_timeout);
  std::vector<std::int64_t> slots{1};
  std::vector<std::string> ids{id_};
  std::int64_t counted = 1;          // arrival numbers handed out so far, as last seen
  std::vector<std::int64_t> unread;  // numbers taken whose ids were not there yet (dead, or about to write)
  auto came = [&](const std::string& id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); };
  auto arrive = [&](std::int64_t slot, const std::string& id) {
    slots.push_back(slot);
    ids.push_back(id);
  };
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
    const std::vector<bool> alive = store_->check(keys, patience);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (alive[i]) awaited.push_back(who[i]);
    return awaited;
  };
  std::vector<std::string> awaited = still_awaited();
  for (;;) {
    const int n = static_cast<int>(ids.size());
    if (n >= options_.max_workers) break;
    if (before && awaited.empty() && n >= options_.min_workers) break;  // every live member came
    if (Clock::now() >= deadline) {
      // Those awaited are connected but do not come (stopped): the round goes on without
      // them, unless none of the round before came, when they are running on without
      // having seen this round (a newcomer must not form a job of its own beside theirs).
      const bool members_came = !before || std::any_of(before->members.begin(), before->members.end(), came);
      // A newcomer waits for running members as long as they run: they look for it only
      // at their commits, which may be far apart; it gives up once the job ended.
      if (before && !members_came && !awaited.empty()) {
        if (store_->check({elastic_keys::ended()}, patience).front())
          DTRAIN_THROW(PeerFailure, "elastic: the job's members finished before ", id_, " could join them (it waited ",
                       "for round ", number, "); nothing is left for it to do");
        deadline = Clock::now() + options_.join_timeout;
        awaited = still_awaited();
        continue;
      }
      if (n >= options_.min_workers && (members_came || awaited.empty())) break;
      const std::string why =
          "elastic round " + std::to_string(number) + ": " + std::to_string(n) + " worker(s) came within " +
          seconds_text(options_.join_timeout) + " s, of the at least " +
          std::to_string(options_.min_workers) + " needed (came: " + join_ids(ids) +
          "; still connected but not come: " + join_ids(awaited) + ")" +
          (members_came ? "" : "; none of the running members came to meet this one");
      store_->set(elastic_keys::members(number), bytes_of("!" + why));
      DTRAIN_THROW(Timeout, why);
    }
    // Wait for the next arrival: a settle where enough came and nobody alive is awaited; a
    // short while where someone is, to look again.
    std::chrono::milliseconds wait = time_left(deadline);
    if (!awaited.empty() || !unread.empty()) wait = std::min(wait, std::chrono::milliseconds(50));
    else if (n >= options_.min_workers) wait = std::min(wait, options_.settle);
    const std::string next = elastic_keys::slot(number, counted + 1);
    const bool arrived = detail::arrived(*store_, {next}, std::max(wait, std::chrono::milliseconds(1)));
    if (arrived) {
      arrive(++counted, string_of(store_->get(next)));
      awaited.erase(std::remove(awaited.begin(), awaited.end(), ids.back()), awaited.end());
      continue;
    }
    // A while with no arrival under the next number: numbers taken by workers that died
    // before writing their ids (or are about to write them) must not hide those after.
    const std::size_t had = ids.size();
    const std::int64_t handed = store_->add(elastic_keys::arrivals(number), 0);
    for (std::int64_t k = counted + 1; k <= handed; ++k) unread.push_back(k);
    counted = std::max(counted, handed);
    if (!unread.empty()) {
      std::vector<std::string> keys;
      for (std::int64_t k : unread) keys.push_back(elastic_keys::slot(number, k));
      const std::vector<bool> present = store_->check(keys, patience);
      std::vector<std::int64_t> missing;
      for (std::size_t i = 0; i < unread.size(); ++i) {
        if (!present[i]) {
          missing.push_back(unread[i]);
          continue;
        }
        arrive(unread[i], string_of(store_->get(keys[i])));
      }
      unread = std::move(missing);
    }
    if (!before && n >= options_.min_workers && ids.size() == had) break;  // settled
    awaited = still_awaited();
  }
  // Rank order: the round before's members in their order, then the newcomers.
  std::string text;
  std::vector<bool> placed(ids.size(), false);
  if (before)
    for (const std::string& member : before->members)
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (!placed[i] && ids[i] == member) {
          text += std::to_string(slots[i]) + " " + ids[i] + "\n";
          placed[i] = true;
        }
  // Newcomers in the order of their ids ("worker:2" before "worker:10"), not of their
  // arrival: the first round's ranks are the launcher's task numbers.
  std::vector<std::size_t> newcomers;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (!placed[i]) newcomers.push_back(i);
  std::sort(newcomers.begin(), newcomers.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(ids[a].size(), ids[a]) < std::pair(ids[b].size(), ids[b]);
  });
  for (std::size_t i : newcomers) text += std::to_string(slots[i]) + " " + ids[i] + "\n";
  store_->set(elastic_keys::members(number), bytes_of(text));
  store_->set(elastic_keys::latest(), bytes_of(std::to_string(number)));
}

Membership ElasticRendezvous::rounds(std::int64_t number, std::optional<Membership> before,
                                     Clock::time_point start) {
  const auto patience = detail::patience(options_.join_timeout);
  for (;; ++number) {
    const std::int64_t slot = store_->add(elastic_keys::arrivals(number), 1);
    store_->set_while_connected(elastic_keys::slot(number, slot), bytes_of(id_));
    if (slot == 1) close(number, before ? &*before : nullptr);
    // The members, waited for in slices: where the round's first arrival died before it
    // closed the round, the next round goes on at once.
    const std::string key = elastic_keys::members(number);
    const auto deadline = Clock::now() + options_.join_timeout + patience;
    bool closer_gone = false;
    while (!detail::arrived(*store_, {key}, std::min(time_left(deadline), std::chrono::milliseconds(250)))) {
      const std::vector<bool> seen = store_->check({elastic_keys::slot(number, 1), elastic_keys::ended()}, patience);
      if (seen[1])
        DTRAIN_THROW(PeerFailure, "elastic: the job's members finished before ", id_,
                     " could join them (it waited for round ", number, "); nothing is left for it to do");
      closer_gone = !seen[0];
      if (closer_gone) break;
      if (Clock::now() >= deadline)
        DTRAIN_THROW(Timeout, "elastic round ", number, ": ", id_, " waited ",
                     (options_.join_timeout + patience).count() / 1000.0,
                     " s for the members, and its first arrival (still connected) did not close it");
    }
    if (closer_gone) continue;
    Membership m = parse_members(number, string_of(store_->get(key)));
    for (std::size_t i = 0; i < m.members.size(); ++i)
      if (m.members[i] == id_ && m.slots[i] == slot) m.rank = static_cast<int>(i);
    if (m.rank >= 0) {
      m.seconds = seconds_since(start);
      return m;
    }
    before = std::move(m);  // came after the round closed: the members meet this worker in the next
  }
}

}  // namespace dtrain::comm
