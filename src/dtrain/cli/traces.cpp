// Merging the workers' trace files.
#include "dtrain/cli/traces.h"

#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "dtrain/cli/config.h"
#include "dtrain/core/error.h"
#include "dtrain/core/files.h"

namespace dtrain::cli {
namespace {

using nlohmann::json;

json read_trace(const std::string& path) {
  json j = read_json_file(path, "merge-traces: cannot read " + path);
  if (j.is_discarded()) DTRAIN_THROW(IoError, "merge-traces: ", path, " is not JSON");
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    DTRAIN_THROW(IoError, "merge-traces: ", path, " has no \"traceEvents\" array (is it a trace fit --profile wrote?)");
  for (const json& e : j["traceEvents"])
    if (!e.is_object() || !e.contains("pid") || !e["pid"].is_number_integer())
      DTRAIN_THROW(IoError, "merge-traces: ", path, ": an event without an integer \"pid\": ", e.dump());
  return j;
}

// "step N" slice ends (µs) by N.
std::map<long long, double> step_ends(const json& trace) {
  std::map<long long, double> ends;
  for (const json& e : trace["traceEvents"]) {
    if (e.value("cat", "") != "step" || !e.contains("ts") || !e.contains("dur")) continue;
    const std::string name = e.value("name", "");
    char* end = nullptr;
    const long long step = name.rfind("step ", 0) == 0 ? std::strtoll(name.c_str() + 5, &end, 10) : 0;
    if (!end || *end != '\0' || !e["ts"].is_number() || !e["dur"].is_number()) continue;
    ends[step] = e["ts"].get<double>() + e["dur"].get<double>();
  }
  return ends;
}

}  // namespace

json merge_traces(const MergeOptions& o) {
  if (o.inputs.empty()) DTRAIN_THROW(InvalidArgument, "merge-traces: no input traces");
  std::vector<json> traces;
  for (const std::string& path : o.inputs) traces.push_back(read_trace(path));

  std::vector<double> shift(traces.size(), 0.0);
  if (o.align_steps) {
    // The first step every trace has.
    std::vector<std::map<long long, double>> ends;
    for (const json& t : traces) ends.push_back(step_ends(t));
    std::optional<long long> common;
    for (const auto& [step, end] : ends.front()) {
      bool everywhere = true;
      for (const auto& e : ends) everywhere = everywhere && e.count(step);
      if (everywhere) {
        common = step;
        break;
      }
    }
    if (!common)
      DTRAIN_THROW(InvalidArgument, "merge-traces: --align-steps needs a step that every trace has; these traces have "
                   "none in common");
    for (std::size_t i = 0; i < traces.size(); ++i) shift[i] = ends.front().at(*common) - ends[i].at(*common);
  }

  json events = json::array();
  std::set<long long> taken;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    // This file's process ids, each moved to a free one if an earlier file has it.
    std::map<long long, long long> pid_of;
    for (const json& e : traces[i]["traceEvents"]) {
      const long long pid = e["pid"].get<long long>();
      if (pid_of.count(pid)) continue;
      long long to = pid;
      while (taken.count(to)) ++to;
      pid_of[pid] = to;
      taken.insert(to);
    }
    for (json e : traces[i]["traceEvents"]) {
      e["pid"] = pid_of.at(e["pid"].get<long long>());
      if (shift[i] != 0 && e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() + shift[i];
      events.push_back(std::move(e));
    }
  }
  return json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
}

void run_merge_traces(const MergeOptions& o) {
  write_file_replacing(o.output, merge_traces(o).dump() + "\n", "merge-traces: the merged trace");
}

}  // namespace dtrain::cli
