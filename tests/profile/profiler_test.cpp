#include "dtrain/profile/profiler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <set>
#include <sstream>
#include <utility>

#include "dtrain/core/percentile.h"
#include "dtrain/profile/diagnosis.h"
#include "dtrain/profile/summary.h"

namespace dtrain::profile {
namespace {

using std::chrono::microseconds;

double seconds(const StepRecord& r, Phase p) { return r.phases[static_cast<std::size_t>(p)]; }

// Intervals are given, not measured: the phase arithmetic is exact.
TEST(Profiler, ReducesTracksIntoTheStepsPhases) {
  Profiler profiler;
  Track& r0 = profiler.add_track("replica 0", TrackKind::replica);
  Track& r1 = profiler.add_track("replica 1", TrackKind::replica);
  const Clock::time_point t = Clock::now();
  profiler.begin_step();
  profiler.loop().add(Phase::input_wait, t, t + microseconds(100));
  // Replica 0: forward 1 ms, backward 3 ms of which 0.5 ms summed a bucket, then 1 ms
  // waiting for the sums (0.4 ms of it for the communication thread).
  r0.add(Phase::forward, t, t + microseconds(1000));
  r0.add_nested(Phase::communication, Phase::backward, t + microseconds(2000), t + microseconds(2500));
  r0.add(Phase::backward, t + microseconds(1000), t + microseconds(4000));
  r0.add(Phase::communication, t + microseconds(4000), t + microseconds(5000));
  r0.add_wait_for_communication_thread(0.0004);
  // Replica 1: forward 2 ms, backward 2 ms, no communication.
  r1.add(Phase::forward, t, t + microseconds(2000));
  r1.add(Phase::backward, t + microseconds(2000), t + microseconds(4000));
  Track& comm = profiler.add_track("communication", TrackKind::communication);
  comm.add(Phase::straggler_wait, t, t + microseconds(300));
  comm.add(Phase::communication, t + microseconds(300), t + microseconds(1300));
  comm.add_bytes(1000);
  const StepRecord& r = profiler.end_step(64);

  EXPECT_NEAR(seconds(r, Phase::input_wait), 100e-6, 1e-12);
  EXPECT_NEAR(seconds(r, Phase::forward), 1.5e-3, 1e-12);    // mean of 1 and 2 ms
  EXPECT_NEAR(seconds(r, Phase::backward), 2.25e-3, 1e-12);  // mean of 2.5 and 2 ms
  // Exposed: the mean of the replicas' 1.5 and 0 ms, less the straggler part of it.
  EXPECT_NEAR(seconds(r, Phase::straggler_wait), 0.2e-3, 1e-12);  // min(mean wait 0.2, late peer 0.3)
  EXPECT_NEAR(seconds(r, Phase::communication), 0.75e-3 - 0.2e-3, 1e-12);
  // Busy: 0.75 ms mean in the replicas, less their 0.2 ms mean wait, plus the thread's 1.3 ms.
  EXPECT_NEAR(r.communication_total, 0.75e-3 - 0.2e-3 + 1.3e-3, 1e-12);
  EXPECT_NEAR(r.transfer, 1e-3, 1e-12);
  EXPECT_EQ(r.bytes, 1000u);
  EXPECT_EQ(r.samples, 64);
  EXPECT_GT(r.wall, 0.0);
  // The step's own work: the loop's 0.1 ms, then the slowest replica's: replica 1's 4 ms of
  // forward and backward, not replica 0's 3.5 (its bucket sum and waits are communication).
  // The intervals are given, not lived: the step's wall, as measured, is most likely shorter
  // than its phases, which leaves no time between the records; any it did take beyond the
  // loop's 0.1 ms and the longest replica's 5 ms is the step's own too.
  EXPECT_NEAR(r.work, 100e-6 + 4e-3 + std::max(0.0, r.wall - 100e-6 - 5e-3), 1e-12);
  const double first_work = r.work;  // (r is the profiler's last step, which the next replaces)

  // The next step starts from zero; totals add up.
  profiler.begin_step();
  profiler.loop().add(Phase::optimizer, t, t + microseconds(250));
  const StepRecord& second = profiler.end_step(64);
  const double second_work = second.work;
  EXPECT_NEAR(second_work, 250e-6 + std::max(0.0, second.wall - 250e-6), 1e-12);
  EXPECT_EQ(second.phases[static_cast<std::size_t>(Phase::forward)], 0.0);
  EXPECT_NEAR(seconds(second, Phase::optimizer), 250e-6, 1e-12);
  EXPECT_EQ(profiler.total().steps, 2);
  EXPECT_EQ(profiler.total().samples, 128);
  EXPECT_EQ(profiler.total().bytes, 1000u);
  EXPECT_NEAR(profiler.total().phases[static_cast<std::size_t>(Phase::optimizer)], 250e-6, 1e-12);
  profiler.begin_epoch();
  EXPECT_EQ(profiler.epoch().steps, 0);
  EXPECT_EQ(profiler.total().steps, 2);
  // The steady steps' work: after the first epoch, as many as asked for.
  EXPECT_EQ(profiler.steady_work(10), (std::vector<double>{first_work, second_work}));  // one epoch: all steps
  profiler.begin_epoch();
  for (const double work : {1.0, 2.0, 3.0}) {  // seconds: longer than any step's wall here
    profiler.begin_step();
    profiler.loop().add(Phase::forward, t, t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(work)));
    profiler.end_step(64);
  }
  const std::vector<double> steady = profiler.steady_work(2);
  ASSERT_EQ(steady.size(), 2u);
  EXPECT_NEAR(steady[0], 1.0, 1e-9);
  EXPECT_NEAR(steady[1], 2.0, 1e-9);
  // A step with no phases at all: every moment of it is its own.
  profiler.begin_step();
  const StepRecord& bare = profiler.end_step(64);
  EXPECT_EQ(bare.work, bare.wall);
}

// A GPU's compute stream: its phases are the step's GPU figures, beside the host's phases,
// not part of them; it is a row of the trace like any thread.
TEST(Profiler, AGpuTrackGivesTheStepsGpuTimeApartFromItsPhases) {
  Profiler profiler(ProfilerOptions{.trace = true});
  const Clock::time_point t = Clock::now();
  profiler.begin_step();
  profiler.loop().add(Phase::forward, t, t + microseconds(100));
  profiler.loop().add(Phase::device_wait, t + microseconds(100), t + microseconds(900));
  Track& gpu = profiler.add_track("cuda:0 compute stream", TrackKind::device);
  gpu.add(Phase::forward, t, t + microseconds(300));
  gpu.add(Phase::backward, t + microseconds(300), t + microseconds(800));
  gpu.add(Phase::optimizer, t + microseconds(800), t + microseconds(850));
  const StepRecord& r = profiler.end_step(32);
  EXPECT_NEAR(seconds(r, Phase::forward), 100e-6, 1e-12);  // the host's launches only
  EXPECT_EQ(seconds(r, Phase::backward), 0.0);
  EXPECT_NEAR(r.gpu[static_cast<std::size_t>(Phase::forward)], 300e-6, 1e-12);
  EXPECT_NEAR(r.gpu[static_cast<std::size_t>(Phase::backward)], 500e-6, 1e-12);
  EXPECT_NEAR(profiler.total().gpu_seconds(), 850e-6, 1e-12);
  std::ostringstream trace;
  profiler.write_trace(trace, 1, "worker 0");
  const auto j = nlohmann::json::parse(trace.str());
  int gpu_rows = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == 1) ++gpu_rows;
  EXPECT_EQ(gpu_rows, 3);
  EXPECT_NE(trace.str().find("cuda:0 compute stream"), std::string::npos);

