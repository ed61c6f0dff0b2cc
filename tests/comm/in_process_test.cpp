// The in-memory all-reduce: ranks run as threads, swept over world sizes and sizes.
#include <gtest/gtest.h>

#include <barrier>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm/in_process.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

// Values are small integers, so every order of summation gives the exact sum.
float contribution(int replica, std::size_t segment, std::size_t i, int round) {
  return static_cast<float>((replica + 1) * 3 + static_cast<int>(segment) * 5 + static_cast<int>(i % 7) + round);
}

// World size, element count, and whether sums bypass the caches.
class AllReduceSweep : public ::testing::TestWithParam<std::tuple<int, std::size_t, bool>> {};

TEST_P(AllReduceSweep, EveryReplicaSeesTheSumEveryRound) {
  const auto [replicas, count, streaming] = GetParam();
  // Three buckets: one segment; two segments; a small one. A small chunk splits large
  // segments into many chunks.
  const std::vector<std::vector<std::size_t>> segments{{count}, {count / 2 + 1, 5}, {3}};
  // inputs[bucket][segment][replica], outputs[bucket]
  std::vector<std::vector<std::vector<std::vector<float>>>> inputs(segments.size());
  std::vector<std::vector<float>> outputs;
  std::vector<float*> output_ptrs;
  for (std::size_t b = 0; b < segments.size(); ++b) {
    std::size_t total = 0;
    for (std::size_t n : segments[b]) {
      inputs[b].emplace_back(static_cast<std::size_t>(replicas), std::vector<float>(n));
      total += n;
    }
    outputs.emplace_back(total);
    output_ptrs.push_back(outputs.back().data());
  }
  InProcessAllReduce all_reduce(replicas, segments, output_ptrs, /*chunk_floats=*/1000,
                                /*streaming_above_bytes=*/streaming ? 1 : std::size_t{1} << 40);
  constexpr int kRounds = 3;
  std::vector<int> mismatches(static_cast<std::size_t>(replicas), 0);
  std::barrier<> readers_done(replicas);
  auto body = [&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      for (std::size_t b = 0; b < segments.size(); ++b) {
        for (std::size_t s = 0; s < segments[b].size(); ++s) {
          std::vector<float>& in = inputs[b][s][static_cast<std::size_t>(r)];
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = contribution(r, s, i, round);
          all_reduce.set_input(r, b, s, in.data());
        }
        all_reduce.arrive(r, b);
      }
      all_reduce.finish(r);
      for (std::size_t b = 0; b < segments.size(); ++b) {
        std::size_t at = 0;
        for (std::size_t s = 0; s < segments[b].size(); ++s)
          for (std::size_t i = 0; i < segments[b][s]; ++i, ++at) {
            float want = 0;
            for (int k = 0; k < replicas; ++k) want += contribution(k, s, i, round);
            if (outputs[b][at] != want) ++mismatches[static_cast<std::size_t>(r)];
          }
      }
      // The next round rewrites the inputs and the output: wait for every reader.
      readers_done.arrive_and_wait();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < replicas; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  for (int r = 0; r < replicas; ++r) EXPECT_EQ(mismatches[static_cast<std::size_t>(r)], 0) << "replica " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, AllReduceSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{1001},
                                                              std::size_t{70001}),
                                            ::testing::Bool()));

TEST(InProcessAllReduce, AMissingInputCountsAsZeros) {
  std::vector<float> a{1, 2, 3}, c{10, 20, 30}, out(3);
  InProcessAllReduce all_reduce(3, {{3}}, {out.data()});
  std::thread other([&] {
    all_reduce.set_input(2, 0, 0, c.data());
    all_reduce.arrive(2, 0);
    all_reduce.finish(2);
  });
  std::thread none([&] {
    all_reduce.set_input(1, 0, 0, nullptr);  // this replica had no gradient
    all_reduce.arrive(1, 0);
    all_reduce.finish(1);
  });
  all_reduce.set_input(0, 0, 0, a.data());
  all_reduce.arrive(0, 0);
  all_reduce.finish(0);
  other.join();
  none.join();
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33}));
}

