// ParameterServerStrategy with GPU workers, in TensorFlow's layout: every task runs the
// same program with a GPU placement (as a Python program does by default on a GPU
// machine); the workers compute on the GPU, while the chief and the parameter servers hold
// their variables in host memory, and pulls and pushes go through page-locked buffers. On
// a real GPU (scripts/gpu-check.sh) and, in CI, on the stand-in GPU, where any read of the
// GPU's memory from the host outside the runtime throws.
#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/small_models.h"
#include "common/stand_in_gpu.h"
#include "dtrain/dtrain.h"
#include "ps/local_cluster.h"

namespace dtrain {
namespace {

using distribute::ClusterCoordinator;
using distribute::ParameterServerOptions;
using distribute::ParameterServerStrategy;
using testing::GpuForTests;
using testing::LocalCluster;
using testing::Tasks;

constexpr std::int64_t kFeatures = 12, kBatch = 16, kSamples = 160;
constexpr std::int64_t kVocabulary = 50, kLength = 4;  // the embedding's

using ModelMaker = std::function<std::unique_ptr<Model>()>;

std::unique_ptr<Model> mlp_with_batch_norm() { return testing::mlp_with_batch_norm(kFeatures); }

struct Task {
  std::unique_ptr<Model> model;
  History history;
  ClusterCoordinator::Statistics stats;
  Device device;  // where its model's weights are
};

class GpuWorkers : public ::testing::Test {
 protected:
  // One program on every task of a chief, `workers` workers and `num_ps` ps, each under a
  // placement on cuda:0; returns the chief's, and each worker's in `worker_tasks`.
  Task fit_on_cluster(int workers, int num_ps, const ParameterServerOptions& o, const ModelMaker& make,
                      const std::function<History(Model&)>& fit) {
    LocalCluster cluster(workers, num_ps);
    auto program = [&](const std::string& type, int index) {
      const DevicePlacement on_gpu(Device::cuda(0));
      ParameterServerStrategy strategy(cluster.config(type, index), o);
      Task out;
      {
        auto scope = strategy.scope();
        out.model = make();
      }
      out.device = out.model->device();
      out.history = fit(*out.model);
      if (strategy.is_chief()) out.stats = ClusterCoordinator(strategy).statistics();
      return out;
    };
    worker_tasks.clear();
    worker_tasks.resize(static_cast<std::size_t>(workers));
    ps_devices.assign(static_cast<std::size_t>(num_ps), Device::cuda(0));
    Tasks tasks;
    for (int p = 0; p < num_ps; ++p)
      tasks.add([&, p] { ps_devices[static_cast<std::size_t>(p)] = program("ps", p).device; });
    for (int w = 0; w < workers; ++w)
      tasks.add([&, w] { worker_tasks[static_cast<std::size_t>(w)] = program("worker", w); });
    Task chief = program("chief", 0);
    tasks.join();
    EXPECT_EQ(tasks.errors(), std::vector<std::string>{});
    return chief;
  }
  double tolerance() const { return gpu_.stand_in() ? 1e-5 : 1e-4; }

