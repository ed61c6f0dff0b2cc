// MirroredStrategy over GPUs with memories of their own: a replica per GPU, each reading a
// copy of the weights on its GPU, their gradients summed with NCCL's ranks in this process
// or on the first GPU, the update there and copied to the others before the next step.
// A machine with two GPUs runs them on its GPUs; elsewhere (CI, the one-GPU device
// machine) on a stand-in with two GPUs over host memory, with a fake NCCL for the NCCL
// path, so that the strategy's own logic runs everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <thread>

#include "common/compare.h"
#include "common/error_message.h"
#include "common/fake_nccl.h"
#include "common/resume_check.h"
#include "common/small_cnn.h"
#include "common/small_models.h"
#include "common/stand_in_gpu.h"
#include "common/temp_dir.h"
#include "dtrain/comm/local_store.h"
#include "dtrain/distribute/device_reducer.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

using testing::FakeNccl;
using testing::GpuForTests;

FitOptions unshuffled(int epochs, std::int64_t batch = 64, int accumulate = 1) {
  FitOptions o;
  o.epochs = epochs;
  o.batch_size = batch;
  o.shuffle = false;
  o.verbose = 0;
  o.gradient_accumulation_steps = accumulate;
  return o;
}

class MultiGpu : public testing::TempDirTest {
 protected:
  ~MultiGpu() override { comm::set_nccl_library(nullptr); }
  // The NCCL path: the fake's ranks, where the GPUs are the stand-in's.
  void with_fake_nccl() {
    if (gpus_.stand_in()) comm::set_nccl_library(&nccl_.api);
  }
  double tolerance(double on_gpu) const { return gpus_.stand_in() ? 1e-5 : on_gpu; }
  // `make`'s model trained with `o` on cuda:0 alone, and under a MirroredStrategy over
  // cuda:0 and cuda:1; the strategy's fit's first line in `first_line`.
  template <typename Make>
  void train_both(Make make, const Tensor& x, const Tensor& y, FitOptions o, std::unique_ptr<Model>& alone,
                  std::unique_ptr<Model>& mirrored, distribute::CommunicationOptions comm = {}) {
    {
      DevicePlacement on_gpu(Device::cuda(0));
      alone = make();
      alone->fit(x, y, o);
    }
    distribute::MirroredStrategy strategy({"/gpu:0", "/gpu:1"}, comm);
    {
      auto scope = strategy.scope();
      mirrored = make();
    }
    std::ostringstream text;
    o.verbose = 2;
    o.out = &text;
    mirrored->fit(x, y, o);
    first_line = text.str().substr(0, text.str().find('\n'));
  }

  GpuForTests gpus_{2};  // first: it outlives every tensor the test makes
  FakeNccl nccl_{2};
  std::string first_line;
};

// The same global batch on two GPUs gives one GPU's weights and losses, with the sums on
// the first GPU and with NCCL, whose buckets (two of 1 KiB here) start during backward; the
// last batch of each epoch, of one row, leaves the second replica none, which starts its
// buckets in the same order all the same.
TEST_F(MultiGpu, TwoGpusTrainAsOneOnTheSameGlobalBatchSummingOnTheFirstOrWithNccl) {
  const data::Split d = data::make_synthetic(513, 10, 4, 5, data::SyntheticLabels::teacher);
  distribute::CommunicationOptions comm;
  comm.bytes_per_pack = 1024;
  for (const bool nccl : {false, true}) {
    SCOPED_TRACE(nccl ? "NCCL" : "reduction to one device");
    if (nccl) with_fake_nccl();
    std::unique_ptr<Model> alone, mirrored;
    train_both([] { return testing::three_layer_classifier(); }, d.x, d.y, unshuffled(3), alone, mirrored, comm);
    // 3 epochs of 9 steps, 2 buckets a step on each of the 2 GPUs.
    if (nccl && gpus_.stand_in()) {
      EXPECT_EQ(nccl_.beside(), 3 * 9 * 2 * 2);
    }
    EXPECT_LE(testing::relative_difference(*mirrored, *alone), tolerance(1e-4));
    EXPECT_EQ(mirrored->device(), Device::cuda(0));  // the variables themselves: the first GPU's
    EXPECT_NE(first_line.find("MirroredStrategy: 2 replicas on cuda:0, cuda:1, each with a copy of the weights on its "
                              "GPU"),
              std::string::npos)
        << first_line;
    EXPECT_NE(first_line.find(nccl ? "with NCCL while backward runs (a rank per GPU in this process)"
                                   : "after backward on cuda:0, where the update runs"),
              std::string::npos)
        << first_line;
  }
}

