// Training steps on the GPU (cuda:0), printed as tables for docs/benchmarks.md and the
// device check (scripts/gpu-check.sh):
//  1. The seeds' large MLP (1024 -> 1024 relu -> 1024 relu -> 10, Adam, cross-entropy from
//     logits) at several batches: samples/s of a custom loop that reads the loss only at
//     the end, and of fit (which reads the loss every step, as Keras's progress does) with
//     its steps run kernel by kernel and replayed as CUDA graphs (FitOptions::cuda_graph).
//  2. A GEMM-bound MLP of 8192-wide layers in bfloat16 (mixed_bfloat16): its step against the
//     sum of the step's matrix products timed alone through the same cuBLASLt path, and the
//     dense bf16 rate those products reach alone.
// PyTorch's side of the comparison is bench/peers/pytorch_gpu_mlp.py, run beside it.
//
//   bench_gpu_mlp [--quick]
#include <cstdio>
#include <vector>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

const Device kGpu = Device::cuda(0);

void synchronize() { kernels::backend(kGpu).synchronize(); }

std::unique_ptr<Sequential> mlp(const std::vector<std::int64_t>& widths, const char* policy) {
  nn::ScopedGlobalPolicy p(policy);
  auto m = std::make_unique<Sequential>();
  for (std::size_t l = 1; l < widths.size(); ++l)
    m->add<nn::Dense>(widths[l], l + 1 < widths.size() ? "relu" : "", nn::DenseOptions{.seed = l});
  m->compile(std::make_shared<optim::Adam>(1e-4f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  const DevicePlacement on_gpu(kGpu);
  m->build(Shape{widths.front()});
  return m;
}

// Seconds per step of a custom loop (tape, loss, gradients, Adam) on batches already on the
// GPU, waiting for the device only at the end of each timed run.
double loop_step_seconds(Sequential& model, const Tensor& x, const Tensor& y, int steps) {
  losses::SparseCategoricalCrossentropy loss_fn(true);
  const std::vector<Variable*> vars = model.trainable_variables();
  auto step = [&] {
    GradientTape tape;
    const Tensor loss = loss_fn(y, model(x, true));
    model.optimizer().apply_gradients(tape.gradient(loss, vars), vars);
  };
  for (int i = 0; i < 10; ++i) step();
  synchronize();
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const double t0 = bench::now();
    for (int i = 0; i < steps; ++i) step();
    synchronize();
    runs.push_back((bench::now() - t0) / steps);
  }
  return bench::median(runs);
}

// Samples per second of fit() over host data (batches copied to the GPU, the loss read
// every step), the first epoch left out; with its steps replayed as CUDA graphs or not.
double fit_samples_per_second(Sequential& model, std::int64_t batch, int steps, bool graph) {
  const data::Split d = data::make_synthetic(batch * steps, model.input_shape()->dims()[0], 10, 3);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = batch;
  o.verbose = 0;
  o.shuffle = false;
  o.cuda_graph = graph;
  const DevicePlacement on_gpu(kGpu);
  const History h = model.fit(d.x, d.y, o);
  if (graph && !h.cuda_graph.not_used.empty())
    std::printf("(fit did not use CUDA graphs: %s)\n", h.cuda_graph.not_used.c_str());
  return bench::median(std::vector<double>(h.samples_per_second.begin() + 1, h.samples_per_second.end()));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  if (device_count(DeviceType::cuda) == 0) {
    std::printf("bench_gpu_mlp: %s; nothing to measure\n", describe_devices(DeviceType::cuda).c_str());
    return 0;
  }
  std::printf("GPU: %s\n\n", describe_devices(DeviceType::cuda).c_str());
  const int steps = quick ? 50 : 200;

  std::printf("The seeds' large MLP (1024-1024-1024-10, Adam), float32 (exact, no TF32); median of 5 runs of %d steps\n\n",
              steps);
  std::printf("| batch | custom loop ms/step | custom loop samples/s | fit samples/s, kernel by kernel | "
              "fit samples/s, CUDA graphs | graphs / kernel by kernel |\n"
              "|---|---|---|---|---|---|\n");
  for (const std::int64_t batch : {64, 512, 4096}) {
    auto model = mlp({1024, 1024, 1024, 10}, "float32");
    const data::Split d = data::make_synthetic(batch, 1024, 10, 2);
    const Tensor x = d.x.to(kGpu), y = d.y.to(kGpu);
    const double s = loop_step_seconds(*model, x, y, steps);
    auto eager = mlp({1024, 1024, 1024, 10}, "float32"), graphed = mlp({1024, 1024, 1024, 10}, "float32");
    const double eager_sps = fit_samples_per_second(*eager, batch, quick ? 20 : 100, false);
    const double graph_sps = fit_samples_per_second(*graphed, batch, quick ? 20 : 100, true);
    std::printf("| %lld | %.4f | %.0f | %.0f | %.0f | %.2f |\n", static_cast<long long>(batch), s * 1e3, batch / s,
                eager_sps, graph_sps, graph_sps / eager_sps);
    std::fflush(stdout);
  }

  // The GEMM-bound model: every product of its step alone, through the backend's matmul.
  const std::int64_t width = 8192, batch = quick ? 2048 : 8192;
  const std::vector<std::int64_t> widths{width, width, width, width, 10};
  std::printf("\nA GEMM-bound MLP (%lld -> 3 x %lld relu -> 10), mixed_bfloat16, batch %lld\n\n",
              static_cast<long long>(width), static_cast<long long>(width), static_cast<long long>(batch));
  auto big = mlp(widths, "mixed_bfloat16");
  const data::Split d = data::make_synthetic(batch, width, 10, 4);
  const Tensor x = d.x.to(kGpu), y = d.y.to(kGpu);
  const double step = loop_step_seconds(*big, x, y, quick ? 5 : 20);
  double alone = 0, flops = 0;
  auto& be = kernels::backend(kGpu);
  // Random operands (a GPU multiplies zeros faster), cut from one buffer.
  const Tensor random = data::make_synthetic(width, width, 2, 5).x.reshape({width * width}).astype(DType::bf16).to(kGpu);
  auto operand = [&](std::int64_t rows, std::int64_t cols) { return random.slice(0, rows * cols).reshape({rows, cols}); };
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::int64_t in = widths[l], out = widths[l + 1];
    struct Product {
      std::int64_t m, k, n;
      bool ta, tb;
    };
    std::vector<Product> products{{batch, in, out, false, false}, {in, batch, out, true, false}};
    if (l > 0) products.push_back({batch, out, in, false, true});
    for (const Product& p : products) {
      const Tensor a = p.ta ? operand(p.k, p.m) : operand(p.m, p.k);
      const Tensor b = p.tb ? operand(p.n, p.k) : operand(p.k, p.n);
      Tensor c = Tensor::empty({p.m, p.n}, DType::f32, kGpu);
      const double s = bench::seconds_per_call([&] {
        for (int i = 0; i < 10; ++i) be.matmul(a, b, c, {.transpose_a = p.ta, .transpose_b = p.tb});
        synchronize();
      }, 5, 0.1) / 10;
      alone += s;
      flops += 2.0 * static_cast<double>(p.m) * static_cast<double>(p.k) * static_cast<double>(p.n);
    }
  }
  std::printf("| step ms | its products alone ms | step / products | products alone TFLOP/s | step TFLOP/s (products' flops) |\n"
              "|---|---|---|---|---|\n");
  std::printf("| %.3f | %.3f | %.2f | %.0f | %.0f |\n", step * 1e3, alone * 1e3, step / alone, flops / alone * 1e-12,
              flops / step * 1e-12);
  return 0;
}
