#include "dtrain/profile/whatif.h"

#include <gtest/gtest.h>

#include "common/error_message.h"
#include "dtrain/profile/report.h"

namespace dtrain::profile {
namespace {

using dtrain::testing::message_of;

TEST(WhatIf, ParsesRatesDurationsAndTheOption) {
  EXPECT_DOUBLE_EQ(parse_rate("10Gbit"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_rate("100mbit"), 12.5e6);
  EXPECT_DOUBLE_EQ(parse_rate("2.5Gbit/s"), 2.5e9 / 8);
  EXPECT_DOUBLE_EQ(parse_rate("1.25GB/s"), 1.25e9);
  EXPECT_DOUBLE_EQ(parse_rate("800MB/s"), 800e6);
  for (const char* bad : {"fast", "10", "10gb", "-1Gbit", "0Gbit", "10Xbit"})
    EXPECT_NE(message_of([&] { parse_rate(bad); }).find(std::string("'") + bad + "'"), std::string::npos) << bad;
  EXPECT_DOUBLE_EQ(parse_duration("50us"), 50e-6);
  EXPECT_DOUBLE_EQ(parse_duration("0.2ms"), 0.2e-3);
  EXPECT_DOUBLE_EQ(parse_duration("1s"), 1.0);
  EXPECT_NE(message_of([] { parse_duration("50"); }).find("'50'"), std::string::npos);

  const WhatIf w = parse_what_if("workers=16,link=10Gbit,latency=50us");
  EXPECT_EQ(w.workers, 16);
  EXPECT_DOUBLE_EQ(*w.link, 1.25e9);
  EXPECT_DOUBLE_EQ(*w.latency, 50e-6);
  EXPECT_FALSE(parse_what_if("link=1Gbit").workers.has_value());
  EXPECT_NE(message_of([] { parse_what_if("workers=16,speed=1Gbit"); }).find("unknown key 'speed'"), std::string::npos);
  EXPECT_NE(message_of([] { parse_what_if("workers=0"); }).find("workers"), std::string::npos);
  EXPECT_NE(message_of([] { parse_what_if("workers"); }).find("key=value"), std::string::npos);
}

TEST(WhatIf, RingTimeIsBytesOverBandwidthPlusLatencyPerMessage) {
  const Link link{1e6, 0};
  EXPECT_EQ(ring_seconds(1e6, 1, 1, link), 0);
  EXPECT_DOUBLE_EQ(ring_seconds(1e6, 1, 2, link), 1.0);  // 2(N-1)/N = 1
  EXPECT_DOUBLE_EQ(ring_seconds(1e6, 1, 4, link), 1.5);
  // 2(N-1) messages per bucket, each with its latency.
  EXPECT_DOUBLE_EQ(ring_seconds(0, 3, 4, Link{1e6, 1e-3}), 2 * 3 * 3 * 1e-3);
}

// fixed 2 ms, forward 4 ms, backward 8 ms; 10 MB in 2 buckets over 1 GB/s: at 2 workers
// the ring takes 10 ms.
StepModel model() {
  StepModel m;
  m.fixed = 0.002;
  m.optimizer = 0.001;
  m.forward = 0.004;
  m.backward = 0.008;
  m.gradient_bytes = 10e6;
  m.buckets = 2;
  m.batch = 64;
  return m;
}

TEST(WhatIf, BackwardHidesWhatItCanOfTheRing) {
  const Link link{1e9, 0};
  Prediction one = predict(model(), 1, link);
  EXPECT_DOUBLE_EQ(one.step, 0.014);
  EXPECT_DOUBLE_EQ(one.efficiency, 1.0);
  // The second bucket's ring starts after half of backward: 10 - 4 ms exposed.
  Prediction two = predict(model(), 2, link);
  EXPECT_DOUBLE_EQ(two.ring, 0.010);
  EXPECT_NEAR(two.exposed, 0.006, 1e-12);
  EXPECT_NEAR(two.step, 0.020, 1e-12);
  EXPECT_NEAR(two.efficiency, 0.7, 1e-12);
  EXPECT_NEAR(two.samples_per_second, 128 / 0.020, 1e-6);
  // A fast link: one bucket's ring is the least left exposed.
  EXPECT_NEAR(predict(model(), 2, Link{1e10, 0}).exposed, 0.0005, 1e-12);
  // Without overlap, or without a core for the communication thread, nothing is hidden.
  StepModel no_overlap = model();
  no_overlap.overlap = false;
  EXPECT_NEAR(predict(no_overlap, 2, link).exposed, 0.010, 1e-12);
  StepModel busy = model();
  busy.spare_core = false;
  EXPECT_NEAR(predict(busy, 2, link).exposed, 0.010, 1e-12);

  const std::vector<Scenario> fixes = fixes_at(model(), 2, link);
  ASSERT_EQ(fixes.size(), 4u);
  EXPECT_NEAR(fixes[1].prediction.exposed, 0.0025, 1e-12);  // bf16: a 5 ms ring, max(2.5, 5 - 4)
  // Accumulating over 4: per batch 13 ms of compute and fixed costs, and a quarter of the
  // 6 ms exposed and the 1 ms update.
  EXPECT_NEAR(fixes[2].prediction.step, 0.013 + 0.007 / 4, 1e-12);
  // Twice the batch: forward 8, backward 16 (hiding more), the same ring.
  EXPECT_NEAR(fixes[3].prediction.exposed, 0.005, 1e-12);
  EXPECT_NEAR(fixes[3].prediction.step, 0.002 + 0.024 + 0.005, 1e-12);
  // Embedding tables of 8 of the 10 MB, whose rows a step looks up are 0.5 MB: the ps
  // moves 2.5 MB each way instead, through the parameter-server model.
  StepModel tables = model();
  tables.table_bytes = 8e6;
  tables.table_rows_bytes = 0.5e6;
  const std::vector<Scenario> with_tables = fixes_at(tables, 4, link);
  ASSERT_EQ(with_tables.size(), 5u);
  EXPECT_EQ(with_tables[4].name, "ParameterServerStrategy, 4 ps, async: embedding rows only");
  StepModel moved = tables;
  moved.gradient_bytes = 2.5e6;
  EXPECT_DOUBLE_EQ(with_tables[4].prediction.step, predict_ps(moved, 4, 4, "async", link).step);
  EXPECT_GT(with_tables[4].prediction.samples_per_second, with_tables[0].prediction.samples_per_second);
  // Tables of 9.9 MB whose rows a step looks up are 0.1 MB: that is the fix that matters most.
  tables.table_bytes = 9.9e6;
  tables.table_rows_bytes = 0.1e6;
  EXPECT_NE(what_if_report(tables, 4, link).find("the fix that matters most there: ParameterServerStrategy, 4 ps"),
            std::string::npos)
      << what_if_report(tables, 4, link);
  // Tables whose rows a step all looks up gain nothing from it: no such row.
  tables.table_rows_bytes = tables.table_bytes;
  EXPECT_EQ(fixes_at(tables, 4, link).size(), 4u);
  const std::string text = what_if_report(model(), 2, link);
  EXPECT_NE(text.find("| as measured | 20.00 | 10.00 | 6.00 | 6400 | 70% |"), std::string::npos) << text;
  EXPECT_NE(text.find("the fix that matters most there: --gradient-accumulation-steps 4"), std::string::npos) << text;
  // With a noise scale of 50 rows, accumulating over 4 (512 rows an update, 8.9% efficient)
  // is worth least; halving the bytes keeps the 128 rows (28.1%): 7758 x 0.281 = 2179.
  const std::string ranked = what_if_report(model(), 2, link, 50);
  EXPECT_NE(ranked.find("| as measured | 20.00 | 10.00 | 6.00 | 6400 | 70% | 1798 |"), std::string::npos) << ranked;
  EXPECT_NE(ranked.find("the fix that matters most there: --compression bf16 (1.21x the goodput)"), std::string::npos)
      << ranked;
}

// From a run on a GPU: NCCL's ring over NVLink or PCIe overlaps the GPU's own backward;
// dtrain's GPU workers copy their gradients to the host and back and sum them there after
// backward, hiding nothing.
TEST(WhatIf, GpuPathsOverlapTheGpusBackwardOrStageThroughTheHost) {
  EXPECT_DOUBLE_EQ(parse_rate("nvlink"), 450e9);
  EXPECT_DOUBLE_EQ(parse_rate("PCIe5"), 64e9);
  EXPECT_DOUBLE_EQ(parse_rate("pcie4"), 32e9);
  EXPECT_DOUBLE_EQ(*parse_what_if("workers=8,link=nvlink,staged=pcie5").staged, 64e9);
  EXPECT_NE(message_of([] { parse_rate("nvlink5"); }).find("nvlink, pcie5, pcie4"), std::string::npos);

  StepModel m = model();
  m.copy_bytes = 10e6;
  // The ring hides behind the GPU's backward (16 ms), not the host's launches (8 ms):
  // max(10 / 2, 10 - 16 / 2) = 5 ms exposed at 2 workers over 1 GB/s.
  m.gpu_backward = 0.016;
  EXPECT_NEAR(predict(m, 2, Link{1e9, 0}).exposed, 0.005, 1e-12);
  // Staged: a copy each way over 64 GB/s (0.15625 ms each), the 10 ms ring after them.
  StepModel staged = m;
  staged.staging = 64e9;
  const Prediction s2 = predict(staged, 2, Link{1e9, 0});
  EXPECT_NEAR(s2.ring, 0.010 + 2 * 10e6 / 64e9, 1e-12);
  EXPECT_NEAR(s2.exposed, s2.ring, 1e-15);
  EXPECT_NEAR(s2.step, 0.014 + s2.exposed, 1e-12);
  EXPECT_DOUBLE_EQ(predict(staged, 1, Link{1e9, 0}).step, 0.014);  // one worker stages nothing

  // The three paths at 2 GPUs, 10 us a ring step: NVLink's ring (2 buckets: 40 us of
  // latency and 10 MB / 450 GB/s) half hidden behind backward.
  const std::vector<Scenario> paths = gpu_paths(m, 2, Link{1e9, 0});
  ASSERT_EQ(paths.size(), 3u);
  const double nvlink = 4 * 10e-6 + 10e6 / 450e9;
  EXPECT_NEAR(paths[0].prediction.ring, nvlink, 1e-12);
  EXPECT_NEAR(paths[0].prediction.exposed, nvlink / 2, 1e-12);
  EXPECT_NEAR(paths[1].prediction.ring, 4 * 10e-6 + 10e6 / 64e9, 1e-12);
  EXPECT_NEAR(paths[2].prediction.step, s2.step, 1e-12);
  EXPECT_GT(paths[0].prediction.samples_per_second, paths[1].prediction.samples_per_second);
  EXPECT_GT(paths[1].prediction.samples_per_second, paths[2].prediction.samples_per_second);
  const std::string text = gpu_what_if_report(m, 2, Link{1e9, 0});
  EXPECT_NE(text.find("On 2 GPUs"), std::string::npos) << text;
  EXPECT_NE(text.find("10 us a ring step (assumed; latency= sets it)"), std::string::npos) << text;
  EXPECT_NE(text.find("| staged through host memory over PCIe Gen5, summed over 8.0 Gbit/s (1.00 GB/s) after backward "
                      "(dtrain's GPU workers) | 24.31 |"),
            std::string::npos)
      << text;
  EXPECT_EQ(gpu_what_if_report(m, 2, Link{1e9, 0}, 2e-6).find("assumed"), std::string::npos);
}

// A link that sends a burst at once after a rest (a rate limiter's token bucket, as tc
// tbf's and clouds' are): the rest refills it at the link's rate, up to its depth.
TEST(WhatIf, ALinkThatRestedSendsABurstAtOnce) {
  EXPECT_DOUBLE_EQ(parse_bytes("64KB"), 64e3);
  EXPECT_DOUBLE_EQ(parse_bytes("256KiB"), 256 * 1024.0);
  EXPECT_DOUBLE_EQ(parse_bytes("1MB"), 1e6);
  EXPECT_DOUBLE_EQ(parse_bytes("4096"), 4096);
  for (const char* bad : {"big", "64Kbit", "-1KB", "1GB"})
    EXPECT_NE(message_of([&] { parse_bytes(bad); }).find(std::string("'") + bad + "'"), std::string::npos) << bad;
  EXPECT_DOUBLE_EQ(*parse_what_if("link=20Mbit,burst=64KB").burst, 64e3);
  EXPECT_NE(message_of([] { parse_what_if("burst=lots"); }).find("'lots'"), std::string::npos);
  EXPECT_EQ(link_words(Link{12.5e6, 20e-6}), "100 Mbit/s (12.5 MB/s), 20 us latency");
  EXPECT_EQ(link_words(Link{12.5e6, 20e-6, 65536}), "100 Mbit/s (12.5 MB/s), 20 us latency, 65.5 KB burst after idle");

  const Link link{1e6, 0, 50e3};  // 1 MB/s, 50 KB at once
  EXPECT_DOUBLE_EQ(transfer_seconds(1e6, link, 0), 1.0);     // no rest, no burst
  EXPECT_DOUBLE_EQ(transfer_seconds(1e6, link, 0.02), 0.98);  // 20 ms refill 20 KB
  EXPECT_DOUBLE_EQ(transfer_seconds(1e6, link, 1), 0.95);     // a full bucket
  EXPECT_DOUBLE_EQ(transfer_seconds(30e3, link, 1), 0);       // all of it at once
  EXPECT_DOUBLE_EQ(transfer_seconds(1e6, Link{1e6, 0}, 1), 1.0);  // a wire
  // The ring: each worker's 2(n-1)/n of the bytes, the burst saved once.
  EXPECT_DOUBLE_EQ(ring_seconds(1e6, 1, 4, link, 1), 1.45);
  EXPECT_DOUBLE_EQ(ring_seconds(1e6, 1, 4, link), 1.5);

  // model() at 2 workers over 1 GB/s with 1 MB at once: the links rest for the step's 14 ms
  // of work less the 4 ms of ring hidden behind backward, which refills the bucket; the
  // ring takes 9 ms, 5 of them exposed.
  const Prediction two = predict(model(), 2, Link{1e9, 0, 1e6});
  EXPECT_NEAR(two.ring, 0.009, 1e-12);
  EXPECT_NEAR(two.exposed, 0.005, 1e-12);
  EXPECT_NEAR(two.step, 0.019, 1e-12);

  // Under the ps (the closure of 9 ms, 1 MB each way over 100 MB/s, 1 ms to apply): half a
  // megabyte at once. One async worker: its pull and push take 5 ms each.
  StepModel m = model();
  m.input = 0.001;
  m.forward = 0.003;
  m.backward = 0.005;
  m.gradient_bytes = 1e6;
  m.batch = 100;
  const Link bursting{1e8, 0, 5e5};
  EXPECT_NEAR(predict_ps(m, 1, 1, "async", bursting).samples_per_second, 100 / 0.020, 1e-6);
  EXPECT_GT(predict_ps(m, 2, 1, "async", bursting).samples_per_second,
            predict_ps(m, 2, 1, "async", Link{1e8, 0}).samples_per_second);
  // Over two ps its own link still carries the whole megabyte each way, as a flow to each
  // ps, which meet there: no burst (as measured between namespaces), 10 ms each way, and
  // 0.5 ms to apply on each ps. Not a burst per half either, which would move it all at once.
  EXPECT_NEAR(predict_ps(m, 1, 2, "async", bursting).samples_per_second, 100 / 0.0295, 1e-6);
  // Two workers over the two ps: each ps's link carries both workers' halves in the time
  // each worker's own link carries its megabyte, so neither waits for the other there:
  // 10 ms each way, as alone (and a few microseconds in the queue to apply).
  EXPECT_NEAR(predict_ps(m, 2, 2, "async", bursting).samples_per_second, 2 * 100 / 0.0295, 2 * 100 / 0.0295 * 1e-3);
  EXPECT_LT(predict_ps(m, 2, 2, "async", bursting).samples_per_second, 2 * 100 / 0.0295);
  // Sync: the ps link carries both workers' 2 MB each way, 15 ms with the burst: a round of
  // 9 + 30 + 1 ms.
  EXPECT_NEAR(predict_ps(m, 2, 1, "sync", bursting).samples_per_second, 100 * 2 / 0.040, 1e-6);
  // Every 10 steps (0.2 s) the chief copies the values: 1 MB over its link, 5 ms.
  m.steps_per_epoch = 10;
  EXPECT_NEAR(predict_ps(m, 2, 1, "sync", bursting).samples_per_second, 100 * 2 / 0.040 * 0.2 / 0.205, 1e-6);

  // A burst larger than a round refills: never more bytes than the link's rate carries. A
  // closure of 1 ms, 500 KB each way, 10 ms of burst. Sync: the ps link moves 1 MB each
  // way in 4.5 ms after resting 5.5 ms, a round of 10 ms, 100 MB/s.
  StepModel quick;
  quick.fixed = 0.001;
  quick.gradient_bytes = 5e5;
  quick.batch = 100;
  const Link deep{1e8, 0, 1e6};
  EXPECT_NEAR(predict_ps(quick, 2, 1, "sync", deep).samples_per_second, 100 * 2 / 0.010, 1e-6);
  // One async worker: 2 ms each way after resting 3 ms, 500 KB every 5 ms.
  EXPECT_NEAR(predict_ps(quick, 1, 1, "async", deep).samples_per_second, 100 / 0.005, 1e-6);
  // The chief's dispatch, 1 ms a closure. Over a wire, one more millisecond of every
  // closure: one async worker's 1 + 5 + 5 ms, and a sync round's 1 + 2 x 10 ms.
  quick.dispatch = 0.001;
  EXPECT_NEAR(predict_ps(quick, 1, 1, "async", Link{1e8, 0}).samples_per_second, 100 / 0.012, 1e-6);
  EXPECT_NEAR(predict_ps(quick, 2, 1, "sync", Link{1e8, 0}).samples_per_second, 100 * 2 / 0.022, 1e-6);
  // Over the deep bucket each way rests 0.5 ms longer and sends 50 KB more at once, which
  // takes the link 0.5 ms less: a closure every 5 ms, a round every 10, as without it.
  EXPECT_NEAR(predict_ps(quick, 1, 1, "async", deep).samples_per_second, 100 / 0.005, 1e-6);
  EXPECT_NEAR(predict_ps(quick, 2, 1, "sync", deep).samples_per_second, 100 * 2 / 0.010, 1e-6);
}

// A worker's row from seconds per step (10 steps): forward a third of compute.
WorkerSummary row(double step, double compute, double comm) {
  WorkerSummary w;
  Totals& t = w.totals;
  t.steps = 10;
  t.wall = 10 * step;
  t.samples = 640;
  t.phases[static_cast<std::size_t>(Phase::forward)] = 10 * compute / 3;
  t.phases[static_cast<std::size_t>(Phase::backward)] = 10 * compute * 2 / 3;
  t.phases[static_cast<std::size_t>(Phase::communication)] = 10 * comm;
  return w;
}

// Replicas on a GPU: logical GPUs of one GPU run one replica's kernels after another's on
// its one stream (twice one replica's compute for two); GPUs of their own compute at once.
TEST(WhatIf, ModelCheckTakesLogicalGpusInTurnAndGpusOfTheirOwnAtOnce) {
  auto on_gpu = [](WorkerSummary w) {
    w.totals.gpu[static_cast<std::size_t>(Phase::forward)] = w.totals.phases[static_cast<std::size_t>(Phase::forward)];
    w.totals.gpu[static_cast<std::size_t>(Phase::backward)] = w.totals.phases[static_cast<std::size_t>(Phase::backward)];
    return w;
  };
  const ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 6400,
                     .rows = {on_gpu(row(0.010, 0.009, 0))}};
  ScaleRun two{.workers = 1, .replicas = 2, .global_batch = 128, .samples_per_second = 12000,
               .rows = {on_gpu(row(0.010, 0.009, 0))}};
  const std::vector<Check> logical = model_check({one, two}, Link{});
  ASSERT_EQ(logical.size(), 1u);
  EXPECT_NEAR(logical[0].prediction.step, 0.001 + 2 * 0.009, 1e-12);
  two.gpus = 2;
  const std::vector<Check> own = model_check({one, two}, Link{});
  ASSERT_EQ(own.size(), 1u);
  EXPECT_NEAR(own[0].prediction.step, 0.010, 1e-12);
  EXPECT_NEAR(own[0].prediction.samples_per_second, 128 / 0.010, 1e-6);
}

TEST(WhatIf, AParameterServerStepIsTheClosurePlusAPullAndAPushBoundedByThePsLink) {
  StepModel m = model();  // 2 ms fixed: 1 ms of it the optimizer (which moves to the ps)...
  m.input = 0.001;          // ...and 1 ms input wait
  m.forward = 0.003;
  m.backward = 0.005;
  m.gradient_bytes = 1e6;
  m.batch = 100;
  const Link link{1e8, 0};  // 10 ms each way
  // One worker: 9 ms of closure + 20 ms of pull and push + 1 ms of apply, nobody to wait for.
  EXPECT_NEAR(predict_ps(m, 1, 1, "async", link).step, 0.030, 1e-12);
  // Async workers queue for the ps's link: more workers, more samples/s, each worker
  // slower, and never more closures than the ps link carries (100 a second).
  const double two = predict_ps(m, 2, 1, "async", link).samples_per_second;
  const double four = predict_ps(m, 4, 1, "async", link).samples_per_second;
  EXPECT_GT(two, 100 / 0.030);
  EXPECT_LT(two, 2 * 100 / 0.030);
  EXPECT_GT(four, two);
  EXPECT_LT(four, 100 * 100);
  EXPECT_NEAR(predict_ps(m, 64, 1, "async", link).samples_per_second, 100 * 100, 0.02 * 100 * 100);
  // Two ps each carry half: four workers go faster than with one.
  EXPECT_GT(predict_ps(m, 4, 2, "async", link).samples_per_second, four);
  // Nothing shared (no bytes, no optimizer): each worker at its own pace exactly. A
  // straggler computing 3x as long (1 ms input + 24 ms): async sums the paces, ssp holds
  // every worker to the straggler's.
  StepModel alone = m;
  alone.gradient_bytes = 0;
  alone.fixed = 0.001;
  alone.optimizer = 0;
  alone.straggler = 3;
  EXPECT_NEAR(predict_ps(alone, 2, 1, "async", link).samples_per_second, 100 * (1 / 0.009 + 1 / 0.025), 1e-6);
  EXPECT_NEAR(predict_ps(alone, 2, 1, "ssp(2)", link).samples_per_second, 100 * 2 / 0.025, 1e-6);
  m.straggler = 3;
  EXPECT_LT(predict_ps(m, 2, 1, "async", link).samples_per_second, two);
  // Sync: both workers' bytes through the one ps link together (20 ms each way), the update
  // waiting for the straggler, or, with a backup worker, not.
  EXPECT_NEAR(predict_ps(m, 2, 1, "sync", link).samples_per_second, 100 * 2 / (0.025 + 0.040 + 0.001), 1e-6);
  // With a backup worker an update comes every 50 ms; the straggler goes at its own pace
  // (66 ms), its gradients dropped.
  EXPECT_NEAR(predict_ps(m, 2, 1, "sync with 1 backup worker", link).samples_per_second,
              100 * (1 / (0.009 + 0.040 + 0.001) + 1 / (0.025 + 0.040 + 0.001)), 1e-6);
  EXPECT_NE(message_of([&] { predict_ps(m, 2, 0, "async", link); }).find("workers and ps"), std::string::npos);
  EXPECT_NE(message_of([&] { predict_ps(m, 2, 1, "eventually", link); }).find("'eventually'"), std::string::npos);

  // The model check predicts a ps run from the one-worker run on a closure's rows.
  const ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 6400,
                     .rows = {row(0.010, 0.009, 0)}, .gradient_bytes = 1e6, .buckets = 1};
  ScaleRun ps_run{.workers = 2, .replicas = 1, .global_batch = 64, .samples_per_second = 4000,
                  .rows = {row(0.030, 0.009, 0), row(0.030, 0.009, 0)}, .gradient_bytes = 1e6, .buckets = 1};
  ps_run.ps = 1;
  ps_run.consistency = "async";
  const std::vector<Check> checks = model_check({one, ps_run}, link);
  ASSERT_EQ(checks.size(), 1u);
  // From the one-worker run on a closure's rows (64, not 128), under the ps's model.
  EXPECT_NEAR(checks[0].prediction.samples_per_second, predict_ps(step_model(one), 2, 1, "async", link).samples_per_second,
              1e-9);
  EXPECT_NE(model_check_table(checks).find("| 2, 1 ps async | 1 | 4000 |"), std::string::npos)
      << model_check_table(checks);
  // A run of two epochs of 10 steps: each ends with the chief's copy of the values.
  ScaleRun epochs = ps_run;
  epochs.epoch_seconds = {1.0, 1.0};
  epochs.steps_trained = 20;
  StepModel per_epoch = step_model(one);
  per_epoch.steps_per_epoch = 10;
  EXPECT_NEAR(model_check({one, epochs}, link)[0].prediction.samples_per_second,
              predict_ps(per_epoch, 2, 1, "async", link).samples_per_second, 1e-9);
  EXPECT_LT(predict_ps(per_epoch, 2, 1, "async", link).samples_per_second, checks[0].prediction.samples_per_second);
  // Replayed, each closure also waits for the chief's dispatch as the run measured it; the
  // prediction from one worker knows none.
  ScaleRun dispatched = ps_run;
  dispatched.dispatch = 0.002;
  const Check with_dispatch = model_check({one, dispatched}, link)[0];
  ASSERT_TRUE(with_dispatch.replayed.has_value() && checks[0].replayed.has_value());
  EXPECT_LT(with_dispatch.replayed->samples_per_second, checks[0].replayed->samples_per_second);
  EXPECT_NEAR(with_dispatch.prediction.samples_per_second, checks[0].prediction.samples_per_second, 1e-9);
  // Far slower, with pull and push (60 ms a closure) taking what the link (20 ms) does
  // not explain: the ps's and gRPC's CPU time is what the model did not know.
  ScaleRun slow_ps = ps_run;
  slow_ps.samples_per_second = 2 * 64 / 0.080;
  for (WorkerSummary& w : slow_ps.rows) {
    w.totals.phases[static_cast<std::size_t>(Phase::pull)] = 10 * 0.030;
    w.totals.phases[static_cast<std::size_t>(Phase::push)] = 10 * 0.030;
  }
  const std::vector<Check> slow_checks = model_check({one, slow_ps}, link);
  ASSERT_EQ(slow_checks.size(), 1u);
  EXPECT_EQ(slow_checks[0].why.rfind("pull and push took 60.00 ms a closure where the model, queueing included, has ", 0),
            0u)
      << slow_checks[0].why;
  // As slow with pull and push no longer than the model's: the time went elsewhere, to
  // what the ps, gRPC and the chief's dispatch cost.
  for (WorkerSummary& w : slow_ps.rows) {
    w.totals.phases[static_cast<std::size_t>(Phase::pull)] = 10 * 0.005;
    w.totals.phases[static_cast<std::size_t>(Phase::push)] = 10 * 0.005;
  }
  const std::vector<Check> elsewhere = model_check({one, slow_ps}, link);
  ASSERT_EQ(elsewhere.size(), 1u);
  EXPECT_NE(elsewhere[0].why.find("beyond what compute explains: the CPU time of the ps, gRPC and the chief's "
                                  "dispatch of closures, which the model leaves out (10.00 ms of pull and push a "
                                  "closure in this run, "),
            std::string::npos)
      << elsewhere[0].why;
  slow_ps.dispatch = 0.0015;
  const std::string dispatched_why = model_check({one, slow_ps}, link)[0].why;
  EXPECT_NE(dispatched_why.find(" in the model; the chief's dispatch took 1.50 ms a closure, which the replay counts)"),
            std::string::npos)
      << dispatched_why;

