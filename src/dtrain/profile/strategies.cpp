// The strategies compared: time to one loss, final quality, and a recommendation.
#include "dtrain/profile/strategies.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dtrain/core/percentile.h"
#include "dtrain/profile/format.h"

namespace dtrain::profile {
namespace {

using detail::fixed;

std::string seconds(double s) { return fixed(s, 2) + " s"; }

// 780 B, 12.5 kB, 1.88 MB
std::string bytes_text(double bytes) {
  if (bytes < 1e3) return fixed(bytes, 0) + " B";
  if (bytes < 1e6) return fixed(bytes / 1e3, 1) + " kB";
  return fixed(bytes / 1e6, 2) + " MB";
}

std::string metric_text(const StrategyRun& r) {
  if (r.final_metric < 0) return "-";
  return r.metric == "accuracy" ? detail::percent(r.final_metric, 1) : fixed(r.final_metric, 4);
}

}  // namespace

double StrategyRun::median_epoch_seconds() const { return median(epoch_seconds); }

std::optional<double> time_to_loss(std::span<const double> epoch_seconds, std::span<const double> loss, double target) {
  double elapsed = 0;
  for (std::size_t e = 0; e < loss.size() && e < epoch_seconds.size(); ++e) {
    elapsed += epoch_seconds[e];
    if (loss[e] <= target) return elapsed;
  }
  return std::nullopt;
}

std::optional<double> time_to_loss(const StrategyRun& run, double target) {
  return time_to_loss(run.epoch_seconds, run.loss, target);
}

double metric_tolerance(const std::vector<StrategyRun>& runs) {
  double best = -1;
  std::int64_t rows = 0;
  for (const StrategyRun& r : runs) {
    best = std::max(best, r.final_metric);
    if (r.test_samples > 0) rows = rows ? std::min(rows, r.test_samples) : r.test_samples;
  }
  if (best < 0 || best > 1 || rows == 0) return 0.01;
  // A proportion's standard error on `rows` rows; the difference of two has sqrt(2) of it.
  const double p = std::clamp(best, 0.01, 0.99);
  return std::max(0.01, 2 * std::sqrt(2 * p * (1 - p) / static_cast<double>(rows)));
}

Recommendation recommend(const std::vector<StrategyRun>& runs, double target) {
  Recommendation out;
  if (runs.empty()) return out;
  double best_metric = -1;
  for (const StrategyRun& r : runs) best_metric = std::max(best_metric, r.final_metric);
  const double tolerance = metric_tolerance(runs);
  auto eligible = [&](const StrategyRun& r) { return best_metric < 0 || r.final_metric >= best_metric - tolerance; };
  // The soonest to the target among the eligible; the highest samples/s where none reached it.
  std::optional<std::size_t> pick, runner_up;
  auto sooner = [&](std::size_t a, std::size_t b) {
    const auto ta = time_to_loss(runs[a], target), tb = time_to_loss(runs[b], target);
    if (ta && tb) return *ta < *tb;
    if (ta || tb) return ta.has_value();
    return runs[a].samples_per_second > runs[b].samples_per_second;
  };
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (!eligible(runs[i])) continue;
    if (!pick || sooner(i, *pick)) {
      runner_up = pick;
      pick = i;
    } else if (!runner_up || sooner(i, *runner_up)) {
      runner_up = i;
    }
  }
  out.index = pick.value_or(0);
  const StrategyRun& chosen = runs[out.index];
  std::ostringstream why;
  const auto t = time_to_loss(chosen, target);
  why << chosen.label;
  if (t)
    why << " reaches " << chosen.loss_name << " " << fixed(target, 4) << " in " << seconds(*t);
  else
    why << " trains the most samples/s (" << fixed(chosen.samples_per_second, 0) << "); no run reached "
        << chosen.loss_name << " " << fixed(target, 4);
  if (runner_up) {
    const StrategyRun& other = runs[*runner_up];
    const auto to = time_to_loss(other, target);
    // Within 10% the order is not worth a word more than that: one run's noise covers it.
    if (t && to && *t > 0)
      why << ", " << fixed(*to / *t, 2) << "x sooner than " << other.label << " (" << seconds(*to) << ")"
          << (*to / *t < 1.10 ? ", which is within 10%: as good a choice here" : "");
  }
  if (chosen.final_metric >= 0)
    why << ", and ends at " << chosen.metric << " " << metric_text(chosen)
        << (chosen.final_metric < best_metric
                ? " (the best: " + detail::percent(best_metric, 1) + ", within the " + fixed(100 * tolerance, 1) +
                      " points its test rows can tell)"
                : " (the best)");
  // What held the others back, in the table's figures.
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (i == out.index) continue;
    const StrategyRun& r = runs[i];
    if (!eligible(r)) {
      why << "; " << r.label << " ends " << fixed(100 * (best_metric - r.final_metric), 1) << " points of "
          << r.metric << " below the best (more than the " << fixed(100 * tolerance, 1) << " its test rows can tell)";
    } else if (r.straggler_share >= 0.10) {
      why << "; " << r.label << " waits " << detail::percent(r.straggler_share, 0)
          << " of each step for the slowest worker: every synchronous step runs at its pace, where a parameter "
             "server's workers each go at their own";
    } else if (r.wait_share >= 0.25) {
      why << "; " << r.label << " spends " << detail::percent(r.wait_share, 0) << " of each step "
          << (r.kind == "parameter_server" ? "pulling the weights and pushing the gradients"
                                           : "waiting on the all-reduce")
          << " (" << bytes_text(r.bytes_per_worker_step) << " moved per worker step)";
    }
  }
  out.reason = why.str();
  return out;
}

