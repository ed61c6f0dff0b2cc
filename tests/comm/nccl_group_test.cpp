// The NCCL group's joining, sums, deadlines and errors, over a fake NCCL among threads of
// this process (its "GPU memory" is host memory, and a collective sums every rank's buffer
// once all have queued it): the group's own logic, which CI can run. The machine's NCCL
// runs under the same group in test_gpu, with one rank (NCCL refuses two on one GPU).
#include "dtrain/comm/nccl_group.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <latch>
#include <map>
#include <mutex>
#include <thread>

#include "common/error_message.h"
#include "common/fake_nccl.h"
#include "common/on_ranks.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;
using dtrain::testing::FakeNccl;
using dtrain::testing::message_of;
using dtrain::testing::on_ranks;
using dtrain::testing::task_names;

class NcclGroupTest : public ::testing::Test {
 protected:
  std::shared_ptr<RendezvousStore> store(int rank) {
    return std::make_shared<TcpStore>("127.0.0.1", server_.port(), "nccl", 5s, "worker:" + std::to_string(rank));
  }
  NcclGroupOptions options(int rank, int size, std::chrono::milliseconds timeout = 5s) {
    return {rank, size, task_names(size), 0, timeout};
  }
  TcpStoreServer server_{"127.0.0.1", 0, "nccl"};
};