  // The GPU's figures travel with the worker's and close its line.
  WorkerSummary w;
  w.totals = profiler.total();
  std::vector<double> values(WorkerSummary::kValues);
  w.to_values(values);
  EXPECT_EQ(WorkerSummary::from_values(values).totals.gpu, w.totals.gpu);
  w.totals.wall = 1e-3;  // as if the step took 1 ms
  const std::string line = phase_shares(w.totals);
  EXPECT_NE(line.find("; GPU busy 85.0% (forward 30.0%, backward 50.0%, optimizer 5.0%)"), std::string::npos) << line;
}

TEST(Profiler, StepPercentiles) {
  Profiler profiler;
  EXPECT_EQ(profiler.step_percentile(0.5), 0.0);
  for (int i = 0; i < 5; ++i) {
    profiler.begin_step();
    profiler.end_step(1);
  }
  EXPECT_LE(profiler.step_percentile(0.0), profiler.step_percentile(0.5));
  EXPECT_LE(profiler.step_percentile(0.5), profiler.step_percentile(0.9));
  EXPECT_LE(profiler.step_percentile(0.9), profiler.step_percentile(1.0));
}

TEST(Profiler, TraceIsTraceEventJsonWithATrackPerThread) {
  ProfilerOptions options;
  options.trace = true;
  options.max_trace_steps = 2;
  Profiler profiler(options);
  Track& replica = profiler.add_track("replica \"0\"", TrackKind::replica);
  const Clock::time_point t = Clock::now();
  for (int step = 0; step < 3; ++step) {
    profiler.begin_step();
    profiler.loop().add(Phase::input_wait, t, t + microseconds(10));
    replica.add(Phase::forward, t + microseconds(10), t + microseconds(30));
    replica.add(Phase::communication, t + microseconds(30), t + microseconds(40), "sum buckets");
    profiler.end_step(1);
  }
  std::ostringstream out;
  profiler.write_trace(out, 3, "worker 3");
  const nlohmann::json trace = nlohmann::json::parse(out.str());
  std::set<std::string> threads, names;
  int steps = 0, phases = 0;
  for (const auto& e : trace.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 3);
    if (e.at("ph") == "M") {
      if (e.at("name") == "thread_name") threads.insert(e.at("args").at("name").get<std::string>());
      continue;
    }
    ASSERT_EQ(e.at("ph"), "X");
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    EXPECT_GT(e.at("ts").get<double>(), 0.0);
    if (e.at("cat") == "step") ++steps;
    else ++phases, names.insert(e.at("name").get<std::string>());
  }
  EXPECT_EQ(threads, (std::set<std::string>{"training loop", "replica \"0\""}));
  // Only the first two steps are traced.
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(phases, 6);
  EXPECT_EQ(names, (std::set<std::string>{"input wait", "forward", "sum buckets"}));
}

TEST(Profiler, TraceFileThatCannotBeWrittenNamesThePath) {
  Profiler profiler(ProfilerOptions{.trace = true});
  try {
    profiler.write_trace("/nonexistent-dir/trace.json", 0, "x");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/trace.json"), std::string::npos) << e.what();
  }
}