// Accumulated micro-batches add up on each GPU first; a synchronized batch norm sums its
// statistics across the GPUs; a plain one trains as CPU replicas do.
TEST_F(MultiGpu, AccumulationAndBatchNormsAcrossGpusMatchOneGpuOrCpuReplicas) {
  {
    SCOPED_TRACE("accumulated");
    const data::Split d = data::make_synthetic(384, 10, 4, 6, data::SyntheticLabels::teacher);
    std::unique_ptr<Model> alone, mirrored;
    train_both([] { return testing::three_layer_classifier(); }, d.x, d.y, unshuffled(2, 64, 3), alone, mirrored);
    EXPECT_LE(testing::relative_difference(*mirrored, *alone), tolerance(1e-4));
  }
  const auto [x, y] = testing::random_images(64, 21);
  {
    SCOPED_TRACE("synchronized batch norm");
    std::unique_ptr<Model> alone, mirrored;
    train_both([] { return testing::small_cnn(/*synchronized=*/true); }, x, y, unshuffled(2, 32), alone, mirrored);
    EXPECT_LE(testing::relative_difference(*mirrored, *alone), tolerance(1e-3));
  }
  {
    SCOPED_TRACE("plain batch norm");
    distribute::MirroredStrategy cpus(2);
    std::unique_ptr<Model> on_cpus;
    {
      auto scope = cpus.scope();
      on_cpus = testing::small_cnn(/*synchronized=*/false);
    }
    on_cpus->fit(x, y, unshuffled(2, 32));
    distribute::MirroredStrategy gpus({"/gpu:0", "/gpu:1"});
    std::unique_ptr<Model> m;
    {
      auto scope = gpus.scope();
      m = testing::small_cnn(/*synchronized=*/false);
    }
    m->fit(x, y, unshuffled(2, 32));
    EXPECT_LE(testing::relative_difference(*m, *on_cpus), tolerance(1e-3));
  }
}

// A custom loop: inside run() each replica reads its GPU's copy, and apply_gradients sums
// the replicas' gradients and updates the first GPU's variables, which reach the other GPU
// before the next run: two steps give one device's weights.
TEST_F(MultiGpu, ACustomLoopReadsEachGpusCopyAndUpdatesOnce) {
  const data::Split d = data::make_synthetic(64, 10, 4, 7, data::SyntheticLabels::teacher);
  auto step = [&](Model& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y, float share) {
    GradientTape tape;
    const Tensor loss = scale(losses::SparseCategoricalCrossentropy(true)(y, m(x, true)), share);
    const std::vector<Variable*> vars = m.trainable_variables();
    opt.apply_gradients(tape.gradient(loss, vars), vars);
    return loss;
  };
  std::unique_ptr<Sequential> alone;
  optim::SGD alone_opt(0.1f);
  float alone_loss = 0;
  {
    DevicePlacement on_gpu(Device::cuda(0));
    alone = testing::three_layer_classifier();
    alone->build(Shape{10});
    for (int s = 0; s < 2; ++s)
      alone_loss = step(*alone, alone_opt, d.x.to(Device::cuda(0)), d.y.to(Device::cuda(0)), 1.0f).to_vector()[0];
  }
  distribute::MirroredStrategy strategy({"/gpu:0", "/gpu:1"});
  std::unique_ptr<Sequential> m;
  std::unique_ptr<optim::SGD> opt;
  {
    auto scope = strategy.scope();
    m = testing::three_layer_classifier();
    m->build(Shape{10});
    opt = std::make_unique<optim::SGD>(0.1f);
  }
  std::vector<Device> read_on(2);
  std::optional<distribute::PerReplica<Tensor>> losses;
  for (int s = 0; s < 2; ++s)
    losses = strategy.run([&] {
      const int r = replica_context().replica_id;
      const Device gpu = Device::cuda(r);
      read_on[static_cast<std::size_t>(r)] = m->device();
      const Tensor x = d.x.slice(32 * r, 32 * (r + 1)).to(gpu), y = d.y.slice(32 * r, 32 * (r + 1)).to(gpu);
      return step(*m, *opt, x, y, 0.5f);  // each replica's half of the batch's mean
    });
  EXPECT_EQ(read_on[0], Device::cuda(0));
  EXPECT_EQ(read_on[1], Device::cuda(1));
  EXPECT_LE(testing::relative_difference(*m, *alone), tolerance(1e-4));
  // The replicas' losses, each on its GPU, summed: the batch's.
  const Tensor loss = strategy.reduce(distribute::ReduceOp::SUM, *losses);
  EXPECT_EQ(loss.device(), Device::cuda(0));
  EXPECT_NEAR(loss.to_vector()[0], alone_loss, tolerance(1e-4) * std::abs(alone_loss));
}

