#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <sstream>

#include "dtrain/data/datasets.h"
#include "dtrain/model/sequential.h"
#include "dtrain/optim/schedules.h"

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

// No epoch after the first improves by min_delta = 1e9: the rate is cut every `patience`
// epochs, each cut followed by a cooldown epoch that resets the wait (Keras's rule), and
// never below min_lr.
TEST_F(Fixture, ReduceLROnPlateauCutsTheRateAfterPatienceThenCoolsDown) {
  m.compile("sgd", "sparse_categorical_crossentropy", {}, true);
  const auto run = [&](double min_lr) {
    m.optimizer().set_learning_rate(std::make_shared<optim::Constant>(0.1f));
    std::vector<float> seen;
    std::ostringstream said;
    auto plateau = std::make_shared<ReduceLROnPlateau>(
        ReduceLROnPlateauOptions{.monitor = "loss", .factor = 0.5, .patience = 2, .verbose = 1, .min_delta = 1e9,
                                 .cooldown = 1, .min_lr = min_lr},
        &said);
    auto probe = std::make_shared<LambdaCallback>();
    probe->epoch_end = [&](int, const Logs&) { seen.push_back(m.optimizer().learning_rate()); };
    m.fit(d.x, d.y, {.epochs = 8, .callbacks = {plateau, probe}, .verbose = 0});
    return std::pair{seen, said.str()};
  };
  const auto [rates, said] = run(0.0);
  EXPECT_EQ(rates, (std::vector<float>{0.1f, 0.1f, 0.05f, 0.05f, 0.025f, 0.025f, 0.0125f, 0.0125f}));
  EXPECT_NE(said.find("Epoch 3: ReduceLROnPlateau reducing learning rate to 0.05."), std::string::npos) << said;
  EXPECT_EQ(run(0.03).first, (std::vector<float>{0.1f, 0.1f, 0.05f, 0.05f, 0.03f, 0.03f, 0.03f, 0.03f}));
  EXPECT_THROW(ReduceLROnPlateau({.factor = 1.0}), InvalidArgument);
  auto unknown = std::make_shared<ReduceLROnPlateau>(ReduceLROnPlateauOptions{.monitor = "val_auc"});
  EXPECT_THROW(m.fit(d.x, d.y, {.epochs = 1, .callbacks = {unknown}, .verbose = 0}), InvalidArgument);
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

// Whether every weight of the model is finite.
bool weights_finite(const Sequential& model) {
  for (Variable* v : model.variables())
    for (float f : v->value().to_vector())
      if (!std::isfinite(f)) return false;
  return true;
}

TEST_F(Fixture, TerminateOnNaNStopsAtTheBatchWithANaNInput) {
  // Row 70 is in batch 2 (0-based) of the unshuffled first epoch; tanh passes the NaN on
  // to the loss.
  d.x.data<float>()[70 * 6 + 3] = std::numeric_limits<float>::quiet_NaN();
  m.compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  std::ostringstream said, progress;
  auto stop = std::make_shared<TerminateOnNaN>(&said);
  std::int64_t batches = 0;
  auto count = std::make_shared<LambdaCallback>();
  count->batch_end = [&](std::int64_t, const Logs&) { ++batches; };
  History h = m.fit(d.x, d.y, {.epochs = 3, .batch_size = 32, .shuffle = false, .callbacks = {count, stop},
                               .verbose = 2, .out = &progress});
  ASSERT_TRUE(stop->stopped_at().has_value());
  EXPECT_EQ(stop->stopped_at()->epoch, 0);
  EXPECT_EQ(stop->stopped_at()->batch, 2);
  EXPECT_EQ(stop->stopped_at()->what, "loss");
  EXPECT_EQ(batches, 3);  // no batch after it
  ASSERT_EQ(h.epoch.size(), 1u);
  EXPECT_TRUE(std::isnan(h.history["loss"][0]));
  ASSERT_TRUE(h.non_finite.has_value());
  EXPECT_EQ(h.non_finite->batch, 2);
  EXPECT_NE(said.str().find("TerminateOnNaN: the loss was nan at epoch 1, batch 3; terminating training"),
            std::string::npos) << said.str();
  // The epoch's line shows the NaN rather than hiding it.
  EXPECT_NE(progress.str().find("3/4 - "), std::string::npos) << progress.str();
  EXPECT_NE(progress.str().find("loss: nan"), std::string::npos) << progress.str();
}

TEST_F(Fixture, TerminateOnNaNStopsAtTheFirstNonFiniteStepOfADivergingRun) {
  // A linear regression whose learning rate is far too large: each step multiplies the
  // error, until it overflows. The batch it stops at is the first whose loss or updated
  // weights a callback before it saw as non-finite.
  Sequential r;
  r.add<nn::Dense>(1, "", nn::DenseOptions{.seed = 3});
  r.compile(std::make_shared<optim::SGD>(20.0f), std::make_shared<losses::MeanSquaredError>());
  const Tensor y = Tensor::from_vector(Shape{128, 1}, std::vector<float>(128, 1.0f));
  std::optional<std::pair<int, std::int64_t>> first;
  int epoch_now = 0;
  std::int64_t after = 0;
  auto watch = std::make_shared<LambdaCallback>();
  watch->epoch_begin = [&](int e, const Logs&) { epoch_now = e; };
  watch->batch_end = [&](std::int64_t b, const Logs& logs) {
    if (first) ++after;
    else if (!std::isfinite(logs.at("loss")) || !weights_finite(r)) first = std::make_pair(epoch_now, b);
  };
  auto stop = std::make_shared<TerminateOnNaN>(nullptr);
  History h = r.fit(d.x, y, {.epochs = 20, .batch_size = 16, .callbacks = {watch, stop}, .verbose = 0});
  ASSERT_TRUE(first.has_value()) << "the run did not diverge";
  ASSERT_TRUE(stop->stopped_at().has_value());
  EXPECT_EQ(stop->stopped_at()->epoch, first->first);
  EXPECT_EQ(stop->stopped_at()->batch, first->second);
  EXPECT_EQ(after, 0);
  EXPECT_EQ(h.epoch.size(), static_cast<std::size_t>(first->first + 1));
  ASSERT_TRUE(r.non_finite().has_value());
  EXPECT_EQ(r.non_finite()->batch, first->second);
}

TEST_F(Fixture, ANonFiniteStepIsRecordedEvenWithoutTerminateOnNaN) {
  // As in Keras, training goes on without the callback; the history says where it went
  // wrong and every later line shows it.
  d.x.data<float>()[5] = std::numeric_limits<float>::infinity();
  m.compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  std::ostringstream progress;
  History h = m.fit(d.x, d.y, {.epochs = 2, .batch_size = 32, .shuffle = false, .verbose = 2, .out = &progress});
  EXPECT_EQ(h.epoch.size(), 2u);
  ASSERT_TRUE(h.non_finite.has_value());
  EXPECT_EQ(h.non_finite->epoch, 0);
  EXPECT_EQ(h.non_finite->batch, 0);
  EXPECT_FALSE(std::isfinite(h.history["loss"][1])) << progress.str();
  EXPECT_EQ(progress.str().find("loss: 0."), std::string::npos) << progress.str();
}

TEST(NonFinite, AReluThatHidesANaNFromTheLossLeavesItInTheWeights) {
  // relu(NaN) is 0 in the forward pass, so the loss stays finite, but the kernel's
  // gradient x^T dy carries the NaN into the weights: the check after the update sees it.
  data::Split d = data::make_synthetic(64, 4, 2, 1, data::SyntheticLabels::teacher);
  d.x.data<float>()[9] = std::numeric_limits<float>::quiet_NaN();  // row 2, batch 0
  Sequential m;
  m.add<nn::Dense>(8, "relu", nn::DenseOptions{.seed = 1});
  m.add<nn::Dense>(2, "", nn::DenseOptions{.seed = 2});
  m.compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  std::ostringstream progress;
  History h = m.fit(d.x, d.y, {.epochs = 1, .batch_size = 32, .shuffle = false, .verbose = 2, .out = &progress});
  ASSERT_TRUE(h.non_finite.has_value());
  EXPECT_EQ(h.non_finite->what, "weights");
  EXPECT_EQ(h.non_finite->batch, 0);
  EXPECT_TRUE(std::isfinite(h.history["loss"][0]));
  // The epoch's line says so beside the loss.
  EXPECT_NE(progress.str().find("weights: not finite since epoch 1, batch 1"), std::string::npos) << progress.str();
  EXPECT_NE(h.non_finite->to_string().find("the weights became non-finite at epoch 1, batch 1"), std::string::npos)
      << h.non_finite->to_string();
}

TEST(NonFinite, AFitAfterRestoringGoodWeightsTrainsOn) {
  // A fit whose weights went NaN, then good weights restored: the next fit with the same
  // optimizer reports nothing; what the first one wrote is not the second's.
  data::Split d = data::make_synthetic(64, 4, 2, 1, data::SyntheticLabels::teacher);
  Sequential m;
  m.add<nn::Dense>(8, "relu", nn::DenseOptions{.seed = 1});
  m.add<nn::Dense>(2, "", nn::DenseOptions{.seed = 2});
  m.compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  m.build(Shape{4});
  std::vector<Tensor> good;
  for (Variable* v : m.variables()) good.push_back(v->value().clone());
  Tensor bad_x = d.x.clone();
  bad_x.data<float>()[9] = std::numeric_limits<float>::quiet_NaN();
  auto stop = std::make_shared<TerminateOnNaN>(nullptr);
  History first = m.fit(bad_x, d.y, {.epochs = 1, .batch_size = 32, .shuffle = false, .callbacks = {stop}, .verbose = 0});
  ASSERT_TRUE(first.non_finite.has_value());
  for (std::size_t i = 0; i < good.size(); ++i) m.variables()[i]->mutable_value().copy_from(good[i]);
  History second = m.fit(d.x, d.y, {.epochs = 2, .batch_size = 32, .callbacks = {stop}, .verbose = 0});
  EXPECT_FALSE(second.non_finite.has_value()) << second.non_finite->to_string();
  EXPECT_EQ(second.epoch.size(), 2u);
}

TEST_F(Fixture, FiniteTrainingRecordsNothing) {
  m.compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  auto stop = std::make_shared<TerminateOnNaN>(nullptr);
  History h = m.fit(d.x, d.y, {.epochs = 2, .batch_size = 32, .callbacks = {stop}, .verbose = 0});
  EXPECT_EQ(h.epoch.size(), 2u);
  EXPECT_FALSE(h.non_finite.has_value());
  EXPECT_FALSE(stop->stopped_at().has_value());
}

// A batch callback's calls under ParameterServerStrategy's closures end several batches
// each; counted as Keras counts them, across epochs and a mid-epoch resume.
TEST(BatchesSeen, CountsTheBatchesEachCallEnds) {
  BatchesSeen seen;
  // An epoch of 10 batches in closures of 3: calls end batches 2, 5, 8 and 9.
  EXPECT_EQ(seen.after(2), 3);
  EXPECT_EQ(seen.after(5), 3);
  EXPECT_EQ(seen.after(8), 3);
  EXPECT_EQ(seen.after(9), 1);
  EXPECT_EQ(seen.after(2), 3);  // the next epoch starts again at 0
  EXPECT_EQ(seen.after(3), 1);  // one batch a call, as a local fit calls
  seen.restart(6);              // resumed after batch 6 of an epoch
  EXPECT_EQ(seen.after(9), 3);
}

}  // namespace
}  // namespace dtrain

namespace dtrain {
namespace {

// An elastic job that goes back to a commit before an epoch's end keeps only the epochs
// whose ends it will not run again.
TEST(HistoryKeepEpochs, DropsTheEntriesOfEpochsAfterTheFirstOnesKept) {
  History h;
  Logs logs;
  for (int e = 0; e < 3; ++e) {
    logs.set("loss", 1.0 / (e + 1));
    h.on_epoch_end(e, logs);
    h.epoch_seconds.push_back(e);
    h.samples_per_second.push_back(10.0 * e);
  }
  h.keep_epochs(2);
  EXPECT_EQ(h.epoch, (std::vector<int>{0, 1}));
  EXPECT_EQ(h.history["loss"], (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(h.epoch_seconds, (std::vector<double>{0, 1}));
  EXPECT_EQ(h.samples_per_second.size(), 2u);
  h.keep_epochs(5);  // more than there are: nothing changes
  EXPECT_EQ(h.epoch.size(), 2u);
}

}  // namespace
}  // namespace dtrain
