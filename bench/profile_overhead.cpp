// What the step profile costs fit: the time of one phase record (two clock reads and
// the sum), how many records a step of the seeds' large MLP makes (counted in a trace),
// and their share of the step; then the step time of fit with and without a trace,
// epochs taking turns so a slow spell of the machine hits both; and how much of the
// steps' wall time the phases cover (the rest: between phase records, where the thread
// was not running, say; expected above 95%).
//
//   bench_profile_overhead [--quick]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dtrain/dtrain.h"
#include "models.h"
#include "timing.h"

using namespace dtrain;

namespace {

// Median seconds for one Track::add with its two clock reads.
double record_cost() {
  profile::Profiler profiler;
  profile::Track& track = profiler.add_track("replica 0", profile::TrackKind::replica);
  profiler.begin_step();
  return bench::seconds_per_call([&] {
    for (int i = 0; i < 1000; ++i) {
      const Clock::time_point start = Clock::now();
      track.add(profile::Phase::forward, start, Clock::now());
    }
  }) / 1000;
}

// Phase records per step in a traced fit (the step slices themselves excluded).
double records_per_step(const std::string& trace_path, std::int64_t steps) {
  std::ifstream in(trace_path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::int64_t records = 0;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("cat") != "step") ++records;
  return static_cast<double>(records) / static_cast<double>(steps);
}

std::unique_ptr<Sequential> model_for(distribute::Strategy* strategy) {
  if (!strategy) return bench::large_mlp();
  auto scope = strategy->scope();
  return bench::large_mlp();
}

void measure(const char* what, distribute::Strategy* strategy, std::int64_t global_batch, bool quick) {
  const int rounds = quick ? 2 : 6;
  const std::int64_t steps = quick ? 10 : 40;
  data::Split d = data::make_synthetic(steps * global_batch, 1024, 10, 5, data::SyntheticLabels::teacher);
  auto model = model_for(strategy);
  const std::string trace = (std::filesystem::temp_directory_path() / "dtrain_profile_overhead.json").string();
  FitOptions plain{.epochs = 1, .batch_size = global_batch, .shuffle = false, .verbose = 0};
  FitOptions traced = plain;
  traced.callbacks.push_back(std::make_shared<ProfilerCallback>(trace));
  model->fit(d.x, d.y, plain);  // warm-up
  std::vector<double> plain_ms, traced_ms, shares, covered;
  double per_step = 0;
  const double cost = record_cost();
  for (int r = 0; r < rounds; ++r) {
    const History a = model->fit(d.x, d.y, plain);
    const History b = model->fit(d.x, d.y, traced);
    const profile::Totals& t = a.profile_summary.at(0).totals;
    plain_ms.push_back(1000 * t.wall / static_cast<double>(t.steps));
    double phases = 0;
    for (double s : t.phases) phases += s;
    covered.push_back(phases / t.wall);
    traced_ms.push_back(1000 * b.profile_summary.at(0).totals.wall / static_cast<double>(steps));
    per_step = records_per_step(trace, steps);
    shares.push_back(per_step * cost * 1000 / plain_ms.back());
  }
  std::filesystem::remove(trace);
  std::printf("| %s | %.0f | %.1f | %.3f | %.4f%% | %.3f | %+.1f%% | %.1f%% |\n", what, per_step, cost * 1e9,
              bench::median(plain_ms), 100 * bench::median(shares), bench::median(traced_ms),
              100 * (bench::median(traced_ms) / bench::median(plain_ms) - 1), 100 * bench::median(covered));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  std::printf("seeds' large MLP, fit on tensors, %d threads; medians of %d rounds\n\n", num_threads(), quick ? 2 : 6);
  std::printf("| setting | phase records per step | ns per record | step ms | records' share of the step | "
              "step ms with a trace | trace's cost | phases cover |\n|---|---|---|---|---|---|---|---|\n");
  measure("one device, batch 64", nullptr, 64, quick);
  distribute::MirroredStrategy mirrored(2);
  measure("MirroredStrategy 2 replicas, global batch 128", &mirrored, 128, quick);
  return 0;
}
