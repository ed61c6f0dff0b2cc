// A small MLP learns a synthetic separable problem with the TensorFlow custom-loop idiom:
// GradientTape, model call, loss, tape.gradient, optimizer.apply_gradients.
#include <gtest/gtest.h>

#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

// Labels are the arg-max of a fixed random linear map: separable by construction.
void make_problem(std::int64_t n, std::uint64_t seed, Tensor& x, Tensor& y) {
  const std::int64_t dim = 10, classes = 4;
  Generator g(seed), teacher(999);
  std::vector<float> w(dim * classes);
  for (auto& v : w) v = teacher.normal();
  x = Tensor::empty({n, dim});
  y = Tensor::empty({n}, DType::i32);
  float* px = x.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t d = 0; d < dim; ++d) px[i * dim + d] = g.normal();
    int best = 0;
    float best_score = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float s = 0;
      for (std::int64_t d = 0; d < dim; ++d) s += px[i * dim + d] * w[d * classes + c];
      if (s > best_score) best_score = s, best = c;
    }
    y.data<std::int32_t>()[i] = best;
  }
}

TEST(MlpTraining, ReachesNinetyFivePercentOnSeparableData) {
  Tensor x_train, y_train, x_test, y_test;
  make_problem(8000, 1, x_train, y_train);
  make_problem(1000, 2, x_test, y_test);

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

}  // namespace
}  // namespace dtrain
