// A GPU training step as CUDA graphs (FitOptions::cuda_graph): recorded once after two
// steps, replayed with each step's batch, the same training as kernel by kernel; where a
// step cannot be recorded, kernel by kernel with the reason. On the stand-in GPU a graph
// is the recorded primitives, replayed in order (common/stand_in_gpu.h); on a real GPU
// (scripts/gpu-check.sh) it is CUDA's.
#include <gtest/gtest.h>

#include <array>
#include <sstream>

#include "common/compare.h"
#include "common/small_cnn.h"
#include "common/stand_in_gpu.h"
#include "dtrain/dtrain.h"

namespace dtrain {
namespace {

using testing::GpuForTests;

class Graphs : public ::testing::Test {
 protected:
  GpuForTests gpu_;  // first member: it outlives every tensor the test makes
  const Device cuda0 = Device::cuda(0);
  double tolerance(double on_gpu) const { return gpu_.stand_in() ? 0.0 : on_gpu; }
};

std::unique_ptr<Sequential> graphed_mlp(float dropout = 0.0f, const std::string& policy = "float32") {
  nn::ScopedGlobalPolicy p(policy);
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(24, "gelu", nn::DenseOptions{.seed = 11});
  if (dropout > 0) m->add<nn::Dropout>(dropout, 7);
  m->add<nn::LayerNormalization>();
  m->add<nn::Dense>(12, "relu", nn::DenseOptions{.seed = 12});
  m->add<nn::Dense>(4, "", nn::DenseOptions{.seed = 13});
  // A decaying rate: the update's values change at every step.
  m->compile(std::make_shared<optim::Adam>(std::make_shared<optim::ExponentialDecay>(0.01f, 3, 0.9f)),
             std::make_shared<losses::SparseCategoricalCrossentropy>(true), {"accuracy"});
  return m;
}

FitOptions graph_options(int epochs, bool graph) {
  FitOptions o;
  o.epochs = epochs;
  o.batch_size = 64;
  o.verbose = 0;
  o.cuda_graph = graph;
  return o;
}

// Two models from the same seeds, one with graphs and one without, trained on the GPU.
struct GraphPair {
  std::unique_ptr<Sequential> graph, eager;
  History with, without;
};

GraphPair train_both(Device device, const TensorData& data, int epochs, float dropout = 0.0f, int accumulate = 1) {
  GraphPair p;
  const DevicePlacement on_gpu(device);
  p.graph = graphed_mlp(dropout);
  p.eager = graphed_mlp(dropout);
  FitOptions on = graph_options(epochs, true), off = graph_options(epochs, false);
  on.gradient_accumulation_steps = off.gradient_accumulation_steps = accumulate;
  p.with = p.graph->fit(data.x.front(), data.y.front(), on);
  p.without = p.eager->fit(data.x.front(), data.y.front(), off);
  return p;
}

TensorData graph_data(std::int64_t rows) {
  const data::Split d = data::make_synthetic(rows, 10, 4, 5, data::SyntheticLabels::teacher);
  TensorData t;
  t.x = {d.x};
  t.y = {d.y};
  return t;
}

// 600 rows in batches of 64: nine full batches and one of 24 an epoch. The first two steps
// run kernel by kernel, the third is captured and replayed, and so is every full batch
// after it; the short ones run kernel by kernel without a new capture. The weights, losses
// and accuracies are those of the steps run kernel by kernel.
TEST_F(Graphs, ReplayedStepsTrainAsKernelByKernelAndShortBatchesRunWithoutThem) {
  const TensorData d = graph_data(600);
  const std::uint64_t replays_before = gpu_.stand_in() ? gpu_.stand_in_runtime()->replays() : 0;
  const GraphPair p = train_both(cuda0, d, 3);
  EXPECT_EQ(p.with.cuda_graph.not_used, "");
  EXPECT_EQ(p.with.cuda_graph.captures, 1);
  EXPECT_EQ(p.with.cuda_graph.replays, 7 + 9 + 9);
  EXPECT_EQ(p.without.cuda_graph.replays, 0);
  EXPECT_EQ(p.without.cuda_graph.captures, 0);
  if (gpu_.stand_in()) {  // two graphs a step: forward with the loss, then backward
    EXPECT_EQ(gpu_.stand_in_runtime()->replays() - replays_before, 2u * 25u);
  }
  EXPECT_LE(testing::relative_difference(*p.graph, *p.eager), tolerance(1e-5));
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(p.with.history.at("loss")[e], p.without.history.at("loss")[e],
                tolerance(1e-5) * p.without.history.at("loss")[e]);
    EXPECT_NEAR(p.with.history.at("accuracy")[e], p.without.history.at("accuracy")[e], tolerance(1e-2));
  }
  EXPECT_EQ(p.graph->optimizer().iterations(), p.eager->optimizer().iterations());
  // The GPU's time is still split into forward, backward and update.
  for (const profile::Phase phase : {profile::Phase::forward, profile::Phase::backward, profile::Phase::optimizer})
    EXPECT_GT(p.with.profile.back().gpu[static_cast<int>(phase)], 0.0) << profile::phase_name(phase);
}

// Under mixed_float16 with a dynamic loss scale from 2^30, the first steps overflow and
// the scale halves: backward starts from the loss times the scale, so each new scale is
// captured again; the skipped steps, the scale and the weights are kernel by kernel's.
TEST_F(Graphs, ANewLossScaleIsCapturedAgain) {
  const TensorData d = graph_data(640);
  const DevicePlacement on_gpu(cuda0);
  std::array<std::unique_ptr<Sequential>, 2> models{graphed_mlp(0.0f, "mixed_float16"),
                                                     graphed_mlp(0.0f, "mixed_float16")};
  std::array<History, 2> histories;
  for (std::size_t i = 0; i < 2; ++i) {
    models[i]->optimizer().set_loss_scale(optim::LossScale{.dynamic = true, .initial_scale = 1073741824.0f});
    histories[i] = models[i]->fit(d.x.front(), d.y.front(), graph_options(2, i == 0));
  }
  const optim::Optimizer &graphed = models[0]->optimizer(), &eager = models[1]->optimizer();
  ASSERT_GT(eager.skipped_updates(), 2);
  EXPECT_GT(histories[0].cuda_graph.captures, 1);
  EXPECT_GT(histories[0].cuda_graph.replays, 0);
  EXPECT_EQ(graphed.skipped_updates(), eager.skipped_updates());
  EXPECT_EQ(graphed.loss_scale(), eager.loss_scale());
  EXPECT_EQ(graphed.iterations(), eager.iterations());
  EXPECT_LE(testing::relative_difference(*models[0], *models[1]), tolerance(2e-3));
}

// A conv net with batch normalization (convolutions, pooling, the moving statistics
// updated in place by the graph) replays as it trains kernel by kernel.
TEST_F(Graphs, AConvNetWithBatchNormReplaysAsKernelByKernel) {
  const auto [x, y] = testing::random_images(96, 5);
  std::array<std::unique_ptr<Model>, 2> models;
  std::array<History, 2> histories;
  for (std::size_t i = 0; i < 2; ++i) {
    const DevicePlacement on_gpu(cuda0);
    models[i] = testing::small_cnn(false);
    FitOptions o = graph_options(2, i == 0);
    o.batch_size = 16;
    histories[i] = models[i]->fit(x, y, o);
  }
  EXPECT_EQ(histories[0].cuda_graph.not_used, "");
  EXPECT_EQ(histories[0].cuda_graph.captures, 1);
  EXPECT_EQ(histories[0].cuda_graph.replays, 12 - 2);
  EXPECT_LE(testing::relative_difference(*models[0], *models[1]), tolerance(1e-4));
  EXPECT_NEAR(histories[0].history.at("loss")[1], histories[1].history.at("loss")[1],
              tolerance(1e-4) * histories[1].history.at("loss")[1]);
}

// A replayed step allocates nothing for its forward and backward (their memory is the
// graph's), and waits for the device as often as a step run kernel by kernel.
// A variable whose storage moves (here its value is held by a callback after the fifth step,
// so the next update writes to a copy, as TensorFlow's variables copy on write) is read
// and written where it is now: the step is captured again, and trains as kernel by kernel.
TEST_F(Graphs, AVariableWhoseStorageMovedIsCapturedAgain) {
  const TensorData d = graph_data(640);
  const DevicePlacement on_gpu(cuda0);
  std::array<std::unique_ptr<Sequential>, 2> models{graphed_mlp(), graphed_mlp()};
  std::array<History, 2> histories;
  std::vector<Tensor> held;
  for (std::size_t i = 0; i < 2; ++i) {
    Sequential& m = *models[i];
    auto hold = std::make_shared<LambdaCallback>();
    hold->batch_end = [&](std::int64_t batch, const Logs&) {
      if (batch == 4 && held.size() == i) held.push_back(m.layers().front()->trainable_variables().front()->value());
    };
    FitOptions o = graph_options(2, i == 0);
    o.callbacks = {hold};
    histories[i] = m.fit(d.x.front(), d.y.front(), o);
  }
  EXPECT_EQ(histories[0].cuda_graph.captures, 2);
  EXPECT_EQ(histories[0].cuda_graph.replays, 18);
  EXPECT_LE(testing::relative_difference(*models[0], *models[1]), tolerance(1e-5));
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].to_vector(), held[1].to_vector());
}

