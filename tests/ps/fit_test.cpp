// model.fit under ParameterServerStrategy, every task a thread of this process running the
// same program (build, compile, fit) over 127.0.0.1: one worker gives one device's fit,
// two workers count every step once, and what cannot work is refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "common/compare.h"
#include "common/error_message.h"
#include "common/small_models.h"
#include "common/two_headed.h"
#include "dtrain/dtrain.h"
#include "ps/local_cluster.h"

namespace dtrain {
namespace {

using distribute::ClusterCoordinator;
using distribute::ParameterServerOptions;
using distribute::ParameterServerStrategy;
using testing::kUnderTsan;
using testing::LocalCluster;
using testing::Tasks;

constexpr std::int64_t kFeatures = 12, kBatch = 16;
const std::int64_t kSamples = kUnderTsan ? 64 : 160;

struct Data {
  Tensor x, y, x_val, y_val;
};
Data make_data() {
  data::Split train = data::make_synthetic(kSamples, kFeatures, 10, 5, data::SyntheticLabels::teacher);
  data::Split val = data::make_synthetic(64, kFeatures, 10, 6, data::SyntheticLabels::teacher);
  return {train.x, train.y, val.x, val.y};
}

std::unique_ptr<Sequential> compiled_model() {
  auto model = std::make_unique<Sequential>();
  model->add<nn::Dense>(16, "relu", nn::DenseOptions{.seed = 1});
  model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2});
  model->build(Shape{kFeatures});
  model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(),
                 {"accuracy"});
  return model;
}

// The same with a batch norm between the layers: moving statistics that each step's forward
// pass changes on the worker.
std::unique_ptr<Sequential> compiled_model_with_batch_norm() { return testing::mlp_with_batch_norm(kFeatures); }

using ModelMaker = std::function<std::unique_ptr<Model>()>;

ParameterServerOptions options(distribute::Consistency mode = {}) { return testing::ps_options({}, mode); }

struct Fitted {
  std::unique_ptr<Model> model;
  History history;
  ClusterCoordinator::Statistics stats;
};

// The one program every task runs: build and compile under scope(), then fit. `fit` is
// called with the model; on the chief the coordinator's statistics are kept too.
Fitted run_task(const cluster::TfConfig& config, const ParameterServerOptions& o,
                const std::function<History(Model&)>& fit, const ModelMaker& make = compiled_model) {
  ParameterServerStrategy strategy(config, o);
  Fitted out;
  {
    auto scope = strategy.scope();
    out.model = make();
  }
  out.history = fit(*out.model);
  if (strategy.is_chief()) out.stats = ClusterCoordinator(strategy).statistics();
  return out;
}

// Runs the program on a chief, `workers` workers and `num_ps` ps; returns the chief's.
Fitted fit_on_cluster(int workers, int num_ps, const ParameterServerOptions& o,
                      const std::function<History(Model&)>& fit, const ModelMaker& make = compiled_model) {
  LocalCluster cluster(workers, num_ps);
  Tasks tasks;
  for (int p = 0; p < num_ps; ++p) tasks.add([&, p] { run_task(cluster.config("ps", p), o, fit, make); });
  for (int w = 0; w < workers; ++w) tasks.add([&, w] { run_task(cluster.config("worker", w), o, fit, make); });
  Fitted chief = run_task(cluster.config("chief", 0), o, fit, make);
  tasks.join();
  EXPECT_EQ(tasks.errors(), std::vector<std::string>{});
  return chief;
}

// One device's fit of the data, the reference the one-worker jobs below must give.
struct OneDevice {
  FitOptions fit_options;
  std::unique_ptr<Model> model;
  History history;
};
OneDevice one_device_fit(const Data& d, const ModelMaker& make) {
  OneDevice one{.fit_options = {.epochs = kUnderTsan ? 1 : 2, .batch_size = kBatch, .seed = 3, .verbose = 0},
                .model = make()};
  one.fit_options.validation_data = std::make_pair(d.x_val, d.y_val);
  one.history = one.model->fit(d.x, d.y, one.fit_options);
  return one;
}

