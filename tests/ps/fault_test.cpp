// ParameterServerStrategy's faults with real processes on 127.0.0.1 (the task program is
// ps_task.cpp): a worker SIGKILLed between its push and its answer, and a worker stopped
// (hung) before it pushes. Training finishes on the other worker, the lost closure runs
// again, and each closure's gradients count exactly once; the tasks the coordinator leaves
// stop by themselves.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "common/spawn.h"
#include "common/temp_dir.h"
#include "dtrain/cluster/launcher.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

// The task program: DTRAIN_PS_TASK from the environment where set (the GPU
// check runs these tests from its bundle), else the one this build made.
std::string task_program() {
  const char* given = std::getenv("DTRAIN_PS_TASK");
  return given != nullptr && *given != '\0' ? given : DTRAIN_PS_TASK;
}

using Clock = std::chrono::steady_clock;

struct Process {
  std::string task;
  pid_t pid = 0;
  int pidfd = -1;
  int status = -1;  // from waitpid; -1: had to be killed
  std::string log;
};

class ParameterServerFaults : public testing::TempDirTest {
 protected:
  // Starts every task of a cluster (chief, `workers`, `num_ps`) running ps_task with
  // `args`; waits at most `limit` seconds for the chief, then at most `limit` more for the
  // tasks it leaves to stop by themselves, except `abandoned` (killed or stopped by the
  // test's plan), which is killed. With `restart_args`, `abandoned` is instead waited for
  // (it kills itself) and started again with those arguments, as a task that must end well.
  std::map<std::string, Process> run(int workers, int num_ps, std::vector<std::string> args,
                                     std::string abandoned, double limit = 60,
                                     std::vector<std::string> restart_args = {}) {
    const int total = 1 + workers + num_ps;
    const cluster::ClusterSpec spec = cluster::local_cluster(workers, num_ps, true, cluster::free_ports(total));
    args.insert(args.begin(), task_program());
    std::map<std::string, Process> tasks;
    for (const cluster::TaskId& id : spec.tasks()) {
      Process p;
      p.task = id.to_string();
      const std::string log = (dir_ / (p.task + ".log")).string();
      const std::string tf_config = cluster::tf_config_json(spec, id);
      p.pid = testing::spawn(
          args, {{"TF_CONFIG", tf_config}, {"DTRAIN_CLUSTER_TOKEN", "ps-fault-test"}, {"OMP_NUM_THREADS", "1"}}, log);
      p.pidfd = static_cast<int>(syscall(SYS_pidfd_open, p.pid, 0));
      tasks[p.task] = p;
    }
    if (!restart_args.empty()) {
      Process& first = tasks.at(abandoned);
      wait_for({abandoned}, tasks, limit);
      restarted_status_ = first.status;
      restart_args.insert(restart_args.begin(), task_program());
      cluster::TaskId id{abandoned.substr(0, abandoned.find(':')), std::stoi(abandoned.substr(abandoned.find(':') + 1))};
      first.pid = testing::spawn(restart_args,
                                 {{"TF_CONFIG", cluster::tf_config_json(spec, id)},
                                  {"DTRAIN_CLUSTER_TOKEN", "ps-fault-test"},
                                  {"OMP_NUM_THREADS", "1"}},
                                 (dir_ / (abandoned + ".log")).string());
      first.pidfd = static_cast<int>(syscall(SYS_pidfd_open, first.pid, 0));
      first.status = -1;
      abandoned.clear();
    }
    wait_for({"chief:0"}, tasks, limit);
    std::vector<std::string> rest;
    for (auto& [name, p] : tasks)
      if (name != "chief:0" && name != abandoned) rest.push_back(name);
    wait_for(rest, tasks, limit);
    for (auto& [name, p] : tasks) {
      if (p.pidfd >= 0) wait_for({name}, tasks, 0);  // ended by itself: keep its status
      if (p.pidfd >= 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
        ::close(p.pidfd);
        if (name != abandoned) ADD_FAILURE() << name << " was still running after " << limit << " s";
      }
      std::ifstream in(dir_ / (name + ".log"));
      std::ostringstream text;
      text << in.rdbuf();
      p.log = text.str();
    }
    return tasks;
  }

