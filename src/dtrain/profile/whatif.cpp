// The what-if model's arithmetic, its options' parsing and its tables.
#include "dtrain/profile/whatif.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <numeric>
#include <cstdlib>
#include <sstream>

#include "dtrain/core/error.h"
#include "dtrain/profile/format.h"

namespace dtrain::profile {
namespace {

using detail::ms;

// Splits "2.5Gbit" into 2.5 and "Gbit"; false when it does not start with a number.
bool split_number(const std::string& text, double& value, std::string& unit) {
  const char* begin = text.c_str();
  char* end = nullptr;
  value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value) || value < 0) return false;
  unit = std::string(end);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  return true;
}

double decimal_prefix(char c) {
  switch (c) {
    case 'k':
    case 'K':
      return 1e3;
    case 'm':
    case 'M':
      return 1e6;
    case 'g':
    case 'G':
      return 1e9;
    case 't':
    case 'T':
      return 1e12;
    default:
      return 0;
  }
}

}  // namespace

double parse_rate(const std::string& text) {
  std::string name = text;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "nvlink") return kNvlinkBytesPerSecond;
  if (name == "pcie5") return kPcie5BytesPerSecond;
  if (name == "pcie4") return kPcie5BytesPerSecond / 2;
  double value = 0;
  std::string unit;
  if (split_number(text, value, unit) && value > 0) {
    double scale = 1;
    std::string rest = unit;
    if (!rest.empty() && decimal_prefix(rest.front()) > 0 && rest.size() > 1) {
      scale = decimal_prefix(rest.front());
      rest.erase(0, 1);
    }
    std::string lower = rest;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "bit" || lower == "bit/s" || lower == "bits" || lower == "bits/s") return value * scale / 8;
    if (rest == "B/s" || rest == "B") return value * scale;
  }
  DTRAIN_THROW(InvalidArgument, "link rate '", text,
               "' is not a rate: write it as bits (10Gbit, 100Mbit, 2.5Gbit/s), bytes per second (1.25GB/s), or "
               "a GPU link's name (nvlink, pcie5, pcie4)");
}

double parse_duration(const std::string& text) {
  double value = 0;
  std::string unit;
  if (split_number(text, value, unit)) {
    if (unit == "s") return value;
    if (unit == "ms") return value * 1e-3;
    if (unit == "us") return value * 1e-6;
    if (unit == "ns") return value * 1e-9;
  }
  DTRAIN_THROW(InvalidArgument, "latency '", text, "' is not a duration: write it as 50us, 0.2ms or 1s");
}

double parse_bytes(const std::string& text) {
  double value = 0;
  std::string unit;
  if (split_number(text, value, unit)) {
    std::string lower = unit;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower.empty() || lower == "b") return value;
    if (lower == "kb") return value * 1e3;
    if (lower == "mb") return value * 1e6;
    if (lower == "kib") return value * 1024;
    if (lower == "mib") return value * 1024 * 1024;
  }
  DTRAIN_THROW(InvalidArgument, "burst '", text, "' is not a size in bytes: write it as 64KB, 256KiB or 1MB");
}

std::string link_words(const Link& link) {
  std::string words = format_rate(link.bytes_per_second) + ", " + detail::fixed(link.latency_seconds * 1e6, 0) +
                      " us latency";
  if (link.burst_bytes > 0) words += ", " + detail::fixed(link.burst_bytes / 1e3, 1) + " KB burst after idle";
  return words;
}

double transfer_seconds(double bytes, const Link& link, double idle) {
  if (!(bytes > 0)) return 0;
  const double refilled = std::min(link.burst_bytes, link.bytes_per_second * std::max(0.0, idle));
  return std::max(0.0, bytes - refilled) / link.bytes_per_second;
}

namespace {

// A transfer of `bytes` each way every round, the round's `others` seconds (and the other
// way's transfer, as long) between: the link rests for others + t before each, so that t
// solves t = T - min(burst time, others + t), T the bytes at the link's rate. Where the
// rest refills the whole burst, t = T - burst time; where not, t = (T - others) / 2.
double round_trip_transfer(double bytes, const Link& link, double others) {
  if (!(bytes > 0)) return 0;
  const double whole = bytes / link.bytes_per_second, burst = link.burst_bytes / link.bytes_per_second;
  return others + whole >= 2 * burst ? std::max(0.0, whole - burst) : std::max(0.0, (whole - others) / 2);
}

}  // namespace

std::string format_rate(double bytes_per_second) {
  const double bits = bytes_per_second * 8;
  std::string b = bits >= 1e9 ? detail::fixed(bits / 1e9, 1) + " Gbit/s" : detail::fixed(bits / 1e6, 0) + " Mbit/s";
  std::string B = bytes_per_second >= 1e9 ? detail::fixed(bytes_per_second / 1e9, 2) + " GB/s"
                                          : detail::fixed(bytes_per_second / 1e6, 1) + " MB/s";
  return b + " (" + B + ")";
}