TEST(InProcessAllReduce, AbortReleasesAWaitingReplicaNamingTheFailedOne) {
  std::vector<float> a(100), out(100);
  InProcessAllReduce all_reduce(2, {{100}}, {out.data()});
  std::thread failing([&] { all_reduce.abort(1, "the loss was NaN"); });
  all_reduce.set_input(0, 0, 0, a.data());
  // Depending on when the abort lands, arrive() already refuses or finish() is released.
  try {
    all_reduce.arrive(0, 0);
    all_reduce.finish(0);
    ADD_FAILURE() << "finish() returned without replica 1";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 failed (the loss was NaN)"), std::string::npos) << e.what();
  }
  failing.join();
}

// Each round every replica writes its slot, passes the barrier, and reads every slot:
// a replica that got through before the others wrote would read last round's values.
// Both with spinning and with sleeping waiters (more replicas than cores).
TEST(InProcessBarrier, NobodyPassesBeforeEveryoneArrived) {
  constexpr int kReplicas = 3, kRounds = 200;
  for (const int spins : {kSpinPauses, 0}) {
    InProcessBarrier barrier(kReplicas, spins);
    std::vector<int> slots(kReplicas, -1);
    std::vector<int> wrong(kReplicas, 0);
    auto replica = [&](int r) {
      for (int round = 0; round < kRounds; ++round) {
        slots[static_cast<std::size_t>(r)] = round;
        barrier.arrive_and_wait(r);
        for (int other = 0; other < kReplicas; ++other) wrong[static_cast<std::size_t>(r)] += slots[static_cast<std::size_t>(other)] != round;
        barrier.arrive_and_wait(r);  // nobody writes the next round before all have read
      }
    };
    std::vector<std::thread> threads;
    for (int r = 1; r < kReplicas; ++r) threads.emplace_back(replica, r);
    replica(0);
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(wrong, std::vector<int>(kReplicas, 0)) << spins << " spins";
  }
}

// Replicas 0 and 1 wait at the barrier on threads of their own, and `meanwhile` runs on
// the calling thread; returns what each waiter's wait ended with (replica 2 never comes).
template <typename Meanwhile>
std::vector<std::string> wait_without_replica_2(InProcessBarrier& barrier, Meanwhile&& meanwhile) {
  std::vector<std::string> errors(2);
  std::vector<std::thread> waiters;
  for (int r = 0; r < 2; ++r)
    waiters.emplace_back([&, r] {
      try {
        barrier.arrive_and_wait(r);
        errors[static_cast<std::size_t>(r)] = "passed the barrier without replica 2";
      } catch (const Timeout& e) {
        errors[static_cast<std::size_t>(r)] = std::string("Timeout: ") + e.what();
      } catch (const PeerFailure& e) {
        errors[static_cast<std::size_t>(r)] = std::string("PeerFailure: ") + e.what();
      }
    });
  meanwhile();
  for (std::thread& t : waiters) t.join();
  return errors;
}

TEST(InProcessBarrier, AbortReleasesWaitersNamingTheFailedReplica) {
  InProcessBarrier barrier(3);
  const std::vector<std::string> errors =
      wait_without_replica_2(barrier, [&] { barrier.abort(2, "its batch was empty"); });
  for (const std::string& e : errors) EXPECT_EQ(e.rfind("PeerFailure: ", 0), 0u) << e;
  for (const std::string& e : errors) EXPECT_NE(e.find("replica 2 failed (its batch was empty)"), std::string::npos) << e;
  // Later arrivals fail at once.
  EXPECT_THROW(barrier.arrive_and_wait(0), PeerFailure);
}

