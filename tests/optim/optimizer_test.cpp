#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtrain/autograd/ops.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::optim {
namespace {

TEST(SGD, PlainStepIsLearningRateTimesGradient) {
  Variable w("w", Tensor::from_vector({2}, {1, 2}));
  SGD sgd(0.1f);
  Tensor g = Tensor::from_vector({2}, {1, -1});
  sgd.apply_gradients({{g, &w}});
  EXPECT_NEAR(w.value().to_vector()[0], 0.9f, 1e-7);
  EXPECT_NEAR(w.value().to_vector()[1], 2.1f, 1e-7);
  EXPECT_EQ(sgd.iterations(), 1);
}

// A persistent tape asked after an update (a GAN's generator loss, through the
// discriminator the step just updated): the gradient is of the values the tape read, as
// TensorFlow's copy on write gives it, and the update still lands. Without a reader left,
// the update writes in place, as every step of fit does.
TEST(SGD, AnUpdateLeavesWhatATapeReadBeforeIt) {
  Variable d("d", Tensor::from_vector({2}, {3, 4}));
  Variable g("g", Tensor::from_vector({2}, {1, 1}));
  GradientTape tape(/*persistent=*/true);
  const Tensor loss_d = reduce_sum(mul(d.value(), d.value()));  // d/dd: 2d
  const Tensor loss_g = reduce_sum(mul(d.value(), g.value()));  // d/dg: d
  Variable* ds[] = {&d};
  Variable* gs[] = {&g};
  SGD sgd(0.5f);
  const std::vector<Tensor> grad_d = tape.gradient(loss_d, ds);
  EXPECT_EQ(grad_d[0].to_vector(), (std::vector<float>{6, 8}));
  sgd.apply_gradients(grad_d, ds);
  EXPECT_EQ(d.value().to_vector(), (std::vector<float>{0, 0}));
  EXPECT_EQ(tape.gradient(loss_g, gs)[0].to_vector(), (std::vector<float>{3, 4}));
  EXPECT_EQ(tape.gradient(loss_d, ds)[0].to_vector(), (std::vector<float>{6, 8}));
  // The same through assign().
  Variable a("a", Tensor::from_vector({2}, {5, 6}));
  GradientTape tape_a;
  const Tensor loss_a = reduce_sum(mul(a.value(), g.value()));
  a.assign(Tensor::from_vector({2}, {7, 7}));
  EXPECT_EQ(tape_a.gradient(loss_a, gs)[0].to_vector(), (std::vector<float>{5, 6}));
  EXPECT_EQ(a.value().to_vector(), (std::vector<float>{7, 7}));

  Variable w("w", Tensor::from_vector({2}, {1, 2}));
  const void* storage = w.value().raw_data();
  Variable* ws[] = {&w};
  sgd.apply_gradients(std::vector<Tensor>{Tensor::from_vector({2}, {1, 1})}, ws);
  EXPECT_EQ(w.value().raw_data(), storage);
}

TEST(SGD, MomentumFollowsKerasFormula) {
  Variable w("w", Tensor::from_vector({1}, {1}));
  SGD sgd(0.1f, 0.9f);
  double rw = 1, rv = 0;
  for (int i = 0; i < 4; ++i) {
    sgd.apply_gradients({{Tensor::from_vector({1}, {2}), &w}});
    rv = 0.9 * rv - 0.1 * 2;
    rw += rv;
  }
  EXPECT_NEAR(w.value().item(), rw, 1e-6);
  auto slots = sgd.slots(w);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].first, "momentum");
  EXPECT_NEAR(slots[0].second->item(), rv, 1e-6);
}

TEST(Adam, FirstStepMovesEachWeightByLearningRate) {
  // With zero slots, step 1 of Adam moves every weight by about lr * sign(g).
  Variable w("w", Tensor::from_vector({3}, {0, 0, 0}));
  Adam adam(0.01f);
  adam.apply_gradients({{Tensor::from_vector({3}, {5, -0.2f, 1e-3f}), &w}});
  auto v = w.value().to_vector();
  EXPECT_NEAR(v[0], -0.01f, 1e-5);
  EXPECT_NEAR(v[1], 0.01f, 1e-5);
  EXPECT_NEAR(v[2], -0.01f, 1e-4);
}