WhatIf parse_what_if(const std::string& text) {
  WhatIf w;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const std::size_t eq = part.find('=');
    const std::string key = part.substr(0, eq);
    const std::string value = eq == std::string::npos ? std::string() : part.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      DTRAIN_THROW(InvalidArgument, "--what-if: '", part, "' is not key=value (workers=16,link=10Gbit,latency=50us)");
    if (key == "workers") {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (*end != '\0' || n < 1 || n > 1'000'000)
        DTRAIN_THROW(InvalidArgument, "--what-if: workers must be a whole number from 1, got '", value, "'");
      w.workers = static_cast<int>(n);
    } else if (key == "link") {
      w.link = parse_rate(value);
    } else if (key == "latency") {
      w.latency = parse_duration(value);
    } else if (key == "burst") {
      w.burst = parse_bytes(value);
    } else if (key == "staged") {
      w.staged = parse_rate(value);
    } else {
      DTRAIN_THROW(InvalidArgument, "--what-if: unknown key '", key,
                   "' (known: workers, link, latency, burst, staged)");
    }
  }
  return w;
}

StepModel step_model(const ScaleRun& one) {
  if (one.workers != 1 || one.rows.empty())
    DTRAIN_THROW(InvalidArgument, "what-if: the model starts from a run at one worker, got ", one.workers);
  const StepSeconds s = step_seconds(one.rows.front());
  if (!(s.step > 0))
    DTRAIN_THROW(InvalidArgument, "what-if: the run at one worker (", one.replicas, " replica(s)) has no step time");
  StepModel m;
  m.forward = s.forward;
  m.backward = s.backward;
  m.local_sum = s.comm + s.straggler;
  m.fixed = std::max(0.0, s.step - s.compute() - m.local_sum);
  m.input = s.input;
  m.optimizer = s.optimizer;
  m.gradient_bytes = one.gradient_bytes;
  m.table_bytes = one.table_bytes;
  m.table_rows_bytes = one.table_rows_bytes;
  m.buckets = std::max(1, one.buckets);
  m.overlap = one.overlap;
  m.spare_core = one.spare_core;
  m.compressed = one.compressed;
  m.batch = one.global_batch;
  m.replicas = one.replicas;
  const Totals& t = one.rows.front().totals;
  if (t.steps > 0)
    m.gpu_backward = t.gpu[static_cast<std::size_t>(Phase::backward)] / static_cast<double>(t.steps);
  m.copy_bytes = one.float32_gradient_bytes();
  return m;
}

double ring_seconds(double bytes, int buckets, int workers, const Link& link, double idle) {
  if (workers < 2) return 0;
  if (bytes > 0 && !(link.bytes_per_second > 0))
    DTRAIN_THROW(InvalidArgument, "what-if: a link of ", link.bytes_per_second, " bytes/s cannot move the gradients");
  const double n = workers;
  const double latency = 2 * (n - 1) * std::max(1, buckets) * link.latency_seconds;
  // Every worker sends its 2(n-1)/n of the bytes, the first of them in a burst where the
  // links rested; each of the ring's steps waits for the one before it, so the burst is
  // saved once.
  return latency + transfer_seconds(2 * (n - 1) / n * bytes, link, idle);
}

namespace {

// `work` (a worker's step without the ring, its input wait included) as the straggler does
// it: all but the input wait `straggler` times as long.
double straggling(const StepModel& m, double work) { return m.input + m.straggler * (work - m.input); }

// The part of a `ring` in `buckets` that backward (the slowest worker's) does not hide: it
// starts once backward made the first bucket, and only with overlap on a core of its own.
double exposed_ring(double ring, int buckets, double backward, bool overlap, bool spare_core) {
  const double k = std::max(1, buckets);
  return overlap && spare_core ? std::max(ring / k, ring - backward * (k - 1) / k) : ring;
}

// `p`'s ring and its exposed part, after a step's `work` (the slowest worker's, the ring
// left out): the links rest from one step's ring to the next's, for the work less the
// part of the ring hidden behind it, and send a burst's worth at once after that.
void ring_after(Prediction& p, double bytes, int buckets, int workers, const Link& link, double work,
                double backward, bool overlap, bool spare_core) {
  const double steady = ring_seconds(bytes, buckets, workers, link);
  const double rest = std::max(0.0, work - (steady - exposed_ring(steady, buckets, backward, overlap, spare_core)));
  p.ring = ring_seconds(bytes, buckets, workers, link, rest);
  p.exposed = exposed_ring(p.ring, buckets, backward, overlap, spare_core);
}

}  // namespace

Prediction predict(const StepModel& m, int workers, const Link& link) {
  Prediction p;
  p.workers = workers;
  const double alone = m.fixed + m.forward + m.backward + m.local_sum;
  const double work = workers > 1 ? straggling(m, alone) : alone;
  // The slowest worker computes `straggler` times as long; the ring waits for its buckets.
  const double slower = workers > 1 ? m.straggler : 1.0;
  const double window = m.gpu_backward > 0 ? m.gpu_backward : m.backward;
  if (m.staging > 0 && workers > 1) {
    // Staged through the host after backward: a copy each way, and the ring between them.
    ring_after(p, m.gradient_bytes, m.buckets, workers, link, work, 0, false, false);
    p.ring += 2 * m.copy_bytes / m.staging;
    p.exposed = p.ring;
  } else {
    ring_after(p, m.gradient_bytes, m.buckets, workers, link, work, slower * window, m.overlap, m.spare_core);
  }
  p.step = work + p.exposed;
  p.samples_per_second = p.step > 0 ? static_cast<double>(m.batch) * workers / p.step : 0;
  p.efficiency = p.step > 0 ? alone / p.step : 0;
  return p;
}

