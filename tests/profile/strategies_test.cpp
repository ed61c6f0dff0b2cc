// The doctor's "run both and compare": time to one loss at the resolution of epochs, the
// target every strategy reached, the accuracy a test set can tell apart, and a
// recommendation that follows the figures (a straggler turns it to the parameter server).
#include <gtest/gtest.h>

#include "dtrain/profile/strategies.h"

namespace dtrain::profile {
namespace {

StrategyRun run(std::string label, std::string kind, std::vector<double> seconds, std::vector<double> loss,
                double accuracy) {
  StrategyRun r;
  r.label = std::move(label);
  r.kind = std::move(kind);
  r.workers = 2;
  r.epoch_seconds = std::move(seconds);
  r.loss = std::move(loss);
  r.metric = "accuracy";
  r.final_metric = accuracy;
  r.test_samples = 10000;
  r.samples_per_second = 1000;
  return r;
}

TEST(Strategies, TimeToALossIsAtTheEndOfTheEpochThatReachedIt) {
  const StrategyRun r = run("a", "multi_worker", {2.0, 1.0, 1.5}, {0.9, 0.5, 0.3}, 0.9);
  EXPECT_DOUBLE_EQ(*time_to_loss(r, 0.9), 2.0);
  EXPECT_DOUBLE_EQ(*time_to_loss(r, 0.6), 3.0);
  EXPECT_DOUBLE_EQ(*time_to_loss(r, 0.3), 4.5);
  EXPECT_FALSE(time_to_loss(r, 0.29).has_value());
  EXPECT_DOUBLE_EQ(r.median_epoch_seconds(), 1.5);
  // The target every run reached: the highest of their lowest losses.
  const StrategyRun slow = run("b", "parameter_server", {1, 1, 1}, {1.0, 0.7, 0.45}, 0.9);
  EXPECT_DOUBLE_EQ(common_target({r, slow}), 0.45);
}

TEST(Strategies, FewTestRowsWidenWhatCountsAsTheSameAccuracy) {
  StrategyRun a = run("a", "multi_worker", {1}, {0.5}, 0.97);
  EXPECT_DOUBLE_EQ(metric_tolerance({a}), 0.01);  // 10000 rows: one point
  a.test_samples = 200;  // 2 * sqrt(2 * 0.97 * 0.03 / 200) = 0.0341
  EXPECT_NEAR(metric_tolerance({a}), 0.0341, 1e-4);
  a.test_samples = 0;  // not known: one point
  EXPECT_DOUBLE_EQ(metric_tolerance({a}), 0.01);
}

TEST(Strategies, TheRecommendationFollowsTimeToLossAmongTheAccurateAndSaysWhy) {
  // All-reduce is sooner to the loss; the ps waits on its pulls and pushes.
  StrategyRun all_reduce = run("MultiWorkerMirroredStrategy", "multi_worker", {1, 1, 1}, {0.8, 0.5, 0.4}, 0.900);
  StrategyRun ps = run("ParameterServerStrategy (async)", "parameter_server", {2, 2, 2}, {0.8, 0.5, 0.4}, 0.905);
  ps.wait_share = 0.4;
  ps.bytes_per_worker_step = 1.88e6;
  Recommendation r = recommend({all_reduce, ps}, 0.4);
  EXPECT_EQ(r.index, 0u);
  EXPECT_NE(r.reason.find("MultiWorkerMirroredStrategy reaches loss 0.4000 in 3.00 s, 2.00x sooner than "
                          "ParameterServerStrategy (async) (6.00 s)"),
            std::string::npos)
      << r.reason;
  EXPECT_NE(r.reason.find("spends 40% of each step pulling the weights and pushing the gradients (1.88 MB moved"),
            std::string::npos)
      << r.reason;

  // A straggler: the all-reduce runs at its pace, the ps does not.
  all_reduce.epoch_seconds = {3, 3, 3};
  all_reduce.straggler_share = 0.6;
  r = recommend({all_reduce, ps}, 0.4);
  EXPECT_EQ(r.index, 1u);
  EXPECT_NE(r.reason.find("1.50x sooner than MultiWorkerMirroredStrategy (9.00 s)"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("MultiWorkerMirroredStrategy waits 60% of each step for the slowest worker"),
            std::string::npos)
      << r.reason;

  // Sooner but worse: a run that ends more than the tolerance below the best is passed over.
  ps.final_metric = 0.85;
  r = recommend({all_reduce, ps}, 0.4);
  EXPECT_EQ(r.index, 0u);
  EXPECT_NE(r.reason.find("ParameterServerStrategy (async) ends 5.0 points of accuracy below the best"),
            std::string::npos)
      << r.reason;

  const std::string table = strategies_table({all_reduce, ps}, 0.4);
  EXPECT_NE(table.find("| MultiWorkerMirroredStrategy | 2 | 3.00 | 1000 | 9.00 | 90.0% | 0 B | 0% | 60% |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| ParameterServerStrategy (async) | 2 | 2.00 | 1000 | 6.00 | 85.0% | 1.88 MB | 40% | 0% |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("time to loss 0.4000 s"), std::string::npos) << table;
}

}  // namespace
}  // namespace dtrain::profile