TEST(Summary, TravelsAsNumbersAndFormatsATable) {
  WorkerSummary w;
  w.totals.steps = 10;
  w.totals.wall = 2.0;
  w.totals.samples = 640;
  w.totals.bytes = 4'000'000'000;
  w.totals.transfer = 1.0;
  w.totals.communication_total = 1.2;
  w.totals.phases[static_cast<std::size_t>(Phase::forward)] = 0.5;
  w.totals.phases[static_cast<std::size_t>(Phase::backward)] = 1.0;
  w.totals.phases[static_cast<std::size_t>(Phase::communication)] = 0.4;
  w.step_p50 = 0.19;
  w.step_p90 = 0.25;
  std::vector<double> values(WorkerSummary::kValues);
  w.to_values(values);
  const WorkerSummary back = WorkerSummary::from_values(values);
  EXPECT_EQ(back.totals.steps, 10);
  EXPECT_EQ(back.totals.bytes, w.totals.bytes);
  EXPECT_EQ(back.totals.phases, w.totals.phases);
  EXPECT_EQ(back.step_p50, 0.19);
  EXPECT_EQ(back.step_p90, 0.25);
  EXPECT_DOUBLE_EQ(w.samples_per_second(), 320.0);
  EXPECT_DOUBLE_EQ(w.bytes_per_step(), 4e8);
  // Two workers: each moves 2(n-1)/n = 1 times the bytes, in 1 s.
  EXPECT_DOUBLE_EQ(w.bus_bandwidth(2), 4e9);
  EXPECT_DOUBLE_EQ(w.bus_bandwidth(4), 1.5 * 4e9);
  EXPECT_EQ(w.bus_bandwidth(1), 0.0);
  EXPECT_NEAR(w.totals.unaccounted(), 0.1, 1e-12);

  const std::string table = summary_table({w, back});
  EXPECT_NE(table.find("| 0 | 10 | 320 | 190.00 | 250.00 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 1 | 10 | 320 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 25.0% |"), std::string::npos) << table;  // forward
  EXPECT_NE(table.find("| 4.00 |"), std::string::npos) << table;   // bus GB/s
  EXPECT_EQ(table.find("straggler"), std::string::npos) << table;  // no worker had any
  const std::string line = phase_shares(w.totals);
  EXPECT_NE(line.find("communication 20.0% exposed of 60.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("other 5.0%"), std::string::npos) << line;
}

// A parameter-server worker's steps: pull and push, no all-reduce, no optimizer (the ps
// applies the updates). The table shows what it has and none of what it lacks.
TEST(Summary, AParameterServerWorkersTableShowsPullAndPushAndNoAllReduce) {
  Totals closure;
  StepRecord step;
  step.wall = 0.010;
  step.samples = 128;
  step.phases[static_cast<std::size_t>(Phase::pull)] = 0.002;
  step.phases[static_cast<std::size_t>(Phase::forward)] = 0.003;
  step.phases[static_cast<std::size_t>(Phase::backward)] = 0.003;
  step.phases[static_cast<std::size_t>(Phase::push)] = 0.0015;
  closure.add(step);
  closure.add(step);
  Totals worker;  // two closures of two steps
  worker.add(closure);
  worker.add(closure);
  EXPECT_EQ(worker.steps, 4);
  EXPECT_EQ(worker.samples, 512);
  EXPECT_NEAR(worker.wall, 0.040, 1e-15);
  EXPECT_NEAR(worker.unaccounted(), 4 * 0.0005, 1e-12);

  const std::string table = summary_table({WorkerSummary{worker, 0.010, 0.010}});
  EXPECT_NE(table.find("| pull |"), std::string::npos) << table;
  EXPECT_NE(table.find("| push |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 0 | 4 | 12800 | 10.00 | 10.00 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 20.0% |"), std::string::npos) << table;  // pull
  for (const char* absent : {"communication", "bus GB/s", "optimizer", "straggler"})
    EXPECT_EQ(table.find(absent), std::string::npos) << absent << "\n" << table;
  const std::string line = phase_shares(worker);
  EXPECT_NE(line.find("push 15.0%, pull 20.0%"), std::string::npos) << line;
  EXPECT_EQ(line.find("communication"), std::string::npos) << line;
}

// A worker's row from seconds per step (10 steps).
WorkerSummary row(double step, double input, double compute, double comm, double optimizer, double bytes = 0,
                  double transfer = 0) {
  WorkerSummary w;
  Totals& t = w.totals;
  t.steps = 10;
  t.wall = 10 * step;
  t.samples = 640;
  t.phases[static_cast<std::size_t>(Phase::input_wait)] = 10 * input;
  t.phases[static_cast<std::size_t>(Phase::forward)] = 10 * compute / 3;
  t.phases[static_cast<std::size_t>(Phase::backward)] = 10 * compute * 2 / 3;
  t.phases[static_cast<std::size_t>(Phase::communication)] = 10 * comm;
  t.phases[static_cast<std::size_t>(Phase::optimizer)] = 10 * optimizer;
  t.bytes = static_cast<std::uint64_t>(10 * bytes);
  t.transfer = 10 * transfer;
  return w;
}

std::vector<std::string> causes(const std::vector<Finding>& findings) {
  std::vector<std::string> out;
  for (const Finding& f : findings) out.push_back(f.cause);
  return out;
}

TEST(Diagnosis, NamesEachPlantedCause) {
  const ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 1000,
                     .rows = {row(0.010, 0.0002, 0.008, 0, 0.0015)}};
  // Compute-bound and healthy: nothing to say.
  EXPECT_TRUE(diagnose({one}).empty()) << format_findings(diagnose({one}));

  ScaleRun input = one;
  input.rows = {row(0.030, 0.020, 0.008, 0, 0.0015)};
  EXPECT_EQ(causes(diagnose({one, input})), std::vector<std::string>{"input-bound"});
  EXPECT_NE(diagnose({input}).front().evidence.find("67%"), std::string::npos) << diagnose({input}).front().evidence;

  // Two workers whose link is slow: 8 MB per step, exposed communication half the step.
  ScaleRun slow_link{.workers = 2, .replicas = 1, .global_batch = 128, .samples_per_second = 900,
                     .rows = {row(0.020, 0.0002, 0.008, 0.010, 0.0015, 8e6, 0.009),
                              row(0.020, 0.0002, 0.008, 0.010, 0.0015, 8e6, 0.009)}};
  // Most of the wait is the bytes crossing the link: the link is named first.
  const std::vector<Finding> comm = diagnose({one, slow_link});
  EXPECT_EQ(causes(comm), (std::vector<std::string>{"communication-bound", "too small a batch per replica"}));
  EXPECT_NE(comm.front().evidence.find("8.0 MB all-reduced per step"), std::string::npos) << comm.front().evidence;
  EXPECT_NE(comm.front().fix.find("--compression bf16"), std::string::npos) << comm.front().fix;

  // Replicas with a few rows each on a fast link: each round's fixed cost, not its 4 KB,
  // outweighs their compute, and their small share of work is named first.
  ScaleRun small_batch{.workers = 2, .replicas = 1, .global_batch = 8, .samples_per_second = 900,
                       .rows = {row(0.004, 0.0001, 0.001, 0.0025, 0.0004, 4e3, 0.0001),
                                row(0.004, 0.0001, 0.001, 0.0025, 0.0004, 4e3, 0.0001)}};
  const std::vector<Finding> small = diagnose({one, small_batch});
  EXPECT_EQ(causes(small), (std::vector<std::string>{"too small a batch per replica", "communication-bound"}));
  // 4 rows computing 1 ms against 2.9 ms of that work: about 12 rows would balance them.
  EXPECT_EQ(small.front().fix.rfind("give each replica more rows: about 12 (a global batch of 24) would let its "
                                    "compute outweigh that work; at twice the per-replica batch (global 16)",
                                    0),
            0u)
      << small.front().fix;

  // Two rows per replica on a link: moving the bytes is most of the 3 ms wait but less
  // than the 4 ms of compute, and with the update (2 ms) the step spends more than it
  // computes on work a larger batch would spread. The batch is named first, with its
  // parts and the rows that would balance them (2 x 5 / 4, rounded up: 3).
  const WorkerSummary short_bytes = row(0.010, 0.0001, 0.004, 0.003, 0.002, 1e6, 0.002);
  ScaleRun few_rows{.workers = 2, .replicas = 1, .global_batch = 4, .samples_per_second = 400,
                    .rows = {short_bytes, short_bytes}};
  const std::vector<Finding> few = diagnose({one, few_rows});
  EXPECT_EQ(causes(few), (std::vector<std::string>{"too small a batch per replica", "communication-bound"}));
  EXPECT_EQ(few.front().evidence.rfind("each replica computes 4.00 ms per step on its 2 row(s), and the step spends "
                                       "5.00 ms on work that does not grow with the batch (communication 3.00 ms, the "
                                       "optimizer's update 2.00 ms) at 2 worker(s)",
                                       0),
            0u)
      << few.front().evidence;
  // 3 rows are within twice the batch: only the doubling is offered.
  EXPECT_EQ(few.front().fix.rfind("give each replica more rows: at twice the per-replica batch (global 8)", 0), 0u)
      << few.front().fix;
  // The same rows with the bytes taking longer (4.5 ms of a 5 ms wait) than the compute:
  // the link comes first.
  const WorkerSummary long_bytes = row(0.012, 0.0001, 0.004, 0.005, 0.002, 1e6, 0.0045);
  few_rows.rows = {long_bytes, long_bytes};
  EXPECT_EQ(causes(diagnose({one, few_rows})),
            (std::vector<std::string>{"communication-bound", "too small a batch per replica"}));

  // Worker 1 computes three times as long; worker 0 waits for it in communication. The
  // straggler is named by its own time (step less waits), and its wait is not blamed on
  // the link.
  ScaleRun straggler = slow_link;
  straggler.rows = {row(0.026, 0.0002, 0.008, 0.016, 0.0015, 8e6, 0.001),
                    row(0.026, 0.0002, 0.024, 0.0005, 0.0015, 8e6, 0.001)};
  const std::vector<Finding> s = diagnose({one, straggler});
  ASSERT_EQ(causes(s), std::vector<std::string>{"straggler"}) << format_findings(s);
  EXPECT_EQ(s[0].evidence.rfind("worker:1 works 25.50 ms per step (compute 24.00 ms), ", 0), 0u) << s[0].evidence;
  EXPECT_NE(s[0].evidence.find("x the other workers' median 10.00 ms (the fastest: 10.00 ms)"), std::string::npos)
      << s[0].evidence;
  EXPECT_NE(s[0].fix.find("At the others' pace a step would take about 10.50 ms"), std::string::npos) << s[0].fix;
  // With each step's work kept: slower step after step, it is still the straggler.
  straggler.rows[0].step_work.assign(40, 0.0095);
  straggler.rows[1].step_work.assign(40, 0.0255);
  ASSERT_EQ(causes(diagnose({one, straggler})), std::vector<std::string>{"straggler"});
  // The same mean from typical steps and a few long stops (the scheduler, a moment's
  // other load): no straggler; the wait goes to the communication it was spent in.
  straggler.rows[1].step_work.assign(40, 0.0095);
  for (int k = 0; k < 4; ++k) straggler.rows[1].step_work[static_cast<std::size_t>(10 * k)] = 0.1695;
  EXPECT_NEAR(dtrain::median(straggler.rows[1].step_work), 0.0095, 1e-12);
  const std::vector<Finding> stops = diagnose({one, straggler});
  const std::vector<std::string> named = causes(stops);
  EXPECT_EQ(std::find(named.begin(), named.end(), "straggler"), named.end()) << format_findings(stops);
  // 1.6x as long, step after step: a straggler between workers of their own cores; on one
  // host whose cores the workers' compute threads fill, what the scheduler alone gives one
  // of them (a straggler there takes 1.8x as long).
  ScaleRun uneven = slow_link;
  uneven.rows = {row(0.020, 0.0002, 0.008, 0.0095, 0.0015, 8e6, 0.001),
                 row(0.020, 0.0002, 0.0141, 0.0034, 0.0015, 8e6, 0.001)};
  uneven.rows[0].step_work.assign(40, 0.0097);
  uneven.rows[1].step_work.assign(40, 0.0158);
  const std::vector<WorkerSummary> one_and_a_half = uneven.rows;
  const auto named_in = [&](const ScaleRun& run) {
    const std::vector<Finding> f = diagnose({one, run});
    const std::vector<std::string> c = causes(f);
    return testing::AssertionResult(std::find(c.begin(), c.end(), "straggler") != c.end()) << format_findings(f);
  };
  EXPECT_TRUE(named_in(uneven));
  uneven.host_threads = 2;
  uneven.host_cores = 2;
  EXPECT_FALSE(named_in(uneven));
  uneven.host_cores = 4;  // a core to spare
  EXPECT_TRUE(named_in(uneven));
  uneven.host_cores = 2;
  uneven.rows = {row(0.022, 0.0002, 0.008, 0.0115, 0.0015, 8e6, 0.001),  // twice as long
                 row(0.022, 0.0002, 0.020, 0.0003, 0.0015, 8e6, 0.001)};
  uneven.rows[0].step_work.assign(40, 0.0097);
  uneven.rows[1].step_work.assign(40, 0.0214);
  EXPECT_TRUE(named_in(uneven));
  // 1.6x on each of two hosts whose cores are full: no host's scheduler made it.
  uneven.rows = one_and_a_half;
  uneven.hosts = 2;
  uneven.host_threads = 1;
  uneven.host_cores = 1;
  EXPECT_TRUE(named_in(uneven));
  // A worker whose steps' work is not kept (an older summary): the means decide, not the
  // other's typical step.
  uneven.rows[1].step_work.clear();
  uneven.rows[0].step_work.assign(40, 0.05);
  EXPECT_TRUE(named_in(uneven));

  ScaleRun optimizer = one;
  optimizer.rows = {row(0.010, 0.0002, 0.006, 0, 0.0035)};
  EXPECT_EQ(causes(diagnose({optimizer})), std::vector<std::string>{"optimizer-bound"});

  const std::string table = scaling_table({one, slow_link});
  EXPECT_NE(table.find("| 1 | 1 | 64 | - | 1000 | - | 1.00 | 10.00 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 2 | 1 | 128 | - | 900 | - | 0.90 | 20.00 |"), std::string::npos) << table;
  EXPECT_NE(format_findings({}).find("No single cause"), std::string::npos);
}

// A GPU run: the batch's copy on the training thread, and a GPU that waits for the host's
// launches, are named with their figures; a GPU-bound step is not a finding.
TEST(Diagnosis, OnAGpuNamesTheBatchCopyAndAGpuWaitingForLaunches) {
  // A step of `launches` on the host (5/6 of them forward and backward, 1/6 the update).
  auto gpu_row = [](double step, double to_device, double launches, double device_wait, double gpu) {
    WorkerSummary w = row(step, 0, launches * 5 / 6, 0, launches / 6);
    Totals& t = w.totals;
    t.phases[static_cast<std::size_t>(Phase::to_device)] = 10 * to_device;
    t.phases[static_cast<std::size_t>(Phase::device_wait)] = 10 * device_wait;
    t.gpu[static_cast<std::size_t>(Phase::forward)] = 10 * gpu / 3;
    t.gpu[static_cast<std::size_t>(Phase::backward)] = 10 * gpu * 2 / 3;
    return w;
  };
  ScaleRun run{.workers = 1, .replicas = 1, .global_batch = 256, .samples_per_second = 1000};
  // GPU-bound: 1 ms of launches, then 8 ms waiting for 8.9 ms of GPU work.
  run.rows = {gpu_row(0.0100, 0.0002, 0.001, 0.008, 0.0089)};
  EXPECT_TRUE(diagnose({run}).empty()) << format_findings(diagnose({run}));
  // The table says each GPU share under its row.
  const std::string table = scaling_table({run});
  EXPECT_NE(table.find("the GPU's own time 89% of the step; the host's launches 10%, its wait for the GPU 80%, "
                       "the batch's copy on the training thread 2%"),
            std::string::npos)
      << table;
  // Launch-bound: 6 ms of launches, the GPU done 0.1 ms after them.
  run.rows = {gpu_row(0.0070, 0.0002, 0.006, 0.0001, 0.0061)};
  std::vector<Finding> f = diagnose({run});
  ASSERT_EQ(causes(f), std::vector<std::string>{"launch-bound"}) << format_findings(f);
  EXPECT_NE(f.front().evidence.find("the host took 6.00 ms"), std::string::npos) << f.front().evidence;
  EXPECT_NE(f.front().fix.find("larger batch"), std::string::npos) << f.front().fix;
  // The batch's copy: 3 ms of a 12 ms step.
  run.rows = {gpu_row(0.0120, 0.003, 0.001, 0.0078, 0.0087)};
  f = diagnose({run});
  ASSERT_EQ(causes(f), std::vector<std::string>{"host-to-device copies"}) << format_findings(f);
  EXPECT_NE(f.front().evidence.find("25%"), std::string::npos) << f.front().evidence;
  EXPECT_NE(f.front().fix.find("prefetch_to_device"), std::string::npos) << f.front().fix;
}

// The communication finding quotes the table's shares, each as its column shows it.
TEST(Diagnosis, TheCommunicationFindingQuotesTheTablesShares) {
  const ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 1000,
                     .rows = {row(0.010, 0.0002, 0.008, 0, 0.0015)}};
  ScaleRun two{.workers = 2, .replicas = 1, .global_batch = 128, .samples_per_second = 1100,
               .rows = {row(0.020, 0.0002, 0.010, 0.0052, 0.0015, 8e6, 0.004),
                        row(0.020, 0.0002, 0.010, 0.0052, 0.0015, 8e6, 0.004)}};
  for (WorkerSummary& w : two.rows) w.totals.phases[static_cast<std::size_t>(Phase::straggler_wait)] = 10 * 0.0012;
  const std::string table = scaling_table({one, two});
  EXPECT_NE(table.find("| 26% | 6% |"), std::string::npos) << table;  // communication (exposed), straggler wait
  const std::vector<Finding> f = diagnose({one, two});
  ASSERT_EQ(causes(f), std::vector<std::string>{"communication-bound"}) << format_findings(f);
  EXPECT_NE(f[0].evidence.find("communication (exposed) is 26% of each step and straggler wait 6%"), std::string::npos)
      << f[0].evidence;
  EXPECT_EQ(f[0].evidence.find("32%"), std::string::npos) << f[0].evidence;
  EXPECT_EQ(f[0].fix.find("parameter servers"), std::string::npos) << f[0].fix;
  // Gradients mostly an embedding table of which a batch looks up a small part: the fix
  // names the parameter servers, with the bytes a step would move of it.
  two.gradient_bytes = 8e6;
  two.table_bytes = 6e6;
  two.table_rows_bytes = 0.3e6;
  const std::vector<Finding> tables = diagnose({one, two});
  ASSERT_EQ(causes(tables), std::vector<std::string>{"communication-bound"}) << format_findings(tables);
  EXPECT_NE(tables[0].fix.find("hold the embedding tables on parameter servers in row shards"), std::string::npos)
      << tables[0].fix;
  EXPECT_NE(tables[0].fix.find("at most 0.3 MB of the tables' 6.0 MB"), std::string::npos) << tables[0].fix;
}

