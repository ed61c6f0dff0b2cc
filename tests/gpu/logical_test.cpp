// Logical GPUs, as TensorFlow users test multi-GPU code on one GPU: a GPU split by
// set_logical_device_configuration, MirroredStrategy's replicas on its parts training as the
// GPU does alone on the same global batch, and the parts' memory limit. The same tests run
// on a real GPU (scripts/gpu-check.sh) and, in CI, on the stand-in GPU.
#include <gtest/gtest.h>

#include <sstream>

#include "common/compare.h"
#include "common/error_message.h"
#include "common/resume_check.h"
#include "common/small_cnn.h"
#include "common/small_models.h"
#include "common/stand_in_gpu.h"
#include "common/temp_dir.h"
#include "dtrain/comm/nccl_group.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

using testing::GpuForTests;

// fn throws E, whose message has each of `parts`.
template <typename E>
void expect_error(const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  const std::string message = testing::message_of<E>(fn);
  for (const char* part : parts) EXPECT_NE(message.find(part), std::string::npos) << part << " is not in: " << message;
}

class LogicalGpus : public testing::TempDirTest {
 protected:
  ~LogicalGpus() override { set_logical_device_configuration(cuda0, {}); }  // the process's setting
  // cuda:0 as `parts` logical GPUs; the strategy over all of them.
  std::vector<std::string> split(int parts, std::size_t memory_limit_mb = 0) {
    set_logical_device_configuration(cuda0, std::vector<LogicalDeviceConfiguration>(
                                                static_cast<std::size_t>(parts), {memory_limit_mb}));
    std::vector<std::string> names;
    for (int i = 0; i < parts; ++i) names.push_back("/gpu:" + std::to_string(i));
    return names;
  }
  double tolerance(double on_gpu) const { return gpu_.stand_in() ? 1e-5 : on_gpu; }

  GpuForTests gpu_;  // first: it outlives every tensor the test makes
  const Device cuda0 = Device::cuda(0);
};

FitOptions in_order(int epochs, int accumulate = 1) {
  FitOptions o;
  o.epochs = epochs;
  o.batch_size = 64;
  o.shuffle = false;
  o.verbose = 0;
  o.gradient_accumulation_steps = accumulate;
  return o;
}

TEST_F(LogicalGpus, NamesCountLogicalGpusAndCudaNamesCountPhysicalOnes) {
  EXPECT_EQ(logical_gpus().size(), 1u);
  split(3, 64);
  const std::vector<LogicalGpu> gpus = logical_gpus();
  ASSERT_EQ(gpus.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(gpus[static_cast<std::size_t>(i)].physical, cuda0);
    EXPECT_EQ(gpus[static_cast<std::size_t>(i)].part, i);
    EXPECT_EQ(gpus[static_cast<std::size_t>(i)].parts, 3);
    EXPECT_EQ(gpus[static_cast<std::size_t>(i)].memory_limit, std::size_t{64} << 20);
  }
  for (const char* name : {"/gpu:2", "GPU:1", "/device:GPU:2", "/job:localhost/replica:0/task:0/device:GPU:1"})
    EXPECT_EQ(parse_device(name), cuda0) << name;
  EXPECT_EQ(parse_device("cuda:1"), Device::cuda(1));  // PyTorch's names are physical GPUs
  // A GPU's TensorFlow name is its first logical GPU's: cuda:1 follows cuda:0's three.
  EXPECT_EQ(Device::cuda(0).tf_name(), "/device:GPU:0");
  EXPECT_EQ(Device::cuda(1).tf_name(), "/device:GPU:3");
  EXPECT_EQ(parse_device("/physical_device:GPU:1"), Device::cuda(1));
  expect_error<InvalidArgument>([] { (void)parse_device("/gpu:3"); }, {"'/gpu:3'", "3 logical GPUs"});
  EXPECT_EQ(logical_device_configuration(cuda0).size(), 3u);
  set_logical_device_configuration(cuda0, {});  // one device again
  EXPECT_EQ(parse_device("/gpu:1"), Device::cuda(1));
  EXPECT_TRUE(logical_device_configuration(cuda0).empty());
  expect_error<InvalidArgument>([] { set_logical_device_configuration(Device::cpu(), {{}, {}}); },
                                         {"splits GPUs only"});
}

