// The seeds' large MLP (1024 -> Dense 1024 relu -> Dense 1024 relu -> Dense 10 softmax,
// Adam) trained with fit() at one global batch, on one device and under
// MirroredStrategy, in samples/s. The ways take turns one epoch at a time, so that a slow
// spell of this machine hits all of them; figures are medians over the rounds.
//
//   bench_mirrored [--batch 128] [--replicas 2] [--quick]
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/dtrain.h"
#include "timing.h"

using namespace dtrain;

namespace {

bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

int int_flag(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

std::unique_ptr<Sequential> large_mlp() {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(1024, "relu", nn::DenseOptions{.seed = 1});
  m->add<nn::Dense>(1024, "relu", nn::DenseOptions{.seed = 2});
  m->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 3});
  m->compile("adam", "sparse_categorical_crossentropy");
  m->build(Shape{1024});
  return m;
}

struct Way {
  std::string name;
  std::int64_t batch;
  int accumulation = 1;
  int threads = 0;                                // one device: kernel threads
  std::shared_ptr<distribute::Strategy> strategy;  // null: one device
  std::unique_ptr<Sequential> model;
  std::vector<double> samples_per_second;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = has_flag(argc, argv, "--quick");
  const std::int64_t batch = int_flag(argc, argv, "--batch", 128);
  const int replicas = int_flag(argc, argv, "--replicas", 2);
  const int cores = available_cores();
  const int steps = quick ? 8 : 40, rounds = quick ? 2 : 7;
  data::Split d = data::make_synthetic(steps * batch, 1024, 10, 0);

  std::vector<Way> ways;
  auto one_device = [&](std::string name, std::int64_t b, int threads, int k) {
    Way w{std::move(name), b, k, threads, nullptr, nullptr, {}};
    w.model = large_mlp();
    ways.push_back(std::move(w));
  };
  auto mirrored = [&](std::string name, int k, std::size_t bytes_per_pack) {
    Way w{std::move(name), batch, k, 0, nullptr, nullptr, {}};
    w.strategy = std::make_shared<distribute::MirroredStrategy>(replicas, distribute::CommunicationOptions{bytes_per_pack});
    auto scope = w.strategy->scope();
    w.model = large_mlp();
    ways.push_back(std::move(w));
  };
  const std::string rxt = std::to_string(replicas) + " replicas x " + std::to_string(std::max(1, cores / replicas)) + " thread";
  one_device("one device, " + std::to_string(cores) + " threads", batch, cores, 1);
  mirrored("MirroredStrategy, " + rxt + " (4 MiB buckets)", 1, 0);
  one_device("one device, " + std::to_string(cores) + " threads, K = 4", batch, cores, 4);
  mirrored("MirroredStrategy, " + rxt + ", K = 4", 4, 0);
  one_device("one replica's share alone: batch " + std::to_string(batch / replicas) + ", 1 thread", batch / replicas, 1, 1);
  if (!quick)
    for (std::size_t kib : {256u, 1024u, 16384u, 65536u})
      mirrored("MirroredStrategy, " + rxt + ", " + std::to_string(kib) + " KiB buckets", 1, std::size_t{kib} << 10);

  for (int round = 0; round <= rounds; ++round) {
    for (Way& w : ways) {
      set_num_threads(w.threads > 0 ? w.threads : cores);
      FitOptions o;
      o.batch_size = w.batch;
      o.shuffle = false;
      o.verbose = 0;
      o.gradient_accumulation_steps = w.accumulation;
      const std::int64_t rows = steps * w.batch;
      History h = w.model->fit(d.x.slice(0, std::min(rows, d.x.dim(0))), d.y.slice(0, std::min(rows, d.y.dim(0))), o);
      if (round > 0) w.samples_per_second.push_back(h.samples_per_second.back());  // round 0 warms up
    }
  }
  set_num_threads(cores);
  std::printf("Seeds' large MLP, fit(), global batch %lld, %d steps per epoch, median of %d rounds\n\n",
              static_cast<long long>(batch), steps, rounds);
  std::printf("| way | samples/s | against one device |\n|---|---|---|\n");
  const double base = bench::median(ways[0].samples_per_second);
  for (const Way& w : ways) {
    const double s = bench::median(w.samples_per_second);
    std::printf("| %s | %.0f | %.2f |\n", w.name.c_str(), s, s / base);
  }
  return 0;
}