TEST_F(NcclGroupTest, RanksJoinThroughTheStoreAndSumInPlace) {
  FakeNccl nccl(3);
  const std::vector<std::string> errors = on_ranks(3, [&](int r) {
    NcclGroup group(nccl.api, store(r), options(r, 3));
    EXPECT_EQ(group.describe(), "NCCL (cuda:0, 3 ranks)");
    for (int round = 1; round <= 2; ++round) {
      std::vector<float> x{float(r + 1), float(10 * (r + 1))};
      group.all_reduce(x.data(), x.size());
      EXPECT_EQ(x, (std::vector<float>{6, 60})) << "rank " << r << " round " << round;
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(nccl.aborts(), 0);
}

TEST_F(NcclGroupTest, ARankThatNeverJoinsIsNamedAndTheCommunicatorAborted) {
  FakeNccl nccl(2);
  const std::string message =
      message_of<Timeout>([&] { NcclGroup group(nccl.api, store(0), options(0, 2, 300ms)); });
  EXPECT_NE(message.find("joining the NCCL communicator on cuda:0 (2 ranks): worker:0 waited 0.3 s; never came: "
                         "worker:1"),
            std::string::npos)
      << message;
  EXPECT_EQ(nccl.aborts(), 1);
}

// A peer that never comes to a collective: the others abort theirs at the deadline and
// name it, alive or ended, by the roll call.
TEST_F(NcclGroupTest, ACollectiveAPeerNeverComesToIsAbortedNamingThePeer) {
  for (const bool ended : {false, true}) {
    SCOPED_TRACE(ended ? "its process ended" : "alive");
    FakeNccl nccl(2);
    std::latch joined(2), finished(1);
    std::string message;
    const std::vector<std::string> errors = on_ranks(2, [&](int r) {
      auto s = store(r);
      auto group = std::make_unique<NcclGroup>(nccl.api, s, options(r, 2, 400ms));
      joined.arrive_and_wait();
      if (r == 1) {
        if (ended) {  // its connection to the store closes, as when its process ends
          group.reset();
          s.reset();
          finished.count_down();
        }
        finished.wait();
        return;
      }
      if (ended) finished.wait();
      std::vector<float> x{1, 2};
      message = message_of<Timeout>([&] { group->all_reduce(x.data(), x.size()); });
      if (!ended) finished.count_down();
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_NE(message.find("NCCL all-reduce #1 of 2 floats on cuda:0 among worker:0, worker:1: not done within 0.4 s, "
                           "so the communicator was aborted"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(ended ? "worker:1 (its process ended)" : "worker:1 (alive, but not answering)"),
              std::string::npos)
        << message;
    EXPECT_EQ(nccl.aborts(), 1);
  }
}

// Sums started beside the compute stream (gradient buckets during backward) are all done
// once finish_all_reduces returns; a peer that never starts its second is named within
// the timeout there.
TEST_F(NcclGroupTest, SumsStartedBesideTheComputeStreamAreWaitedForTogether) {
  FakeNccl nccl(2);
  nccl.still_queueing = true;  // each answers ncclInProgress: its end is marked once queued
  const std::vector<std::string> errors = on_ranks(2, [&](int r) {
    NcclGroup group(nccl.api, store(r), options(r, 2));
    std::vector<float> a{1.0f + static_cast<float>(r), 2}, b{10, 20.0f * static_cast<float>(r)};
    group.start_all_reduce(a.data(), a.size());
    group.start_all_reduce(b.data(), b.size());
    group.finish_all_reduces();
    EXPECT_EQ(a, (std::vector<float>{3, 4}));
    EXPECT_EQ(b, (std::vector<float>{20, 20}));
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(nccl.beside(), 4);
  EXPECT_EQ(nccl.records(), 4);

  FakeNccl lonely(2);
  std::string message;
  std::latch done(1);
  on_ranks(2, [&](int r) {
    NcclGroup group(lonely.api, store(r), options(r, 2, 400ms));
    std::vector<float> x{1, 2};
    group.start_all_reduce(x.data(), x.size());
    if (r == 1) {
      done.wait();  // alive, but never starts its second
      return;
    }
    group.start_all_reduce(x.data(), x.size());
    message = message_of<Timeout>([&] { group.finish_all_reduces(); });
    done.count_down();
  });
  EXPECT_NE(message.find("NCCL all-reduce #2 of 2 floats on cuda:0 among worker:0, worker:1: not done within 0.4 s"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("worker:1 (alive, but not answering)"), std::string::npos) << message;
}

// A rank of this process that failed cancels the others' groups: a wait under way aborts
// its communicator and says why, long before the timeout.
TEST_F(NcclGroupTest, ACancelledGroupAbortsItsWaitNamingTheFailedRank) {
  FakeNccl nccl(2);
  std::string message;
  std::unique_ptr<NcclGroup> first;
  std::latch started(1);
  on_ranks(2, [&](int r) {
    auto group = std::make_unique<NcclGroup>(nccl.api, store(r), options(r, 2, 30s));
    if (r == 1) {
      started.wait();
      first->cancel("replica 1 failed: out of memory");
      return;
    }
    std::vector<float> x{1, 2};
    first = std::move(group);
    try {
      first->start_all_reduce(x.data(), x.size());  // rank 1 never starts its own
    } catch (...) {
      started.count_down();  // rank 1 waits for it, whatever happened here
      throw;
    }
    started.count_down();
    message = message_of<PeerFailure>([&] { first->finish_all_reduces(); });
  });
  EXPECT_NE(message.find("NCCL all-reduce #1 of 2 floats on cuda:0 among worker:0, worker:1: cancelled, so the "
                         "communicator was aborted: replica 1 failed: out of memory"),
            std::string::npos)
      << message;
  EXPECT_EQ(nccl.aborts(), 1);
}

TEST_F(NcclGroupTest, NcclsErrorsBecomeDtrainsNamingTheCollective) {
  FakeNccl nccl(2);
  nccl.remote_error_at = 2;
  std::vector<std::string> messages(2);
  on_ranks(2, [&](int r) {
    NcclGroup group(nccl.api, store(r), options(r, 2));
    std::vector<float> x{1, 2};
    group.all_reduce(x.data(), x.size());
    messages[static_cast<std::size_t>(r)] = message_of<PeerFailure>([&] { group.all_reduce(x.data(), x.size()); });
    EXPECT_NE(message_of<InvalidArgument>([&] { group.all_reduce(x.data(), x.size()); }).find("used again"),
              std::string::npos);
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("NCCL all-reduce #2 of 2 floats on cuda:0 among worker:0, worker:1: NCCL says 'fake error 6' "
                     "(ncclResult_t 6); a peer failed or closed its connection; every other rank answered"),
              std::string::npos)
        << m;
  }
  FakeNccl refusing(1);
  refusing.usage_error_at = 1;
  NcclGroup alone(refusing.api, store(0), options(0, 1));
  std::vector<float> x{1};
  EXPECT_NE(message_of<InvalidArgument>([&] { alone.all_reduce(x.data(), 1); }).find("'fake error 5'"),
            std::string::npos);
  EXPECT_EQ(refusing.aborts(), 1);
}

}  // namespace
}  // namespace dtrain::comm