TEST(ParameterServerFit, OneWorkerGivesOneDevicesFitWithOneAndSeveralStepsToAClosure) {
  const Data d = make_data();
  const OneDevice one = one_device_fit(d, compiled_model);
  const FitOptions& fit_options = one.fit_options;
  const Model* reference = one.model.get();
  const History& expected = one.history;
  const std::int64_t steps_per_epoch = kSamples / kBatch;
  for (int per_closure : {1, 3}) {
    SCOPED_TRACE(std::to_string(per_closure) + " steps to a closure");
    FitOptions o = fit_options;
    o.steps_per_execution = per_closure;
    Fitted chief = fit_on_cluster(1, 1, options(), [&](Model& m) { return m.fit(d.x, d.y, o); });
    EXPECT_LE(testing::relative_difference(*chief.model, *reference), 1e-5);
    for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy"}) {
      ASSERT_EQ(chief.history.history[key].size(), expected.history.at(key).size()) << key;
      for (std::size_t e = 0; e < expected.history.at(key).size(); ++e)
        EXPECT_NEAR(chief.history.history[key][e], expected.history.at(key)[e], 1e-5) << key << " epoch " << e;
    }
    // Every step pushed once, and each push was applied once.
    EXPECT_EQ(chief.stats.pushes_applied, fit_options.epochs * steps_per_epoch);
    EXPECT_EQ(chief.stats.closures_finished,
              fit_options.epochs * ((steps_per_epoch + per_closure - 1) / per_closure));
    EXPECT_EQ(chief.stats.pushes_refused, 0);
    // Where the steps' time went was measured on the worker and at the ps.
    EXPECT_EQ(chief.stats.steps_finished, fit_options.epochs * steps_per_epoch);
    EXPECT_GT(chief.stats.pull_seconds, 0.0);
    EXPECT_GT(chief.stats.push_seconds, 0.0);
    EXPECT_GT(chief.stats.run_seconds, chief.stats.pull_seconds + chief.stats.push_seconds);
    EXPECT_GT(chief.stats.apply_seconds, 0.0);
    // The chief's calls that ran the closures took longer than the workers' runs.
    EXPECT_GT(chief.stats.dispatch_seconds, 0.0);
  }
}

// Batch norm's moving statistics live on the parameter servers like the weights: each step
// pushes what its forward pass changed in them with its gradients, so one worker gives one
// device's weights and moving statistics, in every mode, whether the statistics are whole
// on one ps or split over several.
// A model of two inputs and two outputs: the worker's steps take every input and target,
// and each output's loss and metrics come back to the chief's logs.
TEST(ParameterServerFit, SeveralInputsAndOutputsGiveOneDevicesFit) {
  const TensorData d = testing::two_headed_data(kSamples);
  auto make = [] {
    auto m = testing::two_headed();
    testing::compile_two_headed(*m, 0.05f);
    return m;
  };
  const FitOptions o{.epochs = 2, .batch_size = kBatch, .seed = 3, .verbose = 0};
  auto reference = make();
  const History expected = reference->fit(d, o);
  Fitted chief = fit_on_cluster(1, 1, options(), [&](Model& m) { return m.fit(d, o); }, make);
  EXPECT_LE(testing::relative_difference(*chief.model, *reference), 1e-5);
  for (const char* key : {"loss", "kind_loss", "size_loss", "kind_accuracy"})
    EXPECT_NEAR(chief.history.history.at(key).back(), expected.history.at(key).back(), 1e-4) << key;
}

