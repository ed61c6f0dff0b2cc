// Training on a GPU as TensorFlow users expect it: weights where the placement says, inputs
// copied to them, nothing read on the host behind the caller's back, checkpoints that do not
// depend on the device, out-of-memory errors that name the layer. The same tests run on a
// real GPU (scripts/gpu-check.sh) and, in CI, on the stand-in GPU (common/stand_in_gpu.h).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <cstring>
#include <limits>

#include "common/compare.h"
#include "common/error_message.h"
#include "common/gradcheck.h"
#include "common/small_cnn.h"
#include "common/stage_clocks.h"
#include "common/stand_in_gpu.h"
#include "common/temp_dir.h"
#include "dtrain/core/device_staging.h"
#include "dtrain/dtrain.h"
#include "dtrain/model/device_batches.h"

namespace dtrain {
namespace {

using testing::GpuForTests;

class Gpu : public testing::TempDirTest {
 protected:
  GpuForTests gpu_;  // first member: it outlives every tensor the test makes
  const Device cuda0 = Device::cuda(0);
  // On the stand-in the GPU computes with the CPU's kernels: results are the CPU's, bit
  // for bit. On a real GPU they agree to rounding, within `on_gpu`.
  double tolerance(double on_gpu) const { return gpu_.stand_in() ? 0.0 : on_gpu; }
};

std::unique_ptr<Sequential> mlp(const std::string& policy = "float32", float dropout = 0.0f) {
  nn::ScopedGlobalPolicy p(policy);
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(32, "relu", nn::DenseOptions{.seed = 1});
  if (dropout > 0) m->add<nn::Dropout>(dropout, 7);
  m->add<nn::Dense>(16, "tanh", nn::DenseOptions{.seed = 2});
  m->add<nn::Dense>(4, "", nn::DenseOptions{.seed = 3});
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, /*from_logits=*/true);
  return m;
}

FitOptions quiet(int epochs) {
  FitOptions o;
  o.epochs = epochs;
  o.batch_size = 64;
  o.verbose = 0;
  return o;
}

TEST_F(Gpu, HostCodeCannotReadAGpuTensorAndCopiesRoundTrip) {
  const Tensor host = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor on_gpu = host.to(cuda0);
  EXPECT_EQ(on_gpu.device(), cuda0);
  EXPECT_FALSE(on_gpu.on_cpu());
  EXPECT_EQ(on_gpu.to(cuda0).raw_device_data(), on_gpu.raw_device_data());  // already there: no copy
  const std::string m = testing::message_of([&] { (void)on_gpu.data<float>(); });
  EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_EQ(on_gpu.to_vector(), host.to_vector());
  EXPECT_EQ(on_gpu.slice(1, 2).to_vector(), (std::vector<float>{4, 5, 6}));
  const Tensor copy = on_gpu.clone();
  EXPECT_EQ(copy.device(), cuda0);
  EXPECT_NE(copy.raw_device_data(), on_gpu.raw_device_data());
  Tensor back = Tensor::empty({2, 3});
  back.copy_from(copy);
  EXPECT_EQ(back.to_vector(), host.to_vector());
  EXPECT_EQ(Tensor::zeros({5}, DType::f32, cuda0).to_vector(), std::vector<float>(5, 0.0f));
  const Tensor half = on_gpu.astype(DType::bf16);
  EXPECT_EQ(half.device(), cuda0);
  EXPECT_EQ(half.dtype(), DType::bf16);
  EXPECT_EQ(half.to_vector(), host.to_vector());  // small integers are exact in bfloat16
  EXPECT_FLOAT_EQ(on_gpu.slice(1, 2).reshape({3}).to(Device::cpu()).data<float>()[2], 6.0f);
}

TEST_F(Gpu, OpsRunWhereTheirInputsAreAndNameAMixOfDevices) {
  const Tensor a = Tensor::from_vector({3}, {1, 2, 3}).to(cuda0), b = Tensor::from_vector({3}, {4, 5, 6});
  const Tensor c = add(a, b.to(cuda0));
  EXPECT_EQ(c.device(), cuda0);
  EXPECT_EQ(c.to_vector(), (std::vector<float>{5, 7, 9}));
  const std::string m = testing::message_of([&] { add(a, b); });
  EXPECT_NE(m.find("cpu:0"), std::string::npos) << m;
  EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
  // Gradients come back on the variables' device.
  Variable v("v", Tensor::from_vector({3}, {1, -2, 3}).to(cuda0));
  GradientTape tape;
  const Tensor loss = reduce_sum(square(v.value()));
  const std::vector<Tensor> grads = tape.gradient(loss, std::vector<Variable*>{&v});
  EXPECT_EQ(grads[0].device(), cuda0);
  EXPECT_EQ(grads[0].to_vector(), (std::vector<float>{2, -4, 6}));
}

TEST_F(Gpu, WeightsAreMadeWhereThePlacementSaysAndInputsFollowThem) {
  auto model = mlp();
  {
    DevicePlacement on_gpu(cuda0);
    model->build({10});
  }
  EXPECT_EQ(model->device(), cuda0);
  for (const Variable* v : model->variables()) EXPECT_EQ(v->value_device(), cuda0) << v->name();
  const Tensor x = testing::random_tensor({5, 10}, 4);
  const Tensor y = (*model)(x);  // a host batch is copied to the weights' device
  EXPECT_EQ(y.device(), cuda0);
  const Tensor p = model->predict(x, 2);  // predictions come back to the host
  EXPECT_TRUE(p.on_cpu());
  const std::vector<float> yv = y.to_vector(), pv = p.to_vector();
  for (std::size_t i = 0; i < yv.size(); ++i) EXPECT_NEAR(pv[i], yv[i], 1e-6) << i;
  auto on_cpu = mlp();
  on_cpu->build({10});
  EXPECT_EQ(on_cpu->device(), Device::cpu());
}

// The same seeds, data and batches on the GPU and on the CPU: the same training.
TEST_F(Gpu, FitOnTheGpuTrainsAsOnTheCpu) {
  const data::Split d = data::make_synthetic(640, 10, 4, 5, data::SyntheticLabels::teacher);
  auto cpu = mlp(), gpu = mlp();
  const History hc = cpu->fit(d.x, d.y, quiet(3));
  const std::uint64_t beside = gpu_.stand_in() ? gpu_.stand_in_runtime()->copies_beside() : 0;
  History hg;
  {
    DevicePlacement on_gpu(cuda0);
    hg = gpu->fit(d.x, d.y, quiet(3));
  }
  // The arrays' batches were drawn a step ahead and copied beside the compute stream: x
  // and y of ten batches in each of three epochs.
  if (gpu_.stand_in()) {
    EXPECT_EQ(gpu_.stand_in_runtime()->copies_beside() - beside, 60u);
  }
  EXPECT_EQ(gpu->device(), cuda0);
  EXPECT_LE(testing::relative_difference(*gpu, *cpu), tolerance(1e-4));
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(hg.history.at("loss")[e], hc.history.at("loss")[e], tolerance(1e-4) * hc.history.at("loss")[e]);
    EXPECT_NEAR(hg.history.at("accuracy")[e], hc.history.at("accuracy")[e], tolerance(1e-2));
  }
  EXPECT_LT(hg.history.at("loss")[2], hg.history.at("loss")[0]);
  // The batches' handing over to the GPU and the waits for it are phases of the step; the
  // CPU has neither.
  EXPECT_GT(hg.profile.back().phases[static_cast<int>(profile::Phase::to_device)], 0.0);
  EXPECT_EQ(hc.profile.back().phases[static_cast<int>(profile::Phase::to_device)], 0.0);
  EXPECT_EQ(hc.profile.back().phases[static_cast<int>(profile::Phase::device_wait)], 0.0);
  // The GPU's own time in the forward, backward and update, from events on its stream.
  for (const profile::Phase p : {profile::Phase::forward, profile::Phase::backward, profile::Phase::optimizer})
    EXPECT_GT(hg.profile.back().gpu[static_cast<int>(p)], 0.0) << profile::phase_name(p);
  EXPECT_EQ(hc.profile.back().gpu_seconds(), 0.0);
  // Evaluation on the GPU agrees too, its batches copied a batch ahead as fit's.
  const Logs ec = cpu->evaluate(d.x, d.y);
  const std::uint64_t before_evaluation = gpu_.stand_in() ? gpu_.stand_in_runtime()->copies_beside() : 0;
  const Logs eg = gpu->evaluate(d.x, d.y);
  EXPECT_NEAR(eg.at("loss"), ec.at("loss"), tolerance(1e-4) * ec.at("loss"));
  if (gpu_.stand_in()) {
    EXPECT_EQ(gpu_.stand_in_runtime()->copies_beside() - before_evaluation, 40u);  // x and y of 20 batches of 32
  }
}