  // Far faster, pull and push (4 ms a closure) far shorter than the model's sharing of the
  // ps's link: TCP served the workers one after the other.
  ScaleRun fast_ps = ps_run;
  fast_ps.samples_per_second = 2 * 64 / 0.015;
  for (WorkerSummary& w : fast_ps.rows) {
    w.totals.phases[static_cast<std::size_t>(Phase::pull)] = 10 * 0.002;
    w.totals.phases[static_cast<std::size_t>(Phase::push)] = 10 * 0.002;
  }
  const Check fast = model_check({one, fast_ps}, link)[0];
  EXPECT_LT(fast.error, -0.15);
  EXPECT_EQ(fast.why.rfind("pull and push took 4.00 ms a closure where the model, queueing included, has ", 0), 0u)
      << fast.why;
  EXPECT_NE(fast.why.find("TCP did not share the ps's link evenly"), std::string::npos) << fast.why;
  // Predicted right but replayed 15% slow, its closures' own work longer and its pull and
  // push shorter than the model's: the table gives the replay's why.
  ScaleRun replay_only = fast_ps;
  replay_only.samples_per_second = checks[0].prediction.samples_per_second;
  for (WorkerSummary& w : replay_only.rows) {
    w.totals.wall = 10 * 0.040;
    w.totals.phases[static_cast<std::size_t>(Phase::forward)] = 10 * 0.010;
    w.totals.phases[static_cast<std::size_t>(Phase::backward)] = 10 * 0.020;
  }
  const Check replayed_slow = model_check({one, replay_only}, link)[0];
  EXPECT_LE(std::abs(replayed_slow.error), 0.15);
  ASSERT_TRUE(replayed_slow.replayed.has_value());
  EXPECT_LT(replayed_slow.replay_error, -0.15);
  EXPECT_EQ(replayed_slow.why.rfind("replayed from its own steps it misses: pull and push took 4.00 ms", 0), 0u)
      << replayed_slow.why;
  EXPECT_NE(model_check_table({replayed_slow}).find(replayed_slow.why), std::string::npos);
  // Within 15% both ways: no why in the table.
  Check within = replayed_slow;
  within.replay_error = 0.1;
  EXPECT_NE(model_check_table({within}).find(" | - |\n"), std::string::npos) << model_check_table({within});
}

TEST(WhatIf, ModelCheckPredictsEachMultiWorkerRunFromItsOneWorkerPartner) {
  const ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 6400,
                     .rows = {row(0.010, 0.009, 0)}, .gradient_bytes = 4e6, .buckets = 1};
  ScaleRun two{.workers = 2, .replicas = 1, .global_batch = 128, .samples_per_second = 8000,
               .rows = {row(0.016, 0.009, 0.006), row(0.016, 0.009, 0.006)}, .gradient_bytes = 4e6, .buckets = 1};
  ScaleRun lonely = two;  // 2 replicas per worker: no run at one worker to start from
  lonely.replicas = 2;
  const std::vector<Check> checks = model_check({one, two, lonely}, Link{1e9, 0});
  ASSERT_EQ(checks.size(), 1u);
  // One bucket: nothing hides; 10 ms + 4 ms of ring.
  EXPECT_NEAR(checks[0].prediction.step, 0.014, 1e-12);
  EXPECT_NEAR(checks[0].error, (128 / 0.014 - 8000) / 8000, 1e-9);
  EXPECT_NE(model_check_table(checks).find("| 2 | 1 | 8000 | 9143 | +14.3% | - | - | 9.00, 9.00 | - |"), std::string::npos)
      << model_check_table(checks);
  EXPECT_NE(message_of([&] { step_model(two); }).find("one worker"), std::string::npos);
  // Two workers of one host sharing its cores twice over compute twice as long.
  ScaleRun crowded = two;
  crowded.host_threads = 4;  // on 2 cores
  crowded.host_cores = 2;
  const std::vector<Check> shared = model_check({one, crowded}, Link{1e9, 0});
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_NEAR(shared[0].prediction.step, 0.001 + 0.018 + 0.004, 1e-12);
  EXPECT_NEAR(shared[0].compute_alone, 0.009, 1e-12);
  // Where it misses by more than 15% the table says why: here the run's compute took 1x
  // the one-worker run's where the model allowed 2x.
  EXPECT_GT(std::abs(shared[0].error), 0.15);
  EXPECT_NE(model_check_table(shared).find("| forward + backward took 1.00x the one-worker run's where the model "
                                           "allowed 2.00x (threads beyond the cores contend more than their ratio) |"),
            std::string::npos)
      << model_check_table(shared);
  // Computing as slowly as the ratio allows, and still a step far longer: the workers'
  // time-slicing is what the model did not know.
  ScaleRun sliced = crowded;
  sliced.rows = {row(0.040, 0.018, 0.006), row(0.040, 0.018, 0.006)};
  sliced.samples_per_second = 128 / 0.040;
  const std::vector<Check> waited_for_cores = model_check({one, sliced}, Link{1e9, 0});
  ASSERT_EQ(waited_for_cores.size(), 1u);
  EXPECT_EQ(waited_for_cores[0].why.rfind("4 compute threads time-sliced on 2 cores", 0), 0u) << waited_for_cores[0].why;
  // Three workers on two cores, as slow as predicted, but replayed from steps of the
  // one-worker run's work far faster: their sums waited for workers the scheduler had not
  // run, which the probe's link did not show.
  ScaleRun three{.workers = 3, .replicas = 1, .global_batch = 192, .samples_per_second = 1,
                 .rows = {row(0.030, 0.009, 0.010), row(0.030, 0.009, 0.010), row(0.030, 0.009, 0.010)},
                 .gradient_bytes = 4e6, .buckets = 1};
  three.host_threads = 3;
  three.host_cores = 2;
  for (WorkerSummary& w : three.rows) w.step_work = {0.009, 0.009};
  three.samples_per_second = model_check({one, three}, Link{1e9, 0})[0].prediction.samples_per_second;
  const Check unslept = model_check({one, three}, Link{1e9, 0})[0];
  EXPECT_NEAR(unslept.error, 0, 1e-9);
  ASSERT_TRUE(unslept.replayed.has_value());
  EXPECT_GT(unslept.replay_error, 0.15);
  EXPECT_EQ(unslept.why.rfind("replayed from its own steps it misses: 3 compute threads time-sliced on 2 cores with "
                              "each worker's communication thread",
                              0),
            0u)
      << unslept.why;
  // A planted straggler computing 3x as long: every synchronous step waits for it; the
  // ring (one bucket) starts once it is done.
  ScaleRun straggled = two;
  straggled.straggler_factor = 3;
  straggled.samples_per_second = 3000;
  const std::vector<Check> waited = model_check({one, straggled}, Link{1e9, 0});
  ASSERT_EQ(waited.size(), 1u);
  EXPECT_NEAR(waited[0].prediction.step, 3 * 0.010 + 0.004, 1e-12);
  EXPECT_NEAR(waited[0].error, (128 / 0.034 - 3000) / 3000, 1e-9);
  // The why of a run checked against the one-worker run (empty where none is given).
  auto why_of = [&](const ScaleRun& run) {
    const std::vector<Check> c = model_check({one, run}, Link{1e9, 0});
    EXPECT_EQ(c.size(), 1u);
    return c.empty() ? std::string() : c[0].why;
  };
  // A run far slower than predicted with the same compute: the miss is in what the model
  // did not know (communication or fixed costs), and the table says so.
  const std::string unknown = "the step took 18.00 ms more than predicted, beyond what compute explains: "
                              "communication or fixed costs the model did not know (the link's latency: 0 us";
  ScaleRun slow = two;
  slow.samples_per_second = 4000;  // a 32 ms step against 14 ms predicted
  slow.hosts = 2;
  EXPECT_EQ(why_of(slow).rfind(unknown, 0), 0u) << why_of(slow);
  // The same two workers on one host over loopback: their bytes are the kernel's copies on
  // the cores they compute on, with the waits that show it.
  slow.hosts = 1;
  EXPECT_NE(why_of(slow).find("beyond what compute explains: on one host the kernel copies the workers' bytes over "
                              "loopback on the cores they compute and prepare input on, which the probe, on idle "
                              "cores, did not see (0.00 ms of input wait and 6.00 ms of communication and straggler "
                              "wait a step in this run, 0.00 ms of input wait in the one-worker run)"),
            std::string::npos)
      << why_of(slow);
  // Through shared memory there is no loopback to blame.
  slow.shared_memory = true;
  EXPECT_EQ(why_of(slow).rfind(unknown, 0), 0u) << why_of(slow);
  // Workers of one host over TCP computing 1.5x as long as the one worker: the slower
  // compute is the miss, and the why names their copies on those cores.
  ScaleRun copying = two;
  copying.rows = {row(0.0185, 0.0135, 0.004), row(0.0185, 0.0135, 0.004)};
  copying.samples_per_second = 128 / 0.0185;  // 4.5 ms over the 14 ms predicted
  EXPECT_EQ(why_of(copying), "forward + backward took 1.50x the one-worker run's where the model allowed 1.00x (the "
                             "workers of one host share its caches and memory bandwidth, and the kernel copies their "
                             "bytes over loopback on the cores they compute on)");

