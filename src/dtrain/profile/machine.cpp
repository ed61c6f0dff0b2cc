// The machine's readings from /proc and sysfs, and the memory bandwidth probe.
#include "dtrain/profile/machine.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "dtrain/core/clock.h"
#include "dtrain/core/percentile.h"
#include "dtrain/profile/format.h"

namespace dtrain::profile {
namespace {

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); }

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

struct ProcessLine {
  ProcessTimes times;
  int ppid = 0;
};

// /proc/PID/stat: "pid (name) state ppid ..." with the name possibly holding spaces and
// parentheses, so the fields are counted from its last ')'.
bool read_process(int pid, double tick, double page, ProcessLine& out) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const std::size_t open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  out.times.pid = pid;
  out.times.name = line.substr(open + 1, close - open - 1);
  std::istringstream fields(line.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3 (state)
  for (std::string w; fields >> w && f.size() < 22;) f.push_back(w);
  if (f.size() < 22) return false;
  try {
    out.ppid = std::stoi(f[1]);
    out.times.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / tick;  // utime, stime
    out.times.start_ticks = std::stoull(f[19]);
    out.times.resident_bytes = std::stod(f[21]) * page;
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

MachineSample sample_machine() {
  MachineSample s;
  s.at = Clock::now();
  s.cpus = affinity_cpus();
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  s.job = seconds(self.ru_utime) + seconds(self.ru_stime) + seconds(children.ru_utime) + seconds(children.ru_stime);

  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    // user nice system idle iowait irq softirq steal
    unsigned long long v[8] = {};
    fields >> cpu;
    for (unsigned long long& x : v) fields >> x;
    if (!fields || std::find(s.cpus.begin(), s.cpus.end(), cpu) == s.cpus.end()) continue;
    s.available = true;
    s.steal += static_cast<double>(v[7]) / tick;
  }
  if (!s.available) return s;

  std::map<int, ProcessLine> all;
  if (DIR* proc = opendir("/proc")) {
    while (const dirent* e = readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0') continue;
      ProcessLine p;
      if (read_process(static_cast<int>(pid), tick, page, p)) all.emplace(static_cast<int>(pid), std::move(p));
    }
    closedir(proc);
  }
  const int self_pid = static_cast<int>(getpid());
  cpu_set_t ours_cpus;
  CPU_ZERO(&ours_cpus);
  for (int c : s.cpus) CPU_SET(c, &ours_cpus);
  // A process the scheduler may not put on any of the job's CPUs (taskset, a cpuset)
  // takes nothing from it.
  auto shares_cpus = [&](int pid) {
    cpu_set_t theirs;
    CPU_ZERO(&theirs);
    if (sched_getaffinity(pid, sizeof theirs, &theirs) != 0) return true;  // gone, or not ours to read: counted
    CPU_AND(&theirs, &theirs, &ours_cpus);
    return CPU_COUNT(&theirs) > 0;
  };
  for (const auto& [pid, p] : all) {
    bool ours = false;
    for (int at = pid, hops = 0; at > 1 && hops < 64; ++hops) {
      if (at == self_pid) {
        ours = true;
        break;
      }
      const auto parent = all.find(at);
      if (parent == all.end()) break;
      at = parent->second.ppid;
    }
    if (!ours && shares_cpus(pid)) s.others.push_back(p.times);
  }
  return s;
}

MachineUse machine_use(const MachineSample& before, const MachineSample& after) {
  MachineUse u;
  if (!before.available || !after.available || after.at <= before.at) return u;
  u.measured = true;
  u.seconds = seconds_between(before.at, after.at);
  u.cores = static_cast<int>(after.cpus.size());
  u.cache_bytes = last_level_cache_bytes();
  u.steal_cores = std::max(0.0, after.steal - before.steal) / u.seconds;
  u.job_cores = std::max(0.0, after.job - before.job) / u.seconds;
  std::map<int, const ProcessTimes*> earlier;
  for (const ProcessTimes& p : before.others) earlier[p.pid] = &p;
  for (const ProcessTimes& p : after.others) {
    const auto b = earlier.find(p.pid);
    // A process started since `before` (or a reused pid) ran for at most the interval.
    const double from = b != earlier.end() && b->second->start_ticks == p.start_ticks ? b->second->cpu_seconds : 0.0;
    const double cores = std::clamp(p.cpu_seconds - from, 0.0, u.seconds * u.cores) / u.seconds;
    u.other_cores += cores;
    if (cores >= 0.05) u.others.push_back({p.pid, p.name, cores, p.resident_bytes});
  }
  std::sort(u.others.begin(), u.others.end(),
            [](const OtherProcess& a, const OtherProcess& b) { return a.cores > b.cores; });
  return u;
}

int cores_wanted(const MachineUse& use, int threads) { return threads > 0 ? std::min(threads, use.cores) : use.cores; }

double busy_excess(const MachineUse& use, int threads) {
  if (!use.measured || use.cores <= 0) return 0.0;
  const double wanted = cores_wanted(use, threads);
  const double excess = use.taken_cores() - (use.cores - wanted);
  return excess >= std::max(0.2, 0.25 * wanted) ? excess : 0.0;
}

std::string busy_words(const std::string& run, const MachineUse& use) {
  return "Measured on a busy machine, " + run + ": " + machine_words(use) + ".\n";
}

std::size_t last_level_cache_bytes() {
  std::size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string size;
    if (!(in >> size) || size.empty()) continue;
    std::size_t bytes = 0;
    try {
      bytes = std::stoull(size);
    } catch (const std::exception&) {
      continue;
    }
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    largest = std::max(largest, bytes);
  }
  return largest > 0 ? largest : std::size_t{32} << 20;
}