// prefetch_to_device delivers each element on the GPU, equal to the host's, and reuses a
// device buffer only once nothing holds a tensor over it.
TEST_F(Gpu, PrefetchToDeviceDeliversOnTheGpuAndReusesBuffersOnlyWhenFree) {
  const data::Split d = data::make_synthetic(640, 10, 4, 7);
  const data::Dataset ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(64).prefetch_to_device(cuda0, 2);
  std::vector<data::Element> held;  // every element at once: no buffer may be reused under them
  {
    data::Iterator it = ds.make_iterator();
    while (std::optional<data::Element> e = it.next()) held.push_back(*e);
  }
  ASSERT_EQ(held.size(), 10u);
  for (std::size_t i = 0; i < held.size(); ++i) {
    const auto begin = static_cast<std::int64_t>(i) * 64;
    for (std::size_t c = 0; c < 2; ++c) {
      EXPECT_EQ(held[i][c].device(), cuda0) << i;
      const Tensor want = (c == 0 ? d.x : d.y).slice(begin, begin + 64);
      EXPECT_EQ(held[i][c].shape(), want.shape());
      EXPECT_EQ(held[i][c].dtype(), want.dtype());
      EXPECT_EQ(std::memcmp(held[i][c].to(Device::cpu()).raw_data(), want.raw_data(), want.nbytes()), 0) << i << " " << c;
    }
  }
  // Staged one at a time and dropped, as a training loop drops its batches: one buffer.
  DeviceStaging staging(cuda0);
  for (int i = 0; i < 5; ++i) {
    const Tensor host = testing::random_tensor({33, 7}, static_cast<std::uint64_t>(50 + i));
    EXPECT_EQ(staging.stage(host).to_vector(), host.to_vector()) << i;
  }
  EXPECT_EQ(staging.buffers_made(), 1u);
  {
    const Tensor a = staging.stage(testing::random_tensor({33, 7}, 60)), b = staging.stage(testing::random_tensor({3}, 61));
    EXPECT_EQ(staging.buffers_made(), 2u);  // a holds the first buffer; b fits in a new one
    EXPECT_EQ(a.to_vector(), testing::random_tensor({33, 7}, 60).to_vector());
  }
  // A tensor already there comes back as it is; strings stay on the CPU.
  const Tensor there = Tensor::zeros({4}, DType::f32, cuda0);
  EXPECT_EQ(staging.stage(there).raw_device_data(), there.raw_device_data());
  const Tensor words = Tensor::from_vector({2}, std::vector<std::string>{"a", "b"});
  EXPECT_TRUE(staging.stage(words).on_cpu());
  const std::string m = testing::message_of([] { DeviceStaging cpu_staging{Device::cpu()}; });
  EXPECT_NE(m.find("not to the CPU"), std::string::npos) << m;
}