  // MirroredStrategy: replicas of one process predicted from one replica on its rows, with
  // no link. Two replicas on the two cores one replica's two threads had compute twice
  // the rows in twice the time; on four cores, in the same time.
  ScaleRun single = one;
  single.host_threads = 2;
  single.host_cores = 4;
  ScaleRun mirrored{.workers = 1, .replicas = 2, .global_batch = 128, .samples_per_second = 6000,
                    .rows = {row(0.020, 0.018, 0)}};
  mirrored.host_threads = 2;
  mirrored.host_cores = 4;
  std::vector<Check> replicas = model_check({single, mirrored}, Link{});
  ASSERT_EQ(replicas.size(), 1u);
  EXPECT_NEAR(replicas[0].prediction.step, 0.001 + 2 * 0.009, 1e-12);
  EXPECT_NEAR(replicas[0].prediction.samples_per_second, 128 / 0.019, 1e-6);
  EXPECT_NE(model_check_table(replicas).find("| 1 | 2 | 6000 | 6737 | +12.3% | - | - | 9.00, 18.00 | - |"), std::string::npos)
      << model_check_table(replicas);
  mirrored.host_threads = 4;
  replicas = model_check({single, mirrored}, Link{});
  ASSERT_EQ(replicas.size(), 1u);
  EXPECT_NEAR(replicas[0].prediction.step, 0.010, 1e-12);
  // Computing twice as long as that allows: the table says the replicas' compute is what
  // the model did not know.
  EXPECT_EQ(replicas[0].why.rfind("forward + backward took 2.00x the one-worker run's where the model allowed 1.00x "
                                  "(the replicas of one process wait for each other",
                                  0),
            0u)
      << replicas[0].why;
  // A run of replicas on a different number of rows each has no partner.
  mirrored.global_batch = 256;
  EXPECT_TRUE(model_check({single, mirrored}, Link{}).empty());

