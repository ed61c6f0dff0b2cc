// The seeds' large MLP (1024 -> Dense 1024 relu -> Dense 1024 relu -> Dense 10 softmax,
// Adam) under MultiWorkerMirroredStrategy, one process per worker; run it with
//
//   dtrain launch --workers 2 -- bench_multi_worker [--batch 128] [--steps 200]
//       [--no-overlap] [--compression bf16|fp16] [--communication ring] [--bucket-kib N]
//       [--rss-every N]
//
// Each worker first trains its own copy on its share of the global batch without any
// communication (compute only: the same work each process does under the strategy,
// with the other process busy alike), then under the strategy. The chief prints the
// median step times, global samples/s, and the share of the step that communication
// added (exposed communication = strategy step - compute-only step). --rss-every N
// prints each worker's resident memory every N steps of the strategy run.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "dtrain/dtrain.h"
#include "models.h"
#include "timing.h"

using namespace dtrain;

namespace {

// Seconds between consecutive batch ends over all epochs (the first `skip` steps are
// warm-up, and so is each epoch's first step, which follows the epoch's end-of-epoch work).
struct StepTimes : Callback {
  std::int64_t skip = 0, rss_every = 0, steps = 0;
  std::string task;
  double last = 0;
  std::vector<double> seconds;
  void on_train_batch_end(std::int64_t batch, const Logs&) override {
    const double t = bench::now();
    if (++steps > skip && batch > 0) seconds.push_back(t - last);
    last = t;
    if (rss_every > 0 && steps % rss_every == 0)
      std::printf("%s rss step %lld: %.1f MB\n", task.c_str(), static_cast<long long>(steps), resident_mb());
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t batch = bench::int_flag(argc, argv, "--batch", 128);
  const int steps = bench::int_flag(argc, argv, "--steps", 200);
  const int warmup = bench::int_flag(argc, argv, "--warmup", 20);
  const int rss_every = bench::int_flag(argc, argv, "--rss-every", 0);
  distribute::CommunicationOptions comm;
  comm.overlap = !bench::has_flag(argc, argv, "--no-overlap");
  comm.bytes_per_pack = static_cast<std::size_t>(bench::int_flag(argc, argv, "--bucket-kib", 0)) << 10;
  std::string wire = "float32";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--compression") wire = argv[i + 1];
    if (std::string(argv[i]) == "--communication" && std::string(argv[i + 1]) == "ring")
      comm.implementation = distribute::CommunicationImplementation::RING;
  }
  if (wire == "bf16") comm.compression = distribute::Compression::BF16;
  if (wire == "fp16") comm.compression = distribute::Compression::FP16;

  distribute::MultiWorkerMirroredStrategy strategy(comm);
  const int workers = strategy.num_workers();
  const std::int64_t local = batch / workers;
  // At most 100 global batches of data (50 MiB), run for as many epochs as it takes.
  const int per_epoch = std::min(steps + warmup, 100);
  data::Split d = data::make_synthetic(per_epoch * batch, 1024, 10, 0);
  FitOptions fit;
  fit.shuffle = false;
  fit.verbose = 0;
  fit.epochs = (steps + warmup + per_epoch - 1) / per_epoch;

  // Compute only: this worker's rows, its own model, no strategy.
  auto alone = bench::large_mlp();
  auto alone_times = std::make_shared<StepTimes>();
  alone_times->skip = warmup;
  fit.batch_size = local;
  fit.callbacks = {alone_times};
  alone->fit(d.x.slice(0, per_epoch * local), d.y.slice(0, per_epoch * local), fit);

  std::unique_ptr<Sequential> model;
  {
    auto scope = strategy.scope();
    model = bench::large_mlp();
  }
  auto times = std::make_shared<StepTimes>();
  times->skip = warmup;
  times->rss_every = rss_every;
  times->task = strategy.task_type() + ":" + std::to_string(strategy.task_id());
  fit.batch_size = batch;
  fit.callbacks = {times};
  model->fit(d.x, d.y, fit);

  if (!strategy.is_chief()) return 0;
  const double compute = bench::median(alone_times->seconds), step = bench::median(times->seconds);
  std::printf("seeds' large MLP, %d workers x %d thread(s), global batch %lld (%lld per worker), %s on the wire, "
              "overlap %s, gradients through %s; medians of %d steps\n",
              workers, num_threads(), static_cast<long long>(batch), static_cast<long long>(local), wire.c_str(),
              comm.overlap ? "on" : "off", strategy.backend()->transport().c_str(), steps);
  std::printf("%-34s %10s %12s\n", "", "step ms", "samples/s");
  std::printf("%-34s %10.2f %12.0f\n", "compute only (per worker)", compute * 1e3, static_cast<double>(local) / compute);
  std::printf("%-34s %10.2f %12.0f\n", "MultiWorkerMirroredStrategy", step * 1e3, static_cast<double>(batch) / step);
  std::printf("exposed communication: %.2f ms, %.0f%% of the step\n", (step - compute) * 1e3,
              100.0 * (step - compute) / step);
  return 0;
}