// prefetch_to_device keeps its thread even where the consumer's compute threads take every
// core and the producer computes (an AUTOTUNE prefetch would pull in the consumer's thread
// there): inline, the copy would be the training step's.
TEST_F(Gpu, PrefetchToDeviceKeepsItsThreadWhereAPrefetchWouldGoInline) {
  set_num_threads(available_cores());
  auto identity = [](const data::Element& e) { return e; };
  auto plain = testing::run_under(data::Dataset::range(40).map(identity).prefetch(data::AUTOTUNE),
                                  testing::producer_clocks(true));
  auto to_gpu = testing::run_under(data::Dataset::range(40).map(identity).prefetch_to_device(cuda0),
                                   testing::producer_clocks(true));
  int n = 0;
  while (plain->next()) {
    const std::optional<data::Element> e = to_gpu->next();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ((*e)[0].device(), cuda0);
    ++n;
  }
  EXPECT_EQ(n, 40);
  EXPECT_FALSE(to_gpu->next().has_value());
  EXPECT_TRUE(testing::went_inline(*plain));  // the rule applies here
  EXPECT_FALSE(testing::went_inline(*to_gpu));
  set_num_threads(0);
}

// fit's arrays on a GPU are drawn and copied a step ahead on a thread of their own: the
// batches and their order are those drawn on the training thread, through epochs and a
// change of batch size within one (the batch drawn ahead is put back).
TEST_F(Gpu, ArraysDrawnAStepAheadKeepTheirOrderThroughEpochsAndABatchSizeChange) {
  const data::Split d = data::make_synthetic(100, 3, 2, 9);
  const TensorData all(d.x, d.y);
  detail::TensorBatches plain(all, 16, /*shuffle=*/true, 5, false), inner(all, 16, /*shuffle=*/true, 5, false);
  detail::DeviceBatches staged(inner, cuda0);
  EXPECT_EQ(staged.steps(), plain.steps());
  for (int epoch = 0; epoch < 2; ++epoch) {
    plain.begin_epoch(epoch);
    staged.begin_epoch(epoch);
    TensorData a, b;
    int n = 0;
    while (plain.next(a)) {
      ASSERT_TRUE(staged.next(b)) << epoch << " " << n;
      ASSERT_EQ(b.x[0].device(), cuda0);
      EXPECT_EQ(b.x[0].to_vector(), a.x[0].to_vector()) << epoch << " " << n;
      EXPECT_EQ(b.y[0].to(Device::cpu()).to_vector(), a.y[0].to_vector()) << epoch << " " << n;
      if (epoch == 1 && ++n == 2) {
        ASSERT_TRUE(plain.set_batch_size(10));
        ASSERT_TRUE(staged.set_batch_size(10));
      }
    }
    EXPECT_FALSE(staged.next(b)) << epoch;
  }
}

