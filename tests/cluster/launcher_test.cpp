// dtrain's local launcher: TF_CONFIG per task, prefixed output, and a failure that stops
// the rest and names the task that failed first (or the stopped task the others gave up
// waiting for), the job's deadline, and restarts of the whole job with the rule that ends
// them. Tasks are /bin/sh one-liners.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
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

// Restarts: each test bounds itself with the job's deadline, which covers every start.

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string last_line(const std::string& text) {
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) last = line;
  return last;
}

// Replaces the progress file as a program must: a temporary, then a rename.
const char* kWriteProgress = R"(echo "$1" > "$DTRAIN_PROGRESS_FILE.tmp" && mv "$DTRAIN_PROGRESS_FILE.tmp" "$DTRAIN_PROGRESS_FILE")";

TEST(LauncherRestarts, ATaskThatFailsOnItsFirstStartIsRestartedWithTheWholeJob) {
  LaunchOptions o;
  o.workers = 2;
  o.max_restarts = 3;
  o.timeout_seconds = 120;
  Launched r = run(o, std::string("echo \"start $DTRAIN_RESTART_COUNT token $DTRAIN_CLUSTER_TOKEN\"; ") +
                          "if [ \"$DTRAIN_RESTART_COUNT\" = 0 ]; then if " + kIsWorker1 +
                          "; then exit 3; fi; exec sleep 60; fi");
  EXPECT_EQ(r.result.exit_code, 0) << r.err;
  EXPECT_EQ(r.result.restarts, 1) << r.err;
  EXPECT_EQ(r.result.restart_causes, (std::vector<std::string>{"worker:1 exited with code 3"}));
  EXPECT_EQ(r.result.restart_detected_seconds.size(), 1u);
  EXPECT_EQ(r.result.restart_started_seconds.size(), 1u);
  EXPECT_TRUE(r.result.failed_task.empty()) << r.result.failed_task;
  EXPECT_NE(r.err.find("dtrain launch: worker:1 exited with code 3; restarting the job (restart 1 of 3)\n"),
            std::string::npos)
      << r.err;
  // Every task of the second start sees its restart count.
  EXPECT_NE(r.out.find("[worker:0] start 1 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[worker:1] start 1 "), std::string::npos) << r.out;
  // A fresh token per start, unless the launcher's environment gives one.
  auto token = [&](const std::string& start) {
    const std::string prefix = "[worker:1] start " + start + " token ";
    const auto at = r.out.find(prefix);
    return at == std::string::npos ? std::string("missing") : r.out.substr(at + prefix.size(), 32);
  };
  if (const char* given = std::getenv("DTRAIN_CLUSTER_TOKEN"); !given || !*given) {
    EXPECT_NE(token("0"), token("1")) << r.out;
  }
  EXPECT_NE(token("0"), "missing") << r.out;
  EXPECT_NE(token("1"), "missing") << r.out;
}

TEST(LauncherRestarts, AJobThatNeverReportsProgressIsRestartedMaxRestartsTimes) {
  LaunchOptions o;
  o.max_restarts = 2;
  o.timeout_seconds = 120;
  Launched r = run(o, "echo \"start $DTRAIN_RESTART_COUNT\"; exit 3");
  EXPECT_EQ(r.result.exit_code, 1) << r.err;
  EXPECT_EQ(r.result.restarts, 2) << r.err;
  EXPECT_EQ(r.result.restart_causes, (std::vector<std::string>(2, "worker:0 exited with code 3")));
  EXPECT_EQ(r.result.failed_task, "worker:0");
  EXPECT_EQ(r.result.how, "exited with code 3");
  EXPECT_EQ(count(r.err, "; restarting the job"), 2u) << r.err;
  EXPECT_NE(r.err.find("(restart 2 of 2)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[worker:0] start 2\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[worker:0] start 3"), std::string::npos) << r.out;
  EXPECT_EQ(last_line(r.err), "dtrain launch: failed: worker:0 exited with code 3") << r.err;
}

