// A transformer encoder's training step, and attention alone, timed:
// - the model: 4 post-norm encoder layers (multi-head self-attention, 4 heads of 64,
//   then a 1024-wide ReLU feed-forward, each added back and layer-normalized, as PyTorch's
//   nn.TransformerEncoderLayer), 256 wide, a mean over positions and 10 classes, on random
//   [batch, length, 256] inputs: median ms and samples/s of forward, backward and Adam;
// - the fused attention op at the same shapes, forward and forward + backward, against the
//   two matmuls it contains (each head's scores q·kᵀ and weighted values p·v) run through
//   the backend's matmul, and the bytes the attention allocates at length 4096.
//
// With --gpu, only the step, on the first GPU: median of 5 runs of `steps` steps, each run
// ending with a wait for the GPU, as PyTorch's side (--device cuda) is timed.
//
//   bench_transformer [--threads T] [--length 128] [--batch 8] [--steps 10] [--gpu]
//
// One JSON line per measurement; bench/transformer_vs_pytorch.sh runs it against
// bench/peers/pytorch_transformer.py.
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "dtrain/core/allocator.h"
#include "dtrain/dtrain.h"
#include "models.h"
#include "timing.h"

namespace {

using namespace dtrain;

constexpr std::int64_t kWidth = 256, kHeads = 4, kFeedForward = 1024, kLayers = 4;

std::unique_ptr<Model> encoder(std::int64_t length) {
  KerasTensor inputs = Input({length, kWidth}, "x");
  KerasTensor x = inputs;
  for (std::int64_t i = 0; i < kLayers; ++i) {
    KerasTensor h = layer<nn::MultiHeadAttention>(kHeads, kWidth / kHeads)({x, x});
    x = layer<nn::LayerNormalization>(nn::LayerNormalizationOptions{.epsilon = 1e-5f})(layer<nn::Add>()({x, h}));
    h = layer<nn::Dense>(kWidth, "")(layer<nn::Dense>(kFeedForward, "relu")(x));
    x = layer<nn::LayerNormalization>(nn::LayerNormalizationOptions{.epsilon = 1e-5f})(layer<nn::Add>()({x, h}));
  }
  return std::make_unique<Model>(inputs, layer<nn::Dense>(10)(layer<nn::GlobalAveragePooling1D>()(x)), "encoder");
}

Tensor random_uniform(const Shape& shape, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = g.uniform(-1.0f, 1.0f);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dtrain::bench;
  const int threads = int_flag(argc, argv, "--threads", 0);
  const std::int64_t length = int_flag(argc, argv, "--length", 128);
  const std::int64_t batch = int_flag(argc, argv, "--batch", 8);
  const int steps = int_flag(argc, argv, "--steps", 10);
  if (threads > 0) set_num_threads(threads);
  const bool gpu = has_flag(argc, argv, "--gpu");
  if (gpu && device_count(DeviceType::cuda) == 0) {
    std::cout << "bench_transformer --gpu: " << describe_devices(DeviceType::cuda) << "; nothing to measure" << std::endl;
    return 0;
  }
  std::optional<DevicePlacement> on_gpu;  // the weights are made at the first step, where this says
  if (gpu) on_gpu.emplace(Device::cuda(0));
  set_random_seed(0);
  auto model = encoder(length);
  model->compile(std::make_shared<optim::Adam>(1e-3f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  const Tensor x = random_uniform({batch, length, kWidth}, 1);
  const Tensor y = random_labels(batch, 10, 2);
  if (gpu) {
    const double step_s = gpu_step_seconds(*model, x, y, 3, steps);
    std::cout << nlohmann::json{{"bench", "transformer_step_gpu"}, {"device", describe_devices(DeviceType::cuda)},
                                {"batch", batch}, {"length", length}, {"step_ms", step_s * 1e3},
                                {"samples_per_second", batch / step_s}}
                     .dump()
              << std::endl;
    return 0;
  }
  const std::function<void()> step = training_step(*model, x, y);
  const double step_s = median_step_seconds(step, 2, steps);
  std::cout << nlohmann::json{{"bench", "transformer_step"}, {"threads", omp_get_max_threads()}, {"batch", batch},
                              {"length", length}, {"step_ms", step_s * 1e3}, {"samples_per_second", batch / step_s}}
                   .dump()
            << std::endl;

  // Attention alone at the step's shapes, against its two matmuls per (batch, head).
  const std::int64_t d = kWidth / kHeads;
  const Tensor q = random_uniform({batch, length, kHeads, d}, 3), k = random_uniform({batch, length, kHeads, d}, 4),
               v = random_uniform({batch, length, kHeads, d}, 5), dout = random_uniform({batch, length, kHeads, d}, 6);
  auto& be = kernels::backend();
  Tensor out = Tensor::empty(q.shape()), lse = Tensor::empty({batch, length, kHeads});
  Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(v.shape());
  const kernels::AttentionOptions o{.scale = 1.0f / 8.0f};
  const double forward = seconds_per_call([&] { be.attention(q, k, v, o, out, lse); }, 5, 0.2);
  const double backward = seconds_per_call([&] { be.attention_backward(q, k, v, out, lse, dout, o, dq, dk, dv); }, 5, 0.2);
  // The matmuls attention contains: per (batch, head), scores [T, T] = q [T, d] · kᵀ and
  // values [T, d] = p [T, T] · v, on contiguous per-head copies.
  const Tensor qh = random_uniform({length, d}, 7), kh = random_uniform({length, d}, 8), vh = random_uniform({length, d}, 9);
  Tensor scores = Tensor::empty({length, length}), values = Tensor::empty({length, d});
  const double matmuls = batch * kHeads * seconds_per_call([&] {
    be.matmul(qh, kh, scores, {.transpose_b = true});
    be.matmul(scores, vh, values, {});
  }, 5, 0.2);
  std::cout << nlohmann::json{{"bench", "attention"}, {"threads", omp_get_max_threads()}, {"batch", batch},
                              {"length", length}, {"heads", kHeads}, {"depth", d}, {"forward_ms", forward * 1e3},
                              {"backward_ms", backward * 1e3}, {"its_matmuls_ms", matmuls * 1e3},
                              {"forward_over_matmuls", forward / matmuls}}
                   .dump()
            << std::endl;

  // Memory at length 4096: what one attention call allocates beyond its operands.
  const std::int64_t n = 4096;
  const Tensor lq = random_uniform({1, n, 1, d}, 10), lk = random_uniform({1, n, 1, d}, 11), lv = random_uniform({1, n, 1, d}, 12);
  cpu_allocator().reset_peak();
  const std::size_t before = cpu_allocator().stats().bytes_in_use;
  const Tensor lo = scaled_dot_product_attention(lq, lk, lv, {.scale = 0.125f});
  std::cout << nlohmann::json{{"bench", "attention_memory"}, {"length", n}, {"depth", d},
                              {"allocated_bytes", cpu_allocator().stats().peak_bytes_in_use - before},
                              {"scores_would_be_bytes", n * n * 4}}
                   .dump()
            << std::endl;
  return lo.numel() > 0 ? 0 : 1;
}