// fit on the GPU from a Dataset: the batches come through prefetch_to_device (copied beside
// the compute stream), and the run is the CPU's.
TEST_F(Gpu, FitFromADatasetOnTheGpuPrefetchesToTheDevice) {
  const data::Split d = data::make_synthetic(640, 10, 4, 5, data::SyntheticLabels::teacher);
  const data::Dataset ds = data::Dataset::from_tensor_slices({d.x, d.y}).batch(64);
  auto cpu = mlp(), gpu = mlp();
  const History hc = cpu->fit(ds, quiet(2));
  const std::uint64_t beside = gpu_.stand_in() ? gpu_.stand_in_runtime()->copies_beside() : 0;
  History hg;
  {
    DevicePlacement on_gpu(cuda0);
    hg = gpu->fit(ds, quiet(2));
  }
  EXPECT_EQ(gpu->device(), cuda0);
  EXPECT_LE(testing::relative_difference(*gpu, *cpu), tolerance(1e-4));
  for (std::size_t e = 0; e < 2; ++e)
    EXPECT_NEAR(hg.history.at("loss")[e], hc.history.at("loss")[e], tolerance(1e-4) * hc.history.at("loss")[e]);
  // Both tensors of all ten batches of each epoch were staged.
  if (gpu_.stand_in()) {
    EXPECT_EQ(gpu_.stand_in_runtime()->copies_beside() - beside, 40u);
  }
  const Logs ec = cpu->evaluate(ds), eg = gpu->evaluate(ds);
  EXPECT_NEAR(eg.at("loss"), ec.at("loss"), tolerance(1e-4) * ec.at("loss"));
}