Prediction predict_ps(const StepModel& m, int workers, int ps, const std::string& consistency, Link link) {
  if (workers < 1 || ps < 1)
    DTRAIN_THROW(InvalidArgument, "what-if: a parameter-server step needs workers and ps, got ", workers, " and ", ps);
  if (m.gradient_bytes > 0 && !(link.bytes_per_second > 0))
    DTRAIN_THROW(InvalidArgument, "what-if: a link of ", link.bytes_per_second, " bytes/s cannot move the variables");
  // A pull or push split among several ps is a TCP flow to each, and they meet at the
  // worker's link (and, from several workers, at each ps's): no burst after a rest then. Measured
  // here between namespaces at 20 Mbit/s to 1 Gbit/s, a pull from two ps took 0.96 to 1.06
  // of its bytes' time at the link's rate and a push 1.03 to 1.16, where one flow to one
  // peer saves the burst (the all-reduce's ring).
  if (ps > 1) link.burst_bytes = 0;
  const bool sync = consistency.rfind("sync", 0) == 0, ssp = consistency.rfind("ssp", 0) == 0;
  if (!sync && !ssp && !consistency.empty() && consistency != "async")
    DTRAIN_THROW(InvalidArgument, "what-if: unknown consistency '", consistency,
                 "' (async, ssp(K), sync [with B backup workers])");
  const double n = workers;
  const double apply = m.optimizer / ps;
  // What a worker computes (the input wait included, the optimizer not); the straggler,
  // the last worker, computes `straggler` times as long.
  const double compute = std::max(0.0, m.fixed - m.optimizer) + m.forward + m.backward + m.local_sum;
  std::vector<double> own(static_cast<std::size_t>(workers), compute);
  if (workers > 1) own.back() = straggling(m, compute);
  double computed = compute;  // a worker's, on the mean
  if (m.closures.size() == own.size()) {
    own = m.closures;
    computed = std::accumulate(own.begin(), own.end(), 0.0) / n;
  }
  // Each ps's link carries every worker's part of its share, each way.
  const double share = m.gradient_bytes / ps;
  double paces = 0;     // closures per second, over every worker
  double transfer = 0;  // a worker's pull and push, queueing included
  if (sync) {
    int backup = 0;
    if (const std::size_t with = consistency.find("with "); with != std::string::npos)
      backup = std::atoi(consistency.c_str() + with + 5);
    std::vector<double> sorted = own;
    std::sort(sorted.begin(), sorted.end());
    const double waited_for = sorted[static_cast<std::size_t>(std::clamp(workers - backup, 1, workers) - 1)];
    // Each way the links rest for the rest of the round (the computing, the applying, the
    // dispatch and the other way), and send a burst's worth at once after it.
    const double others = waited_for + apply + m.dispatch + 2 * link.latency_seconds;
    const double each_way = link.latency_seconds + std::max(round_trip_transfer(m.gradient_bytes, link, others),
                                                            round_trip_transfer(n * share, link, others));
    transfer = 2 * each_way;
    // Each update comes every `round`; a worker slower than that (a backup covers it)
    // goes at its own pace, its late gradients dropped.
    const double after = transfer + apply + m.dispatch;  // a closure's, after its computing
    const double round = waited_for + after;
    for (double c : own) paces += 1 / std::max(round, c + after);
  } else {
    // Each worker at its own pace, meeting the others at the ps: a closed queueing network
    // solved by Schweitzer's approximate mean value analysis. A worker's cycle is its
    // closure, the chief's dispatch and the latencies (its own), then the ps's link each
    // way and its applying, which the workers share (TCP shares a link as processor
    // sharing does, for which the mean values hold). Its own link moves every ps's share
    // at once, each way, alongside them: a pull or push takes as long as the slower of its
    // visit to the ps's link (queueing included) and all its bytes over its own link.
    // A ps link rests between the workers' visits, for (1 - its use) / visits per second
    // on the mean, and sends a burst's worth at once after it. With one ps, its link
    // carries all of a worker's bytes and others' too, so the worker's own link is never
    // the slower; over several ps (no burst, above) it takes all the bytes at its rate.
    std::array<double, 3> demand{transfer_seconds(share, link, 0), transfer_seconds(share, link, 0), apply};
    const double own_link = ps > 1 ? transfer_seconds(m.gradient_bytes, link, 0) : 0;  // each way
    std::vector<double> moving(own.size(), 0);  // each worker's pull and push
    std::vector<std::array<double, 3>> queued(own.size(), {0, 0, 0});
    std::vector<double> pace(own.size(), 0);
    for (int iteration = 0; iteration < 10000; ++iteration) {
      std::array<double, 3> total{0, 0, 0};
      for (const auto& q : queued)
        for (std::size_t k = 0; k < 3; ++k) total[k] += q[k];
      double moved = 0;
      for (std::size_t w = 0; w < own.size(); ++w) {
        std::array<double, 3> residence{};
        const double rest = own[w] + m.dispatch;
        for (std::size_t k = 0; k < 3; ++k) residence[k] = demand[k] * (1 + total[k] - queued[w][k]);
        moving[w] = 2 * link.latency_seconds + std::max(residence[0], own_link) + std::max(residence[1], own_link);
        pace[w] = 1 / (rest + moving[w] + residence[2]);
        for (std::size_t k = 0; k < 3; ++k) {
          const double q = pace[w] * residence[k];
          moved = std::max(moved, std::abs(q - queued[w][k]));
          queued[w][k] = q;
        }
      }
      // The ps link's rest before a visit, as the mean over the visits (the queueing's
      // unevenness left aside); half way to it each time, as the rest and the transfer
      // pull each other back and forth.
      const double visits = std::accumulate(pace.begin(), pace.end(), 0.0);
      const double rest = std::max(0.0, 1 - visits * demand[0]) / visits;
      const double burst_demand = (demand[0] + transfer_seconds(share, link, rest)) / 2;
      moved = std::max(moved, std::abs(burst_demand - demand[0]));
      demand[0] = demand[1] = burst_demand;
      if (moved < 1e-12) break;
    }
    // ssp(K): in the long run nobody gets more than K closures ahead of the slowest.
    if (ssp) std::fill(pace.begin(), pace.end(), *std::min_element(pace.begin(), pace.end()));
    for (double x : pace) paces += x;
    for (double t : moving) transfer += t / n;
  }
  if (m.steps_per_epoch > 0) {
    // The copy after the epoch's steps goes the pulls' way: the chief's link rested all
    // epoch, a ps's at least while the workers computed their last steps.
    const double epoch = static_cast<double>(m.steps_per_epoch) / paces;
    const double copy = link.latency_seconds + std::max(transfer_seconds(m.gradient_bytes, link, computed),
                                                        transfer_seconds(share, link, computed));
    paces *= epoch / (epoch + copy);
  }
  Prediction p;
  p.workers = workers;
  p.step = n / paces;
  p.ring = transfer;
  p.exposed = std::max(0.0, p.step - computed);
  p.samples_per_second = static_cast<double>(m.batch) * paces;
  const double alone = m.fixed + m.forward + m.backward + m.local_sum;
  p.efficiency = alone > 0 ? p.samples_per_second * alone / (n * static_cast<double>(m.batch)) : 0;
  return p;
}