TEST(AdamW, DecaysWeightsTowardZeroWithoutGradient) {
  Variable w("w", Tensor::from_vector({1}, {2}));
  AdamW opt(0.1f, 0.5f);
  opt.apply_gradients({{Tensor::from_vector({1}, {0}), &w}});
  EXPECT_NEAR(w.value().item(), 2 - 0.1 * 0.5 * 2, 1e-6);  // no gradient, only decay
}

TEST(Optimizer, ClipnormPerVariable) {
  Variable a("a", Tensor::zeros({2})), b("b", Tensor::zeros({1}));
  SGD sgd(1.0f, 0.0f, false, {.clipnorm = 1.0f});
  sgd.apply_gradients({{Tensor::from_vector({2}, {3, 4}), &a}, {Tensor::from_vector({1}, {0.5f}), &b}});
  EXPECT_NEAR(a.value().to_vector()[0], -0.6f, 1e-6);  // (3,4) clipped to norm 1
  EXPECT_NEAR(a.value().to_vector()[1], -0.8f, 1e-6);
  EXPECT_NEAR(b.value().item(), -0.5f, 1e-6);  // below the norm: unchanged
}

TEST(Optimizer, GlobalClipnormOverAllVariables) {
  Variable a("a", Tensor::zeros({1})), b("b", Tensor::zeros({1}));
  SGD sgd(1.0f, 0.0f, false, {.global_clipnorm = 1.0f});
  sgd.apply_gradients({{Tensor::from_vector({1}, {3}), &a}, {Tensor::from_vector({1}, {4}), &b}});
  EXPECT_NEAR(a.value().item(), -0.6f, 1e-6);
  EXPECT_NEAR(b.value().item(), -0.8f, 1e-6);
  EXPECT_NEAR(sgd.last_global_norm(), 5.0, 1e-9);
}

