#include <gtest/gtest.h>

#include "dtrain/metrics/metrics.h"

namespace dtrain::metrics {
namespace {

TEST(SparseCategoricalAccuracy, AccumulatesAcrossBatches) {
  SparseCategoricalAccuracy acc;
  Tensor pred = Tensor::from_vector({3, 2}, {0.9f, 0.1f, 0.2f, 0.8f, 0.6f, 0.4f});
  acc.update_state(Tensor::from_vector({3}, std::vector<std::int32_t>{0, 1, 1}), pred);
  EXPECT_NEAR(acc.result(), 2.0 / 3, 1e-12);
  acc.update_state(Tensor::from_vector({1, 1}, {0.0f}), Tensor::from_vector({1, 2}, {1, 0}));
  EXPECT_NEAR(acc.result(), 3.0 / 4, 1e-12);
  acc.reset_state();
  EXPECT_EQ(acc.result(), 0.0);
  EXPECT_THROW(acc.update_state(Tensor::zeros({2}), pred), InvalidArgument);
}

TEST(SparseCategoricalAccuracy, CountsEveryStepOfASequence) {
  SparseCategoricalAccuracy acc;
  // [batch 1, steps 3, classes 2]: steps predict 1, 0, 1; labels 1, 1, 1.
  const Tensor pred = Tensor::from_vector({1, 3, 2}, {0.1f, 0.9f, 0.8f, 0.2f, 0.3f, 0.7f});
  acc.update_state(Tensor::from_vector({1, 3}, std::vector<std::int32_t>{1, 1, 1}), pred);
  EXPECT_NEAR(acc.result(), 2.0 / 3.0, 1e-12);
  EXPECT_THROW(acc.update_state(Tensor::from_vector({2}, std::vector<std::int32_t>{1, 1}), pred), InvalidArgument);
}

TEST(CategoricalAccuracy, ComparesArgmaxes) {
  CategoricalAccuracy acc;
  acc.update_state(Tensor::from_vector({2, 3}, {0, 0, 1, 1, 0, 0}), Tensor::from_vector({2, 3}, {1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(acc.result(), 0.5);
}

TEST(Mean, WeightedMean) {
  Mean m;
  m.update_state(2.0);
  m.update_state(5.0, 2.0);
  EXPECT_EQ(m.result(), 4.0);
  m.update_state(Tensor::from_vector({2}, {1, 1}));
  EXPECT_EQ(m.result(), 14.0 / 5);
}

TEST(Metrics, AccuracyResolvesToLabelKind) {
  EXPECT_EQ(get("accuracy")->name(), "accuracy");
  auto a = get("accuracy", /*sparse_labels=*/false);
  a->update_state(Tensor::from_vector({1, 2}, {0, 1}), Tensor::from_vector({1, 2}, {0.2f, 0.8f}));
  EXPECT_EQ(a->result(), 1.0);
  EXPECT_THROW(get("f1_magic"), InvalidArgument);
}

}  // namespace
}  // namespace dtrain::metrics
