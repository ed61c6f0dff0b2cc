// TF_CONFIG as TensorFlow reads it; each kind of mistake gives its own error naming the field.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dtrain/cluster/tf_config.h"
#include "dtrain/core/error.h"

namespace dtrain::cluster {
namespace {

TEST(TfConfig, ParsesAClusterAndTheTask) {
  const TfConfig c = parse_tf_config(R"({
    "cluster": {"chief": ["127.0.0.1:2222"], "worker": ["localhost:2222", "[::1]:2223"], "ps": ["127.0.0.1:2224"],
                "evaluator": ["127.0.0.1:2225"]},
    "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc", "environment": "cloud"})");
  EXPECT_EQ(c.task, (TaskId{"worker", 1}));
  EXPECT_EQ(c.cluster.num_tasks("worker"), 2);
  EXPECT_EQ(c.cluster.address({"worker", 1}).host, "::1");
  EXPECT_EQ(c.cluster.address({"worker", 1}).to_string(), "[::1]:2223");
  EXPECT_EQ(c.cluster.address({"ps", 0}).port, 2224);
  EXPECT_EQ(c.chief(), (TaskId{"chief", 0}));
  EXPECT_FALSE(c.is_chief());
  EXPECT_EQ(c.cluster.training_tasks(), (std::vector<TaskId>{{"chief", 0}, {"worker", 0}, {"worker", 1}}));
  EXPECT_EQ(c.cluster.tasks().size(), 5u);
  EXPECT_EQ(c.rpc_layer, "grpc");
  EXPECT_NO_THROW(c.require_chief("ParameterServerStrategy"));
}

TEST(TfConfig, WithoutAChiefWorkerZeroIsTheChief) {
  const TfConfig c = parse_tf_config(R"({"cluster": {"worker": ["a:1", "a:2"]}, "task": {"type": "worker", "index": 0}})");
  EXPECT_EQ(c.chief(), (TaskId{"worker", 0}));
  EXPECT_TRUE(c.is_chief());
  try {
    c.require_chief("ParameterServerStrategy");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ParameterServerStrategy needs a \"chief\" job"), std::string::npos) << e.what();
  }
}

TEST(TfConfig, UnsetMeansOneWorkerWithEverything) {
  ::unsetenv("TF_CONFIG");
  TfConfig c = tf_config_from_environment();
  EXPECT_FALSE(c.from_environment);
  EXPECT_EQ(c.cluster.num_tasks("worker"), 1);
  EXPECT_TRUE(c.is_chief());
  ::setenv("TF_CONFIG", R"({"cluster": {"worker": ["h:5"]}, "task": {"type": "worker", "index": 0}})", 1);
  c = tf_config_from_environment();
  EXPECT_TRUE(c.from_environment);
  EXPECT_EQ(c.cluster.address({"worker", 0}).host, "h");
  ::unsetenv("TF_CONFIG");
}

// Found by fuzz/fuzz_tf_config (fuzz/regressions/): a number too large for a double
// escaped as the JSON library's out_of_range instead of an error naming TF_CONFIG.
TEST(TfConfig, NumberTooLargeForADoubleIsInvalidJson) {
  for (const char* text : {"1e1270\"2", R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 1e400}})"}) {
    try {
      parse_tf_config(text);
      ADD_FAILURE() << "no error for " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("TF_CONFIG: invalid JSON"), std::string::npos) << e.what();
    }
  }
}

TEST(TfConfig, EachMistakeHasItsOwnError) {
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"cluster": )", "TF_CONFIG: invalid JSON"},
      {R"([1, 2])", "TF_CONFIG: expected a JSON object"},
      {R"({"task": {"type": "worker", "index": 0}})", "TF_CONFIG: cluster: missing"},
      {R"({"cluster": {"worker": ["a:1"]}})", "TF_CONFIG: task: missing"},
      {R"({"cluster": {}, "task": {"type": "worker"}})", "TF_CONFIG: cluster: has no jobs"},
      {R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}})", "cluster.worker: expected a list"},
      {R"({"cluster": {"trainer": ["a:1"]}, "task": {"type": "trainer"}})", "cluster.trainer: unknown job"},
      {R"({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker"}})",
       "cluster.worker[1]: address 'a:1' is also cluster.worker[0]"},
      {R"({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "worker"}})",
       "cluster.worker[0]: address 'a:1' is also cluster.chief[0]"},
      {R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}})", "cluster.chief: has 2 tasks; there can be only one chief"},
      {R"({"cluster": {"worker": ["a"]}, "task": {"type": "worker"}})", "cluster.worker[0]: 'a' is not host:port (no port)"},
      {R"({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker"}})", "the port must be in [1, 65535]"},
      {R"({"cluster": {"worker": [":80"]}, "task": {"type": "worker"}})", "(no host)"},
      {R"({"cluster": {"worker": [7]}, "task": {"type": "worker"}})", "cluster.worker[0]: expected \"host:port\", got an integer"},
      {R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}})", "cluster: has no chief and no worker"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}})",
       "task.index: 1 is out of range: cluster.worker has 1 task"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})", "task.index: -1 is out of range"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}})", "task.index: expected an integer"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps"}})", "task.type: 'ps' has no tasks in cluster"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "master"}})", "task.type: 'master' is not chief, worker"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}})", "task.type: expected a job name"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "id": 0}})", "task.id: unknown key"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}, "workers": 2})", "TF_CONFIG: workers: unknown key"},
  };
  for (const Case& c : cases) {
    try {
      parse_tf_config(c.json);
      ADD_FAILURE() << "no error for " << c.json;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.json << "\n  gave: " << e.what();
    }
  }
}

}  // namespace
}  // namespace dtrain::cluster