TEST(Optimizer, MismatchIsAnErrorAndChangesNothing) {
  Variable a("dense/kernel", Tensor::full({2}, 1.0f)), b("dense/bias", Tensor::full({1}, 1.0f));
  SGD sgd(0.1f);
  try {
    sgd.apply_gradients({{Tensor::from_vector({2}, {1, 1}), &a}, {Tensor::zeros({3}), &b}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dense/bias"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.value().to_vector(), (std::vector<float>{1, 1}));  // validated before anything changed
  EXPECT_EQ(sgd.iterations(), 0);
}

TEST(Optimizer, StateFollowsTheVariableNotItsAddress) {
  Adam adam(0.1f);
  for (std::int64_t n : {2, 3}) {  // a new variable of another shape, likely at the same address
    Variable v("w", Tensor::zeros({n}));
    adam.apply_gradients({{Tensor::full({n}, 1.0f), &v}});
    EXPECT_EQ(adam.slots(v)[0].second->shape(), Shape({n}));
  }
}

TEST(Optimizer, AVariableGivenTwiceIsAnError) {
  Variable v("dense/kernel", Tensor::zeros({2}));
  SGD sgd(0.1f);
  Tensor g = Tensor::full({2}, 1.0f);
  try {
    sgd.apply_gradients({{g, &v}, {g, &v}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("given twice"), std::string::npos) << e.what();
  }
  EXPECT_EQ(v.value().to_vector(), (std::vector<float>{0, 0}));
}

TEST(Optimizer, UndefinedGradientSkipsVariable) {
  Variable a("a", Tensor::full({1}, 1.0f));
  SGD sgd(0.1f);
  sgd.apply_gradients({{Tensor(), &a}});
  EXPECT_EQ(a.value().item(), 1.0f);
}

TEST(Optimizer, ScheduleDrivesLearningRate) {
  Variable w("w", Tensor::zeros({1}));
  SGD sgd(std::make_shared<ExponentialDecay>(1.0f, 1, 0.5f));
  for (int i = 0; i < 3; ++i) sgd.apply_gradients({{Tensor::from_vector({1}, {1}), &w}});
  EXPECT_NEAR(w.value().item(), -(1 + 0.5 + 0.25), 1e-6);
  EXPECT_NEAR(sgd.learning_rate(), 0.125f, 1e-7);
}

// Keras's constraints on the updated values, norms over `axis` with its epsilon 1e-7.
std::vector<double> keras_constrained(const Constraint& c, const std::vector<double>& w, int rows, int cols) {
  std::vector<double> out = w;
  if (c.kind == Constraint::Kind::non_neg) {
    for (double& v : out) v = v < 0 ? 0 : v;
    return out;
  }
  const bool over_rows = c.axis == std::vector<int>{0};  // one norm per column, else per row
  for (int k = 0; k < (over_rows ? cols : rows); ++k) {
    auto at = [&](int i) -> double& { return over_rows ? out[i * cols + k] : out[k * cols + i]; };
    double sq = 0;
    for (int i = 0; i < (over_rows ? rows : cols); ++i) sq += at(i) * at(i);
    const double norm = std::sqrt(sq);
    double desired = 1.0;
    if (c.kind == Constraint::Kind::max_norm) desired = std::min<double>(norm, c.max_value);
    if (c.kind == Constraint::Kind::min_max_norm)
      desired = c.rate * std::clamp<double>(norm, c.min_value, c.max_value) + (1 - c.rate) * norm;
    for (int i = 0; i < (over_rows ? rows : cols); ++i) at(i) *= desired / (1e-7 + norm);
  }
  return out;
}

// The constraint is applied to the value the update wrote, once per update, by
// apply_gradients and by the replicas' shared update alike.
TEST(Constraints, ApplyAfterEachUpdateAsKerasDoes) {
  const std::vector<float> start{3, -1, 0.5f, 2, -0.2f, 1};  // [3, 2]
  const std::vector<float> grad{1, 0.5f, -2, 1, 0, -1};
  for (const Constraint& c : {Constraint::max_norm(1.5f), Constraint::non_neg(), Constraint::unit_norm({1}),
                              Constraint::min_max_norm(2.0f, 2.5f, 0.5f)}) {
    std::vector<double> expected(6);
    for (int i = 0; i < 6; ++i) expected[i] = static_cast<double>(start[i]) - 0.1 * grad[i];
    expected = keras_constrained(c, expected, 3, 2);
    for (const bool shared : {false, true}) {
      Variable w("w", Tensor::from_vector({3, 2}, start));
      w.set_constraint(c);
      Variable* vars[] = {&w};
      const std::vector<Tensor> grads{Tensor::from_vector({3, 2}, grad)};
      SGD sgd(0.1f);
      if (shared && sgd.begin_shared_update(vars)) {
        sgd.apply_share(grads, vars, 0, 2);
        sgd.apply_share(grads, vars, 1, 2);
        sgd.end_shared_update();
      } else {
        sgd.apply_gradients(grads, vars);
      }
      const std::vector<float> got = w.value().to_vector();
      for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[i], expected[i], 1e-6) << c.class_name() << " " << i;
    }
  }
  Variable w("dense/kernel", Tensor::zeros({3, 2}));
  const std::string message = [&] {
    try {
      w.set_constraint(Constraint::max_norm(2.0f, {0, 1, 2}));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_NE(message.find("dense/kernel"), std::string::npos) << message;
  EXPECT_NE(message.find("axis 2"), std::string::npos) << message;
}

// Keras 3's RMSprop: centered with momentum, slot by slot, against the formula in double.
TEST(RMSprop, CenteredWithMomentumFollowsKeras3) {
  Variable w("w", Tensor::from_vector({2}, {1.0f, -0.5f}));
  RMSprop opt(0.01f, {.rho = 0.8f, .momentum = 0.5f, .epsilon = 1e-3f, .centered = true});
  double rw[2] = {1.0, -0.5}, v[2] = {0, 0}, a[2] = {0, 0}, m[2] = {0, 0};
  const float grads[3][2] = {{0.3f, -1.0f}, {-0.2f, 0.4f}, {0.7f, 0.1f}};
  for (const auto& g : grads) {
    opt.apply_gradients({{Tensor::from_vector({2}, {g[0], g[1]}), &w}});
    for (int i = 0; i < 2; ++i) {
      v[i] = 0.8 * v[i] + 0.2 * g[i] * g[i];
      a[i] = 0.8 * a[i] + 0.2 * g[i];
      m[i] = 0.5 * m[i] + 0.01 * g[i] / std::sqrt(v[i] - a[i] * a[i] + 1e-3);
      rw[i] -= m[i];
    }
  }
  EXPECT_NEAR(w.value().to_vector()[0], rw[0], 1e-6);
  EXPECT_NEAR(w.value().to_vector()[1], rw[1], 1e-6);
  const auto slots = opt.slots(w);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].first, "velocity");
  EXPECT_EQ(slots[1].first, "momentum");
  EXPECT_EQ(slots[2].first, "average_gradient");
  EXPECT_EQ(get("rmsprop")->name(), "RMSprop");
}

// Centered without momentum: the average is the second slot, and the update of all of a
// step's variables at once finds it there.
TEST(RMSprop, CenteredWithoutMomentumKeepsItsAverageInTheSecondSlot) {
  Variable w("w", Tensor::from_vector({2}, {1.0f, -0.5f})), u("u", Tensor::from_vector({1}, {2.0f}));
  RMSprop opt(0.01f, {.rho = 0.8f, .epsilon = 1e-3f, .centered = true});
  double rw[3] = {1.0, -0.5, 2.0}, v[3] = {0, 0, 0}, a[3] = {0, 0, 0};
  const float grads[3][3] = {{0.3f, -1.0f, 0.5f}, {-0.2f, 0.4f, 0.25f}, {0.7f, 0.1f, -2.0f}};
  for (const auto& g : grads) {
    opt.apply_gradients({{Tensor::from_vector({2}, {g[0], g[1]}), &w}, {Tensor::from_vector({1}, {g[2]}), &u}});
    for (int i = 0; i < 3; ++i) {
      v[i] = 0.8 * v[i] + 0.2 * g[i] * g[i];
      a[i] = 0.8 * a[i] + 0.2 * g[i];
      rw[i] -= 0.01 * g[i] / std::sqrt(v[i] - a[i] * a[i] + 1e-3);
    }
  }
  EXPECT_NEAR(w.value().to_vector()[0], rw[0], 1e-6);
  EXPECT_NEAR(w.value().to_vector()[1], rw[1], 1e-6);
  EXPECT_NEAR(u.value().item(), rw[2], 1e-6);
  const auto slots = opt.slots(u);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[1].first, "average_gradient");
  EXPECT_NEAR(slots[1].second->item(), a[2], 1e-6);
}

// Adagrad's accumulator starts at initial_accumulator_value, in updates and in the slot a
// checkpoint restores into.
TEST(Adagrad, AccumulatorStartsAtItsInitialValue) {
  Variable w("w", Tensor::from_vector({1}, {2.0f}));
  Adagrad opt(0.1f, 0.25f);
  double rw = 2.0, acc = 0.25;
  for (float g : {1.0f, -0.5f}) {
    opt.apply_gradients({{Tensor::from_vector({1}, {g}), &w}});
    acc += double(g) * g;
    rw -= 0.1 * g / std::sqrt(acc + 1e-7);
  }
  EXPECT_NEAR(w.value().item(), rw, 1e-6);
  Variable fresh("fresh", Tensor::zeros({3}));
  Adagrad other;
  const auto slots = other.slots(fresh, /*create=*/true);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].second->to_vector(), (std::vector<float>{0.1f, 0.1f, 0.1f}));
  EXPECT_THROW(Adagrad(0.1f, -1.0f), InvalidArgument);
  EXPECT_THROW(RMSprop(0.1f, {.rho = 1.0f}), InvalidArgument);
}

