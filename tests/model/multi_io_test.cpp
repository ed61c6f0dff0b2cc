// Models of several inputs and outputs: fit's step is the hand-written step on the weighted
// sum of the outputs' losses, logs name each output's loss and metrics, datasets and
// tensors give the same training, saved compile settings come back, mistakes are named.
#include <gtest/gtest.h>

#include <cmath>

#include <filesystem>

#include "common/compare.h"
#include "common/quiet_fit.h"
#include "common/two_headed.h"
#include "common/temp_dir.h"
#include "dtrain/autograd/tape.h"
#include "dtrain/model/saving.h"
#include "dtrain/model/sequential.h"

namespace dtrain {
namespace {

using testing::compile_two_headed;
using testing::quiet;
using testing::relative_difference;
using testing::two_headed;
using testing::two_headed_data;

TEST(MultiIO, FitStepIsTheHandWrittenStepOnTheWeightedLosses) {
  const TensorData d = two_headed_data(24);
  auto fitted = two_headed();
  compile_two_headed(*fitted);
  const History h = fitted->fit(d, quiet(24));

  auto by_hand = two_headed();
  optim::SGD sgd(0.1f);
  const std::vector<Variable*> vars = by_hand->trainable_variables();
  {
    GradientTape tape;
    const std::vector<Tensor> out = (*by_hand)(d.x, /*training=*/true);
    const Tensor loss = add(losses::SparseCategoricalCrossentropy(true)(d.y[0], out[0]),
                            scale(losses::MeanSquaredError()(d.y[1], out[1]), 0.5f));
    sgd.apply_gradients(tape.gradient(loss, vars), vars);
  }
  EXPECT_LE(relative_difference(*fitted, *by_hand), 1e-6);

  // "loss" is the weighted sum; each output's own loss and metrics carry its name.
  for (const char* key : {"loss", "kind_loss", "size_loss", "kind_accuracy"})
    EXPECT_EQ(h.history.count(key), 1u) << key;
  EXPECT_EQ(h.history.count("accuracy"), 0u);
  EXPECT_NEAR(h.history.at("loss")[0], h.history.at("kind_loss")[0] + 0.5 * h.history.at("size_loss")[0], 1e-5);
  const Logs logs = fitted->evaluate(d, {.batch_size = 7});
  EXPECT_NEAR(logs.at("loss"), logs.at("kind_loss") + 0.5 * logs.at("size_loss"), 1e-5);
}

TEST(MultiIO, ADatasetOfInputsThenTargetsTrainsAsTheTensorsDo) {
  const TensorData d = two_headed_data(40);
  auto on_tensors = two_headed(), on_dataset = two_headed();
  compile_two_headed(*on_tensors);
  compile_two_headed(*on_dataset);
  on_tensors->fit(d, quiet(8, 2));
  on_dataset->fit(data::Dataset::from_tensor_slices({d.x[0], d.x[1], d.y[0], d.y[1]}).batch(8), quiet(8, 2));
  EXPECT_EQ(relative_difference(*on_dataset, *on_tensors), 0.0);

  // A pair does not fit a model of two inputs and two outputs: the message says what does.
  try {
    on_dataset->fit(data::Dataset::from_tensor_slices({d.x[0], d.y[0]}).batch(8), quiet(8));
    FAIL() << "a pair was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must hold 4 components"), std::string::npos) << e.what();
  }
}

TEST(MultiIO, PredictGivesEachOutputAndTheModelCallsAgree) {
  const TensorData d = two_headed_data(10);
  auto m = two_headed();
  const std::vector<Tensor> p = m->predict(d.x, 3);
  ASSERT_EQ(p.size(), 2u);
  const std::vector<Tensor> direct = (*m)(d.x);
  // Batches of 3 against all 10 rows at once: the matmul may block the rows otherwise and
  // round a sum differently (a few ulps on some processors).
  const std::vector<float> batched = p[0].to_vector(), whole = direct[0].to_vector();
  ASSERT_EQ(batched.size(), whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(batched[i], whole[i], 1e-6f * (1.0f + std::fabs(whole[i]))) << i;
  EXPECT_EQ(p[1].shape(), (Shape{10, 1}));
  EXPECT_EQ(m->output_names(), (std::vector<std::string>{"kind", "size"}));
  EXPECT_THROW(m->predict(d.x[0]), InvalidArgument);
}

TEST(MultiIO, MistakesNameTheOutputOrTheInput) {
  auto m = two_headed();
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  // Three losses for two outputs.
  std::string e = message([&] {
    m->compile(std::make_shared<optim::SGD>(), {std::make_shared<losses::MeanSquaredError>(),
                                                std::make_shared<losses::MeanSquaredError>(),
                                                std::make_shared<losses::MeanSquaredError>()}, {});
  });
  EXPECT_NE(e.find("3 losses for the model's 2 output(s) (kind, size)"), std::string::npos) << e;
  // A sum and a mean cannot share one scaling over replicas.
  e = message([&] {
    m->compile(std::make_shared<optim::SGD>(),
               {std::make_shared<losses::MeanSquaredError>(),
                std::make_shared<losses::MeanSquaredError>(losses::Reduction::sum)}, {});
  });
  EXPECT_NE(e.find("output 'size'"), std::string::npos) << e;
  compile_two_headed(*m);
  TensorData d = two_headed_data(12);
  d.y[1] = d.y[1].slice(0, 11);
  e = message([&] { m->fit(d, quiet(4)); });
  EXPECT_NE(e.find("the target of output 'size' [11, 1]"), std::string::npos) << e;
  d.y.pop_back();
  e = message([&] { m->fit(d, quiet(4)); });
  EXPECT_NE(e.find("got 2 input(s) and 1 target(s)"), std::string::npos) << e;
}

TEST(MultiIO, OneLossForSeveralOutputsIsEachOnesAndSavedSettingsComeBack) {
  const TensorData d = two_headed_data(16);
  auto m = two_headed();
  compile_two_headed(*m);
  m->fit(d, quiet(8));
  const auto path = dtrain::testing::temp_path("multi_io.safetensors").string();
  m->save(path);
  auto loaded = models::load_model(path);
  std::filesystem::remove(path);
  EXPECT_EQ(loaded->loss_weights(), (std::vector<double>{1.0, 0.5}));
  const Logs a = m->evaluate(d), b = loaded->evaluate(d);
  EXPECT_EQ(a.items(), b.items());

  // Keras's rule: one loss and one metric list given for several outputs are every output's.
  auto same = two_headed();
  same->compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::MeanSquaredError>(), {"mean"});
  EXPECT_EQ(same->output_losses().size(), 2u);
  std::vector<std::string> names;
  for (const metrics::Metric* metric : same->metrics()) names.push_back(metric->name());
  EXPECT_EQ(names, (std::vector<std::string>{"kind_loss", "size_loss", "kind_mean", "size_mean"}));
}

}  // namespace
}  // namespace dtrain