  static void wait_for(const std::vector<std::string>& names, std::map<std::string, Process>& tasks, double limit) {
    const auto start = Clock::now();
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Process*> waiting;
      for (const std::string& n : names) {
        Process& p = tasks.at(n);
        if (p.pidfd < 0) continue;
        fds.push_back(pollfd{p.pidfd, POLLIN, 0});
        waiting.push_back(&p);
      }
      if (waiting.empty()) return;
      const double left = limit - std::chrono::duration<double>(Clock::now() - start).count();
      ::poll(fds.data(), fds.size(), std::max(0, static_cast<int>(left * 1000)));
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        waitpid(waiting[i]->pid, &waiting[i]->status, 0);
        ::close(waiting[i]->pidfd);
        waiting[i]->pidfd = -1;
      }
      if (left <= 0) return;  // limit 0: one look
    }
  }

  int restarted_status_ = -1;  // how the restarted task's first process ended

  static bool exited_ok(const Process& p) { return p.status >= 0 && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0; }

  // "stats scheduled=40 ..." from the chief's log, as numbers.
  static std::map<std::string, long long> stats(const std::string& log) {
    std::map<std::string, long long> out;
    const auto at = log.find("stats ");
    if (at == std::string::npos) return out;
    std::istringstream line(log.substr(at + 6, log.find('\n', at) - at - 6));
    for (std::string kv; line >> kv;) {
      const auto eq = kv.find('=');
      out[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
    }
    return out;
  }
};

// The same with the workers on a GPU (their gradients and the loss they return copied to
// the host): the killed one is a GPU worker.
TEST_F(ParameterServerFaults, AWorkerKilledAfterItsPushHasItsClosureRunAgainAndCountedOnce) {
  constexpr int kSteps = 40;
  for (const char* gpu : {"0", "1"}) {
    SCOPED_TRACE(std::string("--gpu ") + gpu);
    // ssp(0) makes the workers take turns, so worker:1 reaches its planted fault whatever
    // the load (async, worker:0 may take every closure first).
    auto tasks = run(2, 1,
                     {"--steps", std::to_string(kSteps), "--ssp", "0", "--kill-task", "worker:1", "--fault-at", "2",
                      "--gpu", gpu},
                     "worker:1");
    const Process& chief = tasks.at("chief:0");
    ASSERT_TRUE(exited_ok(chief)) << chief.log;
    const Process& killed = tasks.at("worker:1");
    EXPECT_TRUE(WIFSIGNALED(killed.status) && WTERMSIG(killed.status) == SIGKILL) << killed.log;
    auto s = stats(chief.log);
    EXPECT_EQ(s["scheduled"], kSteps) << chief.log;
    EXPECT_EQ(s["finished"], kSteps);
    EXPECT_EQ(s["lost"], 1);
    EXPECT_EQ(s["rerun"], 1);
    // The killed worker's push was applied; the closure's second run was refused: each of
    // the 40 closures counted once.
    EXPECT_EQ(s["applied"], kSteps);
    EXPECT_EQ(s["refused"], 1);
    // The coordinator's end stopped the others.
    EXPECT_TRUE(exited_ok(tasks.at("worker:0"))) << tasks.at("worker:0").log;
    EXPECT_TRUE(exited_ok(tasks.at("ps:0"))) << tasks.at("ps:0").log;
  }
}

