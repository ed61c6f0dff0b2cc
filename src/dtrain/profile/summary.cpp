// The per-epoch line and the end-of-training table.
#include "dtrain/profile/summary.h"

#include <algorithm>
#include <sstream>

#include "dtrain/profile/format.h"

namespace dtrain::profile {
namespace {

using detail::fixed;
using detail::percent;

// The phases a table shows, in step order (push and pull only where some worker has them).
constexpr Phase kShown[] = {Phase::setup,          Phase::input_wait, Phase::to_device,      Phase::replica_start,
                            Phase::forward,        Phase::backward,   Phase::communication,  Phase::straggler_wait,
                            Phase::optimizer,      Phase::push,       Phase::pull,           Phase::device_wait,
                            Phase::metrics};

// Phases a line or table leaves out where they took no time (communication on one
// device, the optimizer where parameter servers apply the updates).
bool optional(Phase p) {
  return p == Phase::push || p == Phase::pull || p == Phase::straggler_wait || p == Phase::setup ||
         p == Phase::replica_start || p == Phase::communication || p == Phase::optimizer || p == Phase::to_device ||
         p == Phase::device_wait;
}

}  // namespace

double WorkerSummary::bus_bandwidth(int workers) const {
  if (workers < 2 || totals.transfer <= 0) return 0;
  const double n = workers;
  return 2.0 * (n - 1) / n * static_cast<double>(totals.bytes) / totals.transfer;
}

void WorkerSummary::to_values(std::span<double> out) const {
  out[0] = static_cast<double>(totals.steps);
  out[1] = totals.wall;
  out[2] = totals.communication_total;
  out[3] = totals.transfer;
  out[4] = static_cast<double>(totals.bytes);
  out[5] = static_cast<double>(totals.samples);
  for (int p = 0; p < kPhases; ++p) {
    out[6 + static_cast<std::size_t>(p)] = totals.phases[static_cast<std::size_t>(p)];
    out[6 + kPhases + static_cast<std::size_t>(p)] = totals.gpu[static_cast<std::size_t>(p)];
  }
  // p50 and p90 travel after the phases.
  out[kValues - 2] = step_p50;
  out[kValues - 1] = step_p90;
}

WorkerSummary WorkerSummary::from_values(std::span<const double> in) {
  WorkerSummary w;
  w.totals.steps = static_cast<std::int64_t>(in[0]);
  w.totals.wall = in[1];
  w.totals.communication_total = in[2];
  w.totals.transfer = in[3];
  w.totals.bytes = static_cast<std::uint64_t>(in[4]);
  w.totals.samples = static_cast<std::int64_t>(in[5]);
  for (int p = 0; p < kPhases; ++p) {
    w.totals.phases[static_cast<std::size_t>(p)] = in[6 + static_cast<std::size_t>(p)];
    w.totals.gpu[static_cast<std::size_t>(p)] = in[6 + kPhases + static_cast<std::size_t>(p)];
  }
  w.step_p50 = in[kValues - 2];
  w.step_p90 = in[kValues - 1];
  return w;
}

std::string phase_shares(const Totals& totals) {
  std::ostringstream o;
  const char* sep = "";
  for (Phase p : kShown) {
    if (optional(p) && totals.phases[static_cast<std::size_t>(p)] <= 0) continue;
    o << sep << phase_name(p) << " " << percent(totals.share(p));
    if (p == Phase::communication && totals.communication_total > totals.phases[static_cast<std::size_t>(p)] * 1.001)
      o << " exposed of " << percent(totals.wall > 0 ? totals.communication_total / totals.wall : 0);
    sep = ", ";
  }
  o << sep << "other " << percent(totals.wall > 0 ? totals.unaccounted() / totals.wall : 0);
  if (totals.gpu_seconds() > 0 && totals.wall > 0) {
    o << "; GPU busy " << percent(totals.gpu_seconds() / totals.wall) << " (";
    sep = "";
    for (Phase p : kShown)
      if (const double g = totals.gpu[static_cast<std::size_t>(p)]; g > 0) {
        o << sep << phase_name(p) << " " << percent(g / totals.wall);
        sep = ", ";
      }
    o << ")";
  }
  return o.str();
}

std::string summary_table(const std::vector<WorkerSummary>& workers) {
  const int n = static_cast<int>(workers.size());
  bool shown[kPhases] = {};
  for (Phase p : kShown)
    for (const WorkerSummary& w : workers)
      shown[static_cast<int>(p)] |= !optional(p) || w.totals.phases[static_cast<std::size_t>(p)] > 0;
  // The all-reduce's own columns where some worker summed with others.
  const bool reduced = std::any_of(workers.begin(), workers.end(), [](const WorkerSummary& w) {
    return w.totals.communication_total > 0 || w.totals.bytes > 0;
  });
  std::ostringstream o;
  o << "| worker | steps | samples/s | step p50 ms | step p90 ms |";
  for (Phase p : kShown)
    if (shown[static_cast<int>(p)]) o << " " << phase_name(p) << (p == Phase::communication ? " (exposed)" : "") << " |";
  o << " other |" << (reduced ? " communication (total) | MB all-reduced per step | bus GB/s |" : "") << "\n|";
  int columns = reduced ? 9 : 6;
  for (bool b : shown) columns += b;
  for (int c = 0; c < columns; ++c) o << "---|";
  o << "\n";
  for (int i = 0; i < n; ++i) {
    const WorkerSummary& w = workers[static_cast<std::size_t>(i)];
    const Totals& t = w.totals;
    o << "| " << i << " | " << t.steps << " | " << fixed(w.samples_per_second(), 0) << " | "
      << fixed(w.step_p50 * 1000, 2) << " | " << fixed(w.step_p90 * 1000, 2) << " |";
    for (Phase p : kShown)
      if (shown[static_cast<int>(p)]) o << " " << percent(t.share(p)) << " |";
    o << " " << percent(t.wall > 0 ? t.unaccounted() / t.wall : 0) << " |";
    if (reduced)
      o << " " << percent(t.wall > 0 ? t.communication_total / t.wall : 0) << " | " << fixed(w.bytes_per_step() / 1e6, 2)
        << " | " << (n > 1 ? fixed(w.bus_bandwidth(n) / 1e9, 2) : std::string("-")) << " |";
    o << "\n";
  }
  return o.str();
}

}  // namespace dtrain::profile