std::vector<Finding> strategy_findings(const StrategyRun& run) {
  std::vector<Finding> out;
  if (run.kind != "parameter_server") return out;
  const std::size_t n = run.ps.size();
  double bytes = 0, training = 0;
  for (const PsLoad& p : run.ps) bytes += p.bytes;
  for (double s : run.epoch_seconds) training += s;
  std::size_t hot = 0;
  for (std::size_t p = 1; p < n; ++p)
    if (run.ps[p].bytes > run.ps[hot].bytes) hot = p;
  const double share = bytes > 0 ? run.ps[hot].bytes / bytes : 0;
  // 1.5 times an even share (75% of two ps, 50% of three): every pull and push waits for
  // that ps's larger part, so the others idle while it works.
  if (n >= 2 && share >= 1.5 / static_cast<double>(n) && run.wait_share >= 0.05) {
    std::ostringstream evidence, others;
    auto busy = [&](const PsLoad& p) { return training > 0 ? p.apply_seconds / training : 0.0; };
    evidence << "ps:" << hot << " moved " << detail::percent(share, 0) << " of the values pulled and gradients pushed ("
             << "an even split is " << detail::percent(1.0 / static_cast<double>(n), 0) << " each) and spent "
             << detail::percent(busy(run.ps[hot]), 0) << " of the training time applying updates";
    for (std::size_t p = 0; p < n; ++p)
      if (p != hot) others << (others.tellp() > 0 ? ", " : "") << "ps:" << p << " " << detail::percent(busy(run.ps[p]), 0);
    evidence << " (" << others.str() << "); the workers spend " << detail::percent(run.wait_share, 0)
             << " of each step pulling and pushing, each pull and push as slow as its part on ps:" << hot;
    out.push_back({"ps hot spot", evidence.str(),
                   "split the large variables over the " + std::to_string(n) + " ps on their first axis: --partitioner "
                   "fixed:" + std::to_string(n) + " (FixedShardsPartitioner in ParameterServerOptions::"
                   "variable_partitioner), which gives each ps an even share of every variable; min_size:BYTES:" +
                   std::to_string(n) + " splits only those above BYTES"});
  } else if (run.wait_share >= 0.25) {
    out.push_back({"waiting on the parameter servers",
                   "the workers spend " + detail::percent(run.wait_share, 0) +
                       " of each step pulling the weights and pushing the gradients (" +
                       bytes_text(run.bytes_per_worker_step) + " moved per worker step)",
                   "a larger batch moves the same bytes for more rows; with workers on other hosts, more ps "
                   "(and a partitioner) spread the bytes over more links"});
  }
  return out;
}

std::string strategies_table(const std::vector<StrategyRun>& runs, double target) {
  std::string loss_name = runs.empty() ? "loss" : runs.front().loss_name;
  std::string metric = "final metric";
  for (const StrategyRun& r : runs)
    if (!r.metric.empty()) metric = "final " + r.metric;
  std::ostringstream o;
  o << "| strategy | workers | wall-clock per epoch s | samples/s | time to " << loss_name << " " << fixed(target, 4)
    << " s | " << metric << " | moved per worker step | waiting on others | of which straggler wait |\n"
    << "|---|---|---|---|---|---|---|---|---|\n";
  for (const StrategyRun& r : runs) {
    const auto t = time_to_loss(r, target);
    o << "| " << r.label << " | " << r.workers << " | " << fixed(r.median_epoch_seconds(), 2) << " | "
      << fixed(r.samples_per_second, 0) << " | " << (t ? fixed(*t, 2) : std::string("not reached")) << " | "
      << metric_text(r) << " | " << bytes_text(r.bytes_per_worker_step) << " | " << detail::percent(r.wait_share, 0)
      << " | " << detail::percent(r.straggler_share, 0) << " |\n";
  }
  return o.str();
}

}  // namespace dtrain::profile
