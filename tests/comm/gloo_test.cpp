// Collectives between ranks over Gloo's TCP transport on 127.0.0.1, the ranks being
// threads of this process that meet through an in-memory store; the TCP rendezvous store
// with its cluster token; and the Redis one, where a redis-server is installed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gloo/rendezvous/hash_store.h>

#include <cmath>
#include <thread>

#include "common/on_ranks.h"
#include "dtrain/comm/gloo_group.h"
#include "dtrain/comm/elastic_rendezvous.h"
#include "dtrain/comm/redis_store.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

GlooGroupOptions options(int rank, int size, std::chrono::milliseconds timeout = 20s) {
  GlooGroupOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.task_names = testing::task_names(size);
  return o;
}

using testing::on_ranks;

// Ranks that are threads of one process share memory, so the sweep runs both ways:
// through shared memory, and over TCP as between hosts.
class GlooSweep : public ::testing::TestWithParam<std::tuple<int, std::size_t, bool>> {};

TEST_P(GlooSweep, AllreduceBroadcastAllgatherBarrier) {
  const auto [size, count, shared_memory] = GetParam();
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<int> wrong(static_cast<std::size_t>(size), 0);
  const auto errors = on_ranks(size, [&](int r) {
    GlooGroupOptions o = options(r, size);
    o.shared_memory = shared_memory;
    GlooGroup group(store, o);
    if (size > 1 && group.transport() != (shared_memory ? "shared memory" : "TCP (asked for)"))
      throw Error("transport: " + group.transport());
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
                                                              std::size_t{70001}),
                                            ::testing::Bool()));

class GlooWire : public ::testing::TestWithParam<std::tuple<int, Wire>> {
 protected:
  // Values no 16-bit format holds exactly, of mixed signs and magnitudes.
  static float value(std::size_t i, int rank) {
    return static_cast<float>(std::sin(static_cast<double>(i) * 0.37 + rank) * (1.0 + static_cast<double>(i % 5)));
  }
};

TEST_P(GlooWire, SixteenBitSumsStayWithinTheirRounding) {
  // Sums of values with a spread of magnitudes; every rank must get the same bits, within
  // a few roundings of the exact sum (8 significant bits for bfloat16, 11 for float16).
  const auto [size, wire] = GetParam();
  constexpr std::size_t kCount = 70001;  // odd, and several ring segments
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::vector<float>> results(static_cast<std::size_t>(size));
  const auto errors = on_ranks(size, [&](int r) {
    GlooGroup group(store, options(r, size));
    std::vector<float> v(kCount);
    for (std::size_t i = 0; i < kCount; ++i) v[i] = value(i, r);
    group.allreduce(v.data(), kCount, 3, wire);
    results[static_cast<std::size_t>(r)] = v;
  });
  const double ulp = wire == Wire::bf16 ? 1.0 / 128 : 1.0 / 1024;
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(results[static_cast<std::size_t>(r)], results[0]) << "rank " << r << " got other bits than rank 0";
  }
  int far = 0, rounded = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    double exact = 0, magnitude = 0;
    for (int k = 0; k < size; ++k) {
      exact += value(i, k);
      magnitude += std::abs(value(i, k));
    }
    far += std::abs(results[0][i] - exact) > size * ulp * magnitude;
    rounded += results[0][i] != static_cast<float>(exact);
  }
  EXPECT_EQ(far, 0);
  EXPECT_GT(rounded, static_cast<int>(kCount / 2)) << "the sums look like float32's";
}

INSTANTIATE_TEST_SUITE_P(RanksAndWires, GlooWire,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(Wire::bf16, Wire::f16)));

TEST(Gloo, DoubleSumsAreExact) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::vector<double>> results(3);
  const auto errors = on_ranks(3, [&](int r) {
    GlooGroup group(store, options(r, 3));
    std::vector<double> v{1e15 + r, 0.1 * r, -1.0};
    group.allreduce(v.data(), v.size());
    results[static_cast<std::size_t>(r)] = v;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(errors[static_cast<std::size_t>(r)], "");
    EXPECT_EQ(results[static_cast<std::size_t>(r)][0], 3e15 + 3);
    EXPECT_NEAR(results[static_cast<std::size_t>(r)][1], 0.3, 1e-15);
    EXPECT_EQ(results[static_cast<std::size_t>(r)][2], -3.0);
  }
}