  GpuForTests gpu_;  // first: it outlives every tensor the test makes
  std::vector<Task> worker_tasks;
  std::vector<Device> ps_devices;
};

// One GPU worker gives one device's fit (weights, moving statistics, validation), whether
// each variable is whole on one ps or in shards over two: its steps ran on the GPU, and
// the chief and the parameter servers kept their variables on the CPU.
TEST_F(GpuWorkers, OneGpuWorkerGivesOneDevicesFitWhileTheChiefAndThePsStayOnTheCpu) {
  data::Split train = data::make_synthetic(kSamples, kFeatures, 10, 5, data::SyntheticLabels::teacher);
  data::Split val = data::make_synthetic(64, kFeatures, 10, 6, data::SyntheticLabels::teacher);
  FitOptions o{.epochs = 2, .batch_size = kBatch, .seed = 3, .verbose = 0};
  o.validation_data = std::make_pair(val.x, val.y);
  auto reference = mlp_with_batch_norm();
  const History expected = reference->fit(train.x, train.y, o);
  for (const auto& [name, num_ps, partitioner] :
       {std::tuple{"1 ps", 1, distribute::Partitioner{}},
        std::tuple{"2 ps, 3 shards a variable", 2, distribute::Partitioner(distribute::FixedShardsPartitioner(3))}}) {
    SCOPED_TRACE(name);
    const Task chief = fit_on_cluster(1, num_ps, testing::ps_options(partitioner), mlp_with_batch_norm,
                                      [&](Model& m) { return m.fit(train.x, train.y, o); });
    EXPECT_EQ(worker_tasks[0].device, Device::cuda(0));
    EXPECT_EQ(chief.device, Device::cpu());
    for (const Device& d : ps_devices) EXPECT_EQ(d, Device::cpu());
    EXPECT_LE(testing::relative_difference(*chief.model, *reference), tolerance());
    for (const char* key : {"loss", "val_loss", "val_accuracy"})
      EXPECT_NEAR(chief.history.history.at(key).back(), expected.history.at(key).back(), 10 * tolerance()) << key;
    EXPECT_EQ(chief.stats.steps_finished, 2 * kSamples / kBatch);
  }
}

// An embedding table on a GPU worker is pulled whole (the ids it looks up are on the GPU),
// and still gives one device's weights; two GPU workers sharing the GPU count every step once.
TEST_F(GpuWorkers, AnEmbeddingTableIsPulledWholeAndTwoWorkersShareTheGpu) {
  std::vector<float> ids(static_cast<std::size_t>(kSamples * kLength)), labels(static_cast<std::size_t>(kSamples));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 37 + 11) % kVocabulary);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<float>(static_cast<int>(ids[i * kLength]) % 3);
  const Tensor x = Tensor::from_vector(Shape{kSamples, kLength}, ids), y = Tensor::from_vector(Shape{kSamples}, labels);
  auto make = [] {
    auto model = std::make_unique<Sequential>();
    model->add<nn::Embedding>(kVocabulary, 8, nn::EmbeddingOptions{.seed = 1});
    model->add<nn::GlobalAveragePooling1D>();
    model->add<nn::Dense>(3, "softmax", nn::DenseOptions{.seed = 2});
    model->build(Shape{kLength});
    model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>());
    return std::unique_ptr<Model>(std::move(model));
  };
  const FitOptions o{.epochs = 1, .batch_size = kBatch, .seed = 3, .verbose = 0};
  auto reference = make();
  reference->fit(x, y, o);
  const ParameterServerOptions po = testing::ps_options(distribute::FixedShardsPartitioner(2));
  const Task one = fit_on_cluster(1, 2, po, make, [&](Model& m) { return m.fit(x, y, o); });
  EXPECT_LE(testing::relative_difference(*one.model, *reference), tolerance());

  const Task two = fit_on_cluster(2, 1, po, make, [&](Model& m) {
    return m.fit(data::Dataset::from_tensor_slices({x, y}).batch(kBatch), {.epochs = 2, .verbose = 0});
  });
  for (const Task& w : worker_tasks) EXPECT_EQ(w.device, Device::cuda(0));
  EXPECT_EQ(two.stats.steps_finished, 2 * kSamples / kBatch);
  EXPECT_EQ(two.stats.pushes_refused, 0);
  EXPECT_LT(two.history.history.at("loss").back(), two.history.history.at("loss").front());
}

// A scheduled function's result computed on a worker's GPU reaches the chief.
TEST_F(GpuWorkers, AScheduledFunctionsResultComesBackFromTheGpu) {
  LocalCluster cluster(1, 1);
  auto program = [&](const std::string& type, int index) -> float {
    const DevicePlacement on_gpu(Device::cuda(0));
    ParameterServerStrategy strategy(cluster.config(type, index), testing::ps_options());
    ClusterCoordinator coordinator(strategy);
    Variable* weight = nullptr;
    std::unique_ptr<Variable> owned;
    {
      auto scope = strategy.scope();
      owned = std::make_unique<Variable>("w", Tensor::full(Shape{3}, 2.0f).to(placement()));
      weight = owned.get();
    }
    const auto doubled_sum = coordinator.define("doubled_sum", [weight]() -> std::vector<Tensor> {
      if (weight->value().on_cpu()) throw InvalidArgument("the worker's variable is not on its GPU");
      return {reduce_sum(weight->value() * 2.0f, {0})};
    });
    if (!strategy.is_chief()) {
      coordinator.serve();
      return 0;
    }
    const distribute::RemoteValue result = coordinator.schedule(doubled_sum);
    return result.fetch().at(0).to_vector().at(0);
  };
  Tasks tasks;
  tasks.add([&] { program("ps", 0); });
  tasks.add([&] { program("worker", 0); });
  EXPECT_FLOAT_EQ(program("chief", 0), 12.0f);
  tasks.join();
  EXPECT_EQ(tasks.errors(), std::vector<std::string>{});
}

}  // namespace
}  // namespace dtrain