// A trace of a GPU run has each kernel the step queued (on the stand-in, each primitive) on
// the compute stream's row, inside the phase (forward, backward, optimizer) that queued it.
// Kernels are timed in the traced steps only: not in validation, nor after fit.
// The input pipeline's copies (fit's arrays are staged a batch ahead on the transfer
// stream) are a row of their own.
TEST_F(Gpu, TheTraceHasEachKernelInsideItsPhaseAndEachCopyOnItsRow) {
  const data::Split d = data::make_synthetic(256, 10, 4, 5, data::SyntheticLabels::teacher);
  auto model = mlp();
  const std::string path = (dir_ / "trace.json").string();
  FitOptions o = quiet(1);
  o.callbacks = {std::make_shared<ProfilerCallback>(path)};  // every step, the last one before validation
  o.validation_data = TensorData(d.x.slice(0, 64), d.y.slice(0, 64));
  {
    DevicePlacement on_gpu(cuda0);
    model->fit(d.x, d.y, o);
  }
  if (gpu_.stand_in()) {
    EXPECT_FALSE(gpu_.stand_in_backend()->timing_kernels());
    EXPECT_FALSE(gpu_.stand_in_runtime()->timing_copies());
  }
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  int stream = -1, transfers = -1;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      if (e["args"]["name"] == "cuda:0 compute stream") stream = e["tid"];
      if (e["args"]["name"] == "cuda:0 transfer stream") transfers = e["tid"];
    }
  ASSERT_GE(stream, 0) << "no compute stream row";
  ASSERT_GE(transfers, 0) << "no transfer stream row";
  // Batches 3 and 4 (x and y each) were drawn after the first traced step started (batch 2
  // may have been copied before it, as batch 1 was).
  int copies = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == transfers) {
      EXPECT_EQ(e["name"], "host-to-device copy");
      EXPECT_EQ(e["cat"], "to device");
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      ++copies;
    }
  EXPECT_GE(copies, 4);
  std::vector<nlohmann::json> phases, kernels;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == stream) (e["name"] == e["cat"] ? phases : kernels).push_back(e);
  // Four traced steps of three layers: at least a matmul each forward and two backward.
  ASSERT_GE(kernels.size(), 36u);
  ASSERT_GE(phases.size(), 12u);
  for (const auto& k : kernels) {
    const double begin = k["ts"], end = begin + k["dur"].get<double>();
    bool inside = false;
    for (const auto& p : phases) {
      const double pb = p["ts"], pe = pb + p["dur"].get<double>();
      inside |= p["cat"] == k["cat"] && begin >= pb - 1.0 && end <= pe + 1.0;  // the trace rounds to 1 ns
    }
    EXPECT_TRUE(inside) << k.dump();
  }
}

// Mixed precision (bfloat16 or float16 matmuls; float16's loss scale checking each step's
// gradients on the device) and dropout's masks: the masks are the same function of the
// seed on either device, so the runs still agree.
TEST_F(Gpu, MixedPrecisionAndDropoutTrainAsOnTheCpu) {
  const data::Split d = data::make_synthetic(256, 10, 4, 6, data::SyntheticLabels::teacher);
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    auto cpu = mlp(policy, 0.25f), gpu = mlp(policy, 0.25f);
    cpu->fit(d.x, d.y, quiet(2));
    {
      DevicePlacement on_gpu(cuda0);
      gpu->fit(d.x, d.y, quiet(2));
    }
    EXPECT_LE(testing::relative_difference(*gpu, *cpu), tolerance(2e-3)) << policy;
    EXPECT_EQ(gpu->optimizer().loss_scale(), cpu->optimizer().loss_scale()) << policy;
    EXPECT_EQ(gpu->optimizer().loss_scale_good_steps(), cpu->optimizer().loss_scale_good_steps()) << policy;
  }
}

// Under mixed_float16 the loss scale's check of each step's gradients is queued before the
// update, which skips itself on the device where the check fails: a step waits for its
// loss alone, as in float32, and the steps that overflow are skipped as on the CPU. The
// scale starts at 2^24, so the first steps' float16 gradients overflow.
TEST_F(Gpu, ALossScaleChecksEachStepWithoutAWaitOfItsOwn) {
  const data::Split d = data::make_synthetic(256, 10, 4, 6, data::SyntheticLabels::teacher);
  DeviceRuntime& runtime = *device_runtime(DeviceType::cuda);
  auto waits_in_fit = [&](Model& m) {
    const std::uint64_t before = runtime.host_waits(0);
    DevicePlacement on_gpu(cuda0);
    m.fit(d.x, d.y, quiet(3));
    return runtime.host_waits(0) - before;
  };
  auto scaled = [](std::unique_ptr<Sequential> m) {
    m->optimizer().set_loss_scale(optim::LossScale{.dynamic = true, .initial_scale = 16777216.0f});
    return m;
  };
  std::unique_ptr<Sequential> f32, gpu;
  {
    DevicePlacement on_gpu(cuda0);
    f32 = mlp();
    gpu = scaled(mlp("mixed_float16"));
  }
  auto cpu = scaled(mlp("mixed_float16"));
  cpu->fit(d.x, d.y, quiet(3));
  const std::uint64_t waits = waits_in_fit(*f32);
  // 12 steps, each reading its loss, then the accuracy's classes and labels in one copy,
  // and no more (the updates' non-finite flag is read once the stream has passed them).
  EXPECT_LE(waits, 2u * 12u);
  EXPECT_EQ(waits_in_fit(*gpu), waits);
  ASSERT_GT(cpu->optimizer().skipped_updates(), 0);
  EXPECT_EQ(gpu->optimizer().skipped_updates(), cpu->optimizer().skipped_updates());
  EXPECT_EQ(gpu->optimizer().iterations(), cpu->optimizer().iterations());
  EXPECT_EQ(gpu->optimizer().loss_scale(), cpu->optimizer().loss_scale());
  EXPECT_EQ(gpu->optimizer().loss_scale_good_steps(), cpu->optimizer().loss_scale_good_steps());
  EXPECT_LE(testing::relative_difference(*gpu, *cpu), tolerance(2e-3));
}

