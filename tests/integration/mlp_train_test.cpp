// A small MLP learns a synthetic separable problem with the TensorFlow custom-loop idiom:
// GradientTape, model call, loss, tape.gradient, optimizer.apply_gradients.
#include <gtest/gtest.h>

#include <cmath>

#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

class MlpTraining : public ::testing::TestWithParam<const char*> {
 protected:
  nn::ScopedGlobalPolicy policy_{GetParam()};
};

// The same in float32 and in mixed precision (bfloat16 matmuls, float32 variables).
TEST_P(MlpTraining, ReachesNinetyFivePercentOnSeparableData) {
  // Labels are the arg-max of a fixed random linear map of the inputs: separable.
  data::Split all = data::make_synthetic(9000, 10, 4, 1, data::SyntheticLabels::teacher);
  Tensor x_train = all.x.slice(0, 8000), y_train = all.y.slice(0, 8000);
  Tensor x_test = all.x.slice(8000, 9000), y_test = all.y.slice(8000, 9000);

  nn::Dense d1(64, "relu", {.seed = 10}), d2(64, "relu", {.seed = 11}), d3(4, "", {.seed = 12});
  auto model = [&](const Tensor& x, bool training) { return d3(d2(d1(x, training), training), training); };
  losses::SparseCategoricalCrossentropy loss_fn(/*from_logits=*/true);
  optim::Adam optimizer(0.005f);
  // float16's custom loop, as TensorFlow's guide writes it: the loss scaled before backward
  // (LossScaleOptimizer.get_scaled_loss), the optimizer dividing it out.
  const bool float16 = std::string(GetParam()) == "mixed_float16";
  if (float16) optimizer.set_loss_scale(optim::LossScale{});

  std::vector<Variable*> vars;
  const std::int64_t batch = 64;
  float first_loss = 0, last_loss = 0;
  for (int epoch = 0; epoch < 10; ++epoch) {
    for (std::int64_t start = 0; start + batch <= x_train.dim(0); start += batch) {
      Tensor xb = x_train.slice(start, start + batch), yb = y_train.slice(start, start + batch);
      GradientTape tape;
      Tensor loss = loss_fn(yb, model(xb, true));
      if (vars.empty())
        for (auto* layer : std::initializer_list<nn::Layer*>{&d1, &d2, &d3})
          for (Variable* v : layer->trainable_variables()) vars.push_back(v);
      auto grads = tape.gradient(float16 ? scale(loss, optimizer.loss_scale()) : loss, vars);
      if (float16) optimizer.apply_scaled_gradients(grads, vars);
      else optimizer.apply_gradients(grads, vars);
      if (epoch == 0 && start == 0) first_loss = loss.item();
      last_loss = loss.item();
    }
  }
  metrics::SparseCategoricalAccuracy acc;
  acc.update_state(y_test, model(x_test, false));
  EXPECT_GE(acc.result(), 0.95) << "test accuracy after 10 epochs";
  EXPECT_LT(last_loss, 0.25f * first_loss);
}

INSTANTIATE_TEST_SUITE_P(Policies, MlpTraining, ::testing::Values("float32", "mixed_bfloat16", "mixed_float16"));

// Gradients under float16's smallest value (2^-24) are zeros in its matmuls: compile() under
// mixed_float16 adds Keras's dynamic loss scale, which carries them, and the kernels then
// move as in float32; without the scale they do not move at all.
TEST(MixedFloat16, CompileAddsALossScaleThatKeepsSmallGradients) {
  const data::Split d = data::make_synthetic(128, 8, 1, 5, data::SyntheticLabels::teacher);
  std::vector<float> targets;  // a regression target: the first input
  const std::vector<float> xs = d.x.to_vector();
  for (std::size_t r = 0; r < 128; ++r) targets.push_back(xs[r * 8]);
  const Tensor y = Tensor::from_vector({128, 1}, targets);
  auto kernels_after_one_epoch = [&](const char* policy, bool keep_loss_scale) {
    nn::ScopedGlobalPolicy scoped(policy);
    Sequential m("tiny");
    m.add<nn::Dense>(6, "tanh", nn::DenseOptions{.seed = 1});
    m.add<nn::Dense>(1, "", nn::DenseOptions{.seed = 2});
    m.build(Shape{8});
    // The loss weighted by 1e-8: the output's gradient is about 1e-9 a row, under float16's least.
    m.compile(std::make_shared<optim::SGD>(1e5f), {std::make_shared<losses::MeanSquaredError>()}, {}, {1e-8});
    EXPECT_EQ(m.optimizer().loss_scale_options().has_value(), std::string(policy) == "mixed_float16") << policy;
    if (!keep_loss_scale) m.optimizer().set_loss_scale(std::nullopt);
    std::vector<std::vector<float>> before, moved;
    for (Variable* v : m.trainable_variables()) before.push_back(v->value().to_vector());
    m.fit(d.x, y, {.epochs = 1, .batch_size = 32, .shuffle = false, .verbose = 0});
    std::size_t i = 0;
    for (Variable* v : m.trainable_variables()) {
      std::vector<float> now = v->value().to_vector();
      for (std::size_t j = 0; j < now.size(); ++j) now[j] -= before[i][j];
      moved.push_back(now);
      ++i;
    }
    return moved;  // kernel 1, bias 1, kernel 2, bias 2
  };
  const auto f32 = kernels_after_one_epoch("float32", true);
  const auto scaled = kernels_after_one_epoch("mixed_float16", true);
  const auto unscaled = kernels_after_one_epoch("mixed_float16", false);
  for (std::size_t k : {0u, 2u}) {
    double norm = 0, diff = 0;
    for (std::size_t j = 0; j < f32[k].size(); ++j) {
      norm += double(f32[k][j]) * f32[k][j];
      diff += double(scaled[k][j] - f32[k][j]) * (scaled[k][j] - f32[k][j]);
      EXPECT_EQ(unscaled[k][j], 0.0f) << "kernel " << k << " element " << j << " moved without a loss scale";
    }
    EXPECT_GT(norm, 0.0) << "kernel " << k;
    EXPECT_LT(std::sqrt(diff), 2e-2 * std::sqrt(norm)) << "kernel " << k << " under mixed_float16's loss scale";
  }
}

}  // namespace
}  // namespace dtrain