std::vector<Scenario> fixes_at(const StepModel& m, int workers, const Link& link) {
  std::vector<Scenario> out;
  out.push_back({"as measured", predict(m, workers, link)});

  if (!m.compressed) {
    StepModel bf16 = m;
    bf16.gradient_bytes = m.gradient_bytes / 2;
    out.push_back({"--compression bf16", predict(bf16, workers, link)});
  }

  // Four micro-batches, one reduction and one update: per batch, the compute and fixed
  // costs stay, the reduction and update are shared by four.
  const double k = 4;
  Prediction acc = out.front().prediction;
  const double per_batch = m.fixed - m.optimizer + m.forward + m.backward;
  acc.step = per_batch + (m.local_sum + acc.exposed + m.optimizer) / k;
  acc.samples_per_second = acc.step > 0 ? static_cast<double>(m.batch) * workers / acc.step : 0;
  acc.efficiency = acc.step > 0 ? (per_batch + (m.local_sum + m.optimizer) / k) / acc.step : 0;
  out.push_back({"--gradient-accumulation-steps 4", acc, k});

  // Twice the rows: input, forward and backward double; the bytes do not, and the longer
  // backward hides more of them.
  StepModel twice = m;
  twice.forward *= 2;
  twice.backward *= 2;
  twice.fixed += m.input;
  twice.batch *= 2;
  out.push_back({"twice the batch per replica", predict(twice, workers, link), 2});

  // The embedding tables on parameter servers: each worker pulls and pushes the rows its
  // batch looks up and the rest of the model whole, at its own pace.
  if (m.table_bytes > 0 && m.table_rows_bytes < m.table_bytes) {
    // The ps moves float32 values, whatever went on the ring.
    StepModel rows = m;
    rows.gradient_bytes =
        std::max(0.0, (m.compressed ? 2 * m.gradient_bytes : m.gradient_bytes) - m.table_bytes) + m.table_rows_bytes;
    rows.compressed = false;
    out.push_back({"ParameterServerStrategy, " + std::to_string(workers) + " ps, async: embedding rows only",
                   predict_ps(rows, workers, workers, "async", link)});
  }
  return out;
}

namespace {

// "| name | step ms | all-reduce ms | exposed ms | samples/s | efficiency |", without a line end.
std::string scenario_row(const Scenario& s) {
  const Prediction& p = s.prediction;
  return "| " + s.name + " | " + detail::fixed(p.step * 1000, 2) + " | " + detail::fixed(p.ring * 1000, 2) + " | " +
         detail::fixed(p.exposed * 1000, 2) + " | " + detail::fixed(p.samples_per_second, 0) + " | " +
         detail::percent(p.efficiency, 0) + " |";
}

}  // namespace

