#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/data/datasets.h"
#include "dtrain/model/sequential.h"

namespace dtrain {
namespace {

struct Fixture : ::testing::Test {
  void SetUp() override {
    d = data::make_synthetic(128, 6, 2, 1, data::SyntheticLabels::teacher);
    m.add<nn::Dense>(8, "tanh", nn::DenseOptions{.seed = 1});
    m.add<nn::Dense>(2, "", nn::DenseOptions{.seed = 2});
  }
  data::Split d;
  Sequential m;
};

TEST_F(Fixture, EarlyStoppingStopsWhenNothingImproves) {
  m.compile(std::make_shared<optim::SGD>(0.0f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  auto stop = std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "loss", .min_delta = 1e-3, .patience = 2});
  History h = m.fit(d.x, d.y, {.epochs = 10, .batch_size = 32, .callbacks = {stop}, .verbose = 0});
  EXPECT_EQ(h.epoch.size(), 3u);  // best at epoch 0, two epochs of patience
  EXPECT_EQ(stop->stopped_epoch(), 2);
  EXPECT_EQ(stop->best_epoch(), 0);
}

TEST_F(Fixture, EarlyStoppingRestoresBestWeights) {
  // A learning rate this large makes the loss blow up after the first epoch.
  m.compile(std::make_shared<optim::SGD>(50.0f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  std::vector<std::vector<float>> after_epoch;
  auto record = std::make_shared<LambdaCallback>();
  record->epoch_end = [&](int, const Logs&) {
    std::vector<float> all;
    for (Variable* v : m.variables())
      for (float f : v->value().to_vector()) all.push_back(f);
    after_epoch.push_back(all);
  };
  auto stop = std::make_shared<EarlyStopping>(
      EarlyStoppingOptions{.monitor = "loss", .patience = 1, .restore_best_weights = true});
  History h = m.fit(d.x, d.y, {.epochs = 20, .batch_size = 32, .shuffle = false, .callbacks = {record, stop}, .verbose = 0});
  ASSERT_GE(stop->stopped_epoch(), 1);
  std::vector<float> now;
  for (Variable* v : m.variables())
    for (float f : v->value().to_vector()) now.push_back(f);
  EXPECT_EQ(now, after_epoch[static_cast<size_t>(stop->best_epoch())]);
}

TEST_F(Fixture, RestoreBestWeightsAlsoWithoutAnEarlyStop) {
  // As Keras 3: the best epoch's weights come back even when every epoch ran.
  m.compile(std::make_shared<optim::SGD>(50.0f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  std::vector<std::vector<float>> after_epoch;
  std::vector<double> losses;
  auto record = std::make_shared<LambdaCallback>();
  record->epoch_end = [&](int, const Logs& l) {
    std::vector<float> all;
    for (Variable* v : m.variables())
      for (float f : v->value().to_vector()) all.push_back(f);
    after_epoch.push_back(all);
    losses.push_back(l.at("loss"));
  };
  auto stop = std::make_shared<EarlyStopping>(
      EarlyStoppingOptions{.monitor = "loss", .min_delta = -0.0, .patience = 100, .restore_best_weights = true});
  m.fit(d.x, d.y, {.epochs = 4, .batch_size = 32, .shuffle = false, .callbacks = {record, stop}, .verbose = 0});
  EXPECT_EQ(stop->stopped_epoch(), -1);
  const auto best = static_cast<size_t>(std::min_element(losses.begin(), losses.end()) - losses.begin());
  EXPECT_EQ(stop->best_epoch(), static_cast<int>(best));
  std::vector<float> now;
  for (Variable* v : m.variables())
    for (float f : v->value().to_vector()) now.push_back(f);
  EXPECT_EQ(now, after_epoch[best]);
}

TEST_F(Fixture, EarlyStoppingModeMustBeKnowable) {
  EXPECT_THROW(EarlyStopping({.monitor = "val_f1_of_doom"}), InvalidArgument);
  EarlyStopping ok({.monitor = "val_f1_of_doom", .mode = "max"});
  (void)ok;
}

TEST_F(Fixture, EarlyStoppingNeedsTheMonitoredLog) {
  m.compile("sgd", "sparse_categorical_crossentropy", {}, true);
  auto stop = std::make_shared<EarlyStopping>();  // val_loss, but no validation data
  EXPECT_THROW(m.fit(d.x, d.y, {.epochs = 2, .callbacks = {stop}, .verbose = 0}), InvalidArgument);
}

TEST_F(Fixture, LearningRateSchedulerSetsEachEpoch) {
  m.compile("sgd", "sparse_categorical_crossentropy", {}, true);
  std::vector<float> seen;
  auto sched = std::make_shared<LearningRateScheduler>([](int epoch, double) { return 0.1 / (epoch + 1); });
  auto probe = std::make_shared<LambdaCallback>();
  probe->epoch_end = [&](int, const Logs&) { seen.push_back(m.optimizer().learning_rate()); };
  m.fit(d.x, d.y, {.epochs = 3, .callbacks = {sched, probe}, .verbose = 0});
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_FLOAT_EQ(seen[0], 0.1f);
  EXPECT_FLOAT_EQ(seen[2], 0.1f / 3);
}

TEST_F(Fixture, CsvLoggerWritesARowPerEpoch) {
  const auto path = std::filesystem::temp_directory_path() / ("dtrain_csv_" + std::to_string(::getpid()) + ".csv");
  m.compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, true);
  m.fit(d.x, d.y,
        {.epochs = 3, .validation_split = 0.25, .callbacks = {std::make_shared<CSVLogger>(path.string())}, .verbose = 0});
  std::ifstream in(path);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header, "epoch,loss,accuracy,val_loss,val_accuracy");
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, 3);
  std::filesystem::remove(path);
}

TEST_F(Fixture, CsvLoggerAppendsWithoutASecondHeader) {
  const auto path = std::filesystem::temp_directory_path() / ("dtrain_csv_append_" + std::to_string(::getpid()) + ".csv");
  m.compile("sgd", "sparse_categorical_crossentropy", {}, true);
  for (int run = 0; run < 2; ++run)
    m.fit(d.x, d.y, {.epochs = 2, .callbacks = {std::make_shared<CSVLogger>(path.string(), ',', true)}, .verbose = 0});
  std::ifstream in(path);
  std::string line;
  int headers = 0, rows = 0;
  while (std::getline(in, line)) (line.rfind("epoch", 0) == 0 ? headers : rows) += 1;
  EXPECT_EQ(headers, 1);
  EXPECT_EQ(rows, 4);
  std::filesystem::remove(path);
}

TEST_F(Fixture, LambdaHooksSeeEveryBatch) {
  m.compile("sgd", "sparse_categorical_crossentropy", {}, true);
  int batches = 0, epochs = 0;
  double last_loss = -1;
  auto hooks = std::make_shared<LambdaCallback>();
  hooks->batch_end = [&](std::int64_t, const Logs& l) {
    ++batches;
    last_loss = l.at("loss");
  };
  hooks->epoch_end = [&](int, const Logs&) { ++epochs; };
  m.fit(d.x, d.y, {.epochs = 2, .batch_size = 50, .initial_epoch = 0, .callbacks = {hooks}, .verbose = 0});
  EXPECT_EQ(batches, 2 * 3);  // 128 samples in batches of 50: 3 per epoch
  EXPECT_EQ(epochs, 2);
  EXPECT_GT(last_loss, 0);
}

TEST_F(Fixture, InitialEpochResumesNumbering) {
  m.compile("sgd", "sparse_categorical_crossentropy", {}, true);
  History h = m.fit(d.x, d.y, {.epochs = 5, .initial_epoch = 3, .verbose = 0});
  EXPECT_EQ(h.epoch, (std::vector<int>{3, 4}));
}

}  // namespace
}  // namespace dtrain