namespace {

// Reads `words` 64-bit words over and over for `seconds` of wall-clock on `cpu`; the bytes
// read per second of this thread's CPU time.
double stream_reads(int cpu, std::size_t words, double seconds) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  std::unique_ptr<std::uint64_t[]> buffer(new std::uint64_t[words]);
  for (std::size_t i = 0; i < words; ++i) buffer[i] = i;  // touched: resident, and not one shared zero page
  volatile std::uint64_t sink = 0;
  const auto wall_end = Clock::now() + clock_seconds(seconds);
  const double cpu0 = thread_cpu_seconds();
  double bytes = 0;
  do {
    std::uint64_t a = 0, b = 0, c = 0, d = 0;
    for (std::size_t i = 0; i + 4 <= words; i += 4) {
      a += buffer[i];
      b ^= buffer[i + 1];
      c += buffer[i + 2];
      d ^= buffer[i + 3];
    }
    sink = sink + (a ^ b ^ c ^ d);
    bytes += static_cast<double>(words * sizeof(std::uint64_t));
  } while (Clock::now() < wall_end);
  const double busy = thread_cpu_seconds() - cpu0;
  return busy > 0 ? bytes / busy : 0.0;
}

}  // namespace

MemoryBandwidth probe_memory_bandwidth(double seconds_each) {
  MemoryBandwidth m;
  std::vector<int> cpus = affinity_cpus();
  if (cpus.empty()) return m;
  if (cpus.size() > 32) cpus.resize(32);
  m.cores = static_cast<int>(cpus.size());
  // Twice what the caches hold, at most 256 MiB, between the threads reading at once
  // (8 MiB each at least: 256 MiB at 32 cores).
  const std::size_t total = std::min(2 * last_level_cache_bytes(), std::size_t{256} << 20);
  const std::size_t alone = total / sizeof(std::uint64_t);
  const std::size_t each = std::max<std::size_t>(total / cpus.size(), std::size_t{8} << 20) / sizeof(std::uint64_t);
  // A thread that cannot have its buffer reads nothing (rate 0) rather than end the doctor.
  auto reads = [&](int cpu, std::size_t words, double& rate) {
    try {
      rate = stream_reads(cpu, words, seconds_each);
    } catch (const std::exception&) {
      rate = 0;
    }
  };
  double one = 0;
  std::thread([&] { reads(cpus.front(), alone, one); }).join();
  m.one_core = one;
  std::vector<double> rates(cpus.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cpus.size(); ++i) threads.emplace_back([&, i] { reads(cpus[i], each, rates[i]); });
  for (std::thread& t : threads) t.join();
  m.each_of_all = median(rates);
  return m;
}

std::string cores_words(double cores) {
  if (cores < 0.995) return detail::fixed(cores, 2) + " of a core";
  return cores < 1.005 ? std::string("a whole core") : detail::fixed(cores, 2) + " cores";
}

std::string others_words(const MachineUse& use, std::size_t most) {
  std::string out;
  for (std::size_t i = 0; i < use.others.size() && i < most; ++i) {
    const OtherProcess& p = use.others[i];
    out += (i ? ", " : "") + std::string("pid ") + std::to_string(p.pid) + " '" + p.name + "', " + cores_words(p.cores);
    const double mib = p.resident_bytes / (1 << 20);
    if (mib >= 1) out += ", " + detail::fixed(mib, 0) + " MiB resident";
    if (use.cache_bytes > 0 && p.resident_bytes > static_cast<double>(use.cache_bytes))
      out += " (more than the " + std::to_string(use.cache_bytes >> 20) +
             " MiB cache holds: where it reads them, it takes memory bandwidth too)";
  }
  if (use.others.size() > most) out += ", and " + std::to_string(use.others.size() - most) + " more";
  return out;
}

std::string machine_words(const MachineUse& use, bool job) {
  if (!use.measured) return "not measured";
  std::string out = "other processes used " + cores_words(use.other_cores) + " of the " +
                    std::to_string(use.cores) + " core(s) here";
  if (!use.others.empty()) out += " (" + others_words(use) + ")";
  out += "; the hypervisor took " + cores_words(use.steal_cores) + " (steal)";
  if (job) out += "; the job got " + cores_words(use.job_cores);
  return out;
}

}  // namespace dtrain::profile