// ---- loss scaling (keras.mixed_precision.LossScaleOptimizer)

// One step of gradients of the scaled loss (fit's, and Keras 3's LossScaleOptimizer.apply).
void scaled_step(Optimizer& opt, const std::vector<std::pair<Tensor, Variable*>>& grads_and_vars) {
  std::vector<Tensor> grads;
  std::vector<Variable*> vars;
  for (const auto& [g, v] : grads_and_vars) {
    grads.push_back(g);
    vars.push_back(v);
  }
  opt.apply_scaled_gradients(grads, vars);
}

// Gradients of the loss times the scale, applied under that scale, update as the plain
// gradients do without one, bit for bit (the scale is a power of two), slots included.
TEST(LossScale, ScaledGradientsUpdateAsTheUnscaledOnes) {
  for (const bool clip : {false, true}) {
    OptimizerOptions o;
    if (clip) o.global_clipnorm = 0.5f;
    Variable a("a", Tensor::from_vector({3}, {1, -2, 3})), b("b", Tensor::from_vector({3}, {1, -2, 3}));
    Adam plain(0.01f, {}, o), scaled(0.01f, {}, o);
    scaled.set_loss_scale(LossScale{.initial_scale = 1024.0f});
    for (int step = 0; step < 3; ++step) {
      const Tensor g = Tensor::from_vector({3}, {0.5f, -1e-3f, 2.0f + static_cast<float>(step)});
      plain.apply_gradients({{g, &a}});
      scaled_step(scaled, {{scale(g, scaled.loss_scale()), &b}});
    }
    EXPECT_EQ(b.value().to_vector(), a.value().to_vector()) << (clip ? "with" : "without") << " global_clipnorm";
    EXPECT_EQ(scaled.slots(b)[1].second->to_vector(), plain.slots(a)[1].second->to_vector());
    EXPECT_EQ(scaled.iterations(), 3);
    EXPECT_EQ(scaled.loss_scale(), 1024.0f);
    EXPECT_EQ(scaled.loss_scale_good_steps(), 3);
  }
}