// A check left to settle whose update could not be queued (here the first update's slots
// find the device full) ends with the call that threw, counted as the check that waits
// counts it; the next steps check and update as usual.
TEST_F(Gpu, ALossScaleCheckEndsWithTheUpdateThatFailed) {
  if (!gpu_.stand_in()) GTEST_SKIP() << "fills the stand-in's memory";
  Variable w("w", Tensor::full({12345}, 1.0f).to(cuda0));
  const Tensor good = Tensor::full({12345}, 2.0f).to(cuda0);
  optim::Adam adam(0.01f);
  adam.set_loss_scale(optim::LossScale{});
  gpu_.stand_in_runtime()->set_limit(1);  // no fresh device memory: the slots cannot be made
  EXPECT_THROW(adam.apply_scaled_gradients(std::span(&good, 1), std::span<Variable* const>({&w}), true),
               ResourceExhausted);
  gpu_.stand_in_runtime()->set_limit(0);
  EXPECT_EQ(adam.iterations(), 0);
  EXPECT_EQ(adam.loss_scale_good_steps(), 1);
  const std::vector<float> before = w.value().to_vector();
  adam.apply_scaled_gradients(std::span(&good, 1), std::span<Variable* const>({&w}), true);  // no check under way
  adam.settle_loss_scale();
  EXPECT_EQ(adam.iterations(), 1);
  EXPECT_NE(w.value().to_vector(), before);
}

// The accuracies on a GPU read each row's class and its label (or its target's class)
// with one copy, and count as on the CPU, a sequence's steps and weights included.
TEST_F(Gpu, AccuracyReadsClassesAndLabelsWithOneCopy) {
  const std::int64_t n = 37, classes = 6;
  std::vector<float> logits, dist(static_cast<std::size_t>(n * classes), 0.0f), weights;
  std::vector<std::int32_t> labels;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t c = 0; c < classes; ++c) logits.push_back(static_cast<float>((i * 7 + c * 5) % 11));
    labels.push_back(static_cast<std::int32_t>((i * 3) % classes));
    dist[static_cast<std::size_t>(i * classes + (i * 5) % classes)] = 1.0f;
    weights.push_back(0.5f + static_cast<float>(i % 4));
  }
  const Tensor x = Tensor::from_vector({n, classes}, logits), t = Tensor::from_vector({n, classes}, dist);
  const Tensor y = Tensor::from_vector({n}, labels), w = Tensor::from_vector({n}, weights);
  DeviceRuntime& runtime = *device_runtime(DeviceType::cuda);
  metrics::SparseCategoricalAccuracy sparse_cpu, sparse_gpu;
  metrics::CategoricalAccuracy dense_cpu, dense_gpu;
  sparse_cpu.update_state(y, x);
  sparse_cpu.update_state(y, x, w);
  sparse_cpu.update_state(y.reshape({1, n}), x.reshape({1, n, classes}));  // a sequence's steps
  sparse_cpu.update_state(y.reshape({n, 1}), x);
  dense_cpu.update_state(t, x);
  const Tensor xg = x.to(cuda0), tg = t.to(cuda0), yg = y.to(cuda0);
  std::uint64_t before = runtime.host_waits(0);
  sparse_gpu.update_state(yg, xg);
  EXPECT_EQ(runtime.host_waits(0) - before, 1u);
  sparse_gpu.update_state(yg, xg, w);
  sparse_gpu.update_state(yg.reshape({1, n}), xg.reshape({1, n, classes}));
  sparse_gpu.update_state(yg.reshape({n, 1}), xg);
  before = runtime.host_waits(0);
  dense_gpu.update_state(tg, xg);
  EXPECT_EQ(runtime.host_waits(0) - before, 1u);
  EXPECT_GT(sparse_cpu.total(), 0.0);
  EXPECT_EQ(sparse_gpu.total(), sparse_cpu.total());
  EXPECT_EQ(sparse_gpu.count(), sparse_cpu.count());
  EXPECT_GT(dense_cpu.total(), 0.0);
  EXPECT_EQ(dense_gpu.total(), dense_cpu.total());
  EXPECT_EQ(dense_gpu.count(), dense_cpu.count());
}

