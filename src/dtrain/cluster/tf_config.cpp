// TF_CONFIG parsing and validation.
#include "dtrain/cluster/tf_config.h"

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"

namespace dtrain::cluster {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& field, const std::string& message) {
  DTRAIN_THROW(InvalidArgument, origin, ": ", field.empty() ? "" : field + ": ", message);
}

std::string type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  return "null";
}

}  // namespace

std::string Address::to_string() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Address parse_address(const std::string& text, const std::string& field) {
  auto bad = [&](const std::string& why) {
    DTRAIN_THROW(InvalidArgument, field, ": '", text, "' is not host:port (", why, ")");
  };
  Address a;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') bad("an IPv6 address is [addr]:port");
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) bad("no port");
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (a.host.find(':') != std::string::npos) bad("write an IPv6 address as [addr]:port");
  }
  if (a.host.empty()) bad("no host");
  for (char c : a.host)
    if (c == ' ' || c == '/' || c == '\t') bad("the host has a '" + std::string(1, c) + "'");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) bad("the port is not a number");
  a.port = std::stoi(port);
  if (a.port < 1 || a.port > 65535) bad("the port must be in [1, 65535]");
  return a;
}

std::string TaskId::to_string() const { return type + ":" + std::to_string(index); }

const std::vector<std::string>& ClusterSpec::job_names() {
  static const std::vector<std::string> names{"chief", "worker", "ps", "evaluator"};
  return names;
}

int ClusterSpec::num_tasks(const std::string& type) const {
  const auto it = jobs_.find(type);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
}

const Address& ClusterSpec::address(const TaskId& task) const {
  const auto it = jobs_.find(task.type);
  if (it == jobs_.end() || task.index < 0 || task.index >= static_cast<int>(it->second.size()))
    DTRAIN_THROW(InvalidArgument, "cluster: there is no task ", task.to_string());
  return it->second[static_cast<std::size_t>(task.index)];
}

std::vector<TaskId> ClusterSpec::tasks() const {
  std::vector<TaskId> out;
  for (const std::string& type : job_names())
    for (int i = 0; i < num_tasks(type); ++i) out.push_back({type, i});
  return out;
}

std::vector<TaskId> ClusterSpec::training_tasks() const {
  std::vector<TaskId> out;
  for (int i = 0; i < num_tasks("chief"); ++i) out.push_back({"chief", i});
  for (int i = 0; i < num_tasks("worker"); ++i) out.push_back({"worker", i});
  return out;
}

TaskId TfConfig::chief() const {
  if (cluster.num_tasks("chief") > 0) return {"chief", 0};
  return {"worker", 0};
}

void TfConfig::require_chief(const std::string& who) const {
  if (cluster.num_tasks("chief") == 0)
    DTRAIN_THROW(InvalidArgument, "TF_CONFIG: cluster: ", who, " needs a \"chief\" job (one task that coordinates), ",
                 "and the cluster has none");
}

TfConfig parse_tf_config(const std::string& text, const std::string& origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // a syntax error, or a number too large for a double
    fail(origin, "", std::string("invalid JSON (") + e.what() + ")");
  }
  if (!doc.is_object()) fail(origin, "", "expected a JSON object with \"cluster\" and \"task\", got " + type_name(doc));
  TfConfig c;
  c.from_environment = true;
  for (const auto& [key, value] : doc.items()) {
    if (key != "cluster" && key != "task" && key != "rpc_layer" && key != "environment")
      fail(origin, key, "unknown key (expected cluster, task, rpc_layer, environment)");
    if ((key == "rpc_layer" || key == "environment") && !value.is_string())
      fail(origin, key, "expected a string, got " + type_name(value));
  }
  c.rpc_layer = doc.value("rpc_layer", "");
  c.environment = doc.value("environment", "");
  if (!doc.contains("cluster")) fail(origin, "cluster", "missing (the tasks of the job and their addresses)");
  const json& cl = doc["cluster"];
  if (!cl.is_object()) fail(origin, "cluster", "expected an object of job name -> list of \"host:port\", got " + type_name(cl));
  if (cl.empty()) fail(origin, "cluster", "has no jobs");
  std::map<std::string, std::string> seen;  // address -> field that gave it
  for (const auto& [job, list] : cl.items()) {
    const std::string jf = "cluster." + job;
    const auto& names = ClusterSpec::job_names();
    if (std::find(names.begin(), names.end(), job) == names.end())
      fail(origin, jf, "unknown job (expected chief, worker, ps or evaluator)");
    if (!list.is_array()) fail(origin, jf, "expected a list of \"host:port\", got " + type_name(list));
    if ((job == "chief" || job == "evaluator") && list.size() > 1)
      fail(origin, jf, "has " + std::to_string(list.size()) + " tasks; there can be only one " + job);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string field = jf + "[" + std::to_string(i) + "]";
      if (!list[i].is_string()) fail(origin, field, "expected \"host:port\", got " + type_name(list[i]));
      const Address a = parse_address(list[i].get<std::string>(), origin + ": " + field);
      const auto [it, fresh] = seen.emplace(a.to_string(), field);
      if (!fresh) fail(origin, field, "address '" + a.to_string() + "' is also " + it->second);
      c.cluster.add_task(job, a);
    }
  }
  if (c.cluster.num_tasks("chief") + c.cluster.num_tasks("worker") == 0)
    fail(origin, "cluster", "has no chief and no worker: nothing would train");
  if (!doc.contains("task")) fail(origin, "task", "missing (which task this process is: {\"type\", \"index\"})");
  const json& task = doc["task"];
  if (!task.is_object()) fail(origin, "task", "expected {\"type\": ..., \"index\": ...}, got " + type_name(task));
  for (const auto& [key, value] : task.items())
    if (key != "type" && key != "index" && key != "trial") fail(origin, "task." + key, "unknown key (expected type, index)");
  if (!task.contains("type") || !task["type"].is_string()) fail(origin, "task.type", "expected a job name");
  c.task.type = task["type"].get<std::string>();
  if (c.cluster.num_tasks(c.task.type) == 0) {
    const auto& names = ClusterSpec::job_names();
    if (std::find(names.begin(), names.end(), c.task.type) == names.end())
      fail(origin, "task.type", "'" + c.task.type + "' is not chief, worker, ps or evaluator");
    fail(origin, "task.type", "'" + c.task.type + "' has no tasks in cluster");
  }
  const json& index = task.contains("index") ? task["index"] : json(0);
  if (!index.is_number_integer()) fail(origin, "task.index", "expected an integer, got " + type_name(index));
  const std::int64_t i = index.get<std::int64_t>();
  const int n = c.cluster.num_tasks(c.task.type);
  if (i < 0 || i >= n)
    fail(origin, "task.index", std::to_string(i) + " is out of range: cluster." + c.task.type + " has " + std::to_string(n) +
                                   " task" + (n == 1 ? "" : "s"));
  c.task.index = static_cast<int>(i);
  return c;
}

TfConfig tf_config_from_environment() {
  const char* v = std::getenv("TF_CONFIG");
  // Unset, blank, or an empty object ("{}", as TensorFlow's resolver reads it): no cluster.
  const bool blank = v == nullptr || std::string(v).find_first_not_of(" \t\n\r") == std::string::npos;
  if (blank || json::parse(v, nullptr, /*allow_exceptions=*/false) == json::object()) {
    TfConfig single;
    single.cluster.add_task("worker", Address{"127.0.0.1", 0});
    return single;
  }
  return parse_tf_config(v, "TF_CONFIG");
}

}  // namespace dtrain::cluster