TEST_F(Graphs, AReplayedStepAllocatesLessAndWaitsNoMore) {
  const TensorData d = graph_data(640);
  DeviceRuntime& runtime = *device_runtime(DeviceType::cuda);
  const DevicePlacement on_gpu(cuda0);
  auto graph = graphed_mlp(), eager = graphed_mlp();
  graph->fit(d.x.front(), d.y.front(), graph_options(1, true));  // warm-up and capture
  eager->fit(d.x.front(), d.y.front(), graph_options(1, false));
  auto measure = [&](Model& m, bool on) {
    const DeviceMemoryStats before = runtime.memory_stats(0);
    const std::uint64_t waits = runtime.host_waits(0);
    m.fit(d.x.front(), d.y.front(), graph_options(2, on));
    return std::pair{runtime.memory_stats(0).allocations - before.allocations, runtime.host_waits(0) - waits};
  };
  const auto [graph_allocations, graph_waits] = measure(*graph, true);
  const auto [eager_allocations, eager_waits] = measure(*eager, false);
  EXPECT_LT(graph_allocations, eager_allocations);
  EXPECT_EQ(graph_waits, eager_waits);
}

// Dropout draws its seed on the host at each call, which a graph would replay unchanged:
// the steps run kernel by kernel, say why, and train as with graphs off (the refused
// capture drew nothing). Accumulated gradients run kernel by kernel too, and say so.
TEST_F(Graphs, WhereAStepCannotBeCapturedItRunsKernelByKernelAndSaysWhy) {
  const TensorData d = graph_data(320);
  const GraphPair dropout = train_both(cuda0, d, 2, 0.25f);
  EXPECT_NE(dropout.with.cuda_graph.not_used.find("layer 'dropout"), std::string::npos)
      << dropout.with.cuda_graph.not_used;
  EXPECT_NE(dropout.with.cuda_graph.not_used.find("seed is drawn on the host"), std::string::npos);
  EXPECT_EQ(dropout.with.cuda_graph.replays, 0);
  EXPECT_EQ(dropout.with.cuda_graph.captures, 0);
  EXPECT_LE(testing::relative_difference(*dropout.graph, *dropout.eager), tolerance(1e-5));
  const GraphPair accumulated = train_both(cuda0, d, 2, 0.0f, 2);
  EXPECT_NE(accumulated.with.cuda_graph.not_used.find("gradient accumulation"), std::string::npos)
      << accumulated.with.cuda_graph.not_used;
  EXPECT_EQ(accumulated.with.cuda_graph.replays, 0);
  // fit says it where it prints.
  std::ostringstream out;
  FitOptions o = graph_options(1, true);
  o.verbose = 2;
  o.out = &out;
  {
    const DevicePlacement on_gpu(cuda0);
    graphed_mlp(0.25f)->fit(d.x.front(), d.y.front(), o);
  }
  EXPECT_NE(out.str().find("The steps ran kernel by kernel, not as a CUDA graph: layer 'dropout"), std::string::npos)
      << out.str();
  // On the CPU there is nothing to say.
  std::unique_ptr<Sequential> cpu = graphed_mlp(0.25f);
  EXPECT_EQ(cpu->fit(d.x.front(), d.y.front(), graph_options(1, true)).cuda_graph.not_used, "");
}

