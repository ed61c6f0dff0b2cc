// `dtrain doctor`'s reasoning: runs of one job at several scales, each a row per worker
// of its step profile, turned into a scaling table and findings in plain words, each
// with its evidence and a fix.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "dtrain/profile/machine.h"
#include "dtrain/profile/summary.h"

namespace dtrain::profile {

// One scale of the job: `workers` processes of `replicas` replicas each.
struct ScaleRun {
  int workers = 1;
  int replicas = 1;  // per worker
  // On GPUs: the GPUs of their own a worker's replicas ran on (1: one GPU, its logical
  // GPUs sharing its one stream).
  int gpus = 1;
  std::int64_t global_batch = 0;
  double samples_per_second = 0;    // global, steady state
  std::vector<WorkerSummary> rows;  // [worker]
  // The gradients each step all-reduces between workers, and in how many buckets.
  double gradient_bytes = 0;
  // The embedding tables' float32 bytes, and the most bytes of their rows a worker's step looks up.
  double table_bytes = 0, table_rows_bytes = 0;
  // The gradients' float32 bytes (gradient_bytes is half that where they went as 16-bit).
  double float32_gradient_bytes() const { return compressed ? 2 * gradient_bytes : gradient_bytes; }
  int buckets = 1;
  bool overlap = true;  // buckets start while backward runs
  bool compressed = false;  // the buckets went between workers as 16-bit values
  bool shared_memory = false;  // the workers summed through shared memory, not over a link
  // The communication thread had a core no compute thread used; without one, moving the
  // bytes takes its time from backward and hides nothing.
  bool spare_core = true;
  // The compute threads the workers on one host asked for, and that host's cores (0: not
  // known); the workers ran on `hosts` such hosts.
  int host_threads = 0, host_cores = 0, hosts = 1;
  // The samples/s of each round (each epoch after the warm-up), for the spread.
  std::vector<double> rounds;
  // Why this run's figures are not to be concluded from (set by check_trust); empty when
  // they can be.
  std::string doubt;
  // Training progress: each epoch's loss and wall-clock (the warm-up's included), the
  // final accuracy (-1: none), and the gradient noise scale the run measured (0: none).
  std::vector<double> loss, epoch_seconds;
  std::int64_t steps_trained = 0;
  double final_accuracy = -1;
  double noise_scale = 0;
  std::vector<double> noise_per_epoch;  // each epoch's own (0: none measured that epoch)
  // A worker made to compute this many times as long (fit --fault-slow worker:K:Fx; 1: none).
  double straggler_factor = 1;
  // Under ParameterServerStrategy: its ps tasks and consistency ("async", "ssp(2)",
  // "sync", "sync with 1 backup worker"); 0 and empty for all-reduce or one device.
  int ps = 0;
  std::string consistency;
  // Under the ps: what the chief's dispatch adds to a step, on the mean (its calls that ran
  // the closures less the workers' runs, the summary's ps_phases.dispatch_seconds, over
  // their steps).
  double dispatch = 0;
  // The machine while the run ran, where the doctor ran it (not measured for a summary
  // made elsewhere).
  MachineUse machine;
  int replicas_in_sync() const { return workers * replicas; }
  // The cores that computed: on each host, the threads asked or the cores there, whichever
  // is fewer (0: not known).
  int cores_computing() const {
    return host_threads > 0 && host_cores > 0 ? hosts * std::min(host_threads, host_cores) : 0;
  }
  // The host's compute threads over its cores, at least 1 (1 when not known): workers
  // sharing one host's cores beyond what it has compute this much slower.
  double oversubscription() const {
    return host_cores > 0 ? std::max(1.0, static_cast<double>(host_threads) / host_cores) : 1.0;
  }
  // The rounds' spread, (max - min) / median (0 with fewer than two rounds).
  double spread() const;
};

// One worker's seconds per step by phase, setup (a one-off of the first step) left out.
struct StepSeconds {
  double step = 0, input = 0, start = 0, forward = 0, backward = 0, comm = 0, straggler = 0, optimizer = 0;
  double transfer = 0, bytes = 0;
  double pull = 0, push = 0;  // under the ps
  // On a GPU: the batch's copy to it, the host's wait for its queued work at the step's end,
  // and the GPU's own time from the forward's first kernel to the update's end (its events).
  double to_device = 0, device_wait = 0, gpu = 0;
  double compute() const { return forward + backward; }
  // The step less its waits for other workers: what this worker itself took.
  double own() const { return std::max(0.0, step - comm - straggler); }
  // Under the ps: what of a closure was this worker's own, its pull and push left out.
  double closure_work() const { return std::max(0.0, own() - pull - push); }
  // The step's time in its phases, and what is left of the step beyond them (never negative).
  double accounted() const { return input + start + compute() + comm + straggler + optimizer; }
  double other() const { return std::max(0.0, step - accounted()); }
};
StepSeconds step_seconds(const WorkerSummary& worker);

struct Finding {
  std::string cause;     // "input-bound", "straggler", "communication-bound", ...
  std::string evidence;  // the numbers
  std::string fix;       // what to do, with the predicted gain where there is one
};

// | workers | replicas per worker | global batch | threads / cores | samples/s | spread |
// speedup | phase shares ... | (speedup against the first run; a run in doubt is marked and
// its doubt is said under the table; a run on a GPU has a line under it: the GPU's own time,
// the host's launches and its wait for the GPU, the batch's copy, as shares of the step).
std::string scaling_table(const std::vector<ScaleRun>& runs);

// What the cores allow `run` against `base`: the ratio of their cores computing (0 when
// either is not known).
double speedup_the_cores_allow(const ScaleRun& base, const ScaleRun& run);
// Whether each run's speedup against the first can be concluded from: not when it is
// above what the cores allow (by more than 15% and the spread), nor when the two runs'
// spreads are wider than its distance from 1. Sets each run's `doubt`; returns the indices
// of the runs in doubt (the doctor measures them again once).
std::vector<std::size_t> check_trust(std::vector<ScaleRun>& runs);

// What another load took of the cores a run wanted (its machine reading and its host's
// compute threads: machine.h's busy_excess).
double busy_excess(const ScaleRun& run);

// Findings for the runs, most important first: a busy machine (another load took cores
// a run wanted, busy_excess), the resources (shared cores: the run
// with the most replicas computed on no more cores than the first; oversubscribed: more
// compute threads than cores on a host), untrusted figures (a doubt check_trust set on
// that run), input-bound (input wait >= 10% of the
// step), straggler (a worker whose own time, its step less its waits for the others, is
// > 20% above the median, named), too small a batch per replica (compute below what the
// step spends whatever its batch: exposed communication, start-up, the update),
// communication-bound (exposed communication >= 25%; named before the batch where moving
// the bytes over a link takes longer than the compute), optimizer-bound (optimizer >=
// 25%); on a GPU, host-to-device copies (the batch's copy >= 10% of the step) and
// launch-bound (the host waited < 10% of the step for a GPU whose work ended within 10% of
// its launches: the GPU waited for the host). Judged on the run with the most replicas in sync; empty when nothing stands out.
std::vector<Finding> diagnose(const std::vector<ScaleRun>& runs);

std::string format_findings(const std::vector<Finding>& findings);

// A sample's share of its best progress in a batch of `batch` rows, for a gradient noise
// scale of `noise_scale` samples: B_noise / (B_noise + B) (0 without a noise scale).
inline double statistical_efficiency(double noise_scale, double batch) {
  return noise_scale > 0 ? noise_scale / (noise_scale + batch) : 0.0;
}

// The job's gradient noise scale: the one measured by the run with the most replicas in
// sync that measured one (0: none did).
double job_noise_scale(const std::vector<ScaleRun>& runs);

// Time to accuracy (seed 003: does N times the devices reach a loss N times sooner?):
// | workers | replicas | global batch | samples seen | training s | loss reached | accuracy |
// time to loss L s | sooner than the first | statistical efficiency | goodput samples/s |
// with L the loss every run reached, and with `noise_scale` > 0 each global batch's
// statistical efficiency B_noise / (B_noise + B) and goodput (samples/s times it).
std::string time_to_accuracy_table(const std::vector<ScaleRun>& runs, double noise_scale);

// The what-if in time to the same loss: `workers` workers at `rate` samples/s against
// one at `rate_one`, each taking `batch_one` rows a step; the number of samples a loss
// takes grows by 1 + B / B_noise (McCandlish et al.), so it is reached
// (rate x efficiency(B)) / (rate_one x efficiency(batch_one)) times sooner. In words,
// with the parts (empty without a noise scale).
std::string time_to_loss_what_if(double rate_one, double rate, int workers, double batch_one, double noise_scale);

// The global batch and learning rate the noise scale suggests for the largest run, in
// words (empty without a noise scale).
std::string batch_advice(const std::vector<ScaleRun>& runs, double noise_scale);

}  // namespace dtrain::profile