TEST(ParameterServerFit, BatchNormsMovingStatisticsFollowOneDevice) {
  const Data d = make_data();
  const OneDevice one = one_device_fit(d, compiled_model_with_batch_norm);
  const FitOptions& fit_options = one.fit_options;
  Model* reference = one.model.get();
  const History& expected = one.history;
  auto* norm = dynamic_cast<nn::BatchNormalization*>(reference->layers()[1].get());
  ASSERT_NE(norm, nullptr);
  // The moving statistics left their initial values, so the check below can fail.
  ASSERT_NE(norm->moving_mean().value().to_vector(), std::vector<float>(16, 0.0f));
  struct Case {
    const char* name;
    int num_ps;
    ParameterServerOptions options;
  };
  for (const Case& c : {Case{"async, 1 ps", 1, options()},
                        Case{"sync, 2 ps, 3 shards a variable", 2,
                             testing::ps_options(distribute::FixedShardsPartitioner(3),
                                                 distribute::Consistency::sync())}}) {
    SCOPED_TRACE(c.name);
    Fitted chief = fit_on_cluster(1, c.num_ps, c.options,
                                  [&](Model& m) { return m.fit(d.x, d.y, fit_options); },
                                  compiled_model_with_batch_norm);
    EXPECT_LE(testing::relative_difference(*chief.model, *reference), 1e-5);
    // Validation ran in inference mode on the statistics the parameter servers hold.
    for (std::size_t e = 0; e < expected.history.at("val_loss").size(); ++e)
      EXPECT_NEAR(chief.history.history["val_loss"][e], expected.history.at("val_loss")[e], 1e-5) << "epoch " << e;
  }
}

TEST(ParameterServerFit, TwoWorkersFitADatasetAndEveryStepCountsOnce) {
  const Data d = make_data();
  const int epochs = kUnderTsan ? 1 : 3;
  auto fit = [&](Model& m) {
    FitOptions o{.epochs = epochs, .steps_per_execution = 2, .verbose = 0};
    o.validation_dataset = data::Dataset::from_tensor_slices({d.x_val, d.y_val}).batch(32);
    return m.fit(data::Dataset::from_tensor_slices({d.x, d.y}).shuffle(kSamples, 4).batch(kBatch), o);
  };
  Fitted chief = fit_on_cluster(2, 1, options(), fit);
  const std::int64_t steps = kSamples / kBatch;  // the dataset's length: each epoch's steps
  EXPECT_EQ(chief.stats.pushes_applied, epochs * steps);
  EXPECT_EQ(chief.stats.closures_finished, epochs * ((steps + 1) / 2));
  EXPECT_EQ(chief.stats.pushes_refused, 0);
  ASSERT_EQ(chief.history.history["loss"].size(), static_cast<std::size_t>(epochs));
  ASSERT_EQ(chief.history.history["val_accuracy"].size(), static_cast<std::size_t>(epochs));
  // Validation ran on the chief with the values the parameter servers hold after the
  // last epoch: evaluating the chief's model again gives the same figure.
  const Logs again = chief.model->evaluate(d.x_val, d.y_val, {.batch_size = 32});
  EXPECT_NEAR(again.at("accuracy"), chief.history.history["val_accuracy"].back(), 1e-6);
  // The workers' steps reach the chief's history: each epoch's, summed over the workers,
  // and a row per worker for fit's table (after the first epoch when there were several),
  // with the pull and the push timed and no all-reduce.
  ASSERT_EQ(chief.history.profile.size(), static_cast<std::size_t>(epochs));
  for (const profile::Totals& t : chief.history.profile) {
    EXPECT_EQ(t.steps, steps);
    EXPECT_EQ(t.samples, kSamples);
    EXPECT_GT(t.phases[static_cast<std::size_t>(profile::Phase::pull)], 0.0);
    EXPECT_GT(t.phases[static_cast<std::size_t>(profile::Phase::push)], 0.0);
    EXPECT_EQ(t.bytes, 0u);
  }
  ASSERT_EQ(chief.history.profile_summary.size(), 2u);
  std::int64_t summed = 0;
  for (const profile::WorkerSummary& w : chief.history.profile_summary) {
    summed += w.totals.steps;
    if (w.totals.steps > 0) {
      EXPECT_GT(w.step_p90, 0.0);
    }
  }
  EXPECT_EQ(summed, epochs > 1 ? (epochs - 1) * steps : steps);
  if (kUnderTsan) return;
  EXPECT_LT(chief.history.history["loss"].back(), chief.history.history["loss"].front());
}