  Report report;
  report.title = "dtrain doctor <job>";
  report.runs = {one, two};
  report.findings = {{"communication-bound", "35% exposed", "bf16"}};
  report.checks = checks;
  report.link = "1 GB/s";
  report.curve = {predict(model(), 1, Link{1e9, 0}), predict(model(), 2, Link{1e9, 0})};
  report.what_if = what_if_report(model(), 2, Link{1e9, 0});
  const std::string html = html_report(report);
  // Self-contained: no scripts, nothing fetched; every chart closed; text escaped.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  auto count = [&](const std::string& s) {
    std::size_t n = 0;
    for (std::size_t at = html.find(s); at != std::string::npos; at = html.find(s, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<svg"), 4u);  // throughput, efficiency, phases, the what-if curve
  EXPECT_EQ(count("</svg>"), 4u);
  EXPECT_EQ(count("<table>"), count("</table>"));
  EXPECT_EQ(count("<table>"), 3u);  // scaling, model check, what-if
  EXPECT_NE(html.find("dtrain doctor &lt;job&gt;"), std::string::npos);
  EXPECT_NE(html.find("2\u00d71: 8000 samples/s"), std::string::npos);
  EXPECT_NE(html.find("predicted 9143 samples/s"), std::string::npos);
  EXPECT_NE(html.find("<b>communication-bound</b>"), std::string::npos);
  EXPECT_NE(html.find("<td>--gradient-accumulation-steps 4</td>"), std::string::npos);
  // The runs measured on the what-if's curve: 8000 / (2 x 6400) = 62%.
  EXPECT_NE(html.find("<title>measured, 2×1: 62%</title>"), std::string::npos);
  // A run replayed from its own steps: a square beside the model's point, and in the legend.
  EXPECT_EQ(html.find(">replayed</text>"), std::string::npos);
  Report replayed = report;
  replayed.checks[0].replayed = Prediction{.workers = 2, .step = 0.016, .samples_per_second = 7900};
  const std::string with_replay = html_report(replayed);
  EXPECT_NE(with_replay.find("<title>replayed from its own steps 7900 samples/s</title></rect>"), std::string::npos);
  EXPECT_NE(with_replay.find(">replayed</text>"), std::string::npos);

  // With each run's loss: a chart of loss against time, and the time-to-accuracy table.
  report.runs[0].loss = {0.9, 0.6};
  report.runs[0].epoch_seconds = {1.0, 1.0};
  report.runs[1].loss = {0.8, 0.5};
  report.runs[1].epoch_seconds = {1.5, 1.5};
  report.noise_scale = 100;
  const std::string with_loss = html_report(report);
  EXPECT_NE(with_loss.find("Loss against time, each scale"), std::string::npos);
  EXPECT_NE(with_loss.find("<title>2×1, epoch 2: loss 0.5000 at 3.00 s</title>"), std::string::npos);
  EXPECT_NE(with_loss.find("<h2>Time to accuracy</h2>"), std::string::npos);
  EXPECT_NE(with_loss.find("<th>statistical efficiency</th>"), std::string::npos);
}

TEST(WhatIf, AReplayWaitsForEachStepsSlowestWorkerAndTakesTheRingFromTheLink) {
  const Link link{1e9, 0};
  // Two workers taking turns to be slow: every step waits for the 20 ms one (the mean of
  // each worker's work, 15 ms, would hide that), then the ring: one bucket, 4 ms, exposed.
  ScaleRun two{.workers = 2, .replicas = 1, .global_batch = 128, .samples_per_second = 5000,
               .rows = {row(0.025, 0.009, 0.010), row(0.025, 0.009, 0.010)}, .gradient_bytes = 4e6, .buckets = 1};
  two.rows[0].step_work = {0.010, 0.020, 0.010, 0.020};
  two.rows[1].step_work = {0.020, 0.010, 0.020, 0.010};
  StepModel partner = model();  // the run at one worker: its buckets' sum, its applying
  std::optional<Prediction> p = replay(two, partner, link);
  ASSERT_TRUE(p.has_value());
  EXPECT_NEAR(p->step, 0.020 + 0.004, 1e-12);
  EXPECT_NEAR(p->samples_per_second, 128 / 0.024, 1e-9);
  // Four buckets: backward (6 ms) hides all of the ring but the last bucket's 1 ms.
  two.buckets = 4;
  EXPECT_NEAR(replay(two, partner, link)->step, 0.020 + 0.001, 1e-12);
  // No overlap: all of it exposed.
  two.overlap = false;
  EXPECT_NEAR(replay(two, partner, link)->step, 0.020 + 0.004, 1e-12);
  // Each worker sums its own replicas' buckets as the run at one worker did.
  partner.local_sum = 0.002;
  EXPECT_NEAR(replay(two, partner, link)->step, 0.020 + 0.002 + 0.004, 1e-12);
  partner.local_sum = 0;
  // Workers that kept different numbers of steps are replayed over the steps they share.
  two.rows[1].step_work = {0.030};
  EXPECT_NEAR(replay(two, partner, link)->step, 0.030 + 0.004, 1e-12);
  // Nothing to replay without the steps, or without a link between workers.
  two.rows[1].step_work.clear();
  EXPECT_FALSE(replay(two, partner, link).has_value());
  two.rows[1].step_work = {0.010};
  EXPECT_FALSE(replay(two, partner, Link{}).has_value());
  // ...or without a row for each worker, or with a worker of no steps.
  ScaleRun short_of_rows = two;
  short_of_rows.rows.pop_back();
  EXPECT_FALSE(replay(short_of_rows, partner, link).has_value());
  ScaleRun stepless = two;
  stepless.rows[1].totals.steps = 0;
  EXPECT_FALSE(replay(stepless, partner, link).has_value());
  // Replicas in one process: their own steps, no link.
  ScaleRun mirrored{.workers = 1, .replicas = 2, .global_batch = 128, .samples_per_second = 6000,
                    .rows = {row(0.020, 0.018, 0)}};
  mirrored.rows[0].step_work = {0.012, 0.014};
  EXPECT_NEAR(replay(mirrored, partner, Link{})->step, 0.013, 1e-12);

  // Under the ps: each worker's own closure less its pull and push (here 9 ms and, for a
  // worker twice as slow, 19 ms), through the ps's model with the run at one worker's
  // applying.
  StepModel m = model();
  m.gradient_bytes = 1e6;
  m.batch = 64;
  ScaleRun ps_run{.workers = 2, .replicas = 1, .global_batch = 64, .samples_per_second = 3000,
                  .rows = {row(0.029, 0.009, 0), row(0.039, 0.019, 0)}, .gradient_bytes = 1e6, .buckets = 1};
  ps_run.ps = 1;
  ps_run.consistency = "sync";
  for (WorkerSummary& w : ps_run.rows) {
    w.totals.phases[static_cast<std::size_t>(Phase::pull)] = 10 * 0.010;
    w.totals.phases[static_cast<std::size_t>(Phase::push)] = 10 * 0.010;
  }
  StepModel own = m;
  own.closures = {0.009, 0.019};
  const std::optional<Prediction> ps = replay(ps_run, m, link);
  ASSERT_TRUE(ps.has_value());
  EXPECT_NEAR(ps->samples_per_second, predict_ps(own, 2, 1, "sync", link).samples_per_second, 1e-9);
  // Sync: every update waits for the 19 ms worker, then both workers' bytes through the ps
  // link (2 ms each way), then the 1 ms of applying.
  EXPECT_NEAR(ps->samples_per_second, 2 * 64 / (0.019 + 0.004 + 0.001), 1e-6);

  // The model check replays each run beside predicting it; where the prediction misses and
  // the replay does not, the why says that the run's own work made the difference.
  const ScaleRun one{.workers = 1, .replicas = 1, .global_batch = 64, .samples_per_second = 6400,
                     .rows = {row(0.010, 0.009, 0)}, .gradient_bytes = 4e6, .buckets = 1};
  ScaleRun crowded{.workers = 2, .replicas = 1, .global_batch = 128, .samples_per_second = 128 / 0.030,
                   .rows = {row(0.030, 0.027, 0.002), row(0.030, 0.027, 0.002)}, .gradient_bytes = 4e6, .buckets = 1};
  crowded.rows[0].step_work = {0.026, 0.025};
  crowded.rows[1].step_work = {0.024, 0.027};
  const std::vector<Check> checks = model_check({one, crowded}, link);
  ASSERT_EQ(checks.size(), 1u);
  ASSERT_TRUE(checks[0].replayed.has_value());
  EXPECT_NEAR(checks[0].replayed->step, 0.0265 + 0.004, 1e-12);
  EXPECT_NEAR(checks[0].replay_error, (0.030 / 0.0305 - 1), 1e-9);
  EXPECT_GT(checks[0].error, 0.15);  // 14 ms predicted from the one worker's 10
  EXPECT_NE(checks[0].why.find("; replayed from its own steps it lands within 1.6%: a step's own work (26.50 ms "
                               "against 10.00 ms in the one-worker run) made the difference, not communication or the "
                               "waits for other workers"),
            std::string::npos)
      << checks[0].why;
  // Where the prediction's why would have been communication the model did not know, the
  // replay, whose communication is the model's, says it was the work instead.
  crowded.rows = {row(0.030, 0.009, 0.002), row(0.030, 0.009, 0.002)};
  crowded.rows[0].step_work = {0.026, 0.025};
  crowded.rows[1].step_work = {0.024, 0.027};
  const std::vector<Check> work_not_link = model_check({one, crowded}, link);
  ASSERT_EQ(work_not_link.size(), 1u);
  EXPECT_EQ(work_not_link[0].why.rfind("replayed from its own steps it lands within 1.6%: a step's own work", 0), 0u)
      << work_not_link[0].why;
  EXPECT_NE(model_check_table(checks).find(" | 4197 | -1.6% | "), std::string::npos) << model_check_table(checks);
}

// --strategies --report: the loss of each strategy against time with the target dashed,
// the comparison and the recommendation; no scaling study.
TEST(WhatIf, AStrategiesReportChartsEachStrategysLossAndRecommends) {
  StrategyRun a;
  a.label = "MultiWorkerMirroredStrategy";
  a.kind = "multi_worker";
  a.epoch_seconds = {1, 1};
  a.loss = {0.7, 0.4};
  StrategyRun b = a;
  b.label = "ParameterServerStrategy (async)";
  b.kind = "parameter_server";
  b.epoch_seconds = {2, 2};
  Report report;
  report.title = "dtrain doctor job --strategies";
  report.strategies = {a, b};
  report.target_loss = 0.4;
  const std::string html = html_report(report);
  EXPECT_NE(html.find("Loss against time, each strategy"), std::string::npos);
  EXPECT_NE(html.find("<title>target loss 0.4000</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>ParameterServerStrategy (async), epoch 2: loss 0.4000 at 4.00 s</title>"),
            std::string::npos);
  EXPECT_NE(html.find("Recommendation: MultiWorkerMirroredStrategy reaches loss 0.4000 in 2.00 s"), std::string::npos);
  EXPECT_EQ(html.find("Diagnosis"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

}  // namespace
}  // namespace dtrain::profile