// A worker that comes back rejoins: started again after a SIGKILL, it answers the
// coordinator, pulls the current weights with its first closure and takes closures again.
// Under ssp(0) the other worker cannot run ahead of it, so it takes about half of the
// closures scheduled after it is back.
TEST_F(ParameterServerFaults, AWorkerStartedAgainAfterASigkillRejoinsAndTakesClosures) {
  constexpr int kSteps = 20, kThen = 20;
  auto tasks = run(2, 1,
                   {"--steps", std::to_string(kSteps), "--then-steps", std::to_string(kThen), "--ssp", "0",
                    "--kill-task", "worker:1", "--fault-at", "3"},
                   "worker:1", 60, {"--ssp", "0"});
  EXPECT_TRUE(WIFSIGNALED(restarted_status_) && WTERMSIG(restarted_status_) == SIGKILL);
  const Process& chief = tasks.at("chief:0");
  ASSERT_TRUE(exited_ok(chief)) << chief.log;
  auto s = stats(chief.log);
  EXPECT_EQ(s["finished"], kSteps + kThen) << chief.log;
  EXPECT_EQ(s["lost"], 1);
  EXPECT_EQ(s["applied"], kSteps + kThen);  // each closure counted once
  // Two closures before the kill; after the rejoin, at least kThen / 2 - 1 of the rest.
  EXPECT_GE(s["worker1"], 2 + kThen / 2 - 1) << chief.log;
  EXPECT_EQ(s["worker0"] + s["worker1"], kSteps + kThen);
  EXPECT_TRUE(exited_ok(tasks.at("worker:1"))) << tasks.at("worker:1").log;
  EXPECT_TRUE(exited_ok(tasks.at("worker:0"))) << tasks.at("worker:0").log;
}

TEST_F(ParameterServerFaults, AHungWorkerIsFoundByItsMissedHeartbeatsAndItsClosureRunsElsewhere) {
  constexpr int kSteps = 30;
  for (const char* gpu : {"0", "1"}) {  // a hung CPU worker, then a hung GPU worker
    SCOPED_TRACE(std::string("--gpu ") + gpu);
    auto tasks = run(2, 1,
                     {"--steps", std::to_string(kSteps), "--ssp", "0", "--stop-task", "worker:1", "--fault-at", "2",
                      "--worker-timeout", "1.5", "--gpu", gpu},
                     "worker:1");
    const Process& chief = tasks.at("chief:0");
    ASSERT_TRUE(exited_ok(chief)) << chief.log;
    auto s = stats(chief.log);
    EXPECT_EQ(s["finished"], kSteps) << chief.log;
    EXPECT_EQ(s["lost"], 1);
    EXPECT_EQ(s["rerun"], 1);
    EXPECT_EQ(s["applied"], kSteps);
    EXPECT_EQ(s["refused"], 0);
    EXPECT_TRUE(exited_ok(tasks.at("worker:0"))) << tasks.at("worker:0").log;
    EXPECT_TRUE(exited_ok(tasks.at("ps:0"))) << tasks.at("ps:0").log;
  }
}

TEST_F(ParameterServerFaults, TasksWhoseCoordinatorDiedStopByThemselvesNamingIt) {
  // The chief SIGKILLs itself after 5 closures: nobody tells the others the job is over.
  auto tasks = run(2, 1, {"--steps", "10", "--chief-dies-after", "5", "--coordinator-timeout", "3"}, "chief:0");
  const Process& chief = tasks.at("chief:0");
  EXPECT_TRUE(WIFSIGNALED(chief.status) && WTERMSIG(chief.status) == SIGKILL) << chief.log;
  for (const char* name : {"worker:0", "worker:1", "ps:0"}) {
    const Process& p = tasks.at(name);
    EXPECT_TRUE(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 1) << name << ": " << p.log;
    EXPECT_NE(p.log.find("the coordinator (chief:0 at 127.0.0.1:"), std::string::npos) << p.log;
    EXPECT_NE(p.log.find("has not been heard from for 3 s"), std::string::npos) << p.log;
  }
}

}  // namespace
}  // namespace dtrain