// A job restored from a backup goes on as the job left alone: the chief restores the
// values, Adam's slots and its iteration count from the backup of epoch 2 and places them
// on the new job's ps, which trains the third epoch. (One worker on unshuffled rows: its
// steps are one device's whatever the job's start.)
TEST(ParameterServerFit, ABackupRestoredIntoANewJobGoesOnAsTheJobLeftAlone) {
  const Data d = make_data();
  const int epochs = kUnderTsan ? 2 : 3;
  const FitOptions fit_options{.epochs = epochs, .batch_size = kBatch, .shuffle = false, .verbose = 0};
  auto reference = compiled_model();
  reference->fit(d.x, d.y, fit_options);
  const std::int64_t steps = kSamples / kBatch;

  const std::string dir = ::testing::TempDir() + "ps_backup_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto fit_with_backup = [&](int until_epoch) {
    return [&, until_epoch](Model& m) {
      FitOptions o = fit_options;
      o.epochs = until_epoch;
      train::BackupAndRestoreOptions backup;
      backup.delete_checkpoint = false;
      backup.out = nullptr;
      o.callbacks = {std::make_shared<train::BackupAndRestore>(dir, backup)};
      return m.fit(d.x, d.y, o);
    };
  };
  const Fitted first = fit_on_cluster(1, 1, options(), fit_with_backup(epochs - 1));
  EXPECT_EQ(first.model->optimizer().iterations(), (epochs - 1) * steps);  // fit gathers the ps's state
  {
    // Closures of 3 steps: the backup counts every step, and saves every 4 of them.
    std::shared_ptr<train::BackupAndRestore> counted;
    const std::string counted_dir = dir + "_counted";
    fit_on_cluster(1, 1, options(), [&](Model& m) {
      FitOptions o = fit_options;
      o.steps_per_execution = 3;
      train::BackupAndRestoreOptions backup;
      backup.save_freq = 4;
      backup.out = nullptr;
      auto made = std::make_shared<train::BackupAndRestore>(counted_dir, backup);
      // The chief's (only its thread writes `counted`): the callback runs there.
      if (RemoteTraining* remote = m.distribute_strategy()->remote_training(); remote->coordinates()) counted = made;
      o.callbacks = {made};
      return m.fit(d.x, d.y, o);
    });
    std::filesystem::remove_all(counted_dir);
    ASSERT_NE(counted, nullptr);
    EXPECT_EQ(counted->steps_done(), epochs * steps);
    EXPECT_EQ(counted->saves(), epochs * steps / 4);
  }
  const Fitted resumed = fit_on_cluster(1, 1, options(), fit_with_backup(epochs));
  // The same job once more: the backup of its last epoch leaves nothing to train, and the
  // model ends as restored (not as the new job's ps were first given it).
  const Fitted again = fit_on_cluster(1, 1, options(), fit_with_backup(epochs));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(again.stats.pushes_applied, 0);
  EXPECT_EQ(again.model->optimizer().iterations(), epochs * steps);
  EXPECT_LE(testing::relative_difference(*again.model, *reference), 1e-5);
  EXPECT_EQ(resumed.stats.pushes_applied, steps);  // the new job trained the last epoch only
  EXPECT_EQ(resumed.history.history.at("loss").size(), 1u);
  EXPECT_EQ(resumed.model->optimizer().iterations(), epochs * steps);
  EXPECT_LE(testing::relative_difference(*resumed.model, *reference), 1e-5);
  // The slots too: Adam's moments on the chief are the one device's.
  const auto expected_vars = reference->trainable_variables(), got_vars = resumed.model->trainable_variables();
  ASSERT_EQ(got_vars.size(), expected_vars.size());
  for (std::size_t v = 0; v < got_vars.size(); ++v) {
    const auto expected = reference->optimizer().slots(*expected_vars[v]);
    const auto got = resumed.model->optimizer().slots(*got_vars[v]);
    ASSERT_EQ(got.size(), expected.size()) << got_vars[v]->name();
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::vector<float> a = got[i].second->to_vector(), b = expected[i].second->to_vector();
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t j = 0; j < a.size(); ++j)
        ASSERT_NEAR(a[j], b[j], 1e-5 + 1e-4 * std::abs(b[j])) << got_vars[v]->name() << " slot " << got[i].first << " [" << j << "]";
    }
  }
}

