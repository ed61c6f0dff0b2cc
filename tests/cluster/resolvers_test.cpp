// Slurm's and Kubernetes' descriptions of a job as TF_CONFIG: host lists, tasks per node,
// rank ranges for the jobs, and errors that name the variable.
#include <gtest/gtest.h>

#include <map>

#include "common/error_message.h"
#include "dtrain/cluster/resolvers.h"

namespace dtrain::cluster {
namespace {

using testing::message_of;

Environment env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

std::vector<std::string> addresses(const ClusterSpec& spec, const std::string& job) {
  std::vector<std::string> out;
  for (int i = 0; i < spec.num_tasks(job); ++i) out.push_back(spec.address({job, i}).to_string());
  return out;
}

TEST(SlurmHostList, ExpandsRangesListsAndZeroPadding) {
  EXPECT_EQ(expand_hostlist("node[1-3,7],gpu5"), (std::vector<std::string>{"node1", "node2", "node3", "node7", "gpu5"}));
  EXPECT_EQ(expand_hostlist("n[08-10]"), (std::vector<std::string>{"n08", "n09", "n10"}));
  EXPECT_EQ(expand_hostlist("a[1-2]-ib,b"), (std::vector<std::string>{"a1-ib", "a2-ib", "b"}));
  EXPECT_EQ(expand_hostlist("localhost"), (std::vector<std::string>{"localhost"}));
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("3"), (std::vector<int>{3}));
  std::string m = message_of<InvalidArgument>([] { expand_hostlist("n[1-3"); });
  EXPECT_NE(m.find("'[' without ']'"), std::string::npos) << m;
  m = message_of<InvalidArgument>([] { expand_hostlist("n[3-1]"); });
  EXPECT_NE(m.find("range '3-1'"), std::string::npos) << m;
  m = message_of<InvalidArgument>([] { expand_tasks_per_node("2(x"); });
  EXPECT_NE(m.find("SLURM_STEP_TASKS_PER_NODE '2(x'"), std::string::npos) << m;
}

TEST(SlurmResolver, RanksFillEachHostInTurnAndTheJobsTakeThemInOrder) {
  const std::map<std::string, std::string> step{{"SLURM_STEP_NUM_TASKS", "5"},
                                                {"SLURM_STEP_NODELIST", "n[1-2],m"},
                                                {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
                                                {"CUDA_VISIBLE_DEVICES", "1"}};
  auto at = [&](int rank) {
    auto vars = step;
    vars["SLURM_PROCID"] = std::to_string(rank);
    return vars;
  };
  // Every task a worker by default, on ports from the port base per host.
  Resolved r = resolve_slurm({}, env_of(at(3)));
  EXPECT_EQ(r.config.task, (TaskId{"worker", 3}));
  EXPECT_EQ(addresses(r.config.cluster, "worker"),
            (std::vector<std::string>{"n1:8888", "n1:8889", "n2:8888", "n2:8889", "m:8888"}));
  EXPECT_EQ(r.devices, "1");
  EXPECT_TRUE(r.config.from_environment);
  // A chief, a ps and three workers by rank ranges.
  const SlurmOptions o{parse_jobs("chief:1,ps:1,worker:3", "--cluster-jobs"), 2000};
  r = resolve_slurm(o, env_of(at(0)));
  EXPECT_EQ(r.config.task, (TaskId{"chief", 0}));
  EXPECT_TRUE(r.config.is_chief());
  EXPECT_EQ(addresses(r.config.cluster, "ps"), (std::vector<std::string>{"n1:2001"}));
  EXPECT_EQ(addresses(r.config.cluster, "worker"), (std::vector<std::string>{"n2:2000", "n2:2001", "m:2000"}));
  EXPECT_EQ(resolve_slurm(o, env_of(at(4))).config.task, (TaskId{"worker", 2}));
  // The TF_CONFIG it gives reads back as the same cluster and task.
  const TfConfig back = parse_tf_config(to_tf_config_json(r.config));
  EXPECT_EQ(back.task, r.config.task);
  EXPECT_EQ(addresses(back.cluster, "worker"), addresses(r.config.cluster, "worker"));
}

TEST(SlurmResolver, WhatIsMissingOrDoesNotAddUpIsNamed) {
  std::map<std::string, std::string> vars{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "3"},
                                          {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  std::string m = message_of<InvalidArgument>([&] { resolve_slurm({}, env_of(vars)); });
  EXPECT_NE(m.find("places 4 task(s) but SLURM_STEP_NUM_TASKS is 3"), std::string::npos) << m;
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2,1";
  m = message_of<InvalidArgument>([&] { resolve_slurm({parse_jobs("ps:1,worker:1", "jobs"), 8888}, env_of(vars)); });
  EXPECT_NE(m.find("the jobs name 2 task(s) but the job has 3"), std::string::npos) << m;
  vars.erase("SLURM_PROCID");
  m = message_of<InvalidArgument>([&] { resolve_slurm({}, env_of(vars)); });
  EXPECT_NE(m.find("SLURM_PROCID is not set (srun sets it"), std::string::npos) << m;
  vars["SLURM_PROCID"] = "0";
  m = message_of<InvalidArgument>([&] { resolve_slurm({{{"worker", 2}, {"ps", -1}, {"worker", 2}}, 8888}, env_of(vars)); });
  EXPECT_NE(m.find("job 'ps' has no tasks"), std::string::npos) << m;
  m = message_of<InvalidArgument>([&] { resolve_slurm({{{"worker", 1}, {"ps", 1}, {"worker", 1}}, 8888}, env_of(vars)); });
  EXPECT_NE(m.find("job 'worker' is named twice"), std::string::npos) << m;
  // srun's cyclic distribution puts rank 1 on the second host: the addresses would be wrong.
  vars["SLURM_PROCID"] = "1";
  vars["SLURMD_NODENAME"] = "n2";
  vars["SLURM_LOCALID"] = "0";
  m = message_of<InvalidArgument>([&] { resolve_slurm({}, env_of(vars)); });
  EXPECT_NE(m.find("needs srun's block distribution"), std::string::npos) << m;
  vars["SLURMD_NODENAME"] = "n1";
  vars["SLURM_LOCALID"] = "1";
  EXPECT_EQ(resolve_slurm({}, env_of(vars)).config.task, (TaskId{"worker", 1}));
  m = message_of<InvalidArgument>([] { parse_jobs("ps=1", "--cluster-jobs"); });
  EXPECT_NE(m.find("--cluster-jobs: 'ps=1' is not job:count"), std::string::npos) << m;
}

TEST(IndexedJobResolver, PodsAreNamedByTheJobTheirIndexAndTheService) {
  Resolved r = resolve_k8s_indexed_job({.service = "train", .num_tasks = 3},
                                       env_of({{"JOB_COMPLETION_INDEX", "2"}, {"HOSTNAME", "mnist-2"}}));
  EXPECT_EQ(r.config.task, (TaskId{"worker", 2}));
  EXPECT_EQ(addresses(r.config.cluster, "worker"),
            (std::vector<std::string>{"mnist-0.train:2222", "mnist-1.train:2222", "mnist-2.train:2222"}));
  r = resolve_k8s_indexed_job({.jobs = parse_jobs("chief:1,worker:1,ps:1", "jobs"), .port = 5000},
                              env_of({{"JOB_COMPLETION_INDEX", "0"}, {"HOSTNAME", "lm-job-0"},
                                      {"DTRAIN_NUM_TASKS", "3"}, {"DTRAIN_SERVICE", "lm"}}));
  EXPECT_EQ(r.config.task, (TaskId{"chief", 0}));
  EXPECT_EQ(addresses(r.config.cluster, "ps"), (std::vector<std::string>{"lm-job-2.lm:5000"}));
  std::string m = message_of<InvalidArgument>([] {
    resolve_k8s_indexed_job({.service = "s", .num_tasks = 2}, env_of({{"JOB_COMPLETION_INDEX", "1"}, {"HOSTNAME", "box"}}));
  });
  EXPECT_NE(m.find("the hostname 'box' is not <job>-1"), std::string::npos) << m;
  m = message_of<InvalidArgument>([] { resolve_k8s_indexed_job({.service = "s"}, env_of({{"JOB_COMPLETION_INDEX", "0"}})); });
  EXPECT_NE(m.find("DTRAIN_NUM_TASKS is not set"), std::string::npos) << m;
}

}  // namespace
}  // namespace dtrain::cluster
