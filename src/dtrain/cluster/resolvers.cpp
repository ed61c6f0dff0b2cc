// Slurm's and Kubernetes' descriptions of a job as TF_CONFIG.
#include "dtrain/cluster/resolvers.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>

#include "dtrain/cluster/launcher.h"
#include "dtrain/core/error.h"

namespace dtrain::cluster {
namespace {

// A whole number from all of `text`, else InvalidArgument naming `what`.
long long whole(std::string_view text, const std::string& what) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    DTRAIN_THROW(InvalidArgument, what, ": '", std::string(text), "' is not a whole number");
  return v;
}

// Splits at the commas outside brackets.
std::vector<std::string_view> top_level(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') ++depth;
    if (s[i] == ']') --depth;
    if (s[i] == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

// The variable's value; InvalidArgument naming it, and what sets it, where it is unset.
std::string required(const Environment& env, const std::string& name, const std::string& who, const char* set_by) {
  const std::optional<std::string> v = env(name);
  if (!v || v->empty()) DTRAIN_THROW(InvalidArgument, who, ": ", name, " is not set (", set_by, ")");
  return *v;
}

constexpr const char* kBySrun = "srun sets it in each task of a Slurm job step";
constexpr const char* kByJob = "Kubernetes sets it in each pod of an indexed Job";
constexpr const char* kByManifest = "the Job's manifest sets it, or the resolver's options give it";

// The jobs for `total` tasks: every one a worker where none are given; else each named
// once, with at least one task, the counts adding up to `total`.
Jobs checked_jobs(const Jobs& jobs, int total, const std::string& who) {
  if (jobs.empty()) return {{"worker", total}};
  long long sum = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].second < 1) DTRAIN_THROW(InvalidArgument, who, ": job '", jobs[i].first, "' has no tasks (", jobs[i].second, ")");
    for (std::size_t j = 0; j < i; ++j)
      if (jobs[j].first == jobs[i].first) DTRAIN_THROW(InvalidArgument, who, ": job '", jobs[i].first, "' is named twice");
    sum += jobs[i].second;
  }
  if (sum != total) DTRAIN_THROW(InvalidArgument, who, ": the jobs name ", sum, " task(s) but the job has ", total);
  return jobs;
}

// Task `rank` of `total` as (type, index) by the jobs' rank ranges (checked_jobs').
TaskId task_of(const Jobs& jobs, int rank, int total, const std::string& who) {
  int first = 0;
  for (const auto& [name, count] : jobs) {
    if (rank < first + count) return {name, rank - first};
    first += count;
  }
  DTRAIN_THROW(InvalidArgument, who, ": rank ", rank, " is past the job's ", total, " tasks");
}

// The resolved task: ranks 0..n-1 at `addresses`, given out to the jobs in order; its
// TF_CONFIG validated as TF_CONFIG's own would be.
Resolved resolved(const Jobs& given, const std::vector<Address>& addresses, int rank, const Environment& env,
                  const std::string& who) {
  const int total = static_cast<int>(addresses.size());
  const Jobs jobs = checked_jobs(given, total, who);
  TfConfig c;
  std::size_t next = 0;
  for (const auto& [name, count] : jobs)
    for (int i = 0; i < count; ++i) c.cluster.add_task(name, addresses.at(next++));
  c.task = task_of(jobs, rank, total, who);
  Resolved r;
  r.config = parse_tf_config(to_tf_config_json(c), who);
  r.devices = env("CUDA_VISIBLE_DEVICES").value_or("");
  return r;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> hosts;
  for (std::string_view part : top_level(list)) {
    if (part.empty()) continue;
    const std::size_t open = part.find('[');
    if (open == std::string_view::npos) {
      hosts.emplace_back(part);
      continue;
    }
    const std::size_t close = part.find(']', open);
    if (close == std::string_view::npos)
      DTRAIN_THROW(InvalidArgument, "Slurm host list '", std::string(list), "': '[' without ']'");
    const std::string prefix(part.substr(0, open)), suffix(part.substr(close + 1));
    std::string_view ranges = part.substr(open + 1, close - open - 1);
    std::size_t start = 0;
    while (start <= ranges.size()) {
      std::size_t comma = ranges.find(',', start);
      if (comma == std::string_view::npos) comma = ranges.size();
      const std::string_view range = ranges.substr(start, comma - start);
      const std::size_t dash = range.find('-');
      const std::string_view lo = range.substr(0, dash);
      const std::string what = "Slurm host list '" + std::string(list) + "'";
      const long long a = whole(lo, what), b = dash == std::string_view::npos ? a : whole(range.substr(dash + 1), what);
      if (b < a || b - a > 100000) DTRAIN_THROW(InvalidArgument, what, ": range '", std::string(range), "' is not one");
      for (long long n = a; n <= b; ++n) {
        std::string digits = std::to_string(n);
        if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
        hosts.push_back(prefix + digits + suffix);
      }
      start = comma + 1;
    }
  }
  return hosts;
}

std::vector<int> expand_tasks_per_node(std::string_view text) {
  std::vector<int> out;
  const std::string what = "SLURM_STEP_TASKS_PER_NODE '" + std::string(text) + "'";
  for (std::string_view part : top_level(text)) {
    const std::size_t open = part.find("(x");
    const long long count = whole(part.substr(0, open), what);
    long long times = 1;
    if (open != std::string_view::npos) {
      if (part.back() != ')') DTRAIN_THROW(InvalidArgument, what, ": '", std::string(part), "' is not N(xM)");
      times = whole(part.substr(open + 2, part.size() - open - 3), what);
    }
    if (count < 1 || count > 100000 || times < 1 || times > 100000) DTRAIN_THROW(InvalidArgument, what, ": '", std::string(part), "' is not N(xM)");
    out.insert(out.end(), static_cast<std::size_t>(times), static_cast<int>(count));
  }
  return out;
}

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