std::vector<Scenario> gpu_paths(const StepModel& m, int gpus, const Link& host_link, std::optional<double> gpu_latency) {
  const double latency = gpu_latency.value_or(10e-6);
  // NCCL's ring reads the gradients on the GPU and overlaps backward, its kernels beside
  // the compute stream's.
  StepModel on_gpu = m;
  on_gpu.staging = 0;
  on_gpu.overlap = on_gpu.spare_core = true;
  StepModel staged = m;
  staged.staging = kPcie5BytesPerSecond;
  return {
      {"NVLink, 450 GB/s each way: NCCL's ring overlapping backward",
       predict(on_gpu, gpus, Link{kNvlinkBytesPerSecond, latency})},
      {"PCIe Gen5, 64 GB/s each way: NCCL's ring overlapping backward",
       predict(on_gpu, gpus, Link{kPcie5BytesPerSecond, latency})},
      {"staged through host memory over PCIe Gen5, summed over " + format_rate(host_link.bytes_per_second) +
           " after backward (dtrain's GPU workers)",
       predict(staged, gpus, host_link)},
  };
}

std::string gpu_what_if_report(const StepModel& m, int gpus, const Link& host_link, std::optional<double> gpu_latency) {
  std::ostringstream o;
  o << "On " << gpus << " GPUs, a worker on each: " << m.batch << " rows per GPU per step, "
    << detail::fixed(m.gradient_bytes / 1e6, 1) << " MB of gradients, the GPU's backward "
    << detail::fixed(m.gpu_backward * 1000, 2) << " ms; GPU links' latency "
    << detail::fixed(gpu_latency.value_or(10e-6) * 1e6, 0) << " us a ring step"
    << (gpu_latency ? "" : " (assumed; latency= sets it)") << "\n"
    << "| path | step ms | all-reduce ms | exposed ms | samples/s | efficiency |\n|---|---|---|---|---|---|\n";
  for (const Scenario& s : gpu_paths(m, gpus, host_link, gpu_latency)) o << scenario_row(s) << "\n";
  return o.str();
}

std::string what_if_report(const StepModel& m, int workers, const Link& link, double noise_scale) {
  const bool goodput = noise_scale > 0;
  // What a fix is worth: samples/s, or with a noise scale the progress they make.
  auto worth = [&](const Scenario& s) {
    const double rows = static_cast<double>(m.batch) * workers * s.batch_factor;
    return s.prediction.samples_per_second * (goodput ? statistical_efficiency(noise_scale, rows) : 1.0);
  };
  std::ostringstream o;
  o << "What if: " << workers << " worker(s) x " << m.replicas << " replica(s), " << m.batch
    << " rows per worker per step, link " << link_words(link) << "; " << detail::fixed(m.gradient_bytes / 1e6, 1)
    << " MB of gradients in " << m.buckets << " bucket(s) per step\n"
    << "| | step ms | all-reduce ms | exposed ms | samples/s | efficiency |" << (goodput ? " goodput samples/s |" : "")
    << "\n|---|---|---|---|---|---|" << (goodput ? "---|" : "") << "\n";
  const std::vector<Scenario> scenarios = fixes_at(m, workers, link);
  for (const Scenario& s : scenarios) {
    o << scenario_row(s);
    if (goodput) o << " " << detail::fixed(worth(s), 0) << " |";
    o << "\n";
  }
  const Prediction& base = scenarios.front().prediction;
  const auto best = std::max_element(scenarios.begin() + 1, scenarios.end(),
                                     [&](const Scenario& a, const Scenario& b) { return worth(a) < worth(b); });
  const double gain = worth(*best) / std::max(worth(scenarios.front()), 1e-12);
  const std::string gained = goodput ? "x the goodput" : "x the samples/s";
  if (base.exposed < 0.05 * base.step)
    o << "At " << workers << " workers the all-reduce hides behind backward (" << ms(base.exposed)
      << " exposed per step): the job scales at " << detail::percent(base.efficiency, 0)
      << " efficiency; a fix to communication would gain little (the best, " << best->name << ": "
      << detail::fixed(gain, 2) << gained << ").\n";
  else
    o << "At " << workers << " workers " << ms(base.exposed) << " of each " << ms(base.step)
      << " step is all-reduce not hidden behind backward; the fix that matters most there: " << best->name << " ("
      << detail::fixed(gain, 2) << gained << ")"
      << (goodput ? ", the fixes ranked by goodput: samples/s times the statistical efficiency of their updates' rows" : "")
      << ".\n";
  return o.str();
}

