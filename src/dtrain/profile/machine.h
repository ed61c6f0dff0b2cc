// What a job does not own on its machine, read from Linux's /proc: the CPU time other
// processes took on the job's cores, the time a hypervisor stole from them, the cores the
// job's own processes got, and the memory bandwidth a core reads at. The doctor samples it
// before the runs and around each one, and names a busy machine before any other cause.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"

namespace dtrain::profile {

// One process's CPU time and resident memory at a moment (/proc/PID/stat).
struct ProcessTimes {
  int pid = 0;
  unsigned long long start_ticks = 0;  // when it started, to tell a reused pid apart
  std::string name;
  double cpu_seconds = 0;  // user + system, its own threads only
  double resident_bytes = 0;
};

// A moment's readings.
struct MachineSample {
  bool available = false;  // /proc/stat was read (false elsewhere than Linux)
  Clock::time_point at;
  std::vector<int> cpus;  // the CPUs read: this process's affinity
  // Seconds since boot summed over `cpus` that the hypervisor stole: ran something else
  // while the guest wanted to run. (/proc/stat's busy ticks are too coarse to subtract
  // the job's time from on such a guest: others are summed per process instead.)
  double steal = 0;
  // The CPU seconds of this process and of the descendants it has waited for (the runs).
  double job = 0;
  std::vector<ProcessTimes> others;  // every other process, this one's descendants left out
};
MachineSample sample_machine();

struct OtherProcess {
  int pid = 0;
  std::string name;
  double cores = 0;  // its CPU seconds over the wall-clock
  double resident_bytes = 0;
};

// What happened between two samples, in cores (CPU seconds per second of wall-clock) of
// the job's CPUs.
struct MachineUse {
  bool measured = false;
  double seconds = 0;
  int cores = 0;
  double steal_cores = 0;  // what the hypervisor took
  double job_cores = 0;    // the job's processes (the doctor and the runs it waited for)
  // Every other process that may run on the job's CPUs, alive at both samples (or started
  // between them and alive at the second), summed: one that ended before the second
  // sample is not seen.
  double other_cores = 0;
  std::vector<OtherProcess> others;  // the busiest other processes, busiest first
  std::size_t cache_bytes = 0;       // the largest cache (last_level_cache_bytes)
  // What the job could not have: other processes' time and the hypervisor's.
  double taken_cores() const { return other_cores + steal_cores; }
};
// `before` and `after` must both be available; others below a twentieth of a core are left out.
MachineUse machine_use(const MachineSample& before, const MachineSample& after);

// What another load took of the cores a run of `threads` compute threads wanted (all the
// cores where `threads` <= 0; at most all), in cores: other processes' time and the
// hypervisor's steal beyond the cores the run left free; 0 when that is less than a
// quarter of the cores wanted (a fifth of a core at least: a quiet machine's daemons and a
// virtual machine's usual steal are not a load), or the machine was not measured.
double busy_excess(const MachineUse& use, int threads);
// The cores such a run wanted: its threads, at most the cores (all where `threads` <= 0).
int cores_wanted(const MachineUse& use, int threads);
// "Measured on a busy machine, RUN: <machine_words>.\n": the line under a table of runs.
std::string busy_words(const std::string& run, const MachineUse& use);

// The bytes a core's caches hold at most: the largest cache of CPU 0 (sysfs), 32 MiB
// when it cannot be read.
std::size_t last_level_cache_bytes();

// Streaming reads from memory, beyond the caches: one core alone, then every one of the
// job's cores at once (up to 32), each thread pinned to its core; bytes per second of the
// thread's own CPU time, so that a thread sharing its core with another load still reads
// at its core's rate.
struct MemoryBandwidth {
  double one_core = 0;     // bytes/s
  double each_of_all = 0;  // bytes/s, the median of the cores reading at once
  int cores = 0;
};
MemoryBandwidth probe_memory_bandwidth(double seconds_each = 0.15);

// "0.97 of a core", "a whole core", "1.50 cores".
std::string cores_words(double cores);
// "other processes used 0.97 of a core of the 2 core(s) here (pid 4242 'spin', 0.97 of a
// core); the hypervisor took 0.01 of a core (steal); the job got 1.03 cores" (the job's
// part where `job`).
std::string machine_words(const MachineUse& use, bool job = true);
// "pid 4242 'spin', 0.97 of a core, 3 MiB resident" for each of the busiest `most`; a
// resident set larger than the cache is said to take memory bandwidth where it is read.
std::string others_words(const MachineUse& use, std::size_t most = 3);

}  // namespace dtrain::profile
