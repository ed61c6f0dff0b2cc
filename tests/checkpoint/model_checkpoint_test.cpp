// ModelCheckpoint: the filepath's placeholders as Python formats them, which epochs and
// batches save, save_best_only against a monitor that improves and regresses, weights
// only versus the whole model, and only worker 0 writing. Logs are fixed where the
// callback's decision is the point, and come from a small real fit where fit's calls are.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/model_checkpoint.h"
#include "dtrain/data/datasets.h"
#include "dtrain/model/saving.h"

namespace dtrain::train {
namespace {

using dtrain::testing::message_of;
namespace fs = std::filesystem;

class ModelCheckpointTest : public dtrain::testing::TempDirTest {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  bool exists(const std::string& name) const { return fs::exists(dir_ / name); }
  // The files in the folder, sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_))
      if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir_).string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::unique_ptr<Sequential> small_model() {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(8, "relu", nn::DenseOptions{.seed = 1});
  m->add<nn::Dense>(3, "", nn::DenseOptions{.seed = 2});
  m->build(Shape{4});
  m->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true),
             {"accuracy"});
  return m;
}

Logs logs_of(std::initializer_list<std::pair<const char*, double>> items) {
  Logs l;
  for (const auto& [k, v] : items) l.set(k, v);
  return l;
}

std::vector<float> first_kernel(const Model& m) { return m.variables()[0]->value().to_vector(); }

// Sets every weight of `m` to `value`, so that a file shows which epoch it was saved at.
void fill(Sequential& m, float value) {
  for (Variable* v : m.variables()) v->assign(Tensor::full(v->shape(), value));
}

TEST(ModelCheckpointPath, PlaceholdersFormatAsPythonDoes) {
  const Logs logs = logs_of({{"loss", 0.25}, {"val_loss", 0.123456}, {"acc", 1.0}, {"tiny", 1e-5},
                             {"small", 0.0001}, {"big", 1e16}, {"round", 1234567.0}, {"neg", -0.5}});
  const auto at = [&](const std::string& pattern, std::optional<std::int64_t> batch = std::nullopt) {
    ModelCheckpointOptions o;
    if (batch) o.save_freq = 10;
    return ModelCheckpoint(pattern, o).path_for(3, batch, logs);
  };
  EXPECT_EQ(at("m-{epoch:02d}-{val_loss:.4f}.safetensors"), "m-03-0.1235.safetensors");
  EXPECT_EQ(at("{epoch}"), "3");
  EXPECT_EQ(at("{epoch:4d}|{epoch:04d}|{epoch:.2f}"), "   3|0003|3.00");
  EXPECT_EQ(at("{loss}|{acc}|{tiny}|{small}|{big}|{round}|{neg}"), "0.25|1.0|1e-05|0.0001|1e+16|1234567.0|-0.5");
  EXPECT_EQ(at("{val_loss:8.3f}|{val_loss:08.3f}|{neg:06.2f}|{val_loss:f}"), "   0.123|0000.123|-00.50|0.123456");
  EXPECT_EQ(at("{{literal}}-{epoch}}}"), "{literal}-3}");
  EXPECT_EQ(at("b{batch:04d}-{loss:.1f}", 12), "b0012-0.2");
  EXPECT_EQ(at("plain.safetensors"), "plain.safetensors");
}

