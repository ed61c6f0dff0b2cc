// Input pipeline figures:
//  1. the seeds' slow-input example: a generator that sleeps 10 ms per element, 1000
//     elements, batch 32, the seeds' small model. Epoch time with no prefetch, with
//     prefetch(AUTOTUNE), and with the slow work in map(..., AUTOTUNE), against the bound
//     max(producer work / parallelism used, compute time);
//  2. throughput of from_tensor_slices -> shuffle -> batch -> prefetch over Fashion-MNIST;
//  3. that pipeline's cost per training step of the Fashion-MNIST MLP, against batches
//     already in memory.
//
//   bench_input_pipeline [--quick]
#include <chrono>
#include <cstdio>
#include <thread>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

constexpr int kSlowElements = 1000;
constexpr auto kSlowWork = std::chrono::milliseconds(10);

std::unique_ptr<Sequential> seed_small_model() {
  set_random_seed(0);
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(64, "relu");
  m->add<nn::Dense>(10, "softmax");
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  m->build({100});
  return m;
}

double fit_seconds(Sequential& m, const data::Dataset& ds, double* input_wait = nullptr) {
  const double t0 = bench::now();
  History h = m.fit(ds, {.epochs = 1, .verbose = 0});
  if (input_wait) *input_wait = h.input_wait_seconds.back();
  return bench::now() - t0;
}

void slow_input(bool quick) {
  const int n = quick ? 200 : kSlowElements;
  data::Split d = data::make_synthetic(n, 100, 10, 1);
  // The element as the seeds build it: one random normal row and a label, after slow work.
  auto element = [d](std::int64_t i) {
    return data::Element{d.x.slice(i, i + 1).reshape({100}), d.y.slice(i, i + 1).reshape({})};
  };
  auto slow_generator = [=](std::int64_t i) -> std::optional<data::Element> {
    if (i >= n) return std::nullopt;
    std::this_thread::sleep_for(kSlowWork);
    return element(i);
  };
  auto fast_generator = [=](std::int64_t i) -> std::optional<data::Element> {
    if (i >= n) return std::nullopt;
    return element(i);
  };
  auto slow_map = [](const data::Element& e) {
    std::this_thread::sleep_for(kSlowWork);
    return e;
  };
  const double work = n * std::chrono::duration<double>(kSlowWork).count();

  auto m = seed_small_model();
  // Compute alone: the same batches with no input cost.
  const double compute = fit_seconds(*m, data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).cache());
  const double compute2 = fit_seconds(*m, data::Dataset::from_tensor_slices({d.x, d.y}).batch(32).cache());

  struct Row {
    const char* name;
    data::Dataset ds;
  };
  const Row rows[] = {
      {"generator, no prefetch", data::Dataset::from_generator(slow_generator).batch(32)},
      {"generator, prefetch(AUTOTUNE)", data::Dataset::from_generator(slow_generator).batch(32).prefetch(data::AUTOTUNE)},
      {"map(slow, AUTOTUNE), prefetch(AUTOTUNE)",
       data::Dataset::from_generator(fast_generator).map(slow_map, data::AUTOTUNE).batch(32).prefetch(data::AUTOTUNE)},
      {"map(slow, 8), prefetch(AUTOTUNE), max_threads 8",
       data::Dataset::from_generator(fast_generator).map(slow_map, 8).batch(32).prefetch(data::AUTOTUNE)
           .with_options({.max_threads = 8})},
  };
  std::printf("Slow input: %d elements, %.0f ms of producer work each (%.1f s in all), batch 32, seeds' small model;"
              " compute alone %.3f s per epoch\n\n", n, work / n * 1e3, work, std::min(compute, compute2));
  std::printf("| pipeline | epoch s | input wait s | parallelism | bound s = max(work / parallelism, compute) | epoch / bound |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    double wait = 0;
    data::Iterator probe = r.ds.make_iterator(99);  // measure what AUTOTUNE picks on its own pass
    int parallelism = 1;
    for (int i = 0; i < 8 && probe.next(); ++i) {
    }
    for (const auto& line : probe.autotune_report())
      if (line.rfind("map: parallelism ", 0) == 0) parallelism = std::stoi(line.substr(17));
    const double epoch = fit_seconds(*m, r.ds, &wait);
    const bool parallel = std::string(r.name).rfind("map", 0) == 0;
    const double bound = std::max(work / (parallel ? parallelism : 1), std::min(compute, compute2));
    std::printf("| %s | %.3f | %.3f | %d | %.3f | %.2f |\n", r.name, epoch, wait, parallel ? parallelism : 1, bound,
                epoch / bound);
    std::fflush(stdout);
  }
}

void fashion_mnist(bool quick) {
  data::Classification fm = data::load_fashion_mnist();
  const std::int64_t n = fm.train.x.dim(0);
  auto pipeline = [&] {
    return data::Dataset::from_tensor_slices({fm.train.x, fm.train.y}).shuffle(n, 7).batch(128).prefetch(data::AUTOTUNE);
  };
  std::printf("\nFashion-MNIST pipeline from_tensor_slices -> shuffle(60000) -> batch(128) -> prefetch(AUTOTUNE)\n\n");
  std::printf("| threads | pipeline alone, elements/s | step ms, batches in memory | step ms, pipeline | overhead per step |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    // 2. Iterating the pipeline with no consumer work.
    std::vector<double> rates;
    for (int r = 0; r < (quick ? 1 : 3); ++r) {
      data::Iterator it = pipeline().make_iterator(static_cast<std::uint64_t>(r));
      const double t0 = bench::now();
      std::int64_t elements = 0;
      while (auto e = it.next()) elements += (*e)[0].dim(0);
      rates.push_back(static_cast<double>(elements) / (bench::now() - t0));
    }
    // 3. Steady-state step time: batches already in memory, then the pipeline. Medians
    // over epochs after the first.
    auto step_ms = [&](const data::Dataset& ds) {
      set_random_seed(0);
      Sequential m;
      m.add<nn::Dense>(256, "relu");
      m.add<nn::Dense>(128, "relu");
      m.add<nn::Dense>(10);
      m.compile(std::make_shared<optim::Adam>(1e-3f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
      History h = m.fit(ds, {.epochs = quick ? 2 : 7, .verbose = 0});
      std::vector<double> sps(h.samples_per_second.begin() + 1, h.samples_per_second.end());
      return 128.0 / bench::median(sps) * 1e3;
    };
    const double in_memory = step_ms(data::Dataset::from_tensor_slices({fm.train.x, fm.train.y}).batch(128).cache());
    const double piped = step_ms(pipeline());
    std::printf("| %d | %.0f | %.3f | %.3f | %+.1f%% |\n", threads, bench::median(rates), in_memory, piped,
                100.0 * (piped - in_memory) / in_memory);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = bench::has_flag(argc, argv, "--quick");
  slow_input(quick);
  fashion_mnist(quick);
  return 0;
}
