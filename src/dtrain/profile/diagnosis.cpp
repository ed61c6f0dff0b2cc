// The scaling table and the rules that name a cause.
#include "dtrain/profile/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include "dtrain/core/percentile.h"
#include "dtrain/profile/format.h"
#include "dtrain/profile/strategies.h"
#include "dtrain/profile/whatif.h"

namespace dtrain::profile {
namespace {

using detail::ms;

std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

std::string pct(double share) { return detail::percent(share, 0); }

std::string scale_words(const ScaleRun& r) {
  return std::to_string(r.workers) + " worker(s) x " + std::to_string(r.replicas) + " replica(s)";
}

// The run another load took the most from, in words, and what to do; none when no run's
// machine was busy.
std::optional<Finding> busy_machine(const std::vector<ScaleRun>& runs) {
  const ScaleRun* worst = nullptr;
  std::string also;
  for (const ScaleRun& r : runs) {
    if (busy_excess(r) <= 0) continue;
    if (!worst || busy_excess(r) >= busy_excess(*worst)) worst = &r;
  }
  if (!worst) return std::nullopt;
  for (const ScaleRun& r : runs)
    if (&r != worst && busy_excess(r) > 0) also += (also.empty() ? "" : ", ") + scale_words(r);
  const MachineUse& m = worst->machine;
  const int wanted = cores_wanted(m, worst->host_threads);
  // Both parts where each is a twentieth of a core or more, the larger first.
  const bool stolen = m.steal_cores > m.other_cores;
  const std::string steal = "the hypervisor took " + cores_words(m.steal_cores) +
                            " (CPU steal: this virtual machine's host ran something else on its cores)";
  std::string load = "another load used " + cores_words(m.other_cores);
  if (!m.others.empty()) load += " (" + others_words(m) + ")";
  std::string evidence = stolen ? steal : load;
  if (const double second = stolen ? m.other_cores : m.steal_cores; second >= 0.05)
    evidence += ", and " + (stolen ? load : steal);
  evidence += ", of this machine's " + std::to_string(m.cores) + " core(s), during the run at " + scale_words(*worst) +
              "; its compute threads wanted " + std::to_string(wanted) + " core(s), and the job's processes got " + cores_words(m.job_cores) +
              " (their CPU time over the run's wall-clock)";
  evidence += also.empty() ? ". The speedups were measured on a busy machine"
                           : ". The runs at " + also + " were busy too: the speedups were measured on a busy machine";
  const std::string stop_load =
      "stop the other load, or run the job where nothing else does; or give the job only the cores the load leaves "
      "(fewer --threads-per-worker, or taskset)";
  const std::string own_cores = "run where the cores are the job's: dedicated vCPUs (a VM whose host is not "
                                "oversubscribed), or bare metal";
  return Finding{"busy machine", evidence, (stolen ? own_cores : stop_load) + "; until then every figure here is partly " +
                                     (stolen ? "the hypervisor's" : "the load's")};
}

}  // namespace

StepSeconds step_seconds(const WorkerSummary& w) {
  const Totals& t = w.totals;
  const double n = std::max<double>(1.0, static_cast<double>(t.steps));
  auto phase = [&](Phase p) { return t.phases[static_cast<std::size_t>(p)] / n; };
  StepSeconds s;
  s.step = t.wall / n - phase(Phase::setup);
  s.input = phase(Phase::input_wait);
  s.start = phase(Phase::replica_start);
  s.forward = phase(Phase::forward);
  s.backward = phase(Phase::backward);
  s.comm = phase(Phase::communication);
  s.straggler = phase(Phase::straggler_wait);
  s.optimizer = phase(Phase::optimizer);
  s.pull = phase(Phase::pull);
  s.push = phase(Phase::push);
  s.transfer = t.transfer / n;
  s.bytes = w.bytes_per_step();
  s.to_device = phase(Phase::to_device);
  s.device_wait = phase(Phase::device_wait);
  s.gpu = t.gpu_seconds() / n;
  return s;
}

double ScaleRun::spread() const {
  if (rounds.size() < 2) return 0.0;
  const double mid = dtrain::median(rounds);
  const auto [lo, hi] = std::minmax_element(rounds.begin(), rounds.end());
  return mid > 0 ? (*hi - *lo) / mid : 0.0;
}

double speedup_the_cores_allow(const ScaleRun& base, const ScaleRun& run) {
  const int b = base.cores_computing(), r = run.cores_computing();
  return b > 0 && r > 0 ? static_cast<double>(r) / b : 0.0;
}

std::vector<std::size_t> check_trust(std::vector<ScaleRun>& runs) {
  std::vector<std::size_t> doubted;
  if (runs.empty()) return doubted;
  const ScaleRun& base = runs.front();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    ScaleRun& r = runs[i];
    r.doubt.clear();
    if (i == 0 || base.samples_per_second <= 0) continue;
    const double speedup = r.samples_per_second / base.samples_per_second;
    const double noise = base.spread() + r.spread();
    const double cores = speedup_the_cores_allow(base, r);
    // What does not compute (input, start, communication, the update) is paid per step,
    // and a larger global batch spreads it over more rows: where it weighs, samples/s may
    // grow by up to the batch's ratio with no more cores (an input-bound job, say).
    double allowed = cores;
    if (cores > 0 && !base.rows.empty() && base.global_batch > 0 && r.global_batch > base.global_batch) {
      const StepSeconds s = step_seconds(base.rows.front());
      const double g = static_cast<double>(r.global_batch) / static_cast<double>(base.global_batch);
      const double compute = s.compute(), other = std::max(0.0, s.step - compute);
      if (compute + other > 0) allowed = std::max(cores, g * (compute + other) / (compute * g / cores + other));
    }
    if (allowed > 0 && speedup > allowed * (1.15 + noise)) {
      r.doubt = format("a speedup of %.2fx is more than the %.2fx its cores allow (%.0f against %.0f computing", speedup,
                       allowed, r.cores_computing(), base.cores_computing()) +
                (allowed > cores * 1.005 ? format(", with its per-step costs spread over a %.2gx larger batch",
                                                   static_cast<double>(r.global_batch) / base.global_batch)
                                         : std::string()) +
                "): another load on the machine slowed the first run, or this one ran alone";
    } else if (r.rounds.size() > 1 && base.rounds.size() > 1 && noise > std::abs(speedup - 1)) {
      r.doubt = format("its rounds and the first run's spread %.0f%% and %.0f%%, more than the %.0f%% between them: ",
                       100 * r.spread(), 100 * base.spread(), 100 * std::abs(speedup - 1)) +
                "whether it is faster or slower is within the noise";
    }
    if (!r.doubt.empty()) doubted.push_back(i);
  }
  return doubted;
}