// Resources first: a scale that computes on no more cores than the first is named for
// it before anything else, with the threads asked and the cores there; threads beyond
// the cores are named where the cores did grow.
// A run at one worker of `threads_one` thread(s), and one at two workers of one thread
// each, on a host of two cores, at `speedup` its samples/s; the link looks busy.
std::pair<ScaleRun, ScaleRun> one_and_two_workers(int threads_one, double speedup) {
  ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 1000,
               .rows = {row(0.010, 0.0002, 0.008, 0, 0.0015)}, .host_threads = threads_one, .host_cores = 2};
  ScaleRun two{.workers = 2, .replicas = 1, .global_batch = 128, .samples_per_second = 1000 * speedup,
               .rows = {row(0.024, 0.0002, 0.012, 0.009, 0.0015, 8e6, 0.008),
                        row(0.024, 0.0002, 0.012, 0.009, 0.0015, 8e6, 0.008)},
               .host_threads = 2, .host_cores = 2};
  return {one, two};
}

TEST(Diagnosis, SharedCoresAreNamedFirstWithTheThreadsAndTheCores) {
  // Two workers of one thread each on the two cores one worker had: 0.86x.
  auto [one, two] = one_and_two_workers(2, 0.86);
  std::vector<Finding> f = diagnose({one, two});
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "shared cores") << format_findings(f);
  EXPECT_NE(f[0].evidence.find("2 compute thread(s) on 2 core(s) on one host"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("0.86x"), std::string::npos) << f[0].evidence;
  // The same two workers on two hosts of two cores each have twice the cores: not named.
  ScaleRun apart = two;
  apart.hosts = 2;
  apart.samples_per_second = 1700;
  f = diagnose({one, apart});
  const std::vector<std::string> named = causes(f);
  EXPECT_TRUE(std::find(named.begin(), named.end(), "shared cores") == named.end()) << format_findings(f);
  // Four threads asked of two cores, the first run having used one: oversubscribed.
  one.host_threads = 1;
  ScaleRun crowded = two;
  crowded.host_threads = 4;
  f = diagnose({one, crowded});
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "oversubscribed") << format_findings(f);
  EXPECT_NE(f[0].evidence.find("4 compute thread(s) on 2 core(s)"), std::string::npos) << f[0].evidence;
}

