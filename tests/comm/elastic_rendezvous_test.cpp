// Elastic rounds over the TCP store, threads standing in for worker processes, each with
// its own connection (closing it is a worker's death: its keys go). The last test plays
// the protocol at 1,000 workers and prints the time and the messages each round took.
#include "dtrain/comm/elastic_rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <future>
#include <memory>
#include <thread>

#include "common/error_message.h"
#include "dtrain/comm/gloo_group.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using std::chrono::milliseconds;

class Elastic : public ::testing::Test {
 protected:
  TcpStoreServer server_{"127.0.0.1", 0, "elastic"};

  std::shared_ptr<TcpStore> connect(const std::string& who) {
    return std::make_shared<TcpStore>("127.0.0.1", server_.port(), "elastic", std::chrono::seconds(20), who);
  }
  ElasticOptions options(int min, int max, milliseconds timeout = std::chrono::seconds(20)) {
    ElasticOptions o;
    o.min_workers = min;
    o.max_workers = max;
    o.join_timeout = timeout;
    o.settle = milliseconds(200);
    return o;
  }
};

// Waits, at most 20 s, until `member` sees a worker waiting for the round after `current`.
bool sees_joiner(ElasticRendezvous& member, const Membership& current) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!member.joiner_waiting(current))
    if (std::chrono::steady_clock::now() > deadline) return false;
  return true;
}

