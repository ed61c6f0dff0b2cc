// The doctor's what-if model: a step at N workers predicted from one worker's measured
// step and the link between the workers, and the fixes that would matter there.
//
// A worker's step at N workers is its step at one worker (input, forward, backward, the
// sum over its own replicas, optimizer and the rest), plus the part of the ring
// all-reduce between workers that backward does not hide. The ring moves each bucket of
// S_b bytes in 2(N-1) steps, each a message of S_b/N bytes:
//     T = sum over buckets of 2(N-1) * (latency + S_b / (N * bandwidth)).
// A bucket starts once backward made it; backward makes the first bucket after 1/k of
// its time (k buckets), so at most the other (k-1)/k of backward can hide the ring:
//     exposed = max(T / k, T - backward * (k-1) / k)
// and all of T without overlap, or when the communication thread has no core of its own
// (the compute threads of the host's workers take every core): then moving the bytes
// takes its time from backward.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtrain/profile/diagnosis.h"

namespace dtrain::profile {

// The link between two workers, one direction.
struct Link {
  double bytes_per_second = 0;
  double latency_seconds = 0;  // per message
  // What the link sends at once after it was idle: the depth of a rate limiter's token
  // bucket (a cloud's or tc tbf's), refilled at `bytes_per_second` while nothing is sent.
  // 0: a wire that sends nothing faster after a pause.
  double burst_bytes = 0;
};

// Seconds to move `bytes` over `link` one way after it was idle for `idle` seconds: a
// burst's worth of them (as much as the bucket refilled, at most `burst_bytes`) at once,
// the rest at the link's rate. Latency not included.
double transfer_seconds(double bytes, const Link& link, double idle);

// "10Gbit", "100mbit", "2.5Gbit/s", "1.25GB/s", "800MB/s" -> bytes per second; and the
// links between GPUs by name, one direction each: "nvlink" 450 GB/s (NVLink 4 of the
// H100 and H200, whose 900 GB/s counts both directions), "pcie5" 64 GB/s and "pcie4" 32
// GB/s (x16 slots). InvalidArgument naming the text when it is none of these.
double parse_rate(const std::string& text);
inline constexpr double kNvlinkBytesPerSecond = 450e9, kPcie5BytesPerSecond = 64e9;
// "50us", "0.2ms", "1s" -> seconds.
double parse_duration(const std::string& text);
// "64KB", "256KiB", "1MB", "4096B" (or "4096") -> bytes: KB and MB are 1000 and 10^6
// bytes, KiB and MiB 1024 and 2^20; InvalidArgument naming the text otherwise.
double parse_bytes(const std::string& text);
// "10.0 Gbit/s (1.25 GB/s)".
std::string format_rate(double bytes_per_second);
// The link in words: "95 Mbit/s (11.8 MB/s), 0 us latency" and, with a burst,
// ", 65.5 KB burst after idle".
std::string link_words(const Link& link);

// `--what-if workers=16,link=10Gbit,latency=50us,burst=64KB,staged=pcie5`: each part
// optional. `staged`: GPU workers whose gradients go to the host and back over a bus of
// that rate, to be summed there after backward (dtrain's GPU workers).
struct WhatIf {
  std::optional<int> workers;
  std::optional<double> link;     // bytes per second
  std::optional<double> latency;  // seconds
  std::optional<double> burst;    // bytes (Link::burst_bytes)
  std::optional<double> staged;   // bytes per second (StepModel::staging)
};
WhatIf parse_what_if(const std::string& text);

// One worker's step, from a run at one worker, split as the model needs it.
struct StepModel {
  double fixed = 0;     // input wait, replica start, optimizer, metrics, the rest
  double input = 0;     // of which: input wait
  double optimizer = 0; // of which: the update
  double forward = 0, backward = 0;
  double local_sum = 0;  // summing this worker's replicas' gradients
  double gradient_bytes = 0;
  // The embedding tables' (read by rows) float32 bytes, and the most bytes of their rows
  // one worker's step looks up: what a parameter server's worker would pull and push of them.
  double table_bytes = 0, table_rows_bytes = 0;
  int buckets = 1;
  bool overlap = true;     // buckets start while backward runs...
  bool spare_core = true;  // ...on a core of their own
  bool compressed = false;  // already 16-bit on the wire
  std::int64_t batch = 0;  // rows per worker per step
  int replicas = 1;        // per worker
  // From a run on a GPU: the GPU's own backward time, the window the ring may hide behind
  // (the host's backward is only its launches); 0: the host's backward.
  double gpu_backward = 0;
  // GPU workers that sum on the host: the bus between GPU and host each worker's float32
  // gradients (`copy_bytes`) cross, each way, after backward; the ring then hides behind
  // nothing. 0: the ring reads the gradients where backward left them.
  double staging = 0;
  double copy_bytes = 0;
  // One worker computes this many times as long as the others (1: none): everything of
  // its step but the input wait and the ring, as on slower cores. Every synchronous step
  // waits for it.
  double straggler = 1;
  // Under the ps, each worker's own closure as a run measured it, pulls and pushes left
  // out (the replay of that run); empty: every worker's is the model's, the straggler's
  // `straggler` times as long.
  std::vector<double> closures;
  // Under the ps, what the chief's dispatch adds to each closure: its call to the worker
  // less the worker's run (0: none known, as from a run at one worker without the ps).
  double dispatch = 0;
  // Under the ps, the steps of an epoch (closures of one step each), at whose end the
  // chief copies the trained values from the ps (0: no epochs counted).
  std::int64_t steps_per_epoch = 0;
};
// From `one_worker` (a run at 1 worker; its worker 0). InvalidArgument when it has more,
// or no step time.
StepModel step_model(const ScaleRun& one_worker);

struct Prediction {
  int workers = 1;
  double step = 0;      // seconds
  double ring = 0;      // the all-reduce between workers, hidden or not (under the ps: the pull and push)
  double exposed = 0;   // its part not hidden behind backward
  double samples_per_second = 0;
  double efficiency = 0;  // samples/s against `workers` times one worker's
};

// The ring all-reduce of `bytes` in `buckets` among `workers` (0 for one worker), on
// links idle for `idle` seconds before it (Link::burst_bytes); InvalidArgument for bytes
// over a link of no bandwidth.
double ring_seconds(double bytes, int buckets, int workers, const Link& link, double idle = 0);
Prediction predict(const StepModel& model, int workers, const Link& link);

// A step under ParameterServerStrategy: each worker computes its closure (everything of
// the one-worker step but the optimizer, which runs on the ps), pulls the variables and
// pushes the gradients (latency and the bytes over its own link each way), and waits
// for its push to be applied (the optimizer's time, spread over the ps). `ps` tasks hold
// an even share each, and each one's link carries every worker's part of it.
//   async: each worker at its own pace, queueing for the ps links and the ps's applying
//          as the others use them (approximate mean value analysis of the closed
//          network the workers and the ps form);
//   ssp(K): in the long run every worker at the slowest worker's pace;
//   sync [with B backup workers]: every update waits for the (N - B)th fastest worker,
//          and the workers pull and push together through the ps links; a worker
//          slower than that goes at its own pace, its gradients dropped.
// Each closure also waits for the chief's dispatch (`dispatch`): a worker's cycle, and a
// synchronous round, which the chief dispatches once the round's last push came back.
// With `steps_per_epoch`, every epoch ends with the chief's copy of the trained values
// (over its own link, and each ps's share over that ps's), which the workers wait for.
// An unknown consistency is InvalidArgument.
// The step is the mean time between a worker's closures; samples/s counts every worker's.
Prediction predict_ps(const StepModel& model, int workers, int ps, const std::string& consistency, Link link);

// The model at `workers` as is and with each fix: the buckets as bf16 on the wire (unless
// they already are 16-bit), gradients accumulated over 4 batches, twice the batch per
// replica, and where embedding tables look up fewer rows a step than they hold,
// ParameterServerStrategy (async, as many ps as workers) moving only those rows of them.
struct Scenario {
  std::string name;
  Prediction prediction;
  double batch_factor = 1;  // the rows of an update, against as measured
};
std::vector<Scenario> fixes_at(const StepModel& model, int workers, const Link& link);

// From a run on a GPU (StepModel::gpu_backward > 0): `gpus` workers of one GPU each,
// summing their gradients over NVLink, over PCIe Gen5 (each an all-reduce ring that
// backward hides as on the CPU, as NCCL's is), or staged through host memory over PCIe
// Gen5 and summed over `host_link` (dtrain's GPU workers, after backward). A ring step's
// latency is `host_link`'s for the last, and 10 us (assumed, not measured) for the GPU links
// unless `gpu_latency` is given:
// | path | step ms | all-reduce ms | exposed ms | samples/s | efficiency |.
std::vector<Scenario> gpu_paths(const StepModel& model, int gpus, const Link& host_link,
                                std::optional<double> gpu_latency = std::nullopt);
std::string gpu_what_if_report(const StepModel& model, int gpus, const Link& host_link,
                               std::optional<double> gpu_latency = std::nullopt);

// The what-if table for `workers` and the fix that gains most there, in words. With a
// gradient noise scale (> 0) the table adds each fix's goodput (samples/s times the
// statistical efficiency of its update's rows) and the fix is chosen by it: a fix that
// grows the batch buys samples/s with less progress per sample.
std::string what_if_report(const StepModel& model, int workers, const Link& link, double noise_scale = 0);

// A run replayed from its own steps, as dPRO (MLSys 2022) replays a job from its traces:
// each step's work as the run measured it on each worker (WorkerSummary::step_work: its
// critical path, less communication and waits), the all-reduce's ring from `link` with
// the overlap `predict` gives it, and every synchronous step waiting for that step's
// slowest worker: the mean over the steps of (the slowest worker's work + the sum of a
// worker's own replicas' buckets, `model.local_sum` + the exposed ring). Under the ps,
// each worker's mean closure less its pull and push (StepSeconds::closure_work) and the
// chief's dispatch as the run measured it (ScaleRun::dispatch), through `predict_ps` with
// `model`'s applying (from the run at one worker). What it does not take from the run:
// the communication and the waits for other workers (and under the ps, the order of the
// workers' closures). Nothing (nullopt) without a row with steps for every worker,
// without the steps' work (all-reduce), or with several workers and no link.
std::optional<Prediction> replay(const ScaleRun& run, const StepModel& model, const Link& link);

// Each run at several workers predicted from the run at one worker with the same replicas
// per worker, its forward and backward slowed by the ratio of the two runs' oversubscription
// (compute threads over cores of the host, when above 1); each run of several replicas in
// one process (MirroredStrategy) from the run of one replica, its forward and backward
// slowed by how many more replicas share each core computing:
// | workers | replicas | measured | predicted | error | replayed | error | compute |, each
// run also replayed from its own steps (`replay`). Runs without such a partner are left
// out, and runs at several workers when `link` has no bandwidth; empty when none is left.
struct Check {
  int workers = 0, replicas = 0;  // the run's
  int ps = 0;                     // under the ps: its ps tasks and consistency
  std::string consistency;
  double measured = 0;            // its samples/s
  Prediction prediction;
  double error = 0;  // (predicted - measured) / measured samples/s
  std::optional<Prediction> replayed;  // the run replayed from its own steps
  double replay_error = 0;             // its error, as `error`
  // Forward + backward per step at one worker, and as the run measured it: where they
  // differ (workers sharing one host's cores), the model cannot know it.
  double compute_alone = 0, compute_measured = 0;
  // Where the prediction misses by more than 15%, what the model did not know (empty
  // where it lands within 15%, or no cause is seen).
  std::string why;
};
std::vector<Check> model_check(const std::vector<ScaleRun>& runs, const Link& link);
std::string model_check_table(const std::vector<Check>& checks);
// What the check predicts from, in words ("each run predicted from ..."), with the link's
// words where there is one.
std::string model_check_heading(const std::string& link_words);

}  // namespace dtrain::profile