// A step whose gradients hold a NaN or an infinity changes no weight, slot or iteration
// count, and halves the scale; finite steps in a row double it, never past a float.
TEST(LossScale, SkipsAStepThatOverflowedAndMovesTheScale) {
  Variable w("w", Tensor::from_vector({2}, {1, 2})), u("u", Tensor::from_vector({1}, {5}));
  SGD sgd(0.1f, 0.9f);
  sgd.set_loss_scale(LossScale{.initial_scale = 8.0f, .dynamic_growth_steps = 3});
  scaled_step(sgd, {{Tensor::from_vector({2}, {8, 8}), &w}, {Tensor::from_vector({1}, {8}), &u}});
  const std::vector<float> w1 = w.value().to_vector(), velocity = sgd.slots(w)[0].second->to_vector();
  EXPECT_FALSE(sgd.last_update_skipped());
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    scaled_step(sgd, {{Tensor::from_vector({2}, {1, 1}), &w}, {Tensor::from_vector({1}, {bad}), &u}});
    EXPECT_TRUE(sgd.last_update_skipped());
    EXPECT_EQ(w.value().to_vector(), w1);  // the finite variable is not updated either
    EXPECT_EQ(sgd.slots(w)[0].second->to_vector(), velocity);
    EXPECT_EQ(sgd.iterations(), 1);
    EXPECT_EQ(sgd.loss_scale_good_steps(), 0);
  }
  EXPECT_EQ(sgd.loss_scale(), 2.0f);
  EXPECT_EQ(sgd.skipped_updates(), 2);
  EXPECT_FALSE(sgd.take_non_finite());  // nothing non-finite was written
  for (int i = 0; i < 2; ++i) scaled_step(sgd, {{Tensor::from_vector({2}, {1, 1}), &w}});
  EXPECT_EQ(sgd.loss_scale(), 2.0f);
  scaled_step(sgd, {{Tensor::from_vector({2}, {1, 1}), &w}});
  EXPECT_EQ(sgd.loss_scale(), 4.0f);  // the third finite step in a row
  EXPECT_EQ(sgd.loss_scale_good_steps(), 0);
  EXPECT_EQ(sgd.iterations(), 4);
  // The scale stops halving at 1.
  for (int i = 0; i < 5; ++i)
    scaled_step(sgd, {{Tensor::from_vector({2}, {std::numeric_limits<float>::infinity(), 0}), &w}});
  EXPECT_EQ(sgd.loss_scale(), 1.0f);
}

