// TF_CONFIG, read as TensorFlow reads it: which tasks make up the cluster and which one
// this process is.
//
//   {"cluster": {"chief": ["host:2222"], "worker": ["host:2223", "host:2224"],
//                "ps": ["host:2225"], "evaluator": ["host:2226"]},
//    "task": {"type": "worker", "index": 1}}
//
// Everything is validated up front; each error names the field and the problem
// ("TF_CONFIG: cluster.worker[1]: address 'h:2223' is also cluster.chief[0]").
// Without TF_CONFIG a process is a single worker with everything in it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::cluster {

struct Address {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
  std::string to_string() const;  // "host:port", "[::1]:port"
};

// "host:port" or "[v6]:port"; `field` names where it came from, for the error.
Address parse_address(const std::string& text, const std::string& field);

struct TaskId {
  std::string type;  // "chief", "worker", "ps" or "evaluator"
  int index = 0;
  std::string to_string() const;  // "worker:1"
  friend bool operator==(const TaskId&, const TaskId&) = default;
};

class ClusterSpec {
 public:
  // The job names TensorFlow's strategies know, in this order.
  static const std::vector<std::string>& job_names();

  bool empty() const { return jobs_.empty(); }
  int num_tasks(const std::string& type) const;
  const Address& address(const TaskId& task) const;
  const std::map<std::string, std::vector<Address>>& jobs() const { return jobs_; }
  // Every task, in job_names() order and by index.
  std::vector<TaskId> tasks() const;
  // The tasks that train together: the chief (if any) and the workers, chief first.
  std::vector<TaskId> training_tasks() const;
  // Appends a task to a job (no validation: parse_tf_config validates).
  void add_task(const std::string& type, Address address) { jobs_[type].push_back(std::move(address)); }

 private:
  std::map<std::string, std::vector<Address>> jobs_;
};

struct TfConfig {
  ClusterSpec cluster;
  TaskId task{"worker", 0};
  std::string rpc_layer;    // as given ("grpc"), not used
  std::string environment;  // as given ("cloud"), not used
  bool from_environment = false;  // false: no TF_CONFIG, the single-process default

  // The chief task, or worker 0 when the cluster has no chief (TensorFlow's rule).
  TaskId chief() const;
  bool is_chief() const { return task == chief(); }
  // Throws InvalidArgument naming TF_CONFIG when the cluster has no "chief" job
  // (ParameterServerStrategy needs one); `who` says which strategy asked.
  void require_chief(const std::string& who) const;
};

// Parses and validates a TF_CONFIG value; `origin` starts every error ("TF_CONFIG").
TfConfig parse_tf_config(const std::string& json, const std::string& origin = "TF_CONFIG");
// Reads the TF_CONFIG environment variable; unset, blank or "{}" gives the single-process
// default (one worker; MultiWorkerMirroredStrategy then trains at once, meeting nobody).
TfConfig tf_config_from_environment();

}  // namespace dtrain::cluster
