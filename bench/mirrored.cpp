// The seeds' large MLP (1024 -> Dense 1024 relu -> Dense 1024 relu -> Dense 10 softmax,
// Adam) trained with fit() at one global batch, on one device and under
// MirroredStrategy, in samples/s. The ways take turns one epoch at a time, so that a slow
// spell of this machine hits all of them; figures are medians over the rounds. Then a
// step piece by piece: under fit the replicas compute the dense layers' weight gradients
// together (a block of columns each, over every replica's rows); the pieces of the
// alternative, each replica its own gradients and then their sum, are timed beside it.
//
//   bench_mirrored [--batch 128] [--replicas 2] [--quick]
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/comm/in_process.h"
#include "dtrain/distribute/dense_together.h"
#include "dtrain/dtrain.h"
#include "models.h"
#include "timing.h"

using namespace dtrain;

namespace {

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
  const bool quick = bench::has_flag(argc, argv, "--quick");
  const std::int64_t batch = bench::int_flag(argc, argv, "--batch", 128);
  const int replicas = bench::int_flag(argc, argv, "--replicas", 2);
  const int cores = available_cores();
  const int steps = quick ? 8 : 40, rounds = quick ? 2 : 7;
  data::Split d = data::make_synthetic(steps * batch, 1024, 10, 0);

  std::vector<Way> ways;
  auto one_device = [&](std::string name, std::int64_t b, int threads, int k) {
    Way w{std::move(name), b, k, threads, nullptr, nullptr, {}};
    w.model = bench::large_mlp();
    ways.push_back(std::move(w));
  };
  auto mirrored = [&](std::string name, int k, std::size_t bytes_per_pack) {
    Way w{std::move(name), batch, k, 0, nullptr, nullptr, {}};
    w.strategy = std::make_shared<distribute::MirroredStrategy>(replicas, distribute::CommunicationOptions{bytes_per_pack});
    auto scope = w.strategy->scope();
    w.model = bench::large_mlp();
    ways.push_back(std::move(w));
  };
  const std::string rxt = std::to_string(replicas) + " replicas x " + std::to_string(std::max(1, cores / replicas)) + " thread";
  one_device("one device, " + std::to_string(cores) + " threads", batch, cores, 1);
  mirrored("MirroredStrategy, " + rxt, 1, 0);
  one_device("one device, " + std::to_string(cores) + " threads, K = 4", batch, cores, 4);
  mirrored("MirroredStrategy, " + rxt + ", K = 4", 4, 0);
  one_device("one replica's share alone: batch " + std::to_string(batch / replicas) + ", 1 thread", batch / replicas, 1, 1);

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

