// The Fashion-MNIST ResNet of examples/configs/fashion_mnist_resnet.json, timed:
// - its training step (forward, backward, Adam) on random batches: median ms and samples/s;
// - each of its convolutions run hot in a loop, forward, backward data (not for the first,
//   whose input needs no gradient) and backward weights, with the step's shapes and
//   threads, and their sum against the step;
// - with --rss-steps N, the resident memory after 100 steps and after N;
// - with --gpu, the step on the first GPU instead (channels-last as always; --bf16 for
//   mixed_bfloat16): median of 5 runs of `steps` steps, each run ending with a wait for the
//   GPU, as PyTorch's side (bench/peers/pytorch_resnet.py --device cuda) is timed.
//
//   bench_resnet [--config PATH] [--threads T] [--batch 128] [--steps 30] [--bf16] [--rss-steps 1000] [--gpu]
//
// One JSON line per measurement. ONEDNN_VERBOSE=1 on a run prints each primitive's time
// inside the step, which bench/resnet_vs_pytorch.sh sets beside the hot figures.
#include <fstream>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "dtrain/dtrain.h"
#include "dtrain/model/serialization.h"
#include "models.h"
#include "timing.h"

namespace {

using namespace dtrain;

std::string string_flag(int argc, char** argv, const char* flag, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == flag) return argv[i + 1];
  return fallback;
}

struct Conv {
  std::string name;
  Shape x, kernel, y;
  Conv2dOptions options;
  bool first = false;  // reads the image: no gradient for its input
};

// Every Conv2D node of the graph with the shapes it runs at for `batch` rows.
std::vector<Conv> convolutions(const Model& model, std::int64_t batch) {
  std::vector<Conv> out;
  std::vector<const GraphNode*> seen;
  std::function<void(const GraphNode*)> visit = [&](const GraphNode* n) {
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) return;
    seen.push_back(n);
    for (const KerasTensor& in : n->inputs) visit(in.node().get());
    auto* conv = dynamic_cast<nn::Conv2D*>(n->layer.get());
    if (!conv) return;
    const Shape x = n->inputs[0].shape().with_dim(0, batch);
    Conv c{conv->name(), x, conv->kernel().shape(), n->shape.with_dim(0, batch), {}, false};
    const nn::Conv2DOptions& o = conv->options();
    for (int i = 0; i < 2; ++i) {
      c.options.stride[i] = o.strides[static_cast<std::size_t>(i)];
      c.options.dilation[i] = o.dilation_rate[static_cast<std::size_t>(i)];
      if (o.padding == "same") {
        const auto pad = nn::same_padding(x[1 + i], c.kernel[i], c.options.stride[i], c.options.dilation[i]);
        c.options.pad_begin[i] = pad[0];
        c.options.pad_end[i] = pad[1];
      }
    }
    c.first = n->inputs[0].node()->inputs.empty() || n->inputs[0].node()->inputs[0].node()->inputs.empty();
    out.push_back(c);
  };
  for (const KerasTensor& t : model.outputs()) visit(t.node().get());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dtrain::bench;
  const std::string path = string_flag(argc, argv, "--config", "examples/configs/fashion_mnist_resnet.json");
  const int threads = int_flag(argc, argv, "--threads", 0);
  const std::int64_t batch = int_flag(argc, argv, "--batch", 128);
  const int steps = int_flag(argc, argv, "--steps", 30);
  const int rss_steps = int_flag(argc, argv, "--rss-steps", 0);
  const bool bf16 = has_flag(argc, argv, "--bf16");
  const bool gpu = has_flag(argc, argv, "--gpu");
  if (gpu && device_count(DeviceType::cuda) == 0) {
    std::cout << "bench_resnet --gpu: " << describe_devices(DeviceType::cuda) << "; nothing to measure" << std::endl;
    return 0;
  }
  std::optional<DevicePlacement> on_gpu;  // the weights are made at the first step, where this says
  if (gpu) on_gpu.emplace(Device::cuda(0));
  if (threads > 0) set_num_threads(threads);
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    return 1;
  }
  const nlohmann::json config = nlohmann::json::parse(in);
  set_random_seed(0);
  std::unique_ptr<Model> model = model_from_json(config["model"], "model", bf16 ? "mixed_bfloat16" : "");
  model->compile(std::make_shared<optim::Adam>(1e-3f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  Generator g(1);
  Tensor x = Tensor::empty({batch, 784});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = g.uniform();
  const Tensor y = random_labels(batch, 10, 2);
  if (gpu) {
    const double step_s = gpu_step_seconds(*model, x, y, 5, steps);
    std::cout << nlohmann::json{{"bench", "resnet_step_gpu"}, {"device", describe_devices(DeviceType::cuda)},
                                {"batch", batch}, {"bf16", bf16}, {"step_ms", step_s * 1e3},
                                {"samples_per_second", batch / step_s}}
                     .dump()
              << std::endl;
    return 0;
  }
  const std::function<void()> step = training_step(*model, x, y);
  const double step_s = median_step_seconds(step, 5, steps);
  std::cout << nlohmann::json{{"bench", "resnet_step"}, {"threads", omp_get_max_threads()}, {"batch", batch},
                              {"bf16", bf16}, {"step_ms", step_s * 1e3}, {"samples_per_second", batch / step_s}}
                   .dump()
            << std::endl;

  // Each convolution hot, with the step's shapes and dtypes.
  auto& be = kernels::backend();
  double hot_total = 0;
  for (const Conv& c : convolutions(*model, batch)) {
    const DType type = bf16 ? DType::bf16 : DType::f32;
    const Tensor xs = Tensor::full(c.x, 0.5f).astype(type), k = Tensor::full(c.kernel, 0.01f).astype(type);
    const Tensor dy = Tensor::full(c.y, 0.1f).astype(type);
    Tensor out = Tensor::empty(c.y), dx = Tensor::empty(c.x), dk = Tensor::empty(c.kernel);
    const double fwd = seconds_per_call([&] { be.conv2d(xs, k, out, c.options); }, 5, 0.1);
    const double bwd_data = c.first ? 0.0 : seconds_per_call([&] { be.conv2d_backward_data(dy, k, dx, c.options); }, 5, 0.1);
    const double bwd_weights = seconds_per_call([&] { be.conv2d_backward_weights(xs, dy, dk, nullptr, c.options); }, 5, 0.1);
    hot_total += fwd + bwd_data + bwd_weights;
    std::cout << nlohmann::json{{"bench", "resnet_conv_hot"}, {"layer", c.name}, {"x", c.x.to_string()},
                                {"kernel", c.kernel.to_string()}, {"forward_ms", fwd * 1e3},
                                {"backward_data_ms", bwd_data * 1e3}, {"backward_weights_ms", bwd_weights * 1e3}}
                     .dump()
              << std::endl;
  }
  std::cout << nlohmann::json{{"bench", "resnet_conv_hot_total"}, {"conv_hot_ms", hot_total * 1e3},
                              {"step_ms", step_s * 1e3}, {"conv_share_of_step", hot_total / step_s}}
                   .dump()
            << std::endl;

  if (rss_steps > 0) {
    for (int i = 0; i < 100; ++i) step();
    const double at_100 = resident_mb();
    for (int i = 100; i < rss_steps; ++i) step();
    std::cout << nlohmann::json{{"bench", "resnet_resident_memory"}, {"steps", rss_steps}, {"rss_mb_at_100", at_100},
                                {"rss_mb_at_end", resident_mb()}}
                     .dump()
              << std::endl;
  }
  return 0;
}