// The runtime records a device's work and replays it with the values its inputs hold
// then; a call that would make the host wait, or copy host memory, throws naming itself.
TEST_F(Graphs, ACaptureRecordsDeviceWorkAndRefusesTheHost) {
  DeviceRuntime& runtime = *device_runtime(DeviceType::cuda);
  ASSERT_TRUE(runtime.can_capture(0));
  const Tensor x = Tensor::from_vector({3}, {1.0f, 2.0f, 3.0f}).to(cuda0);
  Tensor y;
  runtime.begin_capture(0);
  EXPECT_TRUE(runtime.capturing(0));
  EXPECT_TRUE(capturing_a_graph());
  try {
    y = add(mul(x, x), x);  // x² + x; x² is freed within the capture, its memory the graph's
    (void)y.to_vector();
    ADD_FAILURE() << "a copy to the host was recorded";
  } catch (const NotCapturable& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be part of a CUDA graph"), std::string::npos) << e.what();
  }
  const DeviceGraph graph = runtime.end_capture(0, /*keep=*/true);
  EXPECT_FALSE(runtime.capturing(0));
  EXPECT_FALSE(capturing_a_graph());
  ASSERT_NE(graph, nullptr);
  // Tensors made after the capture never get the graph's memory: replays leave them be.
  std::vector<Tensor> after;
  for (int i = 0; i < 4; ++i) after.push_back(Tensor::full({3}, 7.0f).to(cuda0));
  for (const float v : {2.0f, -1.0f}) {
    const_cast<Tensor&>(x).copy_from(Tensor::full({3}, v));
    runtime.replay(0, graph);
    EXPECT_EQ(y.to_vector(), std::vector<float>(3, v * v + v)) << v;
    for (const Tensor& t : after) EXPECT_EQ(t.to_vector(), std::vector<float>(3, 7.0f)) << v;
  }
  // Abandoned, the capture leaves the device as it was.
  runtime.begin_capture(0);
  (void)add(x, x);
  EXPECT_EQ(runtime.end_capture(0, /*keep=*/false), nullptr);
  EXPECT_FALSE(capturing_a_graph());
  EXPECT_NO_THROW(runtime.synchronize(0));
}

}  // namespace
}  // namespace dtrain