namespace {

// Under the ps, a closure's pull and push on the mean over the run's workers.
double moved_a_closure(const ScaleRun& r) {
  double moved = 0;
  for (const WorkerSummary& w : r.rows) {
    const StepSeconds s = step_seconds(w);
    moved += (s.pull + s.push) / static_cast<double>(r.rows.size());
  }
  return moved;
}

// Under the ps, where a closure's pull and push explain at least half of what the step
// `missed` (measured less modelled) against the model's `ring`: why; otherwise (or with
// no pull and push measured) empty.
std::string transfer_why(const ScaleRun& r, double missed, double ring) {
  const double moved = moved_a_closure(r);
  const std::string took = "pull and push took " + detail::ms(moved) + " a closure where the model, queueing " +
                           "included, has " + detail::ms(ring) + ": ";
  if (missed > 0 && moved - ring >= 0.5 * missed)
    return took + "the CPU time of gRPC and the ps (serializing, applying, on cores the workers share) is not in "
                  "the model";
  if (missed < 0 && moved > 0 && ring - moved >= 0.5 * -missed)
    return took + "TCP did not share the ps's link evenly between the workers' transfers, as the model does, but "
                  "often served one before the other, which then computed and pushed while the other still pulled";
  return "";
}

// What a run's step spent beyond what the model and its compute explain, by the kind of
// run: replicas of one process, workers of one host over loopback, under the ps, or other.
std::string unexplained(const ScaleRun& r, bool mirrored, bool loopback, const StepSeconds& first,
                        double one_worker_input, double model_ring, const Link& link) {
  const std::string waits = detail::ms(first.comm + first.straggler) + " of communication and straggler wait a step";
  if (mirrored)
    return "the replicas' waits for each other and the sum of the buckets the dense layers do not compute together (" +
           waits + " in this run), which one replica does not show";
  if (loopback)
    return "on one host the kernel copies the workers' bytes over loopback on the cores they compute and prepare "
           "input on, which the probe, on idle cores, did not see (" +
           detail::ms(first.input) + " of input wait and " + waits + " in this run, " + detail::ms(one_worker_input) +
           " of input wait in the one-worker run)";
  if (r.ps > 0) {
    const std::string dispatch =
        r.dispatch > 0 ? "; the chief's dispatch took " + detail::ms(r.dispatch) + " a closure, which the replay counts" : "";
    return "the CPU time of the ps, gRPC and the chief's dispatch of closures, which the model leaves out (" +
           detail::ms(moved_a_closure(r)) + " of pull and push a closure in this run, " + detail::ms(model_ring) +
           " in the model" + dispatch + ")";
  }
  return "communication or fixed costs the model did not know (the link's latency: " +
         detail::fixed(link.latency_seconds * 1e6, 0) + " us a message)";
}

}  // namespace

std::optional<Prediction> replay(const ScaleRun& r, const StepModel& m, const Link& link) {
  // A row per worker, each with steps, and a link between several workers.
  if (r.rows.size() != static_cast<std::size_t>(r.workers) || (r.workers > 1 && !(link.bytes_per_second > 0)))
    return std::nullopt;
  for (const WorkerSummary& w : r.rows)
    if (w.totals.steps < 1) return std::nullopt;
  if (r.ps > 0) {
    StepModel own = m;
    for (const WorkerSummary& w : r.rows) own.closures.push_back(step_seconds(w).closure_work());
    own.dispatch = r.dispatch;
    return predict_ps(own, r.workers, r.ps, r.consistency, link);
  }
  std::size_t steps = r.rows.front().step_work.size();
  double backward = 0;  // the slowest worker's, which the ring waits for
  for (const WorkerSummary& w : r.rows) {
    steps = std::min(steps, w.step_work.size());
    backward = std::max(backward, step_seconds(w).backward);
  }
  if (steps == 0) return std::nullopt;
  double slowest = 0;  // summed over the steps
  for (std::size_t s = 0; s < steps; ++s) {
    double work = 0;
    for (const WorkerSummary& w : r.rows) work = std::max(work, w.step_work[s]);
    slowest += work;
  }
  Prediction p;
  p.workers = r.workers;
  // The sum of each worker's own replicas' buckets, as the model has it.
  const double work = slowest / static_cast<double>(steps) + m.local_sum;
  ring_after(p, r.gradient_bytes, r.buckets, r.workers, link, work, backward, r.overlap, r.spare_core);
  p.step = work + p.exposed;
  if (!(p.step > 0)) return std::nullopt;
  p.samples_per_second = static_cast<double>(r.global_batch) / p.step;
  p.efficiency = work / p.step;
  return p;
}