// A replica that never comes (stuck in its input or in user code) is a Timeout naming it
// and the barrier; the waiters are released, and later arrivals fail at once.
TEST(InProcessBarrier, AReplicaThatNeverArrivesIsATimeoutNamingIt) {
  InProcessBarrier barrier(3, kSpinPauses, std::chrono::milliseconds(100), "step barrier");
  // A waiter may see the other's Timeout first, as a PeerFailure naming the same.
  const std::vector<std::string> errors = wait_without_replica_2(barrier, [] {});
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("step barrier: replica "), std::string::npos) << e;
    EXPECT_NE(e.find("replica(s) 2 never arrived"), std::string::npos) << e;
  }
  EXPECT_THROW(barrier.arrive_and_wait(2), PeerFailure);
}

// Members that sit out (a replica without rows) are not waited for, nor named.
TEST(InProcessBarrier, OnlyMembersAreWaitedForAndNamed) {
  InProcessBarrier barrier(3, 0, std::chrono::milliseconds(100), "dense layer barrier");
  barrier.reset({true, false, true}, 0);
  std::thread other([&] { barrier.arrive_and_wait(2); });
  barrier.arrive_and_wait(0);  // replica 1 is not a member: passes with replica 2
  other.join();
  try {
    barrier.arrive_and_wait(0);
    ADD_FAILURE() << "passed without replica 2";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("dense layer barrier: replica 0 waited 0.1 s, and replica(s) 2 never arrived"),
              std::string::npos)
        << e.what();
  }
}

TEST(InProcessAllReduce, AReplicaThatNeverArrivesIsATimeoutNamingTheBucket) {
  std::vector<float> a(4, 1.0f), b(4, 2.0f), out0(4), out1(4);
  InProcessAllReduce all_reduce(2, {{4}, {4}}, {out0.data(), out1.data()}, 16384, 0, std::chrono::milliseconds(100));
  all_reduce.set_input(1, 0, 0, b.data());
  all_reduce.arrive(1, 0);  // replica 1 hands over bucket 0, then is stuck before bucket 1
  all_reduce.set_input(0, 0, 0, a.data());
  all_reduce.arrive(0, 0);
  all_reduce.set_input(0, 1, 0, a.data());
  all_reduce.arrive(0, 1);
  try {
    all_reduce.finish(0);
    ADD_FAILURE() << "finish() returned without replica 1";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("all-reduce of gradient bucket 1 (of 2): replica 0 waited 0.1 s, and "
                                         "replica(s) 1 never arrived"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(out0, std::vector<float>(4, 3.0f));  // the complete bucket was summed
  // Replica 1, when it comes, is told why the round was given up.
  try {
    all_reduce.finish(1);
    ADD_FAILURE() << "finish() returned after the round was given up";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("replica 0 failed (all-reduce of gradient bucket 1"), std::string::npos)
        << e.what();
  }
}

// Waiting on a Signal: a bump ends the wait; without one, the timeout does.
TEST(Signal, ABumpEndsTheWaitAndTheTimeoutEndsAWaitWithoutOne) {
  Signal signal;
  const std::uint64_t seen = signal.value();
  EXPECT_FALSE(signal.wait(seen, 10, std::chrono::milliseconds(1)));
  std::thread bumper([&] { signal.bump(); });
  EXPECT_TRUE(signal.wait(seen, 0, std::chrono::hours(1)));
  bumper.join();
  EXPECT_TRUE(signal.wait(seen, 0, std::chrono::milliseconds(0)));  // it moved already
}

TEST(InProcessAllReduce, RejectsMismatchedInputs) {
  std::vector<float> out(4);
  EXPECT_THROW(InProcessAllReduce(2, {{4}, {4}}, {out.data()}), InvalidArgument);
  EXPECT_THROW(InProcessAllReduce(0, {{4}}, {out.data()}), InvalidArgument);
  EXPECT_THROW(InProcessAllReduce(2, {{4}}, {nullptr}), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::comm
