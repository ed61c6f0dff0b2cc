// Cluster resolvers: the TF_CONFIG of this process from what a scheduler tells it, as
// TensorFlow's SlurmClusterResolver reads Slurm, and from a Kubernetes indexed Job.
//
// Slurm: a job step's tasks (srun -n N) are ranked by SLURM_PROCID; SLURM_STEP_NODELIST
// names their hosts in Slurm's compressed form ("node[01-03,7],gpu5") and
// SLURM_STEP_TASKS_PER_NODE how many run on each ("2(x3),1"), ranks filling each host in
// turn (Slurm's block distribution). The ranks are given out to the jobs in the order
// `jobs` names them ({"ps", 1}, {"worker", 2}: rank 0 is ps 0, ranks 1 and 2 workers 0
// and 1); without jobs, every task is a worker. The tasks of one host listen on
// port_base, port_base + 1, ...
//
// Kubernetes: an indexed Job's pods get JOB_COMPLETION_INDEX (0, 1, ...) and, under a
// headless service, the names <job>-<index>.<service>; the job's name comes from the pod's
// hostname (<job>-<index>) unless given, the number of tasks from the options (a Job's
// completions) or DTRAIN_NUM_TASKS. The Kubeflow training operator's TFJob sets TF_CONFIG
// itself, which needs no resolver.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/cluster/tf_config.h"

namespace dtrain::cluster {

// Slurm's compressed host list as names: "n[1-3,07],m" -> n1 n2 n3 n07 m; a range keeps
// its first bound's zero padding ("n[08-10]" -> n08 n09 n10).
std::vector<std::string> expand_hostlist(std::string_view list);
// SLURM_STEP_TASKS_PER_NODE as one count per host: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_tasks_per_node(std::string_view text);

// The environment a resolver reads: std::getenv unless a test gives another.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// Jobs and their task counts, in the order ranks are given out.
using Jobs = std::vector<std::pair<std::string, int>>;
// "ps:1,worker:2" as Jobs; InvalidArgument naming `what` otherwise.
Jobs parse_jobs(std::string_view text, const std::string& what);

struct Resolved {
  TfConfig config;           // the cluster and this process's task (from_environment: true)
  std::string devices;       // the GPUs this task may use (CUDA_VISIBLE_DEVICES), "" where none is set
};

struct SlurmOptions {
  Jobs jobs;  // empty: every task a worker
  int port_base = 8888;
};
// InvalidArgument naming the variable that is missing or malformed, or the jobs that do not
// add up to the step's tasks.
Resolved resolve_slurm(const SlurmOptions& options, const Environment& env = process_environment());

struct IndexedJobOptions {
  std::string service;   // the headless service's name (DTRAIN_SERVICE where empty)
  std::string job_name;  // empty: the hostname without its "-<index>"
  int num_tasks = 0;     // 0: DTRAIN_NUM_TASKS
  Jobs jobs;             // empty: every task a worker
  int port = 2222;
};
Resolved resolve_k8s_indexed_job(const IndexedJobOptions& options, const Environment& env = process_environment());

// The TF_CONFIG JSON of a resolved task.
std::string to_tf_config_json(const TfConfig& config);

}  // namespace dtrain::cluster