TEST(ModelCheckpointPath, BadPlaceholdersNameTheFilepathAndTheKey) {
  const auto made = [](const std::string& pattern) {
    return message_of<InvalidArgument>([&] { ModelCheckpoint c(pattern); });
  };
  EXPECT_NE(made("m-{epoch.safetensors").find("'m-{epoch.safetensors': the '{' at character 2 is not closed"),
            std::string::npos);
  EXPECT_NE(made("m-}").find("'m-}': a single '}'"), std::string::npos);
  EXPECT_NE(made("m-{}").find("'m-{}': the placeholder {} names no key"), std::string::npos);
  EXPECT_NE(made("m-{loss:x}").find("the format in {loss:x} is not supported"), std::string::npos);
  EXPECT_NE(made("m-{loss:.2}").find("the format in {loss:.2} is not supported"), std::string::npos);
  EXPECT_NE(made("m-{epoch:.2d}").find("the format in {epoch:.2d} is not supported"), std::string::npos);
  EXPECT_NE(made("m-{loss!r}").find("{loss!r} is not a plain key"), std::string::npos);
  EXPECT_NE(made("m-{batch}").find("'m-{batch}': {batch} is known only when saving every N batches"), std::string::npos);
  EXPECT_EQ(made("m-{batch}-{anything:.3f}"), "ModelCheckpoint: filepath 'm-{batch}-{anything:.3f}': {batch} is known "
                                              "only when saving every N batches (save_freq), not at the end of each epoch");

  // A key the logs lack, and d on a log value, are found when the path is made.
  const Logs logs = logs_of({{"loss", 0.5}});
  std::string m = message_of<InvalidArgument>([&] { ModelCheckpoint("m-{val_acc:.2f}").path_for(2, std::nullopt, logs); });
  EXPECT_NE(m.find("filepath 'm-{val_acc:.2f}' names {val_acc}"), std::string::npos) << m;
  EXPECT_NE(m.find("at the end of epoch 2 do not have (they have: loss)"), std::string::npos) << m;
  m = message_of<InvalidArgument>([&] { ModelCheckpoint("m-{loss:03d}").path_for(2, std::nullopt, logs); });
  EXPECT_NE(m.find("'m-{loss:03d}' formats {loss}, a log value (a float), with d"), std::string::npos) << m;
}

// In a real fit the missing key stops training with the error.
TEST_F(ModelCheckpointTest, AKeyTheLogsLackStopsFitWithTheError) {
  auto model = small_model();
  const data::Split d = data::make_synthetic(16, 4, 3, 1);
  auto cb = std::make_shared<ModelCheckpoint>(path("m-{val_loss:.3f}.safetensors"));
  const std::string m = message_of<InvalidArgument>(
      [&] { model->fit(d.x, d.y, {.epochs = 1, .batch_size = 8, .callbacks = {cb}, .verbose = 0}); });
  EXPECT_NE(m.find("names {val_loss}"), std::string::npos) << m;
  EXPECT_NE(m.find(path("m-{val_loss:.3f}.safetensors")), std::string::npos) << m;
  EXPECT_TRUE(files().empty());
}

TEST_F(ModelCheckpointTest, EveryEpochSavesTheWholeModelUnderItsEpochsName) {
  auto model = small_model();
  const data::Split d = data::make_synthetic(32, 4, 3, 1);
  std::vector<std::vector<float>> at_epoch_end;
  auto record = std::make_shared<LambdaCallback>();
  record->epoch_end = [&](int, const Logs&) { at_epoch_end.push_back(first_kernel(*model)); };
  auto cb = std::make_shared<ModelCheckpoint>(path("run/model-{epoch:02d}-{loss:.2f}.safetensors"));
  const History h = model->fit(d.x, d.y, {.epochs = 3, .batch_size = 8, .callbacks = {record, cb}, .verbose = 0});

  std::vector<std::string> expected;
  char name[64];
  for (int e = 0; e < 3; ++e) {
    std::snprintf(name, sizeof name, "run/model-%02d-%.2f.safetensors", e + 1, h.history.at("loss")[e]);
    expected.push_back(name);
  }
  ASSERT_EQ(files(), expected);  // the folder is made; one file per epoch
  EXPECT_EQ(cb->last_saved(), path(expected.back()));
  for (int e = 0; e < 3; ++e) {
    auto loaded = models::load_model(path(expected[e]));
    EXPECT_EQ(first_kernel(*loaded), at_epoch_end[e]) << "epoch " << e + 1;
    EXPECT_EQ(loaded->optimizer().iterations(), 4 * (e + 1));
  }
}

TEST_F(ModelCheckpointTest, WeightsOnlyWritesWhatLoadWeightsReads) {
  auto model = small_model();
  const data::Split d = data::make_synthetic(16, 4, 3, 1);
  auto cb = std::make_shared<ModelCheckpoint>(path("w.safetensors"), ModelCheckpointOptions{.save_weights_only = true});
  model->fit(d.x, d.y, {.epochs = 1, .batch_size = 8, .callbacks = {cb}, .verbose = 0});
  auto other = small_model();
  fill(*other, 0.0f);
  other->load_weights(path("w.safetensors"));
  EXPECT_EQ(first_kernel(*other), first_kernel(*model));
  const std::string m = message_of<IoError>([&] { models::load_model(path("w.safetensors")); });
  EXPECT_NE(m.find("holds weights only"), std::string::npos) << m;
}

