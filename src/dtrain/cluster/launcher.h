// `dtrain launch`: a whole cluster on this machine, for development and tests. Each task
// is a process with TF_CONFIG set to its place in a cluster of free loopback ports (and
// DTRAIN_CLUSTER_TOKEN, fresh per launch unless set; OMP_NUM_THREADS, the cores divided
// by the chief and worker tasks, unless set); every
// line of its output is prefixed with its task ("[worker:1] ..."); SIGINT and SIGTERM are
// passed on to every task. When a task fails (a non-zero exit or a signal), the others
// are stopped (SIGTERM, then SIGKILL after a grace period) and the launcher says which
// task failed first and how (or which task was stopped, SIGSTOP or a debugger, when the
// others failed waiting for it). An optional job deadline stops every task and names the
// ones still running. Parameter servers run until the other tasks are done. Each
// task runs in its own process group, and signals go to the group, so what a task started
// (a shell's children) stops with it.
//
// Restarts (LaunchOptions::max_restarts): after a failure the whole job starts again, with
// fresh ports and token, as torchrun does; it is not elastic (the cluster keeps its size)
// and no task is restarted alone (parameter-server jobs aside: below). Every task gets
// DTRAIN_RESTART_COUNT (0 on the first start, k on the k-th restart, as torchrun's
// TORCHELASTIC_RESTART_COUNT) and, when restarts are allowed, DTRAIN_PROGRESS_FILE: a file
// in a private directory of the launch that a program making progress replaces atomically
// (write a temporary, rename it) with a line such as its last checkpoint's step. Once a
// program has written it, a restarted job that fails again before the file changes is not
// restarted any more: it would only fail the same way. A task that exits with code 75
// (EX_TEMPFAIL) was preempted: it saved a checkpoint and stopped, and the job may be
// restarted from there.
//
// A parameter-server job (--ps with a chief) is the exception: a worker that fails does
// not stop it, since the chief runs the lost worker's closures on the others. The
// launcher says so and starts that worker alone again, with its TF_CONFIG, while restarts
// are left (each counts as one); it rejoins the job. The job stops when the chief or a ps
// fails, or when its last worker does with no restart left.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "dtrain/cluster/tf_config.h"

namespace dtrain::cluster {

struct LaunchOptions {
  int workers = 1;
  // An elastic job (--workers MIN:MAX, `workers` being MAX): no chief and no ps; the
  // launcher serves the workers' rendezvous store (the TCP store, which outlives any of
  // them) and sets DTRAIN_ELASTIC, DTRAIN_ELASTIC_STORE and DTRAIN_ELASTIC_ID ("worker:K")
  // in each worker's environment instead of TF_CONFIG (MultiWorkerMirroredStrategy reads
  // them). A worker that fails does not stop the job: the others go on without it while
  // they are at least MIN, and it starts again alone while restarts are left (each counts
  // as one), joining at the others' next commit. 0: a fixed job.
  int min_workers = 0;
  // An elastic job's choice when its workers change (DTRAIN_ELASTIC_KEEP): "global_batch"
  // (each global batch keeps its size) or "worker_batch" (each worker keeps its batch; the
  // global batch and the learning rate follow the workers). Empty: the strategy's default.
  std::string elastic_keep;
  int ps = 0;
  bool chief = false;
  // The program and its arguments, run once per task.
  std::vector<std::string> command;
  // Each task's OMP_NUM_THREADS: 0 leaves a value the environment sets, and otherwise gives
  // every training task its share of the cores.
  int threads_per_task = 0;
  // Seconds between SIGTERM and SIGKILL when stopping tasks.
  double grace_seconds = 5.0;
  // The job's deadline, in seconds from the start (0: none). When it passes, every task is
  // stopped as after a failure and the launcher says so, naming the tasks still running.
  double timeout_seconds = 0;
  // How many times the whole job may be started again after a task fails (0: never). The
  // launcher's own SIGINT or SIGTERM and the deadline, which covers every start together,
  // end the job without a restart.
  int max_restarts = 0;
  std::ostream* out = nullptr;  // the tasks' prefixed output; default std::cout
  std::ostream* err = nullptr;  // the launcher's own messages; default std::cerr
};

struct LaunchResult {
  int exit_code = 0;        // 0 when every task succeeded; 124 when the deadline passed
  std::string failed_task;  // "worker:1", empty when none failed
  // "exited with code 3", "exited with code 75 (preempted: saved a checkpoint and stopped)",
  // "was killed by signal 9 (SIGKILL)", or for a task that the
  // kernel reported stopped while the others failed, "was stopped by signal 19 (SIGSTOP)
  // and stopped answering": a stopped task is the cause, whoever noticed it first.
  std::string how;
  bool deadline_passed = false;
  std::vector<std::string> still_running;  // when the deadline passed
  int restarts = 0;                        // how many times the job was started again
  std::vector<std::string> restart_causes;  // per restart: "worker:1 was killed by signal 9 (SIGKILL)"
  // Per restart, seconds from the launch's start: when the failure was noticed, and when
  // the new tasks had all been started (for benchmarks of the time a restart costs).
  std::vector<double> restart_detected_seconds, restart_started_seconds;
};

// The TF_CONFIG cluster for these tasks on 127.0.0.1 ports (from free_ports()).
ClusterSpec local_cluster(int workers, int ps, bool chief, const std::vector<int>& ports);
// `count` TCP ports on 127.0.0.1 that were free when asked.
std::vector<int> free_ports(int count);
// TF_CONFIG's JSON for `task` in `cluster`.
std::string tf_config_json(const ClusterSpec& cluster, const TaskId& task);

LaunchResult launch(const LaunchOptions& options);

}  // namespace dtrain::cluster