Jobs parse_jobs(std::string_view text, const std::string& what) {
  Jobs jobs;
  for (std::string_view part : top_level(text)) {
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos || colon == 0)
      DTRAIN_THROW(InvalidArgument, what, ": '", std::string(part), "' is not job:count (ps:1,worker:2)");
    const long long count = whole(part.substr(colon + 1), what);
    if (count < 1) DTRAIN_THROW(InvalidArgument, what, ": job '", std::string(part.substr(0, colon)), "' has no tasks");
    jobs.emplace_back(std::string(part.substr(0, colon)), static_cast<int>(count));
  }
  return jobs;
}

Resolved resolve_slurm(const SlurmOptions& o, const Environment& env) {
  const std::string who = "the Slurm resolver";
  const long long rank = whole(required(env, "SLURM_PROCID", who, kBySrun), "SLURM_PROCID");
  const long long total = whole(required(env, "SLURM_STEP_NUM_TASKS", who, kBySrun), "SLURM_STEP_NUM_TASKS");
  if (total < 1 || total > 1000000) DTRAIN_THROW(InvalidArgument, who, ": SLURM_STEP_NUM_TASKS ", total, " is not a task count");
  if (rank < 0 || rank >= total) DTRAIN_THROW(InvalidArgument, who, ": SLURM_PROCID ", rank, " is not below ", total);
  const std::vector<std::string> hosts = expand_hostlist(required(env, "SLURM_STEP_NODELIST", who, kBySrun));
  const std::vector<int> per_node = expand_tasks_per_node(required(env, "SLURM_STEP_TASKS_PER_NODE", who, kBySrun));
  if (hosts.size() != per_node.size())
    DTRAIN_THROW(InvalidArgument, who, ": SLURM_STEP_NODELIST names ", hosts.size(), " host(s) but SLURM_STEP_TASKS_PER_NODE ",
                 per_node.size());
  long long placed = 0;
  for (int n : per_node) placed += n;
  if (placed != total)
    DTRAIN_THROW(InvalidArgument, who, ": SLURM_STEP_TASKS_PER_NODE places ", placed, " task(s) but SLURM_STEP_NUM_TASKS is ",
                 total);
  std::vector<Address> addresses;
  for (std::size_t h = 0; h < hosts.size(); ++h)
    for (int i = 0; i < per_node[h]; ++i) {
      // Ranks fill each host in turn (Slurm's block distribution); where srun says where this
      // task is, it must be there, else the others would look for it elsewhere.
      if (static_cast<long long>(addresses.size()) == rank) {
        const auto node = env("SLURMD_NODENAME"), local = env("SLURM_LOCALID");
        if ((node && *node != hosts[h]) || (local && whole(*local, "SLURM_LOCALID") != i))
          DTRAIN_THROW(InvalidArgument, who, ": rank ", rank, " runs on ", node.value_or("?"), " as local task ",
                       local.value_or("?"), ", not on ", hosts[h], " as local task ", i,
                       ": the resolver needs srun's block distribution (--distribution=block)");
      }
      addresses.push_back({hosts[h], o.port_base + i});
    }
  return resolved(o.jobs, addresses, static_cast<int>(rank), env, who);
}

Resolved resolve_k8s_indexed_job(const IndexedJobOptions& o, const Environment& env) {
  const std::string who = "the Kubernetes indexed-Job resolver";
  const int index = static_cast<int>(whole(required(env, "JOB_COMPLETION_INDEX", who, kByJob), "JOB_COMPLETION_INDEX"));
  const int total = o.num_tasks > 0 ? o.num_tasks
                                    : static_cast<int>(whole(required(env, "DTRAIN_NUM_TASKS", who, kByManifest), "DTRAIN_NUM_TASKS"));
  const std::string service = !o.service.empty() ? o.service : required(env, "DTRAIN_SERVICE", who, kByManifest);
  std::string job = o.job_name;
  if (job.empty()) {
    std::string host = env("HOSTNAME").value_or("");
    if (host.empty()) {
      char name[256] = {};
      if (gethostname(name, sizeof name - 1) == 0) host = name;
    }
    const std::string tail = "-" + std::to_string(index);
    if (host.size() <= tail.size() || host.compare(host.size() - tail.size(), tail.size(), tail) != 0)
      DTRAIN_THROW(InvalidArgument, who, ": the hostname '", host, "' is not <job>-", index,
                   " (an indexed Job's pod under a headless service); give the job's name");
    job = host.substr(0, host.size() - tail.size());
  }
  if (total < 1 || total > 1000000) DTRAIN_THROW(InvalidArgument, who, ": ", total, " is not a task count");
  if (index < 0 || index >= total) DTRAIN_THROW(InvalidArgument, who, ": JOB_COMPLETION_INDEX ", index, " is not below ", total);
  std::vector<Address> addresses;
  for (int i = 0; i < total; ++i) addresses.push_back({job + "-" + std::to_string(i) + "." + service, o.port});
  return resolved(o.jobs, addresses, index, env, who);
}

std::string to_tf_config_json(const TfConfig& config) { return tf_config_json(config.cluster, config.task); }

}  // namespace dtrain::cluster