// Another load on the cores a run wanted is named before anything else, with the process,
// what it took and what the job got; a load on a core the run left free, or a whiff of
// one, is not; the hypervisor's steal is named as such.
TEST(Diagnosis, ABusyMachineIsNamedFirstWithTheLoadAndTheCoresTheJobGot) {
  auto [one, two] = one_and_two_workers(1, 0.74);
  const MachineUse loaded{.measured = true, .seconds = 3, .cores = 2, .steal_cores = 0.01,
                          .job_cores = 1.1, .other_cores = 0.9, .others = {{4242, "spin", 0.9, 3.0 * (1 << 20)}},
                          .cache_bytes = std::size_t{32} << 20};
  one.machine = loaded;  // one thread left a core free: the load took nothing it wanted
  one.machine.job_cores = 0.99;
  one.machine.other_cores = 1.01;
  two.machine = loaded;
  EXPECT_EQ(busy_excess(one), 0.0);
  EXPECT_NEAR(busy_excess(two), 0.91, 1e-9);
  std::vector<Finding> f = diagnose({one, two});
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "busy machine") << format_findings(f);
  EXPECT_EQ(f[0].evidence.rfind("another load used 0.90 of a core (pid 4242 'spin', 0.90 of a core, 3 MiB resident), "
                                "of this machine's 2 core(s), during the run at 2 worker(s) x 1 replica(s)",
                                0),
            0u)
      << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("the job's processes got 1.10 cores"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("measured on a busy machine"), std::string::npos) << f[0].evidence;
  const std::string table = scaling_table({one, two});
  EXPECT_NE(table.find("| 0.74 (busy machine) |"), std::string::npos) << table;
  EXPECT_EQ(table.find("| 1.00 (busy machine) |"), std::string::npos) << table;
  EXPECT_NE(table.find("Measured on a busy machine, 2 worker(s) x 1 replica(s): other processes used 0.90 of a core"),
            std::string::npos)
      << table;
  // A load reading more than the cache holds is said to take memory bandwidth too.
  two.machine.others[0].resident_bytes = 512.0 * (1 << 20);
  f = diagnose({one, two});
  EXPECT_NE(f[0].evidence.find("512 MiB resident (more than the 32 MiB cache holds: where it reads them, it takes "
                               "memory bandwidth too)"),
            std::string::npos)
      << f[0].evidence;
  // A fifth of a core is the least named: the noise of a quiet machine is not a load.
  two.machine.other_cores = 0.15;
  two.machine.others = {{17, "kworker/0:1", 0.1, 0}};
  f = diagnose({one, two});
  EXPECT_TRUE(f.empty() || f[0].cause != "busy machine") << format_findings(f);
  // The hypervisor's steal is the cause where it took more than other processes.
  two.machine.steal_cores = 0.6;
  f = diagnose({one, two});
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "busy machine") << format_findings(f);
  EXPECT_EQ(f[0].evidence.rfind("the hypervisor took 0.60 of a core (CPU steal", 0), 0u) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find(", and another load used 0.15 of a core (pid 17 'kworker/0:1', 0.10 of a core)"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].fix.find("dedicated vCPUs"), std::string::npos) << f[0].fix;
  // Not measured (a summary made elsewhere): nothing said.
  two.machine = MachineUse{};
  f = diagnose({one, two});
  EXPECT_TRUE(f.empty() || f[0].cause != "busy machine") << format_findings(f);
}