// --profile under the strategy: each worker traces its steps (the pull of the weights and
// the push of the gradients among their phases), and each ps the pushes it took.
TEST(ParameterServerFit, AWorkerTracesItsStepsWithThePullAndThePush) {
  const Data d = make_data();
  const std::string path = ::testing::TempDir() + "ps_trace_" + std::to_string(::getpid()) + ".json";
  std::filesystem::remove(path);
  fit_on_cluster(1, 1, options(), [&](Model& m) {
    FitOptions o{.epochs = 1, .batch_size = kBatch, .verbose = 0};
    o.callbacks = {std::make_shared<ProfilerCallback>(path)};
    return m.fit(d.x, d.y, o);
  });
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " was not written";
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  std::map<std::string, int> events;
  for (const auto& e : trace.at("traceEvents"))
    if (e.value("ph", "") == "X") ++events[e.value("name", "")];
  const int steps = static_cast<int>(kSamples / kBatch);
  for (const char* phase : {"pull", "forward", "backward", "push"})
    EXPECT_EQ(events[phase], steps) << phase << " in " << trace.dump().substr(0, 400);
  // The ps traced each push it took: its queueing and its apply, on the workers' clock
  // (each apply lies inside the worker's traced time, each after its queueing).
  const std::string ps_path = path.substr(0, path.size() - 5) + ".ps-0.json";
  std::ifstream ps_in(ps_path);
  ASSERT_TRUE(ps_in) << ps_path << " was not written";
  const nlohmann::json ps_trace = nlohmann::json::parse(ps_in);
  std::filesystem::remove(ps_path);
  double first = 1e300, last = 0;
  for (const auto& e : trace.at("traceEvents"))
    if (e.value("ph", "") == "X") {
      first = std::min(first, e.at("ts").get<double>());
      last = std::max(last, e.at("ts").get<double>() + e.at("dur").get<double>());
    }
  int applies = 0, queued = 0;
  for (const auto& e : ps_trace.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    EXPECT_GE(dur, 0.0) << e.dump();
    if (e.at("name") == "apply worker:0") {
      ++applies;
      EXPECT_GE(ts, first) << e.dump();
      EXPECT_LE(ts + dur, last) << e.dump();
      EXPECT_EQ(e.at("args").at("staleness"), 0) << e.dump();  // one worker: never behind
    } else if (e.at("name") == "queued") {
      ++queued;
    } else {
      ADD_FAILURE() << "unexpected event " << e.dump();
    }
  }
  EXPECT_EQ(applies, steps);
  EXPECT_EQ(queued, steps);
}

// stop_training set by a callback stops the coordinator handing out steps: fit ends after
// the closures already out (two a worker ahead), not at the end of the epoch.
TEST(ParameterServerFit, StopTrainingEndsFitWithinAFewClosures) {
  const Data d = make_data();
  constexpr std::int64_t kStopAfter = 3;
  auto fit = [&](Model& m) {
    auto stop = std::make_shared<LambdaCallback>();
    stop->batch_end = [&m](std::int64_t batch, const Logs&) {
      if (batch + 1 >= kStopAfter) m.stop_training = true;
    };
    return m.fit(d.x, d.y, {.epochs = 3, .batch_size = kBatch, .callbacks = {stop}, .verbose = 0});
  };
  Fitted chief = fit_on_cluster(1, 1, options(), fit);
  EXPECT_EQ(chief.history.history["loss"].size(), 1u);
  EXPECT_GE(chief.stats.closures_finished, kStopAfter);
  EXPECT_LE(chief.stats.closures_finished, kStopAfter + 2);
  if (!kUnderTsan) {
    EXPECT_LT(chief.stats.closures_finished, kSamples / kBatch);  // within the first epoch
  }
}

