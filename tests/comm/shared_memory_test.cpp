// The shared-memory all-reduce, its ranks being threads of this process that meet through
// an in-memory store: sums rounded once, with the same bits everywhere, buffers larger
// than a slot, buffers summed where they lie, and peers that give up, leave or fall
// silent named by the others.
#include <gtest/gtest.h>

#include <gloo/rendezvous/hash_store.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>

#include "common/on_ranks.h"
#include "dtrain/comm/shared_memory.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<SharedMemoryGroup> join(gloo::rendezvous::Store& store, int rank, int size,
                                        std::chrono::milliseconds timeout = 20s) {
  std::string why_not;
  auto group = SharedMemoryGroup::join(store, rank, size, timeout, testing::task_names(size), "", why_not);
  if (!group) throw Error("no shared memory between threads of one process: " + why_not);
  return group;
}

// Segments this process made that are still named in /dev/shm.
int named_segments() {
  const std::string mine = "dtrain-" + std::to_string(::getpid()) + "-";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    n += entry.path().filename().string().rfind(mine, 0) == 0;
  return n;
}

using testing::on_ranks;

// Values no sum of which is exact, different on each rank.
float value(std::size_t i, int rank) {
  return static_cast<float>(std::sin(static_cast<double>(i) * 0.61 + rank * 1.7) * (1.0 + static_cast<double>(i % 13)));
}

// What every rank must get: the ranks' values added and rounded once to float32.
float rounded_sum(std::size_t i, int size) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += value(i, r);
  return static_cast<float>(sum);
}

class SharedMemorySizes : public ::testing::TestWithParam<int> {};

TEST_P(SharedMemorySizes, BuffersLargerThanASlotAreSummedWithOneRounding) {
  const int size = GetParam();
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(size));
  std::size_t count = 0;
  const auto errors = on_ranks(size, [&](int r) {
    auto group = join(store, r, size);
    // Two slots and a bit: three pieces, the last one short and not a whole cache line.
    const std::size_t n = 2 * group->slot_bytes() / sizeof(float) + 37;
    if (r == 0) count = n;
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value(i, r);
    group->allreduce(v.data(), n);
    results[static_cast<std::size_t>(r)] = std::move(v);
  });
  for (int r = 0; r < size; ++r) ASSERT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += results[0][i] != rounded_sum(i, size);
  EXPECT_EQ(wrong, 0u);
  for (int r = 1; r < size; ++r) EXPECT_EQ(results[static_cast<std::size_t>(r)], results[0]) << "rank " << r;
}

TEST_P(SharedMemorySizes, SharedBuffersAreSummedWhereTheyLie) {
  // Two pieces of one buffer, summed one after the other (as two gradient buckets are)
  // with a sum through the slots between them; what lies outside them is left alone.
  const int size = GetParam();
  constexpr std::size_t kCount = 100003, kSplit = 40000, kEnd = 100000;
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> copies(static_cast<std::size_t>(size));
  const auto errors = on_ranks(size, [&](int r) {
    auto group = join(store, r, size);
    std::string why_not;
    const std::shared_ptr<SharedBuffer> buffer = group->buffer(store, kCount, "", why_not);
    if (!buffer) throw Error("no buffer: " + why_not);
    float* mine = buffer->local();
    for (std::size_t i = 0; i < kCount; ++i) mine[i] = value(i, r);
    group->allreduce(*buffer, 0, kSplit);
    std::vector<float> v(1001, static_cast<float>(r));
    group->allreduce(v.data(), v.size());
    if (v != std::vector<float>(1001, static_cast<float>(size * (size - 1) / 2))) throw Error("wrong slot sum");
    group->allreduce(*buffer, kSplit, kEnd - kSplit);
    copies[static_cast<std::size_t>(r)].assign(mine, mine + kCount);
  });
  EXPECT_EQ(named_segments(), 0) << "a segment's name was left in /dev/shm";
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    const std::vector<float>& copy = copies[static_cast<std::size_t>(r)];
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kCount; ++i) wrong += copy[i] != (i < kEnd ? rounded_sum(i, size) : value(i, r));
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SharedMemorySizes, ::testing::Values(1, 2, 3, 4));