// Each worker's membership from one call on its own thread.
template <typename Call>
std::vector<Membership> all(std::vector<ElasticRendezvous*> workers, Call call) {
  std::vector<std::future<Membership>> futures;
  for (ElasticRendezvous* w : workers) futures.push_back(std::async(std::launch::async, [w, &call] { return call(*w); }));
  std::vector<Membership> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// The store's atomic add: every one of 8 threads' 100 additions counted once.
TEST_F(Elastic, TheStoresAddIsOneStep) {
  std::vector<std::future<void>> adders;
  for (int t = 0; t < 8; ++t)
    adders.push_back(std::async(std::launch::async, [&, t] {
      auto store = connect("adder:" + std::to_string(t));
      for (int i = 0; i < 100; ++i) store->add("count", 1);
    }));
  for (auto& a : adders) a.get();
  EXPECT_EQ(connect("reader")->add("count", 0), 800);
}

// Three form a round; one dies; the two left agree at once, in their order; a newcomer
// is seen waiting and joins the round after, ranked last.
TEST_F(Elastic, SurvivorsAgreeWithoutTheDeadAndANewcomerJoinsTheNextRound) {
  auto a_store = connect("worker:0"), b_store = connect("worker:1");
  auto c_store = std::make_unique<std::shared_ptr<TcpStore>>(connect("worker:2"));
  // The first round waits for all three (MIN = MAX: no settle to race); the later ones go
  // on with two.
  ElasticRendezvous a0(a_store, "worker:0", options(3, 3)), b0(b_store, "worker:1", options(3, 3));
  ElasticRendezvous a(a_store, "worker:0", options(2, 3)), b(b_store, "worker:1", options(2, 3));
  auto c = std::make_unique<ElasticRendezvous>(*c_store, "worker:2", options(3, 3));
  std::vector<Membership> first = all({&a0, &b0, c.get()}, [](ElasticRendezvous& w) { return w.join(); });
  ASSERT_EQ(first[0].size(), 3);
  for (const Membership& m : first) EXPECT_EQ(m.members, first[0].members);
  EXPECT_EQ(first[0].members[static_cast<std::size_t>(first[0].rank)], "worker:0");
  EXPECT_EQ(first[2].members[static_cast<std::size_t>(first[2].rank)], "worker:2");
  EXPECT_EQ(first[0].rank + first[1].rank + first[2].rank, 3);

  // worker:2 dies: its connection closes and its keys go.
  c.reset();
  c_store.reset();
  std::vector<Membership> second = all({&a, &b}, [&](ElasticRendezvous& w) { return w.next(first[&w == &a ? 0 : 1]); });
  std::vector<std::string> survivors;
  for (const std::string& id : first[0].members)
    if (id != "worker:2") survivors.push_back(id);
  for (const Membership& m : second) {
    EXPECT_EQ(m.round, 1);
    EXPECT_EQ(m.members, survivors);  // the order of the round before
  }
  EXPECT_NE(second[0].rank, second[1].rank);

  // worker:2 starts again: it waits for the members at the round after theirs.
  EXPECT_FALSE(a.joiner_waiting(second[0]));
  ElasticRendezvous again(connect("worker:2"), "worker:2", options(2, 3));
  std::future<Membership> joining = std::async(std::launch::async, [&] { return again.join(); });
  ASSERT_TRUE(sees_joiner(a, second[0])) << "the newcomer never arrived";
  EXPECT_TRUE(b.joiner_waiting(second[1]));
  std::vector<Membership> third = all({&a, &b}, [&](ElasticRendezvous& w) { return w.next(second[&w == &a ? 0 : 1]); });
  const Membership joined = joining.get();
  std::vector<std::string> expected = survivors;
  expected.push_back("worker:2");
  for (const Membership& m : third) EXPECT_EQ(m.members, expected);
  EXPECT_EQ(joined.members, expected);
  EXPECT_EQ(joined.rank, 2);
  EXPECT_EQ(joined.round, 2);
}

// A member that is connected but does not come (stopped) is waited for until the join
// timeout, then left out; below MIN the round fails, naming who came and who did not.
TEST_F(Elastic, AStoppedMemberIsLeftOutAfterTheTimeoutAndTooFewFail) {
  auto stores = std::vector<std::shared_ptr<TcpStore>>{connect("worker:0"), connect("worker:1"), connect("worker:2")};
  ElasticRendezvous a0(stores[0], "worker:0", options(3, 3)), b0(stores[1], "worker:1", options(3, 3));
  ElasticRendezvous c(stores[2], "worker:2", options(3, 3));
  // A join timeout of 2 s: the two that come need only start their threads within it.
  ElasticRendezvous a(stores[0], "worker:0", options(2, 3, std::chrono::seconds(2)));
  ElasticRendezvous b(stores[1], "worker:1", options(2, 3, std::chrono::seconds(2)));
  std::vector<Membership> first = all({&a0, &b0, &c}, [](ElasticRendezvous& w) { return w.join(); });
  // worker:2 stays connected and never calls next().
  std::vector<Membership> second = all({&a, &b}, [&](ElasticRendezvous& w) { return w.next(first[&w == &a ? 0 : 1]); });
  EXPECT_EQ(second[0].size(), 2);
  EXPECT_EQ(second[0].members, second[1].members);
  // Three needed, two come: the round fails for both, naming them and the one awaited.
  ElasticRendezvous a3(stores[0], "worker:0", options(3, 3, milliseconds(500)));
  ElasticRendezvous b3(stores[1], "worker:1", options(3, 3, milliseconds(500)));
  std::future<Membership> fa = std::async(std::launch::async, [&] { return a3.next(second[0]); });
  std::future<Membership> fb = std::async(std::launch::async, [&] { return b3.next(second[1]); });
  for (std::future<Membership>* f : {&fa, &fb}) {
    try {
      f->get();
      ADD_FAILURE() << "a round of 2 closed with MIN 3";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("elastic round 2: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(" of the at least 3 needed (came: "), std::string::npos) << e.what();
      // worker:2 is no member of round 1, so nobody waits for it.
      EXPECT_NE(std::string(e.what()).find("came within 0.5 s"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("still connected but not come: none"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ElasticRendezvous(stores[0], "worker:0", options(3, 2)), InvalidArgument);
  EXPECT_THROW(ElasticRendezvous(stores[0], "two words", options(1, 2)), InvalidArgument);
}

// A worker that took an arrival number and died before writing its id hides nobody after
// it; the round's first arrival dying before it closed sends the others on to the next.
TEST_F(Elastic, ADeadArrivalHidesNobodyAndADeadCloserIsPassedOver) {
  auto a_store = connect("worker:0"), b_store = connect("worker:1");
  {
    auto ghost = connect("ghost");
    EXPECT_EQ(ghost->add(elastic_keys::arrivals(0), 1), 1);  // arrival 1, the closer: gone without a word
  }
  ElasticRendezvous a(a_store, "worker:0", options(2, 2)), b(b_store, "worker:1", options(2, 2));
  std::vector<Membership> first = all({&a, &b}, [](ElasticRendezvous& w) { return w.join(); });
  EXPECT_EQ(first[0].round, 1) << "round 0's closer is gone: round 1 goes on";
  EXPECT_EQ(first[0].members, first[1].members);
  EXPECT_EQ(first[0].size(), 2);
  // In round 2, arrival 2 is taken by a worker that dies before writing its id.
  {
    auto ghost = connect("ghost");
    ghost->set(elastic_keys::slot(2, 1), {'x'});  // not its number to write: nobody reads it
  }
  auto c_store = connect("worker:2");
  ElasticRendezvous c(c_store, "worker:2", options(2, 3));
  ElasticRendezvous a3(a_store, "worker:0", options(2, 3)), b3(b_store, "worker:1", options(2, 3));
  std::future<Membership> joining = std::async(std::launch::async, [&] { return c.join(); });
  ASSERT_TRUE(sees_joiner(a3, first[0]));
  {
    auto ghost = connect("ghost");
    ghost->add(elastic_keys::arrivals(2), 1);  // takes a number after the newcomer's, then dies
  }
  std::vector<Membership> next = all({&a3, &b3}, [&](ElasticRendezvous& w) { return w.next(first[&w == &a3 ? 0 : 1]); });
  const Membership joined = joining.get();
  EXPECT_EQ(next[0].size(), 3);
  EXPECT_EQ(next[0].members, joined.members);
  EXPECT_EQ(next[1].members, joined.members);
}

// The ring re-formed: three workers sum through a Gloo group over round 0's keys; one
// dies; a survivor's next all-reduce fails (the notice), the two agree on round 1 and sum
// through a group over its keys. Each part's time is printed.
TEST_F(Elastic, TheSurvivorsOfAKillSumAgainInTheNextRoundsGroup) {
  auto clock = [] { return std::chrono::steady_clock::now(); };
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::vector<std::shared_ptr<TcpStore>> stores{connect("worker:0"), connect("worker:1"), connect("worker:2")};
  std::vector<std::unique_ptr<ElasticRendezvous>> firsts, laters;
  for (int i = 0; i < 3; ++i) {
    firsts.push_back(std::make_unique<ElasticRendezvous>(stores[i], "worker:" + std::to_string(i), options(3, 3)));
    laters.push_back(std::make_unique<ElasticRendezvous>(stores[i], "worker:" + std::to_string(i), options(2, 3)));
  }
  auto group_of = [&](int i, const Membership& m) {
    GlooGroupOptions g;
    g.rank = m.rank;
    g.size = m.size();
    g.task_names = m.members;
    g.timeout = std::chrono::seconds(20);
    return std::make_unique<GlooGroup>(round_store(stores[static_cast<std::size_t>(i)], m.round), g);
  };
  std::vector<Membership> first = all({firsts[0].get(), firsts[1].get(), firsts[2].get()},
                                      [](ElasticRendezvous& w) { return w.join(); });
  std::vector<std::unique_ptr<GlooGroup>> groups(3);
  {
    std::vector<std::future<void>> forming;
    for (int i = 0; i < 3; ++i)
      forming.push_back(std::async(std::launch::async, [&, i] { groups[i] = group_of(i, first[i]); }));
    for (auto& f : forming) f.get();
  }
  std::vector<std::future<float>> sums;
  for (int i = 0; i < 3; ++i)
    sums.push_back(std::async(std::launch::async, [&, i] {
      float v = static_cast<float>(i + 1);
      groups[i]->allreduce(&v, 1, 0);
      return v;
    }));
  for (auto& f : sums) EXPECT_EQ(f.get(), 6.0f);

  // worker:2 dies: its group and its connection to the store go.
  const auto killed = clock();
  groups[2].reset();
  laters[2].reset();
  firsts[2].reset();
  stores[2].reset();
  std::vector<std::future<double>> noticed;
  for (int i = 0; i < 2; ++i)
    noticed.push_back(std::async(std::launch::async, [&, i] {
      float v = 1;
      EXPECT_THROW(groups[i]->allreduce(&v, 1, 1), PeerFailure);
      return ms(clock() - killed);
    }));
  const double notice = std::max(noticed[0].get(), noticed[1].get());
  const auto agreeing = clock();
  std::vector<Membership> second = all({laters[0].get(), laters[1].get()},
                                       [&](ElasticRendezvous& w) { return w.next(first[&w == laters[0].get() ? 0 : 1]); });
  const double agreement = ms(clock() - agreeing);
  ASSERT_EQ(second[0].size(), 2);
  const auto forming = clock();
  std::vector<std::future<void>> again;
  for (int i = 0; i < 2; ++i)
    again.push_back(std::async(std::launch::async, [&, i] {
      groups[i].reset();
      groups[i] = group_of(i, second[i]);
    }));
  for (auto& f : again) f.get();
  const double formed = ms(clock() - forming);
  sums.clear();
  for (int i = 0; i < 2; ++i)
    sums.push_back(std::async(std::launch::async, [&, i] {
      float v = static_cast<float>(10 * (i + 1));
      groups[i]->allreduce(&v, 1, 0);
      return v;
    }));
  for (auto& f : sums) EXPECT_EQ(f.get(), 30.0f);
  std::printf("from the kill: noticed %.1f ms, agreed on 2 members %.1f ms later, their group formed %.1f ms later\n",
              notice, agreement, formed);
}

// A worker's connection, counting the requests it makes of the store.
class Counting final : public RendezvousStore {
 public:
  explicit Counting(std::shared_ptr<RendezvousStore> store) : store_(std::move(store)) {}
  std::atomic<std::int64_t> requests{0};

  void set(const std::string& key, const std::vector<char>& data) override {
    ++requests;
    store_->set(key, data);
  }
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) override {
    ++requests;
    store_->set(key, data, limit);
  }
  std::vector<char> get(const std::string& key) override {
    ++requests;
    return store_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override {
    ++requests;
    store_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    ++requests;
    store_->wait(keys, timeout);
  }
  std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) override {
    ++requests;
    return store_->check(keys, limit);
  }
  bool set_while_connected(const std::string& key, const std::vector<char>& data) override {
    ++requests;
    return store_->set_while_connected(key, data);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    ++requests;
    return store_->add(key, delta);
  }

 private:
  std::shared_ptr<RendezvousStore> store_;
};

// 1,000 workers (threads, each its own connection): the first round, one member killed,
// and one newcomer; each must agree, and the time and the messages are printed.
TEST_F(Elastic, AThousandWorkersAgreeAndTheMessagesGrowLinearly) {
  const int n = DTRAIN_SANITIZED ? 100 : 1000;
  std::map<std::string, std::shared_ptr<Counting>> stores;  // by worker
  std::vector<std::unique_ptr<ElasticRendezvous>> firsts, workers;
  std::vector<ElasticRendezvous*> first_round, everyone;
  auto store_of = [&](const std::string& id) {
    return stores[id] = std::make_shared<Counting>(connect(id));
  };
  for (int i = 0; i < n; ++i) {
    const std::string id = "worker:" + std::to_string(i);
    auto store = store_of(id);
    // The first round waits for all (MIN = MAX); the later ones for the members of the
    // round before that are alive.
    firsts.push_back(std::make_unique<ElasticRendezvous>(store, id, options(n, n, std::chrono::seconds(60))));
    workers.push_back(std::make_unique<ElasticRendezvous>(store, id, options(n / 2, n, std::chrono::seconds(60))));
    everyone.push_back(workers.back().get());
    first_round.push_back(firsts.back().get());
  }
  // Each round from counts of 0: the most a member sent, and what the closer sent.
  std::uint64_t served = 0;
  auto start_round = [&] {
    for (auto& [id, store] : stores) store->requests = 0;
    served = server_.requests();
  };
  struct Sent {
    std::int64_t member = 0, closer = 0;
  };
  auto report = [&](const char* what, const std::vector<Membership>& ms) {
    double slowest = 0;
    Sent sent;
    for (const Membership& m : ms) {
      slowest = std::max(slowest, m.seconds);
      const std::int64_t mine = stores.at(m.members[static_cast<std::size_t>(m.rank)])->requests;
      std::int64_t& most = m.closed_it() ? sent.closer : sent.member;
      most = std::max(most, mine);
    }
    const std::uint64_t total = server_.requests() - served;
    std::printf("%s: %zu workers agreed in %.1f ms (the slowest); %llu messages to the store (%.2f a worker); a "
                "member sent at most %lld, the round's closer %lld\n",
                what, ms.size(), 1000 * slowest, static_cast<unsigned long long>(total),
                static_cast<double>(total) / static_cast<double>(ms.size()), static_cast<long long>(sent.member),
                static_cast<long long>(sent.closer));
    return sent;
  };
  start_round();
  std::vector<Membership> first = all(first_round, [](ElasticRendezvous& w) { return w.join(); });
  for (const Membership& m : first) ASSERT_EQ(m.members, first[0].members);
  ASSERT_EQ(first[0].size(), n);
  report("first round", first);

  // The last member dies.
  const std::string dead = "worker:" + std::to_string(n - 1);
  firsts.pop_back();
  workers.pop_back();
  stores.erase(dead);
  everyone.pop_back();
  start_round();
  std::vector<Membership> second = all(everyone, [&](ElasticRendezvous& w) {
    const std::size_t i = static_cast<std::size_t>(std::stoi(w.id().substr(7)));
    return w.next(first[i]);
  });
  for (const Membership& m : second) ASSERT_EQ(m.members, second[0].members);
  ASSERT_EQ(second[0].size(), n - 1);
  EXPECT_EQ(std::find(second[0].members.begin(), second[0].members.end(), dead), second[0].members.end());
  // Linear: a member sends a handful of messages whatever the size; the closer one or two
  // per member. (A member that waits on the closer re-asks every 50 ms: a thousand threads
  // on two loaded cores have made that 8 messages where 6 is usual.)
  const Sent sent = report("a member died", second);
  EXPECT_LE(sent.member, 12);
  EXPECT_LE(sent.closer, 2 * n + 10);

  // It starts again and joins.
  ElasticRendezvous again(store_of(dead), dead, options(n / 2, n, std::chrono::seconds(60)));
  ElasticRendezvous observer(connect("observer"), "observer", options(1, 1));  // looks on its own connection
  start_round();
  std::future<Membership> joining = std::async(std::launch::async, [&] { return again.join(); });
  ASSERT_TRUE(sees_joiner(observer, second[0]));
  std::vector<Membership> third = all(everyone, [&](ElasticRendezvous& w) {
    const std::size_t i = static_cast<std::size_t>(std::stoi(w.id().substr(7)));
    return w.next(second[i]);
  });
  third.push_back(joining.get());
  for (const Membership& m : third) ASSERT_EQ(m.members, third[0].members);
  ASSERT_EQ(third[0].size(), n);
  EXPECT_EQ(third[0].members.back(), dead);
  report("a worker joined", third);
}

}  // namespace
}  // namespace dtrain::comm