// The optimizer's own apply_gradients stays the plain update, as a LossScaleOptimizer's
// inner optimizer's does: nothing divided, nothing checked, the scale left alone.
TEST(LossScale, ThePlainApplyGradientsNeitherDividesNorChecks) {
  Variable w("w", Tensor::from_vector({1}, {1}));
  SGD sgd(1.0f);
  sgd.set_loss_scale(LossScale{.initial_scale = 4.0f});
  sgd.apply_gradients({{Tensor::from_vector({1}, {2}), &w}});
  EXPECT_EQ(w.value().item(), -1.0f);
  sgd.apply_gradients({{Tensor::from_vector({1}, {std::numeric_limits<float>::infinity()}), &w}});
  EXPECT_TRUE(std::isinf(w.value().item()));
  EXPECT_EQ(sgd.loss_scale(), 4.0f);
  EXPECT_EQ(sgd.iterations(), 2);
}

// A fixed scale neither checks nor moves: a NaN is applied (and reported as such).
TEST(LossScale, AFixedScaleDividesOnly) {
  Variable w("w", Tensor::from_vector({1}, {1}));
  SGD sgd(1.0f);
  sgd.set_loss_scale(LossScale{.dynamic = false, .initial_scale = 4.0f});
  scaled_step(sgd, {{Tensor::from_vector({1}, {2}), &w}});
  EXPECT_EQ(w.value().item(), 0.5f);
  scaled_step(sgd, {{Tensor::from_vector({1}, {std::numeric_limits<float>::quiet_NaN()}), &w}});
  EXPECT_TRUE(std::isnan(w.value().item()));
  EXPECT_TRUE(sgd.take_non_finite());
  EXPECT_EQ(sgd.loss_scale(), 4.0f);
}

// TensorFlow 2's custom loop divides the gradients itself (get_unscaled_gradients): they
// are checked and applied as given.
TEST(LossScale, UnscaledGradientsAreCheckedAndAppliedAsGiven) {
  Variable w("w", Tensor::from_vector({1}, {1}));
  SGD sgd(1.0f);
  sgd.set_loss_scale(LossScale{.initial_scale = 64.0f});
  Variable* vars[] = {&w};
  sgd.apply_unscaled_gradients(std::vector<Tensor>{Tensor::from_vector({1}, {0.25f})}, vars);
  EXPECT_EQ(w.value().item(), 0.75f);
  sgd.apply_unscaled_gradients(std::vector<Tensor>{Tensor::from_vector({1}, {-std::numeric_limits<float>::infinity()})},
                               vars);
  EXPECT_EQ(w.value().item(), 0.75f);
  EXPECT_EQ(sgd.loss_scale(), 32.0f);
}

TEST(LossScale, ItsSettingsAreChecked) {
  SGD sgd;
  EXPECT_THROW(sgd.set_loss_scale(LossScale{.initial_scale = 0.5f}), InvalidArgument);
  EXPECT_THROW(sgd.set_loss_scale(LossScale{.initial_scale = std::numeric_limits<float>::infinity()}), InvalidArgument);
  EXPECT_THROW(sgd.set_loss_scale(LossScale{.dynamic_growth_steps = 0}), InvalidArgument);
  EXPECT_THROW(sgd.set_loss_scale_state(2.0f, 0), InvalidArgument);  // no loss scale set
  EXPECT_EQ(sgd.loss_scale(), 1.0f);
  sgd.set_loss_scale(LossScale{});
  EXPECT_EQ(sgd.loss_scale(), 32768.0f);
  EXPECT_THROW(sgd.set_loss_scale_state(0.25f, 3), InvalidArgument);
  sgd.set_loss_scale_state(256.0f, 7);
  EXPECT_EQ(sgd.loss_scale(), 256.0f);
  EXPECT_EQ(sgd.loss_scale_good_steps(), 7);
}

TEST(Optimizer, InvalidHyperparameters) {
  EXPECT_THROW(SGD(-1.0f), InvalidArgument);
  EXPECT_THROW(SGD(0.1f, 1.5f), InvalidArgument);
  EXPECT_THROW(Adam(0.1f, {.beta_1 = 1.0f}), InvalidArgument);
  EXPECT_THROW(SGD(0.1f, 0, false, {.clipnorm = 1.0f, .global_clipnorm = 1.0f}), InvalidArgument);
  EXPECT_THROW(get("rmsprop_plus"), InvalidArgument);
  EXPECT_EQ(get("adam")->name(), "Adam");
}

}  // namespace
}  // namespace dtrain::optim