std::vector<Check> model_check(const std::vector<ScaleRun>& runs, const Link& link) {
  std::vector<Check> out;
  for (const ScaleRun& r : runs) {
    // MirroredStrategy's replicas in one process are checked against one replica; runs
    // at several workers only with a link to move their bytes.
    const bool mirrored = r.workers == 1 && r.replicas > 1 && r.ps == 0;
    if ((r.workers < 2 && !mirrored) || r.samples_per_second <= 0) continue;
    if (r.workers > 1 && !(link.bytes_per_second > 0)) continue;
    // The partner: one worker of as many replicas (of one, for replicas in one process),
    // on the rows one worker computes a step (under the ps, a closure has the whole batch).
    const auto one = std::find_if(runs.begin(), runs.end(), [&](const ScaleRun& o) {
      // (A run slowed by a planted straggler is no partner: the model would slow it twice.)
      if (o.workers != 1 || o.ps != 0 || o.straggler_factor > 1 || o.rows.empty()) return false;
      if (mirrored) return o.replicas == 1 && o.global_batch * r.replicas == r.global_batch;
      return o.replicas == r.replicas && o.global_batch * (r.ps > 0 ? 1 : r.workers) == r.global_batch;
    });
    if (one == runs.end()) continue;
    StepModel m = step_model(*one);
    m.gradient_bytes = r.gradient_bytes;
    m.buckets = std::max(1, r.buckets);
    m.overlap = r.overlap;
    m.spare_core = r.spare_core;
    m.compressed = r.compressed;
    m.straggler = r.straggler_factor;
    if (r.ps > 0 && !r.epoch_seconds.empty())
      m.steps_per_epoch = r.steps_trained / static_cast<std::int64_t>(r.epoch_seconds.size());
    // Workers sharing this host's cores beyond what it has compute slower than the run
    // at one worker did, by the ratio of threads to cores (workers with machines of
    // their own, which the what-if describes, do not). Replicas in one process each
    // compute the one replica's rows, all of them on the cores the one replica had or
    // on more: R replicas on C_R cores take R x C_1 / C_R times as long (at least as
    // long). Their gradients need no sum of their own: the dense layers' are computed
    // together, the others' buckets summed in memory, both inside the measured phases.
    double slower = r.oversubscription() / one->oversubscription();
    const bool on_gpu = m.gpu_backward > 0;
    if (mirrored) {
      m.batch = r.global_batch;
      m.replicas = r.replicas;
      const double cores_one = one->cores_computing(), cores = r.cores_computing();
      slower = std::max(1.0, r.replicas * (cores_one > 0 && cores > 0 ? cores_one / cores : 1.0));
      // Logical GPUs of one GPU queue their kernels on its one stream, one replica's after
      // another's; GPUs of their own compute at once, each its replica's rows.
      if (on_gpu) slower = r.gpus > 1 ? 1.0 : r.replicas;
    }
    // dtrain's GPU workers sum through the host after backward, over PCIe (Gen5 assumed).
    if (on_gpu && r.workers > 1 && r.ps == 0) m.staging = kPcie5BytesPerSecond;
    const double alone = m.forward + m.backward;
    m.forward *= slower;
    m.backward *= slower;
    Check c;
    c.workers = r.workers;
    c.replicas = r.replicas;
    c.measured = r.samples_per_second;
    c.ps = r.ps;
    c.consistency = r.consistency;
    c.prediction = r.ps > 0 ? predict_ps(m, r.workers, r.ps, r.consistency, link) : predict(m, r.workers, link);
    c.error = (c.prediction.samples_per_second - c.measured) / c.measured;
    c.replayed = replay(r, m, link);
    if (c.replayed) c.replay_error = (c.replayed->samples_per_second - c.measured) / c.measured;
    c.compute_alone = alone;
    const StepSeconds first = step_seconds(r.rows.front());
    c.compute_measured = first.compute();
    // Workers of one host over TCP: the kernel copies their bytes on the cores they
    // compute on, through the caches they share; the probe measured it on idle cores.
    const bool loopback = r.workers > 1 && r.hosts == 1 && !r.shared_memory && r.ps == 0;
    const bool replay_explains = std::abs(c.error) > 0.15 && c.replayed && std::abs(c.replay_error) <= 0.15;
    if (std::abs(c.error) > 0.15) {
      // What the step missed by, and how much of it compute that changed explains.
      // (Under the ps, the step is the time between one worker's closures.)
      const double measured_step = static_cast<double>(r.global_batch) * (r.ps > 0 ? r.workers : 1) / c.measured;
      const double missed = measured_step - c.prediction.step;
      const double modelled = alone * slower, compute_excess = c.compute_measured - modelled;
      // Compute explains the miss only where it moved the same way as the step.
      if (modelled > 0 && std::abs(c.compute_measured / modelled - 1) > 0.15 && compute_excess * missed > 0 &&
          std::abs(compute_excess) >= 0.5 * std::abs(missed))
        c.why = "forward + backward took " + detail::fixed(c.compute_measured / alone, 2) +
                "x the one-worker run's where the model allowed " + detail::fixed(slower, 2) + "x" +
                (r.oversubscription() > 1 ? " (threads beyond the cores contend more than their ratio)"
                 : mirrored ? " (the replicas of one process wait for each other at each dense layer's gradient, "
                              "and share its caches and memory bandwidth)"
                 : loopback ? " (the workers of one host share its caches and memory bandwidth, and the kernel copies "
                              "their bytes over loopback on the cores they compute on)"
                            : " (other load, or caches and memory bandwidth shared)");
      else if (const std::string moving = r.ps > 0 ? transfer_why(r, missed, c.prediction.ring) : ""; !moving.empty())
        c.why = moving;
      else if (r.ps == 0 && r.oversubscription() > 1 && missed > 0)
        c.why = std::to_string(r.host_threads) + " compute threads time-sliced on " + std::to_string(r.host_cores) +
                (mirrored ? " cores: a step waits for the last replica the scheduler runs, which costs more than the "
                          : " cores, with each worker's communication thread: a synchronous step waits for the last "
                            "worker the scheduler runs, which costs more than the ") +
                detail::fixed(slower, 2) + "x the model allows";
      else if (!r.doubt.empty())
        c.why = "the run's figures are in doubt";
      else if (replay_explains)
        c.why.clear();  // the replay says it, below
      else if (missed > 0)
        c.why = "the step took " + detail::ms(missed) + " more than predicted, beyond what compute explains: " +
                unexplained(r, mirrored, loopback, first, m.input, c.prediction.ring, link);
    }
    // Where the replay misses and the prediction does not: under the ps, its pulls and
    // pushes against the run's; workers of one host beyond its cores, their sums.
    if (std::abs(c.error) <= 0.15 && c.replayed && std::abs(c.replay_error) > 0.15) {
      const double measured_step = static_cast<double>(r.global_batch) * (r.ps > 0 ? r.workers : 1) / c.measured;
      const double missed = measured_step - c.replayed->step;
      std::string reason;
      if (r.ps > 0)
        reason = transfer_why(r, missed, c.replayed->ring);
      else if (!mirrored && r.hosts == 1 && r.oversubscription() > 1 && missed > 0)
        reason = std::to_string(r.host_threads) + " compute threads time-sliced on " + std::to_string(r.host_cores) +
                 " cores with each worker's communication thread: a sum waits for the communication thread of a "
                 "worker the scheduler has not run yet, where the replay takes the sums from the link the probe "
                 "measured on idle cores";
      if (!reason.empty()) c.why = "replayed from its own steps it misses: " + reason;
    }
    // Where the run's own steps explain it, the miss was in what the one-worker run showed
    // of this run's work, not in communication or the waits.
    if (replay_explains) {
      // This run's own work a step (a closure's under the ps, on the mean over the workers)
      // against its partner's, each as the replay takes it.
      double work = 0, partner = 0;
      if (r.ps > 0) {
        for (const WorkerSummary& w : r.rows) work += step_seconds(w).closure_work() / static_cast<double>(r.workers);
        partner = step_seconds(one->rows.front()).own() - m.optimizer;
      } else {
        work = c.replayed->step - c.replayed->exposed - m.local_sum;
        const std::vector<double>& steps = one->rows.front().step_work;
        partner = steps.empty() ? step_seconds(one->rows.front()).own()
                                : std::accumulate(steps.begin(), steps.end(), 0.0) / static_cast<double>(steps.size());
      }
      const std::string dispatched =
          r.ps > 0 && r.dispatch > 0 ? " and the chief's dispatch (" + detail::ms(r.dispatch) + " a closure)" : "";
      c.why = (c.why.empty() ? std::string() : c.why + "; ") + "replayed from its own steps it lands within " +
              detail::percent(std::abs(c.replay_error), 1) + ": " + (r.ps > 0 ? "a closure's" : "a step's") +
              " own work (" + detail::ms(work) + " against " + detail::ms(partner) + " in the " +
              (mirrored ? "one-replica" : "one-worker") +
              " run)" + dispatched + " made the difference, not communication or the waits for other workers";
    }
    out.push_back(c);
  }
  return out;
}