// A job on two GPUs stopped in its second epoch resumes from its backup to the
// uninterrupted run's weights, bit for bit.
TEST_F(MultiGpu, AnInterruptedJobResumesFromItsBackupToTheUninterruptedWeights) {
  distribute::MirroredStrategy strategy({"/gpu:0", "/gpu:1"});
  testing::expect_resumes_bit_for_bit(
      [&] {
        auto scope = strategy.scope();
        std::unique_ptr<Model> m = testing::three_layer_classifier();
        m->build(Shape{10});
        return m;
      },
      (dir_ / "backup").string());
}

// A GPU worker's reducer (its one replica an NCCL rank among the workers'), two workers as
// threads here, each on a GPU of its own: each variable's bucket (4 bytes: one each) is
// summed beside the compute stream once backward has made it, and a variable only one
// worker had a gradient for is that worker's on both.
TEST_F(MultiGpu, GpuWorkersSumEachBucketDuringBackwardAndAgreeOnWhichHadGradients) {
  if (!gpus_.stand_in()) GTEST_SKIP() << "the fake NCCL's ranks need the stand-in's host memory";
  Variable a("a", Tensor::zeros({2})), b("b", Tensor::zeros({3})), c("c", Tensor::zeros({1}));
  Variable* vars[] = {&a, &b, &c};
  auto store = std::make_shared<comm::LocalStore>("the workers' store");
  std::vector<std::vector<std::vector<float>>> got(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w)
    workers.emplace_back([&, w] {
     try {
      const Device gpu = Device::cuda(w);
      auto ranks = std::make_shared<comm::NcclGroup>(
          nccl_.api, store, comm::NcclGroupOptions{w, 2, {"worker:0", "worker:1"}, w, std::chrono::seconds(5)});
      distribute::detail::MultiGpuReducer reducer({gpu}, vars, 4, std::chrono::seconds(5), {ranks});
      const float k = static_cast<float>(w + 1);
      reducer.begin_step(true, {});
      // Backward's order: the last variable first; worker 1 has no gradient for `a`.
      reducer.gradient_ready(0, 2, Tensor::from_vector({1}, {k}).to(gpu));
      reducer.gradient_ready(0, 1, Tensor::from_vector({3}, {k, 2 * k, 3 * k}).to(gpu));
      reducer.gradient_ready(0, 0, w == 0 ? Tensor::from_vector({2}, {5, 6}).to(gpu) : Tensor());
      reducer.finish(0);
      for (const Tensor& t : reducer.reduced(0)) got[static_cast<std::size_t>(w)].push_back(t.to_vector());
     } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(w)] = e.what();
     }
    });
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  for (const auto& sums : got) {
    ASSERT_EQ(sums.size(), 3u);
    EXPECT_EQ(sums[0], (std::vector<float>{5, 6}));
    EXPECT_EQ(sums[1], (std::vector<float>{3, 6, 9}));
    EXPECT_EQ(sums[2], (std::vector<float>{3}));
  }
  EXPECT_EQ(nccl_.beside(), 3 * 2);  // a bucket a variable, on each worker
}

// Replicas on logical GPUs of two GPUs at once are refused, naming the devices.
TEST_F(MultiGpu, LogicalGpusOfSeveralGpusAreRefused) {
  set_logical_device_configuration(Device::cuda(0), {{}, {}});
  const std::string message = testing::message_of<Unsupported>(
      [] { distribute::MirroredStrategy strategy({"/gpu:0", "/gpu:1", "/gpu:2"}); });
  set_logical_device_configuration(Device::cuda(0), {});
  EXPECT_NE(message.find("'/gpu:0', '/gpu:1', '/gpu:2' are logical GPUs of several GPUs"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace dtrain