TEST(LauncherRestarts, AJobThatFailsAgainBeforeAnyNewProgressIsNotRestartedAgain) {
  LaunchOptions o;
  o.workers = 2;
  o.max_restarts = 5;
  o.timeout_seconds = 120;
  // worker:1 reports step 1 on the first start and fails; after the restart it fails
  // again without reporting anything new.
  Launched r = run(o, std::string("progress() { ") + kWriteProgress + "; }\nif " + kIsWorker1 +
                          "; then if [ \"$DTRAIN_RESTART_COUNT\" = 0 ]; then progress 1; fi; exit 3; fi; exec sleep 60");
  EXPECT_EQ(r.result.exit_code, 1) << r.err;
  EXPECT_EQ(r.result.restarts, 1) << r.err;
  EXPECT_EQ(r.result.failed_task, "worker:1");
  EXPECT_EQ(r.result.how, "exited with code 3");
  EXPECT_NE(r.err.find("dtrain launch: worker:1 failed again (exited with code 3) before the job made any progress "
                       "since restart 1; not restarting\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(last_line(r.err), "dtrain launch: failed: worker:1 exited with code 3") << r.err;
}

TEST(LauncherRestarts, AJobThatReportsProgressOnEveryStartIsRestartedUntilItSucceeds) {
  LaunchOptions o;
  o.max_restarts = 5;
  o.timeout_seconds = 120;
  Launched r = run(o, std::string("progress() { ") + kWriteProgress + "; }\necho \"file $DTRAIN_PROGRESS_FILE\"\n" +
                          "progress \"$DTRAIN_RESTART_COUNT\"; [ \"$DTRAIN_RESTART_COUNT\" -ge 3 ] || exit 3");
  EXPECT_EQ(r.result.exit_code, 0) << r.err;
  EXPECT_EQ(r.result.restarts, 3) << r.err;
  EXPECT_EQ(r.result.restart_started_seconds.size(), 3u);
  // The progress file lived in the launch's own directory, gone with the launch.
  const std::string prefix = "[worker:0] file ";
  const auto at = r.out.find(prefix);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::filesystem::path file = r.out.substr(at + prefix.size(), r.out.find('\n', at) - at - prefix.size());
  EXPECT_EQ(file.filename(), "progress") << r.out;
  EXPECT_FALSE(std::filesystem::exists(file.parent_path())) << file;
}

TEST(LauncherRestarts, ExitCode75IsAPreemptionAndIsRestarted) {
  LaunchOptions o;
  o.max_restarts = 1;
  o.timeout_seconds = 120;
  Launched r = run(o, "[ \"$DTRAIN_RESTART_COUNT\" = 1 ] || exit 75");
  EXPECT_EQ(r.result.exit_code, 0) << r.err;
  EXPECT_EQ(r.result.restart_causes,
            (std::vector<std::string>{"worker:0 exited with code 75 (preempted: saved a checkpoint and stopped)"}));
  // Without restarts it is still named as a preemption.
  LaunchOptions once;
  once.timeout_seconds = 120;
  Launched failed = run(once, "exit 75");
  EXPECT_EQ(failed.result.exit_code, 1);
  EXPECT_EQ(failed.result.how, "exited with code 75 (preempted: saved a checkpoint and stopped)");
}

TEST(LauncherRestarts, WithoutMaxRestartsAFailureEndsTheJobAndTasksSeeRestartCountZero) {
  LaunchOptions o;
  o.workers = 2;
  o.timeout_seconds = 120;
  Launched r = run(o, std::string("echo \"start $DTRAIN_RESTART_COUNT progress [$DTRAIN_PROGRESS_FILE]\"; if ") +
                          kIsWorker1 + "; then exit 3; fi; exec sleep 60");
  EXPECT_EQ(r.result.exit_code, 1) << r.err;
  EXPECT_EQ(r.result.restarts, 0);
  EXPECT_TRUE(r.result.restart_causes.empty());
  EXPECT_EQ(r.err.find("restart"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[worker:1] start 0 progress [" +
                       std::string(std::getenv("DTRAIN_PROGRESS_FILE") ? std::getenv("DTRAIN_PROGRESS_FILE") : "") +
                       "]\n"),
            std::string::npos)
      << r.out;
}

TEST(LauncherRestarts, TheLaunchersOwnSigtermStopsTheJobWithoutARestart) {
  LaunchOptions o;
  o.workers = 2;
  o.max_restarts = 3;
  o.timeout_seconds = 120;
  // worker:1 sends SIGTERM to its parent, the launcher, which passes it on to every task.
  Launched r = run(o, std::string("if ") + kIsWorker1 + "; then kill -TERM $PPID; fi; exec sleep 60");
  EXPECT_EQ(r.result.exit_code, 1) << r.err;
  EXPECT_EQ(r.result.restarts, 0) << r.err;
  EXPECT_EQ(r.result.how, "was killed by signal 15 (SIGTERM)") << r.err;
  EXPECT_NE(r.err.find("dtrain launch: passing SIGTERM to every task"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
}

TEST(LauncherRestarts, ANegativeMaxRestartsIsRefused) {
  LaunchOptions o;
  o.command = {"/bin/true"};
  o.max_restarts = -1;
  EXPECT_THROW(launch(o), InvalidArgument);
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