// Seed 003's question: each scale's time to the loss every scale reached, against the
// first's, with each global batch's statistical efficiency and goodput where the noise
// scale is known; and the batch it suggests.
TEST(Diagnosis, TimeToAccuracyAndTheBatchTheNoiseScaleSuggests) {
  ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 1000,
               .rows = {row(0.010, 0.0002, 0.008, 0, 0.0015)}};
  one.loss = {0.9, 0.7, 0.6};
  one.epoch_seconds = {1.0, 1.0, 1.0};
  one.steps_trained = 30;
  one.final_accuracy = 0.8;
  ScaleRun two = one;
  two.workers = 2;
  two.global_batch = 128;
  two.samples_per_second = 1800;
  two.loss = {0.8, 0.6, 0.5};
  two.noise_scale = 192;
  const double noise = job_noise_scale({one, two});
  EXPECT_DOUBLE_EQ(noise, 192.0);
  const std::string table = time_to_accuracy_table({one, two}, noise);
  // The target is 0.6 (the first run's lowest): reached at 3 s, and at 2 s by two workers.
  EXPECT_NE(table.find("time to loss 0.6000 s"), std::string::npos) << table;
  EXPECT_NE(table.find("| 1 | 1 | 64 | 1920 | 3.00 | 0.6000 | 80.0% | 3.00 | 1.00x | 75% | 750 |"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| 2 | 1 | 128 | 3840 | 3.00 | 0.5000 | 80.0% | 2.00 | 1.50x | 60% | 1080 |"),
            std::string::npos)
      << table;
  EXPECT_EQ(time_to_accuracy_table({one, two}, 0).find("efficiency"), std::string::npos);

  // 128 rows against a critical batch of 192: near it, keep it.
  EXPECT_NE(batch_advice({one, two}, 192).find("the batch is near it"), std::string::npos) << batch_advice({one, two}, 192);
  // Against 1000: well below; 500 rows per replica (global 1000), the rate times 7.81.
  const std::string below = batch_advice({one, two}, 1000);
  EXPECT_NE(below.find("raise the global batch toward 1000 (500 rows per replica: --batch-size 1000)"),
            std::string::npos)
      << below;
  EXPECT_NE(below.find("times 7.81"), std::string::npos) << below;
  // Against 32: past it.
  EXPECT_NE(batch_advice({one, two}, 32).find("the batch is past it"), std::string::npos);
  EXPECT_TRUE(batch_advice({one, two}, 0).empty());

  // The what-if in time: 8 workers at 7000 samples/s against one at 1000, 64 rows each,
  // noise scale 192: efficiency 75% at 64 rows, 192 / 704 = 27% at 512; 7 x 0.364 = 2.55x.
  const std::string in_time = time_to_loss_what_if(1000, 7000, 8, 64, 192);
  EXPECT_NE(in_time.find("about 2.55x sooner than one worker (7.00x the samples/s, each sample worth 0.36x as much"),
            std::string::npos)
      << in_time;
  EXPECT_TRUE(time_to_loss_what_if(1000, 7000, 8, 64, 0).empty());
}

