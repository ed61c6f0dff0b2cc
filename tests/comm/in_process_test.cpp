// The in-memory all-reduce: ranks run as threads, swept over world sizes and sizes.
#include <gtest/gtest.h>

#include <barrier>
#include <thread>
#include <vector>

#include "dtrain/comm/in_process.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

// Values are small integers, so every order of summation gives the exact sum.
float contribution(int replica, std::size_t bucket, std::size_t i, int round) {
  return static_cast<float>((replica + 1) * 3 + static_cast<int>(bucket) * 5 + static_cast<int>(i % 7) + round);
}

class AllReduceSweep : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(AllReduceSweep, EveryReplicaSeesTheSumEveryRound) {
  const auto [replicas, count] = GetParam();
  // Three buckets of different sizes; a small chunk so large buckets split into many.
  const std::vector<std::size_t> sizes{count, count / 2 + 1, 3};
  std::vector<std::vector<std::vector<float>>> storage(sizes.size());
  std::vector<std::vector<float*>> inputs(sizes.size());
  for (std::size_t b = 0; b < sizes.size(); ++b)
    for (int r = 0; r < replicas; ++r) {
      storage[b].emplace_back(sizes[b]);
      inputs[b].push_back(storage[b].back().data());
    }
  InProcessAllReduce all_reduce(inputs, sizes, /*chunk_floats=*/1000);
  constexpr int kRounds = 3;
  std::vector<int> mismatches(static_cast<std::size_t>(replicas), 0);
  std::barrier<> readers_done(replicas);
  auto body = [&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      for (std::size_t b = 0; b < sizes.size(); ++b) {
        float* in = all_reduce.input(r, b);
        for (std::size_t i = 0; i < sizes[b]; ++i) in[i] = contribution(r, b, i, round);
        all_reduce.arrive(r, b);
      }
      all_reduce.finish(r);
      for (std::size_t b = 0; b < sizes.size(); ++b)
        for (std::size_t i = 0; i < sizes[b]; ++i) {
          float want = 0;
          for (int k = 0; k < replicas; ++k) want += contribution(k, b, i, round);
          if (all_reduce.result(b)[i] != want) ++mismatches[static_cast<std::size_t>(r)];
        }
      // Replica 0 overwrites the result with its next contribution: wait for readers.
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
                                                              std::size_t{70001})));

TEST(InProcessAllReduce, AbortReleasesAWaitingReplicaNamingTheFailedOne) {
  std::vector<float> a(100), b(100);
  InProcessAllReduce all_reduce({{a.data(), b.data()}}, {100});
  std::thread failing([&] { all_reduce.abort(1, "the loss was NaN"); });
  all_reduce.arrive(0, 0);
  try {
    all_reduce.finish(0);
    ADD_FAILURE() << "finish() returned without replica 1";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("replica 1 failed (the loss was NaN)"), std::string::npos) << e.what();
  }
  failing.join();
}

TEST(InProcessAllReduce, RejectsMismatchedInputs) {
  std::vector<float> a(4);
  EXPECT_THROW(InProcessAllReduce({{a.data()}, {a.data(), a.data()}}, {4, 4}), InvalidArgument);
  EXPECT_THROW(InProcessAllReduce({{a.data()}}, {4, 4}), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::comm