// Every 3rd training batch of the fit, counted across epochs (5 batches an epoch), with
// that batch's logs; {batch} is 1-based within its epoch.
TEST_F(ModelCheckpointTest, SaveFreqInBatchesCountsAcrossEpochs) {
  auto model = small_model();
  const data::Split d = data::make_synthetic(40, 4, 3, 1);
  std::vector<double> batch_loss;
  auto record = std::make_shared<LambdaCallback>();
  record->batch_end = [&](std::int64_t, const Logs& l) { batch_loss.push_back(l.at("loss")); };
  auto cb = std::make_shared<ModelCheckpoint>(path("e{epoch}-b{batch}-{loss:.6f}"), ModelCheckpointOptions{.save_freq = 3});
  model->fit(d.x, d.y, {.epochs = 2, .batch_size = 8, .callbacks = {record, cb}, .verbose = 0});
  ASSERT_EQ(batch_loss.size(), 10u);
  char a[64], b[64], c[64];
  std::snprintf(a, sizeof a, "e1-b3-%.6f", batch_loss[2]);
  std::snprintf(b, sizeof b, "e2-b1-%.6f", batch_loss[5]);
  std::snprintf(c, sizeof c, "e2-b4-%.6f", batch_loss[8]);
  std::vector<std::string> expected{a, b, c};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files(), expected);
  EXPECT_EQ(models::load_model(path(c))->optimizer().iterations(), 9);
}

// The monitor improves, regresses and improves again: the file at a fixed path holds the
// model of the best epoch, and verbose says what happened each time.
TEST_F(ModelCheckpointTest, SaveBestOnlyKeepsTheBestEpochsModel) {
  auto model = small_model();
  std::ostringstream out;
  ModelCheckpoint cb(path("best.safetensors"), {.verbose = 1, .save_best_only = true, .out = &out});
  cb.set_model(model.get());
  cb.on_train_begin({});
  const std::vector<double> val_loss = {0.5, 0.4, 0.45, 0.4, 0.3, 0.35};
  std::vector<std::string> saved;
  for (int e = 0; e < static_cast<int>(val_loss.size()); ++e) {
    fill(*model, static_cast<float>(e + 1));
    cb.on_epoch_begin(e, {});
    cb.on_epoch_end(e, logs_of({{"loss", 1.0}, {"val_loss", val_loss[e]}}));
    saved.push_back(std::to_string(static_cast<int>(models::load_model(path("best.safetensors"))->variables()[0]->value().to_vector()[0])));
  }
  // Epochs 1, 2 and 5 improve; a tie (epoch 4) is no improvement.
  EXPECT_EQ(saved, (std::vector<std::string>{"1", "2", "2", "2", "5", "5"}));
  EXPECT_EQ(cb.best(), 0.3);
  EXPECT_EQ(out.str(),
            "Epoch 1: val_loss improved from inf to 0.50000, saving model to " + path("best.safetensors") + "\n" +
                "Epoch 2: val_loss improved from 0.50000 to 0.40000, saving model to " + path("best.safetensors") + "\n" +
                "Epoch 3: val_loss did not improve from 0.40000\n" + "Epoch 4: val_loss did not improve from 0.40000\n" +
                "Epoch 5: val_loss improved from 0.40000 to 0.30000, saving model to " + path("best.safetensors") + "\n" +
                "Epoch 6: val_loss did not improve from 0.30000\n");
}

