// Models the benchmarks share.
#pragma once

#include <functional>
#include <memory>

#include "dtrain/dtrain.h"
#include "timing.h"

namespace dtrain::bench {

// The seeds' large MLP: 1024 -> Dense 1024 relu -> Dense 1024 relu -> Dense 10 softmax,
// Adam, sparse categorical cross-entropy, fixed seeds.
inline std::unique_ptr<Sequential> large_mlp() {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(1024, "relu", nn::DenseOptions{.seed = 1});
  m->add<nn::Dense>(1024, "relu", nn::DenseOptions{.seed = 2});
  m->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 3});
  m->compile("adam", "sparse_categorical_crossentropy");
  m->build(Shape{1024});
  return m;
}

// `count` class numbers below `classes`, drawn from `seed`: [count] int32 labels.
inline Tensor random_labels(std::int64_t count, std::int64_t classes, std::uint64_t seed) {
  Generator g(seed);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(count));
  for (auto& l : labels) l = static_cast<std::int32_t>(g.below(static_cast<std::uint64_t>(classes)));
  return Tensor::from_vector({count}, labels);
}

// `model`'s training step (forward, backward, its optimizer's update) on one batch (x, y),
// as a function to time; model, x and y must outlive it.
inline std::function<void()> training_step(Model& model, const Tensor& x, const Tensor& y) {
  return [&model, &x, &y, vars = model.trainable_variables()] {
    GradientTape tape;
    const Tensor loss = model.loss()(y, model(x, /*training=*/true));
    model.optimizer().apply_gradients(tape.gradient(loss, vars), vars);
  };
}

// Seconds per step of `model`'s training step on the first GPU, with x and y copied there:
// the median of 5 runs of `steps` steps, each run ending with a wait for the GPU (as
// PyTorch's peers time theirs), after `warmup` steps.
inline double gpu_step_seconds(Model& model, const Tensor& x, const Tensor& y, int warmup, int steps) {
  const Device gpu = Device::cuda(0);
  const Tensor xg = x.to(gpu), yg = y.to(gpu);
  const std::function<void()> step = training_step(model, xg, yg);
  for (int i = 0; i < warmup; ++i) step();
  kernels::backend(gpu).synchronize();
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const double t0 = now();
    for (int i = 0; i < steps; ++i) step();
    kernels::backend(gpu).synchronize();
    runs.push_back((now() - t0) / steps);
  }
  return median(runs);
}

}  // namespace dtrain::bench
