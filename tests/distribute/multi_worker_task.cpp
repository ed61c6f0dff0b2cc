// One task of the multi-worker tests, run once per worker process by multi_worker_test:
// reads TF_CONFIG, trains the seeds' large MLP (or a smaller one) under
// MultiWorkerMirroredStrategy on data every task makes alike, checks that it took the
// steps it should and that every worker ended with the same weights, and saves its
// weights to OUT/<task>.safetensors for the parent test to compare with one process.
// Options plant the failures the parent looks for: a task that kills itself mid-epoch or
// stops (hangs), a task that builds a different model, workers whose own datasets differ
// in length, workers reading their own record files. With --seed it also saves the weights
// as built from that seed, before any training. An error fails the test here with
// its message, which the parent reads.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>

#include "common/quiet_fit.h"
#include "common/small_cnn.h"
#include "common/stand_in_gpu.h"
#include "common/tiny_transformer.h"
#include "dtrain/dtrain.h"

namespace {

using namespace dtrain;

struct Args {
  std::string out = ".";
  int steps = 20, batch = 64, features = 1024, hidden = 1024, replicas = 1;
  bool overlap = true;
  std::string compression = "none";
  std::string communication = "auto";  // or ring: TCP even on one host
  double timeout = 60;
  std::string kill_task;  // this task SIGKILLs itself at kill_step
  int kill_step = 5;
  std::string stop_task;  // this task SIGSTOPs itself (hangs) at kill_step
  std::string mismatch_task;  // this task builds a wider second layer
  bool uneven = false;        // worker w trains on its own 5 - 2w batches (auto-shard OFF)
  int files = 0;              // trains on OUT/part-K.rec, K < files (auto-shard AUTO, so FILE)
  // >= 0: set_random_seed(seed) first, layers without seeds of their own, and the weights
  // as built saved to OUT/<task>.initial.safetensors.
  long long seed = -1;
  // "cnn": the small residual CNN of tests/common/small_cnn.h (synchronized batch norms)
  // on its random images, instead of the MLP; "link" and "gpu_path": the probes instead.
  std::string model = "mlp";
  // Each worker trains on cuda:0 (the stand-in GPU where there is none), its replicas on
  // logical GPUs of it; with gpus > 1, a replica on each of that many GPUs (a stand-in of
  // that many where the machine has fewer).
  bool gpu = false;
  int gpus = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--out") a.out = v;
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--batch") a.batch = std::stoi(v);
    else if (k == "--features") a.features = std::stoi(v);
    else if (k == "--hidden") a.hidden = std::stoi(v);
    else if (k == "--replicas") a.replicas = std::stoi(v);
    else if (k == "--overlap") a.overlap = v == "1";
    else if (k == "--compression") a.compression = v;
    else if (k == "--communication") a.communication = v;
    else if (k == "--timeout") a.timeout = std::stod(v);
    else if (k == "--kill-task") a.kill_task = v;
    else if (k == "--kill-step") a.kill_step = std::stoi(v);
    else if (k == "--stop-task") a.stop_task = v;
    else if (k == "--mismatch-task") a.mismatch_task = v;
    else if (k == "--uneven") a.uneven = v == "1";
    else if (k == "--files") a.files = std::stoi(v);
    else if (k == "--seed") a.seed = std::stoll(v);
    else if (k == "--model") a.model = v;
    else if (k == "--gpu") a.gpu = v == "1";
    else if (k == "--gpus") a.gpus = std::stoi(v);
    else throw std::invalid_argument("unknown option " + k);
  }
  return a;
}

class SignalAt : public Callback {
 public:
  SignalAt(int step, int signal) : step_(step), signal_(signal) {}
  void on_train_batch_begin(std::int64_t step, const Logs&) override {
    if (step == step_) ::raise(signal_);
  }

 private:
  int step_, signal_;
};

Args args;  // from the command line, after GoogleTest's own flags