// A speedup above what the cores allow, or inside the rounds' spread, is in doubt: the
// table marks it, says why, and the diagnosis says so before drawing on it.
TEST(Diagnosis, ASpeedupTheCoresCannotGiveOrTheNoiseCoversIsInDoubt) {
  ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 1000,
               .rows = {row(0.010, 0.0002, 0.008, 0, 0.0015)}, .host_threads = 1, .host_cores = 2,
               .rounds = {990, 1000, 1010}};
  ScaleRun two{.workers = 1, .replicas = 2, .global_batch = 128, .samples_per_second = 26710,
               .rows = {row(0.010, 0.0002, 0.008, 0, 0.0015)}, .host_threads = 2, .host_cores = 2,
               .rounds = {26000, 26710, 27000}};
  std::vector<ScaleRun> runs{one, two};
  EXPECT_DOUBLE_EQ(speedup_the_cores_allow(one, two), 2.0);
  EXPECT_EQ(check_trust(runs), std::vector<std::size_t>{1});
  EXPECT_NE(runs[1].doubt.find("a speedup of 26.71x is more than the 2.00x its cores allow"), std::string::npos)
      << runs[1].doubt;
  const std::string table = scaling_table(runs);
  EXPECT_NE(table.find("| 26.71 (in doubt) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 1 / 2 | 1000 | 2% |"), std::string::npos) << table;
  EXPECT_NE(table.find("In doubt, 1 worker(s) x 2 replica(s): a speedup of 26.71x"), std::string::npos) << table;
  std::vector<Finding> f = diagnose(runs);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].cause, "figures in doubt") << format_findings(f);

  // 1.9x on twice the cores is believed.
  runs[1].samples_per_second = 1900;
  runs[1].rounds = {1880, 1900, 1920};
  EXPECT_TRUE(check_trust(runs).empty()) << runs[1].doubt;
  // 1.05x with rounds spread 20%: whether it is faster is within the noise.
  runs[1].samples_per_second = 1050;
  runs[1].rounds = {950, 1050, 1160};
  EXPECT_EQ(check_trust(runs), std::vector<std::size_t>{1});
  EXPECT_NE(runs[1].doubt.find("spread 20% and 2%, more than the 5% between them"), std::string::npos) << runs[1].doubt;
  // One round each: no spread to judge by, and nothing above the cores: believed.
  runs[0].rounds = {1000};
  runs[1].rounds = {1050};
  EXPECT_TRUE(check_trust(runs).empty()) << runs[1].doubt;

  // An input-bound job on the same cores: 3 ms of each 3.5 ms step waits for the input,
  // paid per step, so twice the global batch may run at up to 2 x 3.5 / (1 + 3) = 1.75x
  // the samples/s with no more cores. 1.6x is believed; 2.5x is not.
  ScaleRun input{.workers = 1, .replicas = 1, .global_batch = 32, .samples_per_second = 9000,
                 .rows = {row(0.0035, 0.003, 0.0005, 0, 0)}, .host_threads = 2, .host_cores = 2};
  ScaleRun same_cores{.workers = 1, .replicas = 2, .global_batch = 64, .samples_per_second = 14400,
                      .rows = {row(0.0040, 0.003, 0.0005, 0.0005, 0)}, .host_threads = 2, .host_cores = 2};
  std::vector<ScaleRun> input_runs{input, same_cores};
  EXPECT_TRUE(check_trust(input_runs).empty()) << input_runs[1].doubt;
  input_runs[1].samples_per_second = 22500;
  EXPECT_EQ(check_trust(input_runs), std::vector<std::size_t>{1});
  EXPECT_NE(input_runs[1].doubt.find("a speedup of 2.50x is more than the 1.75x its cores allow (2 against 2 "
                                     "computing, with its per-step costs spread over a 2x larger batch)"),
            std::string::npos)
      << input_runs[1].doubt;
}

}  // namespace
}  // namespace dtrain::profile
