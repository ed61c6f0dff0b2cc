// The machine's readings: the job's own CPU time (this process and the children it waited
// for) against another process's, told apart by whose descendant each is.
#include "dtrain/profile/machine.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

namespace dtrain::profile {
namespace {

double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Spins until this process has used `seconds` more of CPU time.
void burn(double seconds) {
  const double until = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) + seconds;
  volatile unsigned long x = 1;
  while (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) < until)
    for (int i = 0; i < 100000; ++i) x = x * 2862933555777941757UL + 3037000493UL;
}

const OtherProcess* find_other(const MachineUse& use, int pid) {
  const auto it = std::find_if(use.others.begin(), use.others.end(), [&](const OtherProcess& p) { return p.pid == pid; });
  return it == use.others.end() ? nullptr : &*it;
}

TEST(Machine, TheJobsCpuTimeIsItsOwnAndAnOrphansIsAnotherLoads) {
  const MachineSample first = sample_machine();
  if (!first.available) GTEST_SKIP() << "no /proc/stat here: the machine cannot be read";
  ASSERT_FALSE(first.cpus.empty());

  // A process that is no descendant of this one: forked twice, its parent gone, it burns
  // 0.3 s of CPU, says so on a pipe, and waits for the other pipe to close.
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    if (fork() == 0) {
      close(ready[0]);
      close(release[1]);
      const int self = static_cast<int>(getpid());
      burn(0.3);
      if (write(ready[1], &self, sizeof self) != sizeof self) _exit(1);
      char c;
      while (read(release[0], &c, 1) > 0) {
      }
      _exit(0);
    }
    _exit(0);
  }
  waitpid(middle, nullptr, 0);
  close(ready[1]);
  close(release[0]);
  const MachineSample before = sample_machine();
  // A child of this process burns 0.2 s and is waited for: the job's.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    burn(0.2);
    _exit(0);
  }
  int orphan = 0;
  ASSERT_EQ(read(ready[0], &orphan, sizeof orphan), static_cast<ssize_t>(sizeof orphan));
  waitpid(child, nullptr, 0);
  const MachineSample after = sample_machine();
  close(release[1]);
  close(ready[0]);

  const MachineUse use = machine_use(before, after);
  ASSERT_TRUE(use.measured);
  EXPECT_EQ(use.cores, static_cast<int>(after.cpus.size()));
  // The job: at least the child's 0.2 s; the orphan: its own CPU time, named.
  EXPECT_GE(use.job_cores * use.seconds, 0.2);
  const OtherProcess* other = find_other(use, orphan);
  ASSERT_NE(other, nullptr) << machine_words(use);
  EXPECT_EQ(other->name, "test_profile");
  EXPECT_GT(other->cores, 0.0);
  EXPECT_LE(other->cores * use.seconds, 0.3 + 0.05);
  EXPECT_EQ(find_other(use, child), nullptr) << machine_words(use);
  EXPECT_EQ(find_other(use, static_cast<int>(getpid())), nullptr) << machine_words(use);
  // Other processes' total counts the orphan.
  EXPECT_GE(use.other_cores, other->cores);
  EXPECT_NE(machine_words(use).find("'test_profile'"), std::string::npos) << machine_words(use);
}

TEST(Machine, WordsForCoresAndAMemoryProbeThatReads) {
  EXPECT_EQ(cores_words(0.5), "0.50 of a core");
  EXPECT_EQ(cores_words(1.0), "a whole core");
  EXPECT_EQ(cores_words(1.5), "1.50 cores");
  EXPECT_EQ(machine_words(MachineUse{}), "not measured");
  EXPECT_GT(last_level_cache_bytes(), 0u);
  const MemoryBandwidth m = probe_memory_bandwidth(0.02);
  EXPECT_GE(m.cores, 1);
  EXPECT_GT(m.one_core, 0.0);
  EXPECT_GT(m.each_of_all, 0.0);
}

}  // namespace
}  // namespace dtrain::profile