void run(const Args& a) {
  distribute::CommunicationOptions comm;
  comm.timeout_seconds = a.timeout;
  comm.overlap = a.overlap;
  comm.compression = a.compression == "bf16"   ? distribute::Compression::BF16
                     : a.compression == "fp16" ? distribute::Compression::FP16
                                               : distribute::Compression::NONE;
  if (a.communication == "ring") comm.implementation = distribute::CommunicationImplementation::RING;
  std::vector<std::string> devices;
  std::optional<dtrain::testing::GpuForTests> gpu;
  if (a.gpus > 1) {
    gpu.emplace(a.gpus);
    for (int r = 0; r < a.gpus; ++r) devices.push_back("/gpu:" + std::to_string(r));
  } else {
    if (a.gpu) {
      gpu.emplace();
      set_logical_device_configuration(Device::cuda(0), std::vector<LogicalDeviceConfiguration>(
                                                            static_cast<std::size_t>(a.replicas)));
    }
    for (int r = 0; r < a.replicas; ++r) devices.push_back((a.gpu ? "/gpu:" : "/cpu:") + std::to_string(r));
  }
  if (a.seed >= 0) set_random_seed(static_cast<std::uint64_t>(a.seed));
  const cluster::TfConfig config = cluster::tf_config_from_environment();
  distribute::MultiWorkerMirroredStrategy strategy(config, comm, devices);
  const std::string task = config.task.to_string();

  if (a.model == "link") {
    // The link probe: every worker measures; over TCP it looks for a burst after a rest.
    const distribute::MultiWorkerMirroredStrategy::LinkMeasurement m = strategy.measure_link();
    std::cout << "done " << task << " bandwidth=" << m.bytes_per_second << " burst=" << m.burst_bytes
              << " rest=" << m.rest_seconds << " rested_bytes=" << m.rested.bytes
              << " rested_seconds=" << m.rested.seconds << std::endl;
    return;
  }
  if (a.model == "gpu_path") {
    // The GPU path probe: fit's gradient sum between the workers, and the copies alone.
    const distribute::MultiWorkerMirroredStrategy::GpuPathMeasurement m = strategy.measure_gpu_path();
    std::cout << "done " << task << " bandwidth=" << m.link.bytes_per_second << " latency=" << m.link.latency_seconds
              << " copy=" << m.copy_bytes_per_second << " samples=" << m.link.samples.size() << " path=" << m.path
              << std::endl;
    return;
  }
  std::unique_ptr<Model> model;
  if (a.model == "transformer") {
    {
      auto scope = strategy.scope();
      model = dtrain::testing::tiny_transformer(12, 16, /*causal=*/true);
      model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
    }
    const dtrain::testing::TokenData d = dtrain::testing::ordered_pairs(a.steps * a.batch);
    model->fit(d.ids, d.labels, dtrain::testing::quiet(a.batch));
    EXPECT_EQ(model->optimizer().iterations(), a.steps) << task;
    model->save_weights(a.out + "/" + task + ".safetensors");
    std::cout << "done " << task << " steps=" << model->optimizer().iterations() << std::endl;
    return;
  }
  if (a.model == "cnn") {
    {
      auto scope = strategy.scope();
      model = dtrain::testing::small_cnn(/*synchronized=*/true);
    }
    const auto [x, y] = dtrain::testing::random_images(a.steps * a.batch, 7);
    FitOptions fit;
    fit.batch_size = a.batch;
    fit.shuffle = false;
    fit.verbose = 0;
    model->fit(x, y, fit);
    EXPECT_EQ(model->optimizer().iterations(), a.steps) << task;
    model->save_weights(a.out + "/" + task + ".safetensors");
    std::cout << "done " << task << " steps=" << model->optimizer().iterations() << std::endl;
    return;
  }
  {
    auto scope = strategy.scope();
    auto mlp = std::make_unique<Sequential>();
    // Worker-specific seeds: the chief's weights must reach every worker. With --seed,
    // none: the layers draw from the seed sequence, which must give one process's weights.
    const auto seed = static_cast<std::uint64_t>(strategy.worker_index()) * 100;
    auto seeded = [&](std::uint64_t s) {
      return a.seed >= 0 ? nn::DenseOptions{} : nn::DenseOptions{.seed = seed + s};
    };
    mlp->add<nn::Dense>(a.hidden, "relu", seeded(1));
    mlp->add<nn::Dense>(a.hidden + (task == a.mismatch_task ? 1 : 0), "relu", seeded(2));
    mlp->add<nn::Dense>(10, "softmax", seeded(3));
    mlp->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
    mlp->build(Shape{a.features});
    model = std::move(mlp);
  }
  if (a.seed >= 0) model->save_weights(a.out + "/" + task + ".initial.safetensors");
  FitOptions fit;
  fit.batch_size = a.batch;
  fit.shuffle = false;
  fit.verbose = 0;
  if (task == a.kill_task) fit.callbacks.push_back(std::make_shared<SignalAt>(a.kill_step, SIGKILL));
  if (task == a.stop_task) fit.callbacks.push_back(std::make_shared<SignalAt>(a.kill_step, SIGSTOP));
  History history;
  if (a.files > 0) {
    // Record files the parent wrote; the default policy shards them by file.
    std::vector<std::string> files;
    for (int k = 0; k < a.files; ++k) files.push_back(a.out + "/part-" + std::to_string(k) + ".rec");
    fit.verbose = 2;  // prints the shard plan
    history = model->fit(
        data::Dataset::records(files).map([](const data::Element& e) { return data::decode_element(e[0]); }).batch(a.batch),
        fit);
  } else if (a.uneven) {
    // Worker w's own batches: 5 - 2w of them, rows [w * 320, ...) of the data.
    data::Split d = data::make_synthetic(5 * 2 * a.batch, a.features, 10, 7, data::SyntheticLabels::teacher);
    const std::int64_t w = strategy.worker_index(), count = (5 - 2 * w) * a.batch;
    data::DatasetOptions options;
    options.auto_shard_policy = data::AutoShardPolicy::OFF;
    const data::Dataset mine = data::Dataset::from_tensor_slices({d.x.slice(w * 5 * a.batch, w * 5 * a.batch + count),
                                                                  d.y.slice(w * 5 * a.batch, w * 5 * a.batch + count)})
                                   .batch(a.batch)
                                   .with_options(options);
    history = model->fit(mine, fit);
  } else {
    data::Split d = data::make_synthetic(a.steps * a.batch, a.features, 10, 7, data::SyntheticLabels::teacher);
    history = model->fit(d.x, d.y, fit);
  }
  // Every step updated the weights once: 5 steps with uneven shards (the longest).
  const int steps = a.uneven ? 5 : a.steps;
  EXPECT_EQ(model->optimizer().iterations(), steps) << task;
  // Every worker has every worker's step profile: the same steps, and every bucket's bytes.
  ASSERT_EQ(history.profile_summary.size(), static_cast<std::size_t>(strategy.num_workers())) << task;
  for (const profile::WorkerSummary& w : history.profile_summary) {
    EXPECT_EQ(w.totals.steps, steps) << task;
    // ...and each of its steps' own work, for the doctor's replay.
    ASSERT_EQ(static_cast<std::int64_t>(w.step_work.size()), w.totals.steps) << task;
    for (double work : w.step_work) EXPECT_GT(work, 0.0) << task;
    if (strategy.num_workers() > 1) {
      EXPECT_GT(w.totals.bytes, 0u) << task;
      EXPECT_GT(w.totals.transfer, 0.0) << task;
    }
  }
  // Every worker holds the chief's weights: their sums, gathered, are all the same bits.
  double sum = 0;
  for (const Variable* v : model->variables())
    for (float x : v->value().to_vector()) sum += x;
  std::vector<Tensor> mine(static_cast<std::size_t>(strategy.num_local_replicas()),
                           Tensor::full(Shape{1}, static_cast<float>(sum)));
  const std::vector<float> all = strategy.gather(distribute::PerReplica<Tensor>(mine)).to_vector();
  ASSERT_EQ(all.size(), static_cast<std::size_t>(strategy.num_replicas_in_sync()));
  for (std::size_t r = 1; r < all.size(); ++r) EXPECT_EQ(all[r], all[0]) << "replica " << r << " of all workers";
  model->save_weights(a.out + "/" + task + ".safetensors");
  std::cout << std::setprecision(9) << "done " << task << " steps=" << model->optimizer().iterations()
            << " loss=" << history.history["loss"].back() << " samples_per_second=" << history.samples_per_second.back()
            << " replicas=" << strategy.num_local_replicas() << " transport=" << strategy.backend()->transport()
            << std::endl;
}

TEST(MultiWorkerTask, TrainsAndEndsWithTheOtherWorkersWeights) {
  try {
    run(args);
  } catch (const std::exception& e) {
    FAIL() << "error: " << e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  args = parse(argc, argv);
  return RUN_ALL_TESTS();
}
