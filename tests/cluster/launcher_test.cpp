// dtrain's local launcher: TF_CONFIG per task, prefixed output, and a failure that stops
// the rest and names the task that failed first (or the stopped task the others gave up
// waiting for), and the job's deadline. Tasks are /bin/sh one-liners.
#include <gtest/gtest.h>

#include <csignal>
#include <sstream>

#include "dtrain/cluster/launcher.h"
#include "dtrain/core/error.h"

namespace dtrain::cluster {
namespace {

struct Launched {
  LaunchResult result;
  std::string out, err;
};

Launched run(LaunchOptions o, const std::string& script) {
  std::ostringstream out, err;
  o.out = &out;
  o.err = &err;
  o.grace_seconds = 2;
  o.command = {"/bin/sh", "-c", script};
  Launched r;
  r.result = launch(o);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The shell test for "this task is worker:1" (nlohmann::json writes keys in order).
const char* kIsWorker1 = R"(case "$TF_CONFIG" in *'"index":1,"type":"worker"'*) true;; *) false;; esac)";

TEST(Launcher, EachTaskGetsItsTfConfigAndPrefixedOutput) {
  LaunchOptions o;
  o.workers = 2;
  o.chief = true;
  Launched r = run(o, "echo \"$TF_CONFIG\"; printf 'no newline at the end'");
  EXPECT_EQ(r.result.exit_code, 0) << r.err;
  std::vector<TaskId> seen;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const auto close = line.find("] ");
    ASSERT_EQ(line.front(), '[') << line;
    const std::string prefix = line.substr(1, close - 1), rest = line.substr(close + 2);
    if (rest == "no newline at the end") continue;
    const TfConfig c = parse_tf_config(rest);
    EXPECT_EQ(c.task.to_string(), prefix);
    EXPECT_EQ(c.cluster.num_tasks("worker"), 2);
    EXPECT_EQ(c.cluster.num_tasks("chief"), 1);
    EXPECT_EQ(c.cluster.address(c.task).host, "127.0.0.1");
    seen.push_back(c.task);
  }
  EXPECT_EQ(seen.size(), 3u) << r.out;
  EXPECT_NE(r.out.find("[worker:1] no newline at the end\n"), std::string::npos) << r.out;
}

TEST(Launcher, AFailingTaskStopsTheOthersAndIsNamed) {
  LaunchOptions o;
  o.workers = 3;
  Launched r = run(o, std::string("if ") + kIsWorker1 + "; then echo bye; exit 3; fi; exec sleep 60");
  EXPECT_EQ(r.result.exit_code, 1);
  EXPECT_EQ(r.result.failed_task, "worker:1");
  EXPECT_EQ(r.result.how, "exited with code 3");
  EXPECT_NE(r.err.find("dtrain launch: failed: worker:1 exited with code 3"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[worker:1] bye"), std::string::npos) << r.out;
}

TEST(Launcher, AKilledTaskIsNamedWithItsSignal) {
  LaunchOptions o;
  o.workers = 2;
  Launched r = run(o, std::string("if ") + kIsWorker1 + "; then kill -9 $$; fi; exec sleep 60");
  EXPECT_EQ(r.result.exit_code, 1);
  EXPECT_EQ(r.result.failed_task, "worker:1");
  EXPECT_EQ(r.result.how, "was killed by signal 9 (SIGKILL)");
}

TEST(Launcher, WhatATaskStartedStopsWithItAndCannotHoldTheLauncher) {
  LaunchOptions o;
  o.workers = 2;
  // worker:1 fails leaving a background child that holds the output pipe; worker:0's
  // own background child outlives it too. Both are in their task's process group.
  Launched r = run(o, std::string("sleep 60 & if ") + kIsWorker1 + "; then exit 5; fi; exec sleep 60");
  EXPECT_EQ(r.result.exit_code, 1);
  EXPECT_EQ(r.result.failed_task, "worker:1");
  // A task that exits cleanly while a child of its own keeps the pipe open.
  LaunchOptions one;
  Launched clean = run(one, "sleep 60 & echo done");
  EXPECT_EQ(clean.result.exit_code, 0) << clean.err;
  EXPECT_NE(clean.out.find("[worker:0] done"), std::string::npos) << clean.out;
}

TEST(Launcher, ParameterServersStopWhenTheTrainersAreDone) {
  LaunchOptions o;
  o.workers = 1;
  o.ps = 1;
  Launched r = run(o, R"(case "$TF_CONFIG" in *'"type":"ps"'*) exec sleep 60;; esac; echo trained)");
  EXPECT_EQ(r.result.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[worker:0] trained"), std::string::npos) << r.out;
}

TEST(Launcher, AProgramThatCannotRunIsAFailure) {
  LaunchOptions o;
  std::ostringstream out, err;
  o.out = &out;
  o.err = &err;
  o.command = {"/nonexistent/program"};
  const LaunchResult r = launch(o);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.how, "exited with code 127");
  EXPECT_NE(out.str().find("cannot run '/nonexistent/program'"), std::string::npos) << out.str();
  o.command.clear();
  EXPECT_THROW(launch(o), InvalidArgument);
}

TEST(Launcher, TheJobDeadlineStopsEveryTaskAndNamesTheOnesStillRunning) {
  LaunchOptions o;
  o.workers = 2;
  o.timeout_seconds = 1;
  Launched r = run(o, "exec sleep 1000");
  EXPECT_EQ(r.result.exit_code, 124) << r.err;
  EXPECT_TRUE(r.result.deadline_passed);
  EXPECT_EQ(r.result.still_running, (std::vector<std::string>{"worker:0", "worker:1"}));
  std::string last;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) last = line;
  EXPECT_EQ(last, "dtrain launch: failed: the job's deadline of 1 s passed; still running then: worker:0, worker:1")
      << r.err;
}

TEST(Launcher, AStoppedTaskIsNamedAsTheCauseNotTheTaskThatGaveUpWaitingForIt) {
  LaunchOptions o;
  o.workers = 2;
  o.timeout_seconds = 120;  // the test's own bound
  // worker:0 stops itself (SIGSTOP); worker:1 gives up once it sees, in /proc, a sibling
  // (a child of the launcher) that is stopped.
  const std::string sibling_stopped = R"(sibling_stopped() {
      for s in /proc/[0-9]*/status; do
        ppid=; state=
        while read -r key value rest; do
          case $key in PPid:) ppid=$value;; State:) state=$value;; esac
        done < "$s" 2>/dev/null
        [ "$ppid" = "$PPID" ] && [ "$state" = T ] && return 0
      done
      return 1
    })";
  Launched r = run(o, sibling_stopped + "\nif " + kIsWorker1 +
                          "; then until sibling_stopped; do :; done; echo gave up; exit 3; fi; kill -STOP $$");
  EXPECT_EQ(r.result.exit_code, 1) << r.err;
  EXPECT_EQ(r.result.failed_task, "worker:0") << r.err;
  EXPECT_EQ(r.result.how, "was stopped by signal " + std::to_string(SIGSTOP) +
                              " (SIGSTOP) and stopped answering (worker:1 exited with code 3 first)")
      << r.err;
  std::string last;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) last = line;
  EXPECT_EQ(last, "dtrain launch: failed: worker:0 " + r.result.how) << r.err;
}

TEST(Launcher, FreePortsAreDistinct) {
  const std::vector<int> ports = free_ports(8);
  for (std::size_t i = 0; i < ports.size(); ++i) {
    EXPECT_GT(ports[i], 0);
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(ports[i], ports[j]);
  }
}

}  // namespace
}  // namespace dtrain::cluster