double busy_excess(const ScaleRun& r) { return busy_excess(r.machine, r.host_threads); }

std::string scaling_table(const std::vector<ScaleRun>& runs) {
  std::ostringstream o;
  o << "| workers | replicas per worker | global batch | threads / cores | samples/s | spread | speedup | step ms | "
       "input wait | replica start | forward + backward | communication (exposed) | straggler wait | optimizer | other |\n"
       "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const double base = runs.empty() ? 0 : runs.front().samples_per_second;
  std::string doubts, gpus;
  for (const ScaleRun& r : runs) {
    if (r.rows.empty()) continue;
    const StepSeconds s = step_seconds(r.rows.front());
    const double step = std::max(s.step, 1e-12);
    const std::string resources =
        r.host_cores > 0 ? (r.hosts > 1 ? std::to_string(r.hosts) + " x " : std::string()) +
                               std::to_string(r.host_threads) + " / " + std::to_string(r.host_cores)
                         : std::string("-");
    o << "| " << r.workers << " | " << r.replicas << " | " << r.global_batch << " | " << resources << " | "
      << detail::fixed(r.samples_per_second, 0) << " | "
      << (r.rounds.size() > 1 ? pct(r.spread()) : std::string("-")) << " | "
      << detail::fixed(base > 0 ? r.samples_per_second / base : 0, 2) << (r.doubt.empty() ? "" : " (in doubt)")
      << (busy_excess(r) > 0 ? " (busy machine)" : "")
      << " | " << detail::fixed(s.step * 1000, 2) << " | " << pct(s.input / step) << " | " << pct(s.start / step) << " | "
      << pct(s.compute() / step) << " | " << pct(s.comm / step) << " | " << pct(s.straggler / step) << " | "
      << pct(s.optimizer / step) << " | " << pct(s.other() / step) << " |\n";
    if (s.gpu > 0)  // the GPU's own time, the host's launches and waits, the batch's copy
      gpus += "On the GPU, " + scale_words(r) + ": the GPU's own time " + pct(s.gpu / step) +
              " of the step; the host's launches " + pct((s.compute() + s.optimizer) / step) + ", its wait for the GPU " +
              pct(s.device_wait / step) + ", the batch's copy on the training thread " + pct(s.to_device / step) + ".\n";
    if (busy_excess(r) > 0) doubts += busy_words(scale_words(r), r.machine);
    if (!r.doubt.empty())
      doubts += "In doubt, " + scale_words(r) + ": " + r.doubt + ".\n";
  }
  if (runs.size() > 0 && runs.front().host_cores > 0)
    o << "(threads / cores: the compute threads the workers of one host asked for, and the cores there; spread: "
         "the range of the rounds' samples/s over their median)\n";
  o << gpus << doubts;
  return o.str();
}

