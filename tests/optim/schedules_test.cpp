#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "dtrain/core/error.h"
#include "dtrain/optim/schedules.h"

namespace dtrain::optim {
namespace {

TEST(Schedules, ExponentialAndStepDecay) {
  ExponentialDecay smooth(0.1f, 10, 0.5f);
  EXPECT_NEAR(smooth(0), 0.1f, 1e-8);
  EXPECT_NEAR(smooth(5), 0.1 * std::pow(0.5, 0.5), 1e-7);
  EXPECT_NEAR(smooth(20), 0.025f, 1e-8);
  ExponentialDecay step(0.1f, 10, 0.5f, true);
  EXPECT_NEAR(step(9), 0.1f, 1e-8);
  EXPECT_NEAR(step(10), 0.05f, 1e-8);
  EXPECT_THROW(ExponentialDecay(0.1f, 0, 0.5f), InvalidArgument);
}

TEST(Schedules, PiecewiseConstant) {
  PiecewiseConstantDecay p({100, 200}, {1.0f, 0.5f, 0.1f});
  EXPECT_EQ(p(0), 1.0f);
  EXPECT_EQ(p(100), 1.0f);
  EXPECT_EQ(p(101), 0.5f);
  EXPECT_EQ(p(201), 0.1f);
  EXPECT_THROW(PiecewiseConstantDecay({1}, {1.0f}), InvalidArgument);
}

TEST(Schedules, Cosine) {
  CosineDecay c(1.0f, 100, 0.1f);
  EXPECT_NEAR(c(0), 1.0f, 1e-7);
  EXPECT_NEAR(c(50), 0.9 * 0.5 + 0.1, 1e-6);
  EXPECT_NEAR(c(100), 0.1f, 1e-7);
  EXPECT_NEAR(c(1000), 0.1f, 1e-7);
  EXPECT_NEAR(c(25), 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)) + 0.1, 1e-6);
}

TEST(Schedules, LinearScalingRuleAndGradualWarmup) {
  EXPECT_FLOAT_EQ(linear_scaling_rule(0.1f, 8), 0.8f);
  EXPECT_THROW(linear_scaling_rule(0.1f, 0), InvalidArgument);
  auto w = gradual_warmup(0.1f, 4, 10);
  EXPECT_FLOAT_EQ((*w)(0), 0.1f);   // the single-device rate
  EXPECT_FLOAT_EQ((*w)(5), 0.25f);  // halfway
  EXPECT_FLOAT_EQ((*w)(10), 0.4f);  // then the scaled rate
  EXPECT_FLOAT_EQ((*w)(1000), 0.4f);
}

TEST(Schedules, LinearWarmupThenWrapped) {
  auto after = std::make_shared<ExponentialDecay>(0.4f, 10, 0.5f);
  LinearWarmup w(after, 4);
  EXPECT_NEAR(w(0), 0.0f, 1e-8);
  EXPECT_NEAR(w(1), 0.1f, 1e-7);
  EXPECT_NEAR(w(2), 0.2f, 1e-7);
  EXPECT_NEAR(w(4), 0.4f, 1e-7);
  EXPECT_NEAR(w(14), 0.2f, 1e-7);  // the wrapped schedule counts from the warmup's end
  EXPECT_THROW(LinearWarmup(nullptr, 4), InvalidArgument);
}

// A negative or NaN rate would climb the loss or make every weight NaN: every schedule
// refuses one, as a constant learning rate does, naming the schedule and the argument.
TEST(Schedules, RefuseANegativeOrNotFiniteRate) {
  const auto message = [](auto make) {
    try {
      make();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string nan = message([] { ExponentialDecay(NAN, 10, 0.5f); });
  EXPECT_NE(nan.find("ExponentialDecay: initial_learning_rate must be a finite number >= 0, got nan"),
            std::string::npos) << nan;
  EXPECT_NE(message([] { ExponentialDecay(-0.5f, 10, 0.5f); }).find("initial_learning_rate"), std::string::npos);
  EXPECT_NE(message([] { ExponentialDecay(0.5f, 10, INFINITY); }).find("decay_rate"), std::string::npos);
  EXPECT_NE(message([] { PiecewiseConstantDecay({1}, {0.1f, -0.1f}); }).find("PiecewiseConstantDecay: each of values"),
            std::string::npos);
  EXPECT_NE(message([] { CosineDecay(-1.0f, 10); }).find("CosineDecay: initial_learning_rate"), std::string::npos);
  EXPECT_NE(message([] { CosineDecay(1.0f, 10, -0.1f); }).find("CosineDecay: alpha"), std::string::npos);
  EXPECT_NE(message([] { LinearWarmup(std::make_shared<Constant>(0.1f), 4, -0.01f); })
                .find("LinearWarmup: initial_learning_rate"),
            std::string::npos);
  EXPECT_NE(message([] { Constant(-0.1f); }).find("learning rate must be a finite number >= 0"), std::string::npos);
  EXPECT_EQ(message([] { ExponentialDecay(0.0f, 10, 0.5f); }), "(accepted)");  // 0 trains nothing, but is not wrong
}

}  // namespace
}  // namespace dtrain::optim