// mode "auto" maximizes an accuracy; initial_value_threshold must be beaten first.
TEST_F(ModelCheckpointTest, SaveBestOnlyMaximizesAccuracyAndStartsFromTheThreshold) {
  auto model = small_model();
  ModelCheckpoint cb(path("acc-{epoch}"), {.monitor = "val_accuracy", .save_best_only = true,
                                           .initial_value_threshold = 0.6, .out = nullptr});
  cb.set_model(model.get());
  cb.on_train_begin({});
  const std::vector<double> acc = {0.5, 0.6, 0.7, 0.65, 0.9};
  for (int e = 0; e < 5; ++e) cb.on_epoch_end(e, logs_of({{"val_accuracy", acc[e]}}));
  EXPECT_EQ(files(), (std::vector<std::string>{"acc-3", "acc-5"}));
  EXPECT_EQ(cb.best(), 0.9);

  // An explicit "min" turns it around; a name neither way is an error under "auto".
  ModelCheckpoint low(path("low-{epoch}"), {.monitor = "val_accuracy", .save_best_only = true, .mode = "min"});
  low.set_model(model.get());
  for (int e = 0; e < 5; ++e) low.on_epoch_end(e, logs_of({{"val_accuracy", acc[e]}}));
  EXPECT_EQ(files(), (std::vector<std::string>{"acc-3", "acc-5", "low-1"}));
  EXPECT_NE(message_of<InvalidArgument>([&] { ModelCheckpoint("x", {.monitor = "f1", .save_best_only = true}); })
                .find("ModelCheckpoint: cannot tell whether 'f1' should go up or down"),
            std::string::npos);
}

TEST_F(ModelCheckpointTest, AMissingMonitorWarnsOnceAndSavesNothing) {
  auto model = small_model();
  const data::Split d = data::make_synthetic(16, 4, 3, 1);
  std::ostringstream out;
  auto cb = std::make_shared<ModelCheckpoint>(path("best.safetensors"),
                                              ModelCheckpointOptions{.save_best_only = true, .out = &out});
  model->fit(d.x, d.y, {.epochs = 3, .batch_size = 8, .callbacks = {cb}, .verbose = 0});
  EXPECT_EQ(out.str(),
            "ModelCheckpoint: can save the best model only with 'val_loss' in the logs, which have: loss, accuracy; "
            "skipping\n");
  EXPECT_TRUE(files().empty());
  EXPECT_FALSE(cb->last_saved());
}

// A strategy that says this process is worker 1 of 2; nothing here trains under it.
class SecondWorker final : public StrategyBackend {
 public:
  std::string name() const override { return "SecondWorker"; }
  int num_replicas() const override { return 1; }
  int num_workers() const override { return 2; }
  int worker_index() const override { return 1; }
  void run(const std::function<void(int)>& fn) override { fn(0); }
  std::unique_ptr<GradientReducer> gradient_reducer(std::span<Variable* const>, std::span<const DenseVariables>,
                                                    bool) override {
    DTRAIN_THROW(Unsupported, "not for training");
  }
};

TEST_F(ModelCheckpointTest, OnlyWorkerZeroWrites) {
  std::unique_ptr<Sequential> on_second;
  {
    detail::ScopedStrategy scope(std::make_shared<SecondWorker>());
    on_second = small_model();
  }
  std::ostringstream out;
  ModelCheckpoint second(path("second-{epoch}"), {.verbose = 1, .save_best_only = true, .out = &out});
  second.set_model(on_second.get());
  second.on_epoch_end(0, logs_of({{"val_loss", 0.5}}));
  EXPECT_TRUE(files().empty());
  EXPECT_EQ(out.str(), "");           // the chief says it
  EXPECT_EQ(second.best(), 0.5);      // but every worker keeps the same best

  auto on_first = small_model();
  ModelCheckpoint first(path("first-{epoch}"));
  first.set_model(on_first.get());
  first.on_epoch_end(0, logs_of({{"val_loss", 0.5}}));
  EXPECT_EQ(files(), std::vector<std::string>{"first-1"});
}

// load_model tells a training checkpoint from a saved model.
TEST_F(ModelCheckpointTest, LoadModelOnATrainingCheckpointSaysWhatItIs) {
  auto model = small_model();
  Checkpoint ckpt{{"model", *model}, {"optimizer", model->optimizer()}};
  const std::string file = ckpt.write(path("ckpt.safetensors"));
  const std::string m = message_of<IoError>([&] { models::load_model(file); });
  EXPECT_NE(m.find(file + ": not a saved model"), std::string::npos) << m;
  EXPECT_NE(m.find("training checkpoint"), std::string::npos) << m;
}

}  // namespace
}  // namespace dtrain::train
