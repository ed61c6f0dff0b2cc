// Collectives between ranks over Gloo's TCP transport on 127.0.0.1, the ranks being
// threads of this process that meet through an in-memory store; and the TCP rendezvous
// store with its cluster token.
#include <gtest/gtest.h>

#include <gloo/rendezvous/hash_store.h>

#include <thread>

#include "dtrain/comm/gloo_group.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

GlooGroupOptions options(int rank, int size, std::chrono::milliseconds timeout = 20s) {
  GlooGroupOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  for (int r = 0; r < size; ++r) o.task_names.push_back("worker:" + std::to_string(r));
  return o;
}

// Runs body(rank) on `size` threads; rethrows nothing, records failures per rank.
template <typename Body>
std::vector<std::string> on_ranks(int size, Body body) {
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

class GlooSweep : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(GlooSweep, AllreduceBroadcastAllgatherBarrier) {
  const auto [size, count] = GetParam();
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<int> wrong(static_cast<std::size_t>(size), 0);
  const auto errors = on_ranks(size, [&](int r) {
    GlooGroup group(store, options(r, size));
    // Two all-reduces under different keys, each twice (the cached algorithm is reused).
    for (int round = 0; round < 2; ++round)
      for (std::uint64_t key : {7u, 8u}) {
        std::vector<float> v(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(r + static_cast<int>(i % 7) + round + key);
        group.allreduce(v.data(), count, key);
        for (std::size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int k = 0; k < size; ++k) want += static_cast<float>(k + static_cast<int>(i % 7) + round + key);
          if (v[i] != want) ++wrong[static_cast<std::size_t>(r)];
        }
      }
    std::vector<float> b(count, static_cast<float>(r));
    group.broadcast(b.data(), count, size - 1);
    for (float x : b) wrong[static_cast<std::size_t>(r)] += x != static_cast<float>(size - 1);
    std::vector<float> in(count, static_cast<float>(r * 10)), out(count * static_cast<std::size_t>(size), -1.0f);
    group.allgather(in.data(), out.data(), count);
    for (std::size_t j = 0; j < out.size(); ++j)
      wrong[static_cast<std::size_t>(r)] += out[j] != static_cast<float>(static_cast<int>(j / count) * 10);
    group.barrier();
    EXPECT_EQ(group.sequence(), 7u);
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndCounts, GlooSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{1001},
                                                              std::size_t{70001})));

TEST(GlooGroup, RanksThatNeverArriveAreNamed) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto errors = on_ranks(2, [&](int r) { GlooGroup group(store, options(r, 3, 500ms)); });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("these tasks never arrived: worker:2"), std::string::npos) << e;
}

TEST(GlooGroup, APeerThatLeavesIsNamedByTheOthers) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto errors = on_ranks(2, [&](int r) {
    GlooGroup group(store, options(r, 2, 5s));
    group.barrier();
    if (r == 1) return;  // leaves: its connections close, and it answers no roll call
    std::vector<float> v(100000, 1.0f);
    for (int i = 0; i < 100; ++i) group.allreduce(v.data(), v.size(), 1);
  });
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errors[0].find("worker:0: allreduce #"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("not answering: worker:1"), std::string::npos) << errors[0];
  RecordProperty("error", errors[0]);
}

TEST(TcpStore, SetGetWaitAndTheClusterToken) {
  TcpStoreServer server("127.0.0.1", 0, "secret");
  TcpStore a("127.0.0.1", server.port(), "secret", 2s), b("127.0.0.1", server.port(), "secret", 2s);
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);  // the value arrives while b is waiting for it
    a.set("k", {'v', '1'});
  });
  EXPECT_EQ(b.get("k"), (std::vector<char>{'v', '1'}));
  later.join();
  EXPECT_EQ(a.check({"k", "absent"}), (std::vector<bool>{true, false}));
  try {
    b.wait({"k", "absent"}, 200ms);
    ADD_FAILURE() << "no timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("still missing after 0.2 s: absent"), std::string::npos) << e.what();
  }
  try {
    TcpStore stray("127.0.0.1", server.port(), "wrong", 2s);
    ADD_FAILURE() << "a wrong token was let in";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("refused this process"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, AnUnreachableStoreIsATimeoutNamingIt) {
  int port = 0;
  {
    TcpStoreServer gone("127.0.0.1", 0, "t");
    port = gone.port();
  }
  try {
    TcpStore s("127.0.0.1", port, "t", 300ms);
    ADD_FAILURE() << "connected to nothing";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port) + " (served by the chief)"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, CarriesAGlooRendezvousBetweenRanks) {
  TcpStoreServer server("127.0.0.1", 0, "tok");
  const auto errors = on_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), "tok", 10s);
    GlooGroup group(store, options(r, 2));
    float x = static_cast<float>(r + 1);
    group.allreduce(&x, 1, 0);
    if (x != 3.0f) throw Error("wrong sum");
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace dtrain::comm