// A residual CNN (convolutions, batch norm with a fused relu, max and global average
// pooling, an addition) trains on the GPU as on the CPU; its moving statistics too.
TEST_F(Gpu, AConvNetWithBatchNormTrainsAsOnTheCpu) {
  const auto [x, y] = testing::random_images(64, 3);
  auto cpu = testing::small_cnn(false);
  std::unique_ptr<Model> gpu;
  {
    DevicePlacement on_gpu(cuda0);
    gpu = testing::small_cnn(false);
  }
  cpu->fit(x, y, quiet(2));
  {
    DevicePlacement on_gpu(cuda0);
    gpu->fit(x, y, quiet(2));
  }
  EXPECT_EQ(gpu->device(), cuda0);
  EXPECT_LE(testing::relative_difference(*gpu, *cpu), tolerance(1e-3));
  const Tensor pc = cpu->predict(x), pg = gpu->predict(x);
  const std::vector<float> a = pc.to_vector(), b = pg.to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tolerance(1e-3) * (1 + std::fabs(a[i]))) << i;
}

// Batch normalization computes its per-channel figures where its input is: training and
// inference, forward and backward, it never makes the host wait for the GPU; its results
// are the CPU's.
TEST_F(Gpu, BatchNormNeverMakesTheHostWait) {
  const Tensor x = testing::random_tensor({16, 5, 5, 8}, 40, -2.0f, 3.0f);
  const Tensor gamma = testing::random_tensor({8}, 41, 0.5f, 1.5f), beta = testing::random_tensor({8}, 42);
  const Tensor mean = testing::random_tensor({8}, 43), variance = testing::random_tensor({8}, 44, 0.5f, 2.0f);
  // Gradients of Σy² for x, gamma and beta, training then inference, on `device`.
  auto gradients = [&](Device device) {
    Variable g("gamma", gamma.to(device)), b("beta", beta.to(device));
    const Tensor xd = x.to(device), md = mean.to(device), vd = variance.to(device);
    Variable* vars[] = {&g, &b};
    std::vector<Tensor> all;
    for (const bool training : {true, false}) {
      GradientTape tape(/*persistent=*/true);
      tape.watch(xd);
      const Tensor y = training ? batch_norm(xd, g.value(), b.value(), 1e-3f, false, nullptr, nullptr, true)
                                : batch_norm_inference(xd, md, vd, g.value(), b.value(), 1e-3f, true);
      const Tensor loss = reduce_sum(square(y));
      const std::vector<Tensor> dx = tape.gradient(loss, {xd});
      for (const Tensor& t : tape.gradient(loss, vars)) all.push_back(t);
      all.push_back(dx.front());
      all.push_back(y);
    }
    return all;
  };
  DeviceRuntime& runtime = *device_runtime(DeviceType::cuda);
  const std::uint64_t before = runtime.host_waits(0);
  const std::vector<Tensor> on_gpu = gradients(cuda0);
  EXPECT_EQ(runtime.host_waits(0), before);
  const std::vector<Tensor> on_cpu = gradients(Device::cpu());
  ASSERT_EQ(on_gpu.size(), on_cpu.size());
  for (std::size_t i = 0; i < on_cpu.size(); ++i) {
    ASSERT_TRUE(on_gpu[i].defined()) << i;
    EXPECT_EQ(on_gpu[i].device(), cuda0) << i;
    const std::vector<float> a = on_cpu[i].to_vector(), b = on_gpu[i].to_vector();
    for (std::size_t j = 0; j < a.size(); ++j)
      EXPECT_NEAR(b[j], a[j], tolerance(1e-4) * (1 + std::fabs(a[j]))) << i << " [" << j << "]";
  }
}