// Constraints run where the variables live: each ps applies them to its shards after each
// update, so one worker with every variable split over two ps gives one device's constrained fit.
std::unique_ptr<Sequential> compiled_constrained_model(std::optional<Constraint> kernel_constraint) {
  auto model = std::make_unique<Sequential>();
  model->add<nn::Dense>(16, "relu", nn::DenseOptions{.seed = 1, .kernel_constraint = kernel_constraint});
  model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2, .kernel_constraint = Constraint::non_neg()});
  model->build(Shape{kFeatures});
  model->compile(std::make_shared<optim::Adam>(0.05f), std::make_shared<losses::SparseCategoricalCrossentropy>(),
                 {"accuracy"});
  return model;
}

// An embedding table split over two ps: each step pulls only the rows its batch looks up
// and pushes their gradient only, through shared memory and through gRPC alike, and the
// job still gives one device's fit with Adam (whose update moves rows the batch did not
// look up); a regularizer that reads the table whole pulls it whole, with the same result.
TEST(ParameterServerFit, AnEmbeddingTableMovesOnlyTheRowsABatchLooksUp) {
  constexpr std::int64_t kVocabulary = 400, kLength = 6;
  const std::int64_t samples = kUnderTsan ? 48 : 160;
  std::vector<float> ids(static_cast<std::size_t>(samples * kLength)), labels(static_cast<std::size_t>(samples));
  std::uint32_t state = 7;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    ids[i] = static_cast<float>((state >> 8) % kVocabulary);
  }
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<float>(static_cast<int>(ids[i * kLength]) % 3);
  const Tensor x = Tensor::from_vector(Shape{samples, kLength}, ids), y = Tensor::from_vector(Shape{samples}, labels);
  auto make = [&](bool regularized) {
    return [=]() -> std::unique_ptr<Model> {
      auto model = std::make_unique<Sequential>();
      nn::EmbeddingOptions e{.seed = 1};
      if (regularized) e.embeddings_regularizer = nn::Regularizer::L2(1e-3f);
      model->add<nn::Embedding>(kVocabulary, 8, e);
      model->add<nn::GlobalAveragePooling1D>();
      model->add<nn::Dense>(3, "softmax", nn::DenseOptions{.seed = 2});
      model->build(Shape{kLength});
      model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>());
      return model;
    };
  };
  const FitOptions o{.epochs = 1, .batch_size = kBatch, .seed = 3, .verbose = 0};
  for (bool regularized : {false, true}) {
    auto reference = make(regularized)();
    reference->fit(x, y, o);
    std::map<std::string, std::int64_t> moved;
    for (const auto& [name, rows, shared_memory] :
         {std::tuple{"rows, shared memory", true, true}, std::tuple{"rows, gRPC", true, false},
          std::tuple{"whole", false, true}}) {
      SCOPED_TRACE(std::string(name) + (regularized ? ", regularized" : ""));
      ParameterServerOptions po = testing::ps_options(distribute::FixedShardsPartitioner(2));
      po.embedding_rows = rows;
      po.shared_memory = shared_memory;
      Fitted chief = fit_on_cluster(1, 2, po, [&](Model& m) { return m.fit(x, y, o); }, make(regularized));
      EXPECT_LE(testing::relative_difference(*chief.model, *reference), 1e-5);
      moved[name] = chief.stats.shared_memory_bytes + chief.stats.message_bytes;
    }
    // A batch looks up at most 96 of the 400 rows: under a quarter of the table each way.
    if (!regularized) {
      EXPECT_LT(moved["rows, shared memory"] * 3, moved["whole"]);
      EXPECT_LT(moved["rows, gRPC"] * 3, moved["whole"]);
    }
  }
}

