#include <gtest/gtest.h>

#include <cmath>

#include "common/gradcheck.h"
#include "dtrain/losses/losses.h"

namespace dtrain::losses {
namespace {

Tensor labels(std::vector<std::int32_t> v) {
  const std::int64_t n = static_cast<std::int64_t>(v.size());
  return Tensor::from_vector({n}, std::span<const std::int32_t>(v));
}

TEST(SparseCategoricalCrossentropy, FromLogitsHandComputed) {
  Tensor logits = Tensor::from_vector({2, 2}, {0, 0, 2, 0});
  // row 0: -log(1/2); row 1 (label 1): -log(1/(1+e^2))
  const double l0 = std::log(2.0), l1 = std::log(1 + std::exp(2.0));
  SparseCategoricalCrossentropy loss(true);
  EXPECT_NEAR(loss(labels({0, 1}), logits).item(), (l0 + l1) / 2, 1e-6);
  SparseCategoricalCrossentropy sum(true, Reduction::sum);
  EXPECT_NEAR(sum(labels({0, 1}), logits).item(), l0 + l1, 1e-6);
  SparseCategoricalCrossentropy none(true, Reduction::none);
  auto per = none(labels({0, 1}), logits).to_vector();
  EXPECT_NEAR(per[0], l0, 1e-6);
  EXPECT_NEAR(per[1], l1, 1e-6);
}

TEST(SparseCategoricalCrossentropy, FromProbabilitiesClipsLikeKeras) {
  Tensor probs = Tensor::from_vector({2, 3}, {0.2f, 0.7f, 0.1f, 1.0f, 0.0f, 0.0f});
  SparseCategoricalCrossentropy loss;  // from_logits = false, Keras's default
  auto per = SparseCategoricalCrossentropy(false, Reduction::none)(labels({1, 1}), probs).to_vector();
  EXPECT_NEAR(per[0], -std::log(0.7), 1e-5);
  // A zero probability is clipped to 1e-7, never log(0) = inf.
  EXPECT_NEAR(per[1], -std::log(1e-7 / (1 + 2e-7 - 1e-7)), 0.05);
  EXPECT_TRUE(std::isfinite(loss(labels({1, 1}), probs).item()));
}

TEST(SparseCategoricalCrossentropy, AcceptsFloatAndColumnLabels) {
  Tensor logits = Tensor::from_vector({2, 2}, {0, 1, 1, 0});
  SparseCategoricalCrossentropy loss(true);
  const float want = loss(labels({1, 0}), logits).item();
  EXPECT_NEAR(loss(Tensor::from_vector({2, 1}, {1, 0}), logits).item(), want, 1e-7);
  EXPECT_THROW(loss(Tensor::from_vector({2}, {0.5f, 1}), logits), InvalidArgument);
  EXPECT_THROW(loss(labels({0, 1, 1}), logits), InvalidArgument);
}

// A sequence's logits [batch, steps, classes] with labels [batch, steps] (a language
// model's): a loss per step, the mean over every step, its gradient the rows' own.
TEST(SparseCategoricalCrossentropy, ASequenceGivesALossPerStep) {
  const Tensor logits = testing::random_tensor({2, 3, 4}, 1), ids = labels({0, 3, 1, 2, 2, 0}).reshape({2, 3});
  const std::vector<float> flat = SparseCategoricalCrossentropy(true, Reduction::none)(ids.reshape({6}), logits.reshape({6, 4})).to_vector();
  const Tensor per_step = SparseCategoricalCrossentropy(true, Reduction::none)(ids, logits);
  EXPECT_EQ(per_step.shape(), (Shape{2, 3}));
  EXPECT_EQ(per_step.to_vector(), flat);
  double mean = 0;
  for (float v : flat) mean += v / 6;
  EXPECT_NEAR(SparseCategoricalCrossentropy(true)(ids, logits).item(), mean, 1e-6);
  testing::expect_gradients_match([&](const std::vector<Tensor>& in) { return SparseCategoricalCrossentropy(true)(ids, in[0]); },
                                  {logits}, {0});
  EXPECT_THROW(SparseCategoricalCrossentropy(true)(labels({0, 1, 2}), logits), InvalidArgument);
}

TEST(CategoricalCrossentropy, LogitsProbabilitiesAndSmoothing) {
  Tensor logits = testing::random_tensor({3, 4}, 1);
  Tensor target = Tensor::from_vector({3, 4}, {0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0.5f, 0.5f});
  const float from_logits = CategoricalCrossentropy(true)(target, logits).item();
  const float from_probs = CategoricalCrossentropy(false)(target, softmax(logits)).item();
  EXPECT_NEAR(from_logits, from_probs, 1e-5);
  Tensor lp = log_softmax(logits);
  double want = 0;
  const auto t = target.to_vector(), l = lp.to_vector();
  for (int i = 0; i < 12; ++i) want -= t[i] * l[i];
  EXPECT_NEAR(from_logits, want / 3, 1e-5);
  // Label smoothing 0.2 over 4 classes: targets become t * 0.8 + 0.05.
  double smooth = 0;
  for (int i = 0; i < 12; ++i) smooth -= (t[i] * 0.8 + 0.05) * l[i];
  EXPECT_NEAR(CategoricalCrossentropy(true, 0.2f)(target, logits).item(), smooth / 3, 1e-5);
  EXPECT_THROW(CategoricalCrossentropy(true)(Tensor::zeros({3, 3}), logits), InvalidArgument);
  // Class numbers, as a CSV's label column gives them, are named as such.
  try {
    CategoricalCrossentropy(true)(labels({0, 2, 1}), logits);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the targets are class numbers (int32 [3]) where it needs one-hot rows like "
                                         "the predictions [3, 4]; sparse_categorical_crossentropy takes class numbers"),
              std::string::npos) << e.what();
  }
}