TEST(SharedMemory, OneRankThatRefusesMakesEveryRankKeepToTcp) {
  gloo::rendezvous::HashStore store;
  std::vector<std::string> why(3);
  std::vector<int> attached(3, -1);
  const auto errors = on_ranks(3, [&](int r) {
    std::string why_not;
    auto group = SharedMemoryGroup::join(store, r, 3, 20s, testing::task_names(3), r == 1 ? "TCP asked for" : "", why_not);
    attached[static_cast<std::size_t>(r)] = group != nullptr;
    why[static_cast<std::size_t>(r)] = why_not;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
    EXPECT_EQ(attached[static_cast<std::size_t>(r)], 0) << "rank " << r;
    EXPECT_EQ(why[static_cast<std::size_t>(r)], "worker:1: TCP asked for") << "rank " << r;
  }
  EXPECT_EQ(named_segments(), 0) << "a segment's name was left in /dev/shm";
}

TEST(SharedMemory, OrphanedNamesOfDeadJobsAreRemoved) {
  // A job killed while setting up leaves its segment's name; the next job removes it, but
  // not a name whose creator is alive here, nor one whose creator (in another process
  // namespace, say) still holds its lock.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // a pid with no process behind it
  const std::string orphan = "/dtrain-" + std::to_string(child) + "-abc1";
  const std::string locked = "/dtrain-" + std::to_string(child) + "-abc2";
  const std::string alive = "/dtrain-" + std::to_string(::getppid()) + "-abc3";
  std::vector<int> fds;
  for (const std::string& name : {orphan, locked, alive}) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << name;
    fds.push_back(fd);
  }
  ASSERT_EQ(::flock(fds[1], LOCK_EX), 0);
  gloo::rendezvous::HashStore store;
  join(store, 0, 1);
  auto named = [](const std::string& name) { return std::filesystem::exists("/dev/shm" + name); };
  EXPECT_FALSE(named(orphan));
  EXPECT_TRUE(named(locked));
  EXPECT_TRUE(named(alive));
  for (const std::string& name : {orphan, locked, alive}) ::shm_unlink(name.c_str());
  for (int fd : fds) ::close(fd);
}

TEST(SharedMemory, APeerThatGivesUpOrLeavesIsNamedByTheOthers) {
  // Rank 2 stops after one all-reduce: it gives up (as a rank does whose collective
  // failed) or leaves (its group goes with it); the others, in the next one, name it.
  for (const std::string how : {"gave up (its communication failed or its step was abandoned)", "left the group"}) {
    gloo::rendezvous::HashStore store;
    const auto errors = on_ranks(3, [&](int r) {
      auto group = join(store, r, 3);
      std::vector<float> v(1000, 1.0f);
      group->allreduce(v.data(), v.size());
      if (r == 2) {
        if (how.rfind("gave up", 0) == 0) group->shutdown();
        return;
      }
      group->allreduce(v.data(), v.size());
    });
    EXPECT_EQ(errors[2], "");
    for (int r : {0, 1}) {
      const std::string& e = errors[static_cast<std::size_t>(r)];
      EXPECT_NE(e.find("worker:2 " + how + " while worker:" + std::to_string(r) +
                       " waited for it to start the all-reduce"),
                std::string::npos)
          << e;
    }
  }
}

TEST(SharedMemory, ASilentPeerIsATimeoutNamingIt) {
  gloo::rendezvous::HashStore store;
  std::atomic<bool> timed_out{false};
  const auto errors = on_ranks(2, [&](int r) {
    auto group = join(store, r, 2, 1000ms);
    std::vector<float> v(1000, 1.0f);
    if (r == 1) {
      // Present, but silent until the other has given up on it.
      timed_out.wait(false);
      return;
    }
    try {
      group->allreduce(v.data(), v.size());
    } catch (...) {
      timed_out = true;
      timed_out.notify_all();
      throw;
    }
    timed_out = true;
    timed_out.notify_all();
  });
  EXPECT_NE(errors[0].find("worker:0 waited 1 s for worker:1 to start the all-reduce"), std::string::npos)
      << errors[0];
}

}  // namespace
}  // namespace dtrain::comm