TEST(ParameterServerFit, ConstraintsApplyOnTheParameterServersToEachShard) {
  const Data d = make_data();
  // MaxNorm over axis 1 bounds each row of the kernel: a shard of rows holds whole rows.
  constexpr float kMaxNorm = 0.5f;  // below every row's norm as initialized
  const ModelMaker make = [] { return compiled_constrained_model(Constraint::max_norm(kMaxNorm, {1})); };
  const OneDevice one = one_device_fit(d, make);
  Fitted chief = fit_on_cluster(1, 2, testing::ps_options(distribute::FixedShardsPartitioner(2)),
                                [&](Model& m) { return m.fit(d.x, d.y, one.fit_options); }, make);
  EXPECT_LE(testing::relative_difference(*chief.model, *one.model), 1e-5);
  const Tensor kernel = chief.model->layers()[0]->variables()[0]->value();
  const std::vector<float> k = kernel.to_vector();
  const std::int64_t rows = kernel.shape()[0], cols = kernel.shape()[1];
  for (std::int64_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (std::int64_t c = 0; c < cols; ++c) norm += double(k[r * cols + c]) * k[r * cols + c];
    EXPECT_LE(std::sqrt(norm), kMaxNorm + 1e-5) << "row " << r;
  }
  const std::vector<float> w = chief.model->layers()[1]->variables()[0]->value().to_vector();
  EXPECT_GE(*std::min_element(w.begin(), w.end()), 0.0f);
  EXPECT_GT(std::count(w.begin(), w.end(), 0.0f), 0) << "NonNeg clipped nothing: the test shows nothing";
}

TEST(ParameterServerFit, ANormAcrossShardsIsRefusedNamingTheVariable) {
  const Data d = make_data();
  LocalCluster cluster(1, 2);  // nobody serves: the error comes before anything is placed
  ParameterServerStrategy strategy(cluster.config("chief", 0), testing::ps_options(distribute::FixedShardsPartitioner(2)));
  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = compiled_constrained_model(Constraint::max_norm());  // Keras's default: axis 0
  }
  const std::string message = testing::message_of<InvalidArgument>(
      [&] { model->fit(d.x, d.y, {.batch_size = kBatch, .verbose = 0}); });
  for (const char* part : {"/kernel'", "2 shards", "MaxNorm", "axis 0"})
    EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
}

TEST(ParameterServerFit, WhatCannotWorkIsRefusedByName) {
  const Data d = make_data();
  LocalCluster cluster(1, 1);  // nobody serves: each error comes before any closure is sent
  {
    ParameterServerStrategy strategy(cluster.config("chief", 0), options(distribute::Consistency::sync()));
    std::unique_ptr<Sequential> model;
    {
      auto scope = strategy.scope();
      model = compiled_model();
    }
    auto names = [](const std::string& message, std::initializer_list<const char*> parts) {
      for (const char* part : parts) EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
    };
    names(testing::message_of<InvalidArgument>(
              [&] { model->fit(d.x, d.y, {.batch_size = kBatch, .steps_per_execution = 2, .verbose = 0}); }),
          {"steps_per_execution 2 under sync", "async"});
    names(testing::message_of<InvalidArgument>(
              [&] { model->fit(d.x, d.y, {.batch_size = kBatch, .gradient_accumulation_steps = 2, .verbose = 0}); }),
          {"ParameterServerStrategy", "gradient_accumulation_steps 2"});
    names(testing::message_of<InvalidArgument>([&] {
            model->fit(data::Dataset::from_tensor_slices({d.x, d.y}).batch(kBatch).repeat(), {.verbose = 0});
          }),
          {"length is unknown", "steps_per_epoch"});
    auto schedule = std::make_shared<LearningRateScheduler>([](int, double lr) { return lr / 2; });
    names(testing::message_of<InvalidArgument>(
              [&] { model->fit(d.x, d.y, {.batch_size = kBatch, .callbacks = {schedule}, .verbose = 0}); }),
          {"LearningRateScheduler", "learning-rate schedule"});
    // The first fit above began (and stopped before placing anything): the workers serve one
    // fit's input for the whole job.
    names(testing::message_of<InvalidArgument>([&] { model->fit(d.x, d.y, {.batch_size = kBatch, .verbose = 0}); }),
          {"runs once per strategy"});
  }
}

}  // namespace
}  // namespace dtrain
