// A small MLP learns a synthetic separable problem with the TensorFlow custom-loop idiom:
// GradientTape, model call, loss, tape.gradient, optimizer.apply_gradients.
#include <gtest/gtest.h>

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
      auto grads = tape.gradient(loss, vars);
      optimizer.apply_gradients(grads, vars);
      if (epoch == 0 && start == 0) first_loss = loss.item();
      last_loss = loss.item();
    }
  }
  metrics::SparseCategoricalAccuracy acc;
  acc.update_state(y_test, model(x_test, false));
  EXPECT_GE(acc.result(), 0.95) << "test accuracy after 10 epochs";
  EXPECT_LT(last_loss, 0.25f * first_loss);
}

INSTANTIATE_TEST_SUITE_P(Policies, MlpTraining, ::testing::Values("float32", "mixed_bfloat16"));

}  // namespace
}  // namespace dtrain