// The same global batch on 1, 2 and 4 logical GPUs gives the one GPU's weights: each
// replica takes its rows, and the replicas' gradients summed on the device are the batch's.
TEST_F(LogicalGpus, ReplicasOnLogicalGpusTrainAsTheGpuAloneOnTheSameGlobalBatch) {
  const data::Split d = data::make_synthetic(512, 10, 4, 5, data::SyntheticLabels::teacher);
  std::unique_ptr<Sequential> alone;
  History h1;
  {
    DevicePlacement on_gpu(cuda0);
    alone = testing::three_layer_classifier();
    h1 = alone->fit(d.x, d.y, in_order(3));
  }
  for (const int parts : {1, 2, 4}) {
    distribute::MirroredStrategy strategy(split(parts));
    EXPECT_EQ(strategy.num_replicas_in_sync(), parts);
    EXPECT_EQ(strategy.devices().back(), "/gpu:" + std::to_string(parts - 1));
    std::unique_ptr<Sequential> m;
    {
      auto scope = strategy.scope();
      m = testing::three_layer_classifier();
    }
    const History h = m->fit(d.x, d.y, in_order(3));
    EXPECT_EQ(m->device(), cuda0) << parts;
    EXPECT_LE(testing::relative_difference(*m, *alone), tolerance(1e-4)) << parts << " logical GPUs";
    for (std::size_t e = 0; e < 3; ++e)
      EXPECT_NEAR(h.history.at("loss")[e], h1.history.at("loss")[e], tolerance(1e-4) * h1.history.at("loss")[e]);
    if (parts > 1) {
      // Each replica's track has its gradient sum on the device.
      EXPECT_GT(h.profile.back().phases[static_cast<int>(profile::Phase::communication)], 0.0) << parts;
    }
  }
}

// Accumulated gradients are summed on each replica first, then over the replicas.
TEST_F(LogicalGpus, AccumulatedGradientsOnLogicalGpusMatchTheGpuAlone) {
  const data::Split d = data::make_synthetic(384, 10, 4, 6, data::SyntheticLabels::teacher);
  std::unique_ptr<Sequential> alone;
  {
    DevicePlacement on_gpu(cuda0);
    alone = testing::three_layer_classifier();
    alone->fit(d.x, d.y, in_order(2, /*accumulate=*/3));
  }
  distribute::MirroredStrategy strategy(split(2));
  std::unique_ptr<Sequential> m;
  {
    auto scope = strategy.scope();
    m = testing::three_layer_classifier();
  }
  std::ostringstream text;
  FitOptions o = in_order(2, /*accumulate=*/3);
  o.verbose = 2;
  o.out = &text;
  m->fit(d.x, d.y, o);
  EXPECT_LE(testing::relative_difference(*m, *alone), tolerance(1e-4));
  // fit's first line says how the replicas share the GPU.
  const std::string first = text.str().substr(0, text.str().find('\n'));
  EXPECT_NE(first.find("MirroredStrategy: 2 replicas on logical GPUs of cuda:0 (/gpu:0, /gpu:1)"), std::string::npos)
      << first;
  EXPECT_NE(first.find("reduction to one device"), std::string::npos) << first;
}

// A synchronized batch norm sums its statistics over the logical GPUs on the device: two
// replicas normalize as the GPU does over the whole batch.
TEST_F(LogicalGpus, ASynchronizedBatchNormOverLogicalGpusMatchesTheGpuAlone) {
  const auto [x, y] = testing::random_images(64, 21);
  std::unique_ptr<Model> alone;
  {
    DevicePlacement on_gpu(cuda0);
    alone = testing::small_cnn(/*synchronized=*/true);
    FitOptions o = in_order(2);
    o.batch_size = 32;
    alone->fit(x, y, o);
  }
  distribute::MirroredStrategy strategy(split(2));
  std::unique_ptr<Model> m;
  {
    auto scope = strategy.scope();
    m = testing::small_cnn(/*synchronized=*/true);
  }
  FitOptions o = in_order(2);
  o.batch_size = 32;
  m->fit(x, y, o);
  EXPECT_LE(testing::relative_difference(*m, *alone), tolerance(1e-3));
}

// A plain batch norm: each replica normalizes by its own rows' statistics, and their mean
// goes into the moving statistics, on the GPU as on CPU replicas.
TEST_F(LogicalGpus, APlainBatchNormOverLogicalGpusTrainsAsCpuReplicas) {
  const auto [x, y] = testing::random_images(64, 22);
  FitOptions o = in_order(2);
  o.batch_size = 32;
  distribute::MirroredStrategy cpus(2);
  std::unique_ptr<Model> on_cpus;
  {
    auto scope = cpus.scope();
    on_cpus = testing::small_cnn(/*synchronized=*/false);
  }
  on_cpus->fit(x, y, o);
  distribute::MirroredStrategy gpus(split(2));
  std::unique_ptr<Model> m;
  {
    auto scope = gpus.scope();
    m = testing::small_cnn(/*synchronized=*/false);
  }
  m->fit(x, y, o);
  EXPECT_EQ(m->device(), cuda0);
  EXPECT_LE(testing::relative_difference(*m, *on_cpus), tolerance(1e-3));
}

