// What flushing denormal floats to zero buys (set_flush_denormals, on by default): two
// copies of the Fashion-MNIST MLP (784 -> 256 relu -> 128 relu -> 10, Adam, batch 128)
// train on the same batches, one with denormals flushed and one without, taking turns one
// epoch at a time so that a slow spell of the machine hits both. Adam's moments for
// weights of pixels that are rarely lit decay into the denormal range within an epoch or
// two; each round prints both copies' step and optimizer times, and how many of the
// unflushed copy's moment values are denormal. The medians are over rounds after the first.
//
//   bench_denormals [--quick]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

std::unique_ptr<Sequential> fashion_mnist_model() {
  set_random_seed(0);
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(256, "relu");
  m->add<nn::Dense>(128, "relu");
  m->add<nn::Dense>(10);
  m->compile(std::make_shared<optim::Adam>(1e-3f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  return m;
}

// Denormal values among the optimizer's slots (Adam: m and v), and all of them.
std::pair<std::int64_t, std::int64_t> denormal_slots(Sequential& model) {
  std::int64_t denormal = 0, all = 0;
  for (Variable* v : model.trainable_variables())
    for (const auto& slot : model.optimizer().slots(*v)) {
      const float* p = slot.second->data<float>();
      for (std::int64_t i = 0; i < slot.second->numel(); ++i)
        denormal += std::fpclassify(p[i]) == FP_SUBNORMAL ? 1 : 0;
      all += slot.second->numel();
    }
  return {denormal, all};
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const data::Classification fm = data::load_fashion_mnist();
  const data::Dataset batches = data::Dataset::from_tensor_slices({fm.train.x, fm.train.y}).batch(128).cache();
  std::unique_ptr<Sequential> models[2] = {fashion_mnist_model(), fashion_mnist_model()};  // flushed, not
  const int rounds = quick ? 2 : 9;
  std::vector<double> step_ms[2], optimizer_ms[2], ratio;
  std::printf("Fashion-MNIST MLP, Adam, batch 128, %d compute threads\n\n", num_threads());
  std::printf("| epoch | step ms, flushed | step ms, not flushed | optimizer ms, flushed | optimizer ms, "
              "not flushed | denormal moments, not flushed |\n|---|---|---|---|---|---|\n");
  for (int r = 0; r < rounds; ++r) {
    double step[2], optimizer[2];
    for (int k = 0; k < 2; ++k) {
      set_flush_denormals(k == 0);
      const History h = models[k]->fit(batches, {.epochs = r + 1, .initial_epoch = r, .verbose = 0});
      const profile::Totals& t = h.profile.back();
      step[k] = t.wall * 1e3 / static_cast<double>(t.steps);
      optimizer[k] = t.phases[static_cast<int>(profile::Phase::optimizer)] * 1e3 / static_cast<double>(t.steps);
    }
    set_flush_denormals(true);
    const auto [denormal, all] = denormal_slots(*models[1]);
    std::printf("| %d | %.3f | %.3f | %.3f | %.3f | %lld of %lld |\n", r, step[0], step[1], optimizer[0], optimizer[1],
                static_cast<long long>(denormal), static_cast<long long>(all));
    if (r == 0) continue;  // warm-up: primitive creation, first touches
    for (int k = 0; k < 2; ++k) {
      step_ms[k].push_back(step[k]);
      optimizer_ms[k].push_back(optimizer[k]);
    }
    ratio.push_back(step[1] / step[0]);
  }
  std::printf("\nmedians: step %.3f ms flushed, %.3f ms not (not flushed / flushed: %.3f); optimizer %.3f ms "
              "flushed, %.3f ms not\n",
              bench::median(step_ms[0]), bench::median(step_ms[1]), bench::median(ratio),
              bench::median(optimizer_ms[0]), bench::median(optimizer_ms[1]));
}