std::string model_check_heading(const std::string& link_words) {
  return "each run predicted from the run at one worker (of one replica, for replicas in one process)" +
         (link_words.empty() ? std::string() : " and the link (" + link_words + ")") +
         ", and replayed from its own steps (each step's own work as it measured it, the communication and the "
         "waits for other workers from the model)";
}

std::string model_check_table(const std::vector<Check>& checks) {
  std::ostringstream o;
  auto signed_percent = [](double x) { return (x >= 0 ? "+" : "") + detail::percent(x, 1); };
  o << "| workers | replicas per worker | measured samples/s | predicted | error | replayed from its own steps | "
       "error | forward + backward ms: one worker, this run | where the prediction or the replay misses by more than 15%, "
       "why |\n"
       "|---|---|---|---|---|---|---|---|---|\n";
  for (const Check& c : checks)
    o << "| " << c.workers << (c.ps > 0 ? ", " + std::to_string(c.ps) + " ps " + c.consistency : std::string())
      << " | " << c.replicas << " | " << detail::fixed(c.measured, 0)
      << " | " << detail::fixed(c.prediction.samples_per_second, 0) << " | " << signed_percent(c.error) << " | "
      << (c.replayed ? detail::fixed(c.replayed->samples_per_second, 0) + " | " + signed_percent(c.replay_error)
                     : std::string("- | -"))
      << " | " << detail::fixed(c.compute_alone * 1000, 2) << ", "
      << detail::fixed(c.compute_measured * 1000, 2) << " | "
      << (std::abs(c.error) <= 0.15 && !(c.replayed && std::abs(c.replay_error) > 0.15) ? std::string("-")
          : c.why.empty()                                                               ? std::string("not known")
                                                                                        : c.why)
      << " |\n";
  return o.str();
}

}  // namespace dtrain::profile