TEST(MeanSquaredError, PerExampleMeanOverLastAxis) {
  Tensor y = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  Tensor p = Tensor::from_vector({2, 2}, {1, 4, 0, 4});
  EXPECT_EQ(MeanSquaredError(Reduction::none)(y, p).to_vector(), (std::vector<float>{2, 4.5f}));
  EXPECT_FLOAT_EQ(MeanSquaredError()(y, p).item(), 3.25f);
  EXPECT_THROW(MeanSquaredError()(y, Tensor::zeros({2, 3})), InvalidArgument);
}

TEST(Losses, GradientsMatchFiniteDifferences) {
  Tensor logits = testing::random_tensor({4, 3}, 2);
  Tensor y = labels({0, 2, 1, 1});
  testing::expect_gradients_match(
      [y](const std::vector<Tensor>& in) { return SparseCategoricalCrossentropy(true)(y, in[0]); }, {logits}, {0});
  Tensor probs = softmax(testing::random_tensor({4, 3}, 3));
  testing::expect_gradients_match(
      [y](const std::vector<Tensor>& in) { return SparseCategoricalCrossentropy(false)(y, in[0]); }, {probs}, {0},
      {.eps = 1e-3, .atol = 5e-3, .rtol = 3e-2});
  Tensor target = softmax(testing::random_tensor({4, 3}, 4));
  testing::expect_gradients_match(
      [target](const std::vector<Tensor>& in) { return CategoricalCrossentropy(false)(target, in[0]); }, {probs}, {0},
      {.eps = 1e-3, .atol = 5e-3, .rtol = 3e-2});
  testing::expect_gradients_match(
      [target](const std::vector<Tensor>& in) { return MeanSquaredError()(target, in[0]); }, {probs}, {0});
}

// Probabilities that are NaN (a model whose weights went NaN) give a NaN loss, not the
// loss of the clipped probabilities (ln of the classes): clipping keeps NaN, as in
// TensorFlow.
TEST(Losses, NaNProbabilitiesGiveANaNLoss) {
  const Tensor nan = Tensor::full({2, 4}, NAN);
  EXPECT_TRUE(std::isnan(SparseCategoricalCrossentropy(false)(labels({0, 3}), nan).item()));
  EXPECT_TRUE(std::isnan(CategoricalCrossentropy(false)(Tensor::zeros({2, 4}), nan).item()));
  const std::vector<float> clipped = clip_by_value(Tensor::from_vector({3}, {NAN, -2.0f, 5.0f}), -1.0f, 1.0f).to_vector();
  EXPECT_TRUE(std::isnan(clipped[0]));
  EXPECT_EQ(clipped[1], -1.0f);
  EXPECT_EQ(clipped[2], 1.0f);
}

TEST(Losses, EmptyBatchIsZeroNotNaN) {
  EXPECT_EQ(SparseCategoricalCrossentropy(true)(labels({}), Tensor::zeros({0, 3})).item(), 0.0f);
}

TEST(Losses, LookupByName) {
  EXPECT_EQ(get("mse")->name(), "mean_squared_error");
  EXPECT_THROW(get("hinge_of_doom"), InvalidArgument);
  EXPECT_EQ(reduction_from_name("none"), Reduction::none);
  EXPECT_THROW(reduction_from_name("avg"), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::losses