TEST(Gloo, CheckedCollectivesNameAMismatch) {
  // Rank 1 broadcasts where the others all-reduce: with the check on, every rank fails
  // naming both sides instead of exchanging the wrong bytes.
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto errors = on_ranks(3, [&](int r) {
    GlooGroupOptions o = options(r, 3, 5s);
    o.check_collectives = true;
    GlooGroup group(store, o);
    std::vector<float> v(1000, 1.0f);
    group.allreduce(v.data(), v.size(), 1);  // the same everywhere: passes the check
    if (r == 1) group.broadcast(v.data(), v.size(), 0);
    else group.allreduce(v.data(), v.size(), 1);
  });
  for (int r = 0; r < 3; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    EXPECT_NE(e.find("collective mismatch"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("broadcast #2 (4000 bytes)"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("allreduce #2 (4000 bytes)"), std::string::npos) << "rank " << r << ": " << e;
  }
}

TEST(GlooGroup, RanksThatNeverArriveAreNamed) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto errors = on_ranks(2, [&](int r) { GlooGroup group(store, options(r, 3, 500ms)); });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("these tasks never arrived: worker:2"), std::string::npos) << e;
}

class GlooTransports : public ::testing::TestWithParam<bool> {};

TEST_P(GlooTransports, APeerThatLeavesIsNamedByTheOthers) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto errors = on_ranks(2, [&](int r) {
    GlooGroupOptions o = options(r, 2, 5s);
    o.shared_memory = GetParam();
    GlooGroup group(store, o);
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

INSTANTIATE_TEST_SUITE_P(SharedMemoryAndTcp, GlooTransports, ::testing::Bool());

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

// A redis-server of the test's own on 127.0.0.1, stopped on destruction; port() is 0
// where none is installed or it did not start (the caller skips, saying so).
class RedisServer {
 public:
  RedisServer() {
    const char* server = "/usr/bin/redis-server";
    if (::access(server, X_OK) != 0) return;
    // A port the kernel had free a moment ago.
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(probe);
      return;
    }
    ::close(probe);
    const std::string port = std::to_string(ntohs(a.sin_port));
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl(server, server, "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
              "--loglevel", "warning", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Up once it accepts a connection; at most 10 s.
    for (const auto deadline = Clock::now() + std::chrono::seconds(10); Clock::now() < deadline;) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (up) {
        port_ = std::stoi(port);
        return;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  ~RedisServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(RedisStore, ChecksEachKeyUnderItsPrefix) {
  RedisServer server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server (scripts/install-deps.sh installs it)";
  RedisStore job("127.0.0.1", server.port(), 2s, "worker:0", "job-a"), other("127.0.0.1", server.port(), 2s, "", "job-b");
  job.set("k", {'v'});
  EXPECT_EQ(job.check({"k", "absent", "k"}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(job.get("k"), (std::vector<char>{'v'}));
  EXPECT_EQ(other.check({"k"}), (std::vector<bool>{false})) << "another job's prefix sees the key";
  EXPECT_FALSE(job.set_while_connected("mine", {'1'})) << "Redis cannot tie a key to the connection";
  // An atomic add: arrival numbers of an elastic round.
  EXPECT_EQ(job.add("n", 1), 1);
  EXPECT_EQ(job.add("n", 2), 3);
  EXPECT_EQ(other.add("n", 1), 1) << "another job's counter is its own";
  // Redis keeps a dead process's keys: elastic membership cannot tell the dead from the slow.
  try {
    ElasticRendezvous elastic(std::make_shared<RedisStore>("127.0.0.1", server.port(), 2s, "worker:0", "job-a"),
                              "worker:0", ElasticOptions{});
    ADD_FAILURE() << "elastic membership accepted Redis";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot remove a dead worker's keys (Redis cannot"), std::string::npos)
        << e.what();
  }
  try {
    job.wait({"k", "absent"}, 200ms);
    ADD_FAILURE() << "no timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("still missing after 0.2 s: absent"), std::string::npos) << e.what();
  }
}

// Over Redis, where an ended process's keys stay, the roll call after a failed collective
// waits for every absent rank at once, until one deadline, and names them all without
// claiming to know whether they are alive.
TEST(GlooGroup, OverRedisTheRollCallNamesEveryRankThatLeft) {
  RedisServer server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server (scripts/install-deps.sh installs it)";
  const auto errors = on_ranks(3, [&](int r) {
    auto store = std::make_shared<RedisStore>("127.0.0.1", server.port(), 2s, testing::task_names(3)[r], "job");
    GlooGroupOptions o = options(r, 3, 2s);
    o.shared_memory = false;
    GlooGroup group(store, o);
    group.barrier();
    if (r != 0) return;  // they leave; worker:0 goes on alone
    std::vector<float> v(100000, 1.0f);
    group.allreduce(v.data(), v.size(), 1);
  });
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(errors[2], "");
  EXPECT_NE(errors[0].find("not answering: worker:1, worker:2 ("), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0].find("alive"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace dtrain::comm