  // Where a step's time goes, measured piece by piece in the same process: forward and
  // backward on one device and on the replicas (no reduction, no update), the update on
  // one device and the replicas' shares of it, and the sum of the gradients.
  Sequential& one = *ways[0].model;
  distribute::Strategy& strategy = *ways[1].strategy;
  Sequential& mirrored_model = *ways[1].model;
  losses::SparseCategoricalCrossentropy loss_fn;
  const std::vector<Variable*> vars = one.trainable_variables(), mvars = mirrored_model.trainable_variables();
  const Tensor xb = d.x.slice(0, batch), yb = d.y.slice(0, batch);
  const int samples = quick ? 3 : 7;
  const double fb_one = bench::seconds_per_call([&] {
    GradientTape tape;
    tape.gradient(loss_fn(yb, one(xb, true)), vars);
  }, samples);
  const std::int64_t share = batch / replicas;
  auto replica_step = [&](DenseGradientsTogether* together) {
    const std::int64_t r = replica_context().replica_id;
    const ScopedDenseGradientsTogether hook(together);
    GradientTape tape;
    tape.gradient(loss_fn(yb.slice(r * share, (r + 1) * share), mirrored_model(xb.slice(r * share, (r + 1) * share), true)), mvars);
  };
  const double fb_replicas = bench::seconds_per_call([&] { strategy.run([&] { replica_step(nullptr); }); }, samples);
  // The three dense layers' kernels and biases, as fit hands them over.
  const std::vector<DenseVariables> dense{{0, 1}, {2, 3}, {4, 5}};
  distribute::detail::DenseTogether together(replicas, mvars, dense);
  std::vector<std::int64_t> bounds;
  for (int r = 0; r <= replicas; ++r) bounds.push_back(r * share);
  const double fb_together = bench::seconds_per_call([&] {
    together.begin_step(bounds, /*accumulate=*/false);
    strategy.run([&] {
      const int r = replica_context().replica_id;
      replica_step(together.replica(r));
      together.finish(r);
    });
  }, samples);
  std::vector<Tensor> grads;
  for (Variable* v : vars) grads.push_back(Tensor::full(v->shape(), 1e-6f));
  optim::Adam adam_one, adam_shared;
  const double update_one = bench::seconds_per_call([&] { adam_one.apply_gradients(grads, vars); }, samples);
  const double update_shares = bench::seconds_per_call([&] {
    adam_shared.begin_shared_update(mvars);
    strategy.run([&] { adam_shared.apply_share(grads, mvars, replica_context().replica_id, replicas); });
    adam_shared.end_shared_update();
  }, samples);
  const double run_alone = bench::seconds_per_call([&] { strategy.run([] {}); }, samples);
  std::size_t floats = 0;
  for (Variable* v : vars) floats += static_cast<std::size_t>(v->numel());
  std::vector<std::vector<float>> inputs(static_cast<std::size_t>(replicas), std::vector<float>(floats, 1.0f));
  std::vector<float> sum(floats);
  comm::InProcessAllReduce all_reduce(replicas, {{floats}}, {sum.data()});
  const double reduce = bench::seconds_per_call([&] {
    strategy.run([&] {
      const int r = replica_context().replica_id;
      all_reduce.set_input(r, 0, 0, inputs[static_cast<std::size_t>(r)].data());
      all_reduce.arrive(r, 0);
      all_reduce.finish(r);
    });
  }, samples) - run_alone;

  std::printf("Seeds' large MLP, fit(), global batch %lld, %d steps per epoch, median of %d rounds\n\n",
              static_cast<long long>(batch), steps, rounds);
  std::printf("| way | samples/s | against one device |\n|---|---|---|\n");
  const double base = bench::median(ways[0].samples_per_second);
  for (const Way& w : ways) {
    const double s = bench::median(w.samples_per_second);
    std::printf("| %s | %.0f | %.2f |\n", w.name.c_str(), s, s / base);
  }
  const double step_one = static_cast<double>(batch) / base;
  const double step_mirrored = static_cast<double>(batch) / bench::median(ways[1].samples_per_second);
  std::printf("\nOne step, piece by piece (ms):\n\n| piece | one device, %d threads | MirroredStrategy, %s: "
              "gradients together (fit) | the same, each replica its own gradients, then summed |\n|---|---|---|---|\n",
              cores, rxt.c_str());
  std::printf("| forward + backward | %.2f | %.2f | %.2f |\n", fb_one * 1e3, (fb_together - run_alone) * 1e3,
              (fb_replicas - run_alone) * 1e3);
  std::printf("| sum of the gradients (%.1f MiB, all at once) | - | - | %.2f |\n", static_cast<double>(floats) * 4 / (1 << 20),
              reduce * 1e3);
  std::printf("| Adam update (one device) / each replica's share | %.2f | %.2f | %.2f |\n", update_one * 1e3,
              (update_shares - run_alone) * 1e3, (update_shares - run_alone) * 1e3);
  std::printf("| starting and joining the replicas | - | %.3f | %.3f |\n", run_alone * 1e3, run_alone * 1e3);
  std::printf("| sum of the pieces | %.2f | %.2f | %.2f |\n", (fb_one + update_one) * 1e3,
              (fb_together + update_shares - run_alone) * 1e3, (fb_replicas + reduce + update_shares - run_alone) * 1e3);
  std::printf("| measured step in fit() | %.2f | %.2f | - |\n", step_one * 1e3, step_mirrored * 1e3);
  return 0;
}