// After its first steps a training step asks the device's allocator for nothing: every
// buffer comes back from the cache.
TEST_F(Gpu, ThePlannedStepAllocatesNothingAfterWarmUp) {
  const data::Split d = data::make_synthetic(512, 10, 4, 7);
  auto model = mlp();
  DevicePlacement on_gpu(cuda0);
  model->fit(d.x, d.y, quiet(1));
  DeviceRuntime& runtime = *device_runtime(DeviceType::cuda);
  const DeviceMemoryStats before = runtime.memory_stats(0);
  model->fit(d.x, d.y, quiet(2));
  const DeviceMemoryStats after = runtime.memory_stats(0);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_GT(after.allocations, before.allocations);  // the step did allocate, from the cache
}

// A checkpoint saved from a GPU restores on the CPU to the same bytes, and the other way round.
TEST_F(Gpu, WeightsAndCheckpointsMoveBetweenDevicesBitForBit) {
  const std::string dir = dir_.string();
  const data::Split d = data::make_synthetic(256, 10, 4, 8);
  auto gpu = mlp();
  {
    DevicePlacement on_gpu(cuda0);
    gpu->fit(d.x, d.y, quiet(1));
  }
  gpu->save_weights(dir + "/w.safetensors");
  gpu->save(dir + "/model.safetensors");
  auto cpu = mlp();
  cpu->build({10});
  cpu->load_weights(dir + "/w.safetensors");
  EXPECT_EQ(testing::relative_difference(*cpu, *gpu), 0.0);
  const auto restored = models::load_model(dir + "/model.safetensors");
  EXPECT_EQ(testing::relative_difference(*restored, *gpu), 0.0);
  EXPECT_EQ(restored->optimizer().iterations(), gpu->optimizer().iterations());
  // A checkpoint of the GPU's model and optimizer, restored into a CPU model...
  train::Checkpoint saved{{"model", *gpu}, {"optimizer", gpu->optimizer()}};
  const std::string path = saved.save(dir + "/ckpt");
  auto again = mlp();
  again->build({10});
  train::Checkpoint into{{"model", *again}, {"optimizer", again->optimizer()}};
  into.restore(path);
  EXPECT_EQ(testing::relative_difference(*again, *gpu), 0.0);
  // ...and a CPU model's weights loaded into one on the GPU.
  auto back = mlp();
  {
    DevicePlacement on_gpu(cuda0);
    back->build({10});
  }
  back->load_weights(dir + "/w.safetensors");
  EXPECT_EQ(back->device(), cuda0);
  EXPECT_EQ(testing::relative_difference(*back, *gpu), 0.0);
}

// A weight that becomes NaN on the GPU is reported at the end of its step, as on the CPU,
// though the GPU's update returned before it ran.
TEST_F(Gpu, AWeightThatBecomesNaNIsReportedAtItsStep) {
  data::Split d = data::make_synthetic(128, 10, 4, 9);
  d.x.data<float>()[64 * 10 + 3] = std::numeric_limits<float>::infinity();  // batch 1's gradients
  auto model = mlp();
  model->compile(std::make_shared<optim::SGD>(0.1f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  DevicePlacement on_gpu(cuda0);
  FitOptions o = quiet(1);
  o.shuffle = false;
  const History h = model->fit(d.x, d.y, o);
  ASSERT_TRUE(h.non_finite.has_value());
  EXPECT_EQ(h.non_finite->batch, 1);
}

// Running out of GPU memory names the bytes asked, in use, cached and free, and the layer.
TEST_F(Gpu, OutOfMemoryNamesTheLayerAndTheBytes) {
  // An output of rows x 65536 floats: past what the stand-in is given, or past an H200.
  const std::int64_t rows = gpu_.stand_in() ? 256 : std::int64_t{1} << 20;
  if (gpu_.stand_in()) gpu_.stand_in_runtime()->set_limit(std::size_t{48} << 20);
  Sequential model;
  model.add<nn::Dense>(65536, "", nn::DenseOptions{.seed = 1, .name = "wide"});
  DevicePlacement on_gpu(cuda0);
  model.build({16});
  const Tensor x = Tensor::zeros({rows, 16});
  try {
    (void)model(x);
    FAIL() << "no error";
  } catch (const ResourceExhausted& e) {
    const std::string m = e.what();
    for (const char* part : {"out of memory on cuda:0", "layer 'wide' asked for", "in use by tensors", "cached",
                             "free of"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
}

}  // namespace
}  // namespace dtrain