std::vector<Finding> diagnose(const std::vector<ScaleRun>& runs) {
  std::vector<Finding> out;
  const ScaleRun* big = nullptr;
  for (const ScaleRun& r : runs)
    if (!r.rows.empty() && (!big || r.replicas_in_sync() >= big->replicas_in_sync())) big = &r;
  if (!big) return out;
  const StepSeconds s = step_seconds(big->rows.front());
  const double step = std::max(s.step, 1e-12);
  const std::string where =
      format("at %.0f worker(s) x %.0f replica(s), global batch %.0f", big->workers, big->replicas,
             static_cast<double>(big->global_batch));

  // The machine first: what another load took, the job did not get, and every figure
  // after this one is partly the load's.
  if (std::optional<Finding> busy = busy_machine(runs)) out.push_back(*busy);

  // Resources next: a scale that adds no cores cannot compute faster, whatever else it
  // shows; threads beyond the cores take turns on them.
  const ScaleRun& base = runs.front();
  const bool oversubscribed = big->host_cores > 0 && big->host_threads > big->host_cores;
  const std::string threads_there =
      std::to_string(big->host_threads) + " compute thread(s) on " + std::to_string(big->host_cores) + " core(s)" +
      (big->hosts > 1 ? " on each of its " + std::to_string(big->hosts) + " hosts" : std::string(" on one host"));
  if (&base != big && big->replicas_in_sync() > base.replicas_in_sync() && base.cores_computing() > 0 &&
      big->cores_computing() > 0 && big->cores_computing() <= base.cores_computing()) {
    const double speedup = base.samples_per_second > 0 ? big->samples_per_second / base.samples_per_second : 0;
    out.push_back(
        {big->hosts == 1 ? "shared cores" : "no more compute",
         where + ", the workers and replicas asked for " + threads_there + ", computing on " +
             std::to_string(big->cores_computing()) + " core(s), no more than the " +
             std::to_string(base.cores_computing()) + " the run at " + scale_words(base) + " computed on (" + std::to_string(base.host_threads) +
             " thread(s)): distributing added communication and no compute" +
             (speedup > 0 ? format(", and the job ran at %.2fx its samples/s", speedup) : std::string()),
         "scale onto cores the job does not use yet: workers on other machines (dtrain launch on each, or TF_CONFIG), "
         "or on this host one process with all " +
             std::to_string(big->host_cores) +
             " cores (--threads) is as fast as the job gets here; every replica or worker added on the same cores "
             "only divides them"});
  } else if (oversubscribed) {
    out.push_back({"oversubscribed", where + ", the workers and replicas asked for " + threads_there +
                                         ": the threads take turns, each computing at a fraction of a core",
                   "keep the workers x replicas x threads per replica of one host within its " +
                       std::to_string(big->host_cores) +
                       " cores (each replica computes with at least one thread): fewer replicas per worker, or "
                       "fewer threads per worker (--threads-per-worker for the doctor, OMP_NUM_THREADS or --threads "
                       "for dtrain fit)"});
  }
  if (!big->doubt.empty())
    out.push_back({"figures in doubt", where + ": " + big->doubt,
                   "run the doctor on a machine nothing else loads, with more steps (--steps) or rounds (--rounds); "
                   "no conclusion is drawn here from this run's speedup"});

  if (s.input / step >= 0.10)
    out.push_back({"input-bound",
                   "input wait is " + pct(s.input / step) + " of each step (" + ms(s.input) + " of " + ms(s.step) + ") " +
                       where,
                   "overlap the input with training: prefetch(AUTOTUNE) at the end of the pipeline, and "
                   "map(fn, AUTOTUNE) for slow per-element work (or cache() what does not change); with the input "
                   "hidden, a step would take about " +
                       ms(step - s.input) + format(" (%.2fx the samples/s)", step / std::max(step - s.input, 1e-12))});

  // On a GPU: the batch's copy on the training thread, and a GPU that waits for the
  // host's launches (its work ends with them, and the host hardly waits for it).
  if (s.to_device / step >= 0.10)
    out.push_back({"host-to-device copies",
                   "copying each batch to the GPU takes " + pct(s.to_device / step) + " of the step (" +
                       ms(s.to_device) + " of " + ms(s.step) + ") " + where,
                   "copy the batches ahead of the step, from page-locked memory beside the GPU's compute stream: "
                   "dtrain's fit does so for arrays and Datasets, and a pipeline of your own ends with "
                   "dataset.apply(tf.data.experimental.prefetch_to_device('/gpu:0')); with the copy hidden, a step "
                   "would take about " +
                       ms(step - s.to_device) +
                       format(" (%.2fx the samples/s)", step / std::max(step - s.to_device, 1e-12))});
  const double launches = s.compute() + s.optimizer;
  if (s.gpu > 0 && s.device_wait / step < 0.10 && s.gpu <= 1.10 * launches)
    out.push_back({"launch-bound",
                   "the host took " + ms(launches) + " of each step (" + ms(s.step) + ") " + where +
                       " to launch the forward, backward and update, and then waited " + ms(s.device_wait) +
                       " for the GPU, whose work took " + ms(s.gpu) +
                       ": the GPU's work ended with its launches, so the GPU waited for the host",
                   "give each launch more work: a larger batch per step (a kernel launch costs the same whatever "
                   "it computes), fewer and wider layers; the host's launches are the step's floor here"});

  // What the others wait for a straggler shows as their communication; it is the
  // straggler's finding, not the link's. A worker's own time is its step less its waits
  // for the others (communication, straggler wait): compute, but also its input, its
  // optimizer and whatever else slows it (other load on its machine).
  double straggler_excess = 0;
  if (big->rows.size() > 1) {
    std::vector<StepSeconds> seconds;
    std::vector<double> own;
    for (const WorkerSummary& w : big->rows) {
      seconds.push_back(step_seconds(w));
      own.push_back(seconds.back().own());
    }
    const double fastest = *std::min_element(own.begin(), own.end());
    // Each worker's typical step, the median of its steps' own work (where the summaries
    // keep them): a straggler is slower step after step, where a worker the scheduler, or
    // a moment's other load, stopped a few times has a slower mean but typical steps.
    std::vector<double> typical;
    for (const WorkerSummary& w : big->rows)
      if (!w.step_work.empty()) typical.push_back(dtrain::median(w.step_work));
    if (typical.size() != own.size()) typical.clear();
    // The median of the other workers' values: with two workers, the other one's.
    auto others = [](const std::vector<double>& values, std::size_t k) {
      std::vector<double> rest = values;
      rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(k));
      return dtrain::median(rest);
    };
    // Slower than the others by a fifth. Workers of one host whose compute threads take
    // every core share them with each other's communication and input threads, and the
    // scheduler alone gives one of them a smaller share, step after step, for a whole run
    // (up to 1.6x as long as its peer, with steps of a fraction of a millisecond): there,
    // 1.8x as long, which a worker planted to compute twice as long still is.
    const bool cores_shared = big->hosts == 1 && big->host_cores > 0 && big->host_threads >= big->host_cores;
    const double slower = cores_shared ? 1.8 : 1.2;
    for (std::size_t k = 0; k < own.size(); ++k) {
      const double median = others(own, k);
      // And by enough to matter: a tenth of the step.
      if (median <= 0 || own[k] <= slower * median || own[k] - median < 0.1 * step) continue;
      if (!typical.empty() && typical[k] <= slower * others(typical, k)) continue;
      straggler_excess = std::max(straggler_excess, own[k] - fastest);
      double others_wait = 0;
      for (std::size_t j = 0; j < own.size(); ++j)
        if (j != k) others_wait = std::max(others_wait, seconds[j].straggler + seconds[j].comm);
      out.push_back({"straggler",
                     "worker:" + std::to_string(k) + " works " + ms(own[k]) + " per step (compute " +
                         ms(seconds[k].compute()) + "), " + format("%.1fx", own[k] / median) +
                         " the other workers' median " + ms(median) + " (the fastest: " + ms(fastest) + ")" +
                         "; the others wait up to " + ms(others_wait) + " per step in communication for it " + where,
                     "find what slows worker:" + std::to_string(k) +
                         " (other load on its machine, fewer or slower cores, its input); every synchronous step "
                         "runs at the slowest worker's pace. At the others' pace a step would take about " +
                         ms(s.step - (own[k] - median))});
    }
  }

  // What a step spends whatever its batch: exposed communication (each round's fixed cost
  // and its bytes), the replicas' start and the optimizer's update. Where it outweighs
  // the replicas' compute, the batch each replica gets is too small to pay for it.
  const double exposed = std::max(0.0, s.comm + s.straggler - straggler_excess);
  const double fixed = exposed + s.start + s.optimizer;
  // Samples/s at twice the per-replica batch: the step gains another compute and input.
  const double at_twice_batch = 2 * step / (step + s.compute() + s.input);
  std::optional<Finding> too_small, communication;
  const double rows = static_cast<double>(big->global_batch) / big->replicas_in_sync();
  if (big->replicas_in_sync() > 1 && s.compute() > 0 && rows > 0 && s.compute() < fixed) {
    // Each part as the table's columns show it (exposed communication with the straggler
    // wait where there is one, less a straggler's own lateness).
    std::vector<std::string> parts;
    if (ms(exposed) != ms(0))
      parts.push_back((s.straggler > 0 ? "communication and straggler wait " : "communication ") + ms(exposed));
    if (ms(s.optimizer) != ms(0)) parts.push_back("the optimizer's update " + ms(s.optimizer));
    if (ms(s.start) != ms(0)) parts.push_back("starting the replicas " + ms(s.start));
    std::string listed;
    for (const std::string& part : parts) listed += (listed.empty() ? "" : ", ") + part;
    // Were compute to grow in proportion to the rows, and that work to stay as it is,
    // this many would balance them.
    const double enough = std::ceil(rows * fixed / s.compute());
    const std::string twice =
        format("at twice the per-replica batch (global %.0f) the same work is spread over twice the samples, about "
               "%.2fx the samples/s",
               2.0 * static_cast<double>(big->global_batch), at_twice_batch);
    too_small = Finding{
        "too small a batch per replica",
        "each replica computes " + ms(s.compute()) + " per step on its " + detail::fixed(rows, 0) +
            " row(s), and the step spends " + ms(fixed) + " on work that does not grow with the batch (" + listed +
            ") " + where,
        "give each replica more rows: " +
            (enough > 2 * rows ? format("about %.0f (a global batch of %.0f) would let its compute outweigh that "
                                        "work; ",
                                        enough, enough * big->replicas_in_sync())
                               : std::string()) +
            twice + "; or train on fewer replicas"};
  }

  if (big->replicas_in_sync() > 1 && exposed / step >= 0.25) {
    // The shares are the table's (worker 0's row), each as its column shows it.
    std::string evidence = "communication (exposed) is " + pct(s.comm / step) + " of each step" +
                           (s.straggler > 0 ? " and straggler wait " + pct(s.straggler / step) : std::string()) +
                           " (" + ms(exposed) + " of " + ms(s.step) + " not hidden behind compute" +
                           (straggler_excess > 0 ? ", the straggler's own lateness left out" : "") + ") " + where;
    std::string fix;
    if (s.bytes > 0) {
      evidence += format("; %.1f MB all-reduced per step in %.2f ms", s.bytes / 1e6, s.transfer * 1000);
      if (s.transfer > 0) evidence += " (" + format_rate(s.bytes / s.transfer) + ")";
      // Compressed buckets take the TCP ring: no help to workers that share memory.
      if (!big->shared_memory && !big->compressed)
        fix += "compress the buckets on the wire (--compression bf16 halves the bytes: about " +
               ms(step - std::min(s.comm, s.transfer / 2)) + " per step); ";
    }
    const double k_steps = 4;
    const double per_micro = step - exposed - s.optimizer;
    fix += format("accumulate gradients over 4 batches (--gradient-accumulation-steps 4: one reduction per 4 "
                  "batches, about %.2fx the samples/s); a larger per-replica batch spreads the same bytes over more "
                  "samples (twice the batch: about %.2fx)",
                  step * k_steps / (k_steps * per_micro + exposed + s.optimizer), at_twice_batch);
    // Most of the bytes an embedding table's, of which a batch looks up a small part: the
    // parameter servers move only those rows.
    if (big->table_bytes > 0 && big->table_bytes >= 0.25 * big->float32_gradient_bytes() &&
        big->table_rows_bytes <= 0.5 * big->table_bytes)
      fix += format("; or hold the embedding tables on parameter servers in row shards (--strategy "
                    "parameter_server --ps N --partitioner fixed:N): a step then moves only the rows its batch "
                    "looks up, at most %.1f MB of the tables' %.1f MB",
                    big->table_rows_bytes / 1e6, big->table_bytes / 1e6);
    communication = Finding{"communication-bound", evidence, fix};
  }
  // Both say the step waits on more than it computes. Where moving the bytes alone takes
  // longer than the replicas' compute and is most of the wait (a narrow or slow link), the
  // link is the cause and is named first: no batch a replica can hold hides it. Where it
  // is the fixed cost of each round, the optimizer or the start (few bytes, any link), or
  // the workers share memory (no link to blame), the replicas' small batch is.
  const bool link_bound = communication && !big->shared_memory && s.transfer >= 0.5 * exposed &&
                          (!too_small || s.transfer > s.compute());
  if (link_bound) out.push_back(*communication);
  if (too_small) out.push_back(*too_small);
  if (communication && !link_bound) out.push_back(*communication);

  if (s.optimizer / step >= 0.25)
    out.push_back({"optimizer-bound",
                   "the update is " + pct(s.optimizer / step) + " of each step (" + ms(s.optimizer) + ") " + where,
                   "the optimizer reads and writes every variable and its slots once per step, independent of the "
                   "batch: a larger batch or gradient accumulation spreads it over more samples; SGD with momentum "
                   "moves a third less memory than Adam"});
  return out;
}