// A job on logical GPUs, stopped mid-epoch and resumed from its backup, ends with the
// uninterrupted run's weights and steps, bit for bit (Adam's slots, the shuffle's place).
TEST_F(LogicalGpus, AnInterruptedJobResumesFromItsBackupToTheUninterruptedWeights) {
  distribute::MirroredStrategy strategy(split(2));
  testing::expect_resumes_bit_for_bit(
      [&] {
        auto scope = strategy.scope();
        std::unique_ptr<Model> m = testing::three_layer_classifier();
        m->build(Shape{10});  // a backup is restored into built weights
        return m;
      },
      (dir_ / "backup").string());
}

// The parts' memory_limit, summed, caps what the GPU's cache holds; limits beyond the GPU
// and a mixed or repeated device list are errors that name them.
TEST_F(LogicalGpus, TheirMemoryLimitsCapTheGpuAndBadListsAreNamed) {
  if (!gpu_.stand_in()) GTEST_SKIP() << "sized for the stand-in's 64 MiB";
  gpu_.stand_in_runtime()->set_limit(std::size_t{64} << 20);
  split(2, 8);  // 16 MiB between them
  const Tensor fits = Tensor::zeros({3 << 20}, DType::f32, cuda0);  // 12 MiB
  expect_error<ResourceExhausted>([&] { (void)Tensor::zeros({2 << 20}, DType::f32, cuda0); },
                                           {"out of memory on", "16.00 MiB", "memory_limit of its 2 logical GPUs"});
  // Below what the tensors hold already; more than the GPU has.
  expect_error<InvalidArgument>([&] { split(2, 4); }, {"8.00 MiB", "less than"});
  expect_error<InvalidArgument>([&] { split(2, 40); }, {"80.00 MiB", "more than its 64.00 MiB"});
  set_logical_device_configuration(cuda0, {});  // no limit again
  const Tensor more = Tensor::zeros({2 << 20}, DType::f32, cuda0);
  EXPECT_EQ(more.numel(), 2 << 20);
  split(2);
  expect_error<InvalidArgument>([] { distribute::MirroredStrategy({"/gpu:0", "/device:GPU:0"}); },
                                         {"listed twice"});
  expect_error<InvalidArgument>([] { distribute::MirroredStrategy({"/gpu:0", "/cpu:0"}); },
                                         {"a CPU and a GPU"});
  expect_error<InvalidArgument>([] { distribute::MirroredStrategy({"/gpu:0", "/gpu:2"}); },
                                         {"'/gpu:2'", "2 logical GPUs"});
}

// The machine's NCCL under dtrain's group, with the one rank a GPU allows: its id through
// the store, the nonblocking join, a sum in place on the GPU and the event after it.
TEST(Nccl, AOneRankCommunicatorSumsInPlaceOnTheGpu) {
  GpuForTests gpu;
  if (gpu.stand_in()) GTEST_SKIP() << "needs a GPU";
  std::string absence;
  const comm::NcclApi* nccl = comm::nccl_library(&absence);
  ASSERT_NE(nccl, nullptr) << absence;
  comm::TcpStoreServer server("127.0.0.1", 0, "nccl");
  auto store = std::make_shared<comm::TcpStore>("127.0.0.1", server.port(), "nccl", std::chrono::seconds(30));
  comm::NcclGroup group(*nccl, store, {0, 1, {"worker:0"}, 0, std::chrono::seconds(30)});
  Tensor x = Tensor::from_vector({3}, {1.5f, -2.0f, 4.0f}).to(Device::cuda(0));
  group.all_reduce(static_cast<float*>(x.raw_device_data()), 3);
  EXPECT_EQ(x.to_vector(), (std::vector<float>{1.5f, -2.0f, 4.0f}));
  // Beside the compute stream, after the work queued on it (the doubling): two sums
  // started, then waited for, and the compute stream's next work (the copy) after them.
  kernels::backend(Device::cuda(0)).axpby(1.0f, x, 1.0f, x);
  group.start_all_reduce(static_cast<float*>(x.raw_device_data()), 2);
  group.start_all_reduce(static_cast<float*>(x.raw_device_data()) + 2, 1);
  group.finish_all_reduces();
  EXPECT_EQ(x.to_vector(), (std::vector<float>{3.0f, -4.0f, 8.0f}));
}

}  // namespace
}  // namespace dtrain