double job_noise_scale(const std::vector<ScaleRun>& runs) {
  const ScaleRun* from = nullptr;
  for (const ScaleRun& r : runs)
    if (r.noise_scale > 0 && (!from || r.replicas_in_sync() > from->replicas_in_sync())) from = &r;
  return from ? from->noise_scale : 0.0;
}

std::string time_to_accuracy_table(const std::vector<ScaleRun>& runs, double noise_scale) {
  const double target = common_target(runs);
  std::ostringstream o;
  o << "| workers | replicas per worker | global batch | samples seen | training s | loss reached | accuracy | time to loss "
    << detail::fixed(target, 4) << " s | sooner than the first |"
    << (noise_scale > 0 ? " statistical efficiency | goodput samples/s |" : "") << "\n|---|---|---|---|---|---|---|---|---|"
    << (noise_scale > 0 ? "---|---|" : "") << "\n";
  std::optional<double> first;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const ScaleRun& r = runs[i];
    double seconds = 0;
    for (double s : r.epoch_seconds) seconds += s;
    const std::optional<double> t = time_to_loss(r.epoch_seconds, r.loss, target);
    if (i == 0) first = t;
    const double samples = static_cast<double>(r.global_batch) * static_cast<double>(r.steps_trained);
    o << "| " << r.workers << " | " << r.replicas << " | " << r.global_batch << " | "
      << detail::fixed(samples, 0) << " | " << detail::fixed(seconds, 2) << " | "
      << (r.loss.empty() ? std::string("-") : detail::fixed(r.loss.back(), 4)) << " | "
      << (r.final_accuracy >= 0 ? detail::percent(r.final_accuracy, 1) : std::string("-")) << " | "
      << (t ? detail::fixed(*t, 2) : std::string("not reached")) << " | "
      << (t && first && *t > 0 ? detail::fixed(*first / *t, 2) + "x" : std::string("-")) << " |";
    if (noise_scale > 0) {
      const double efficiency = statistical_efficiency(noise_scale, static_cast<double>(r.global_batch));
      o << " " << detail::percent(efficiency, 0) << " | " << detail::fixed(r.samples_per_second * efficiency, 0) << " |";
    }
    o << "\n";
  }
  return o.str();
}

std::string time_to_loss_what_if(double rate_one, double rate, int workers, double batch_one, double noise_scale) {
  if (noise_scale <= 0 || rate_one <= 0 || batch_one <= 0) return {};
  const double batch = batch_one * workers;
  const double e_one = statistical_efficiency(noise_scale, batch_one), e = statistical_efficiency(noise_scale, batch);
  const double sooner = rate * e / (rate_one * e_one);
  std::ostringstream o;
  o << "Time to the same loss at " << workers << " worker(s): about " << detail::fixed(sooner, 2)
    << "x sooner than one worker (" << detail::fixed(rate / rate_one, 2) << "x the samples/s, each sample worth "
    << detail::fixed(e / e_one, 2) << "x as much: statistical efficiency " << detail::percent(e_one, 0) << " at a global batch of "
    << detail::fixed(batch_one, 0) << ", " << detail::percent(e, 0) << " at " << detail::fixed(batch, 0)
    << ", with a gradient noise scale of " << detail::fixed(noise_scale, 0) << ").\n";
  return o.str();
}

std::string batch_advice(const std::vector<ScaleRun>& runs, double noise_scale) {
  if (noise_scale <= 0 || runs.empty()) return {};
  const ScaleRun* big = &runs.front();
  for (const ScaleRun& r : runs)
    if (r.replicas_in_sync() > big->replicas_in_sync()) big = &r;
  const double B = static_cast<double>(big->global_batch), critical = noise_scale;
  const double efficiency = statistical_efficiency(critical, B);
  std::ostringstream o;
  o << "The gradient noise scale is about " << detail::fixed(critical, 0)
    << " samples (the critical batch: beyond it a larger batch buys little progress per step). At the largest scale's "
       "global batch of "
    << big->global_batch << " a sample makes " << detail::percent(efficiency, 0) << " of its best progress";
  const int replicas = big->replicas_in_sync();
  if (B < critical / 2) {
    const double per_replica = std::ceil(critical / replicas);
    o << "; the batch is well below it: raise the global batch toward " << detail::fixed(critical, 0) << " ("
      << detail::fixed(per_replica, 0) << " rows per replica: --batch-size " << detail::fixed(per_replica * replicas, 0)
      << ") and scale the learning rate with it (the linear rule, times "
      << detail::fixed(per_replica * replicas / B, 2)
      << ", with gradual warmup over the first epochs: optim::gradual_warmup), which spreads each step's communication "
         "and update over more samples at "
      << detail::percent(statistical_efficiency(critical, per_replica * replicas), 0) << " efficiency.\n";
  } else if (B > 2 * critical) {
    o << "; the batch is past it: each added replica adds samples/s but little progress, so time to a loss falls "
         "far less than the samples/s rise; a smaller per-replica batch (or fewer replicas) reaches it in about the "
         "same time with less compute.\n";
  } else {
    o << "; the batch is near it, where samples/s and progress per sample are balanced: keep it.\n";
  }
  return o.str();
}

std::string format_findings(const std::vector<Finding>& findings) {
  std::ostringstream o;
  if (findings.empty()) {
    o << "No single cause stands out: no phase beyond compute takes a large share of the step.\n";
    return o.str();
  }
  for (const Finding& f : findings)
    o << "- " << f.cause << ": " << f.evidence << ".\n  Fix: " << f.fix << ".\n";
  return o.str();
}

}  // namespace dtrain::profile
