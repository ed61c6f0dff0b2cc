// Saving and restoring the seeds' large MLP with Adam (weights and both moments, about
// 25 MB): a synchronous save against the disk's own sequential write rate for the same
// bytes, a restore, and what a background save costs the training step against the time
// to copy the state once; then BackupAndRestore's overhead on 10 epochs of Fashion-MNIST. Usage: bench_checkpoint [FOLDER] (default: the current folder;
// it must be on the disk to measure, not a tmpfs).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "dtrain/checkpoint/backup_and_restore.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/elastic_state.h"
#include "dtrain/checkpoint/manager.h"
#include "dtrain/core/threads.h"
#include "dtrain/data/datasets.h"
#include "models.h"
#include "timing.h"

using namespace dtrain;

namespace {

double median_of(int samples, const std::function<void()>& fn) {
  std::vector<double> t;
  fn();  // warm-up
  for (int i = 0; i < samples; ++i) {
    const double t0 = bench::now();
    fn();
    t.push_back(bench::now() - t0);
  }
  return bench::median(t);
}

// write(2) of `bytes` to a new file, fsync'd, as a checkpoint writes it: the disk's rate.
double write_file_seconds(const std::string& path, const std::vector<char>& bytes) {
  const double t0 = bench::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) break;
    done += static_cast<std::size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
  const double s = bench::now() - t0;
  std::remove(path.c_str());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string folder = argc > 1 ? argv[1] : ".";
  const std::string dir = folder + "/bench_checkpoint.tmp";
  std::filesystem::create_directories(dir);
  auto model = bench::large_mlp();
  data::Split d = data::make_synthetic(64 * 40, 1024, 10, 1);
  const Tensor x = d.x.slice(0, 64), y = d.y.slice(0, 64);
  model->fit(x, y, {.epochs = 1, .batch_size = 64, .verbose = 0});  // Adam's moments exist

  train::Checkpoint ckpt{{"model", *model}, {"optimizer", model->optimizer()}};
  train::Snapshot snap;
  ckpt.snapshot(snap);
  std::size_t bytes = 0;
  for (const auto& [name, t] : snap.data.tensors) bytes += static_cast<std::size_t>(t.nbytes());
  const double mb = static_cast<double>(bytes) / 1e6;

  const int samples = 9;
  // The target's yardstick: the state copied once, tensor by tensor, into buffers kept.
  std::vector<Tensor> copies;
  for (const auto& [name, t] : snap.data.tensors) copies.push_back(Tensor::empty(t.shape(), t.dtype()));
  const double copy = median_of(samples, [&] {
    for (std::size_t i = 0; i < copies.size(); ++i) copies[i].copy_from(snap.data.tensors[i].second);
  });
  // The same copy shared among the compute threads, tensor by tensor, as save()'s is.
  const double copy_threads = median_of(samples, [&] {
    parallel_for(static_cast<std::int64_t>(copies.size()), 1, [&](std::int64_t b, std::int64_t e) {
      for (auto i = static_cast<std::size_t>(b); i < static_cast<std::size_t>(e); ++i)
        copies[i].copy_from(snap.data.tensors[i].second);
    });
  });
  const double snapshot = median_of(samples, [&] { ckpt.snapshot(snap); });
  const std::string path = dir + "/sync.safetensors";
  const double save = median_of(samples, [&] { ckpt.write(path); });
  const double restore = median_of(samples, [&] { ckpt.restore(path); });
  // An elastic job's commit to memory and its restore after a failure (ElasticState).
  train::ElasticState state(ckpt);
  const double commit = median_of(samples, [&] { state.commit(1); });
  const double restore_memory = median_of(samples, [&] { state.restore(); });
  std::vector<char> raw(bytes, 1);
  const double disk = median_of(samples, [&] { write_file_seconds(dir + "/raw.bin", raw); });

  // What a background save costs training: 10 steps with a save started before the first
  // (the write ends within them) against 10 steps without, in pairs; the median difference.
  // Each round also times the same with the writer a checkpoint had before direct I/O, as
  // the baseline: a plain copy, then a thread at nice 10 that checksums the copy and writes
  // it through the page cache (save_checked of the copied tensors), and fsyncs.
  auto step = [&] { model->fit(x, y, {.epochs = 1, .batch_size = 64, .shuffle = false, .verbose = 0}); };
  constexpr int kSteps = 10;
  auto ten_steps = [&] {
    const double t0 = bench::now();
    for (int k = 0; k < kSteps; ++k) step();
    return bench::now() - t0;
  };
  train::CheckpointManager manager(ckpt, dir + "/async", {.max_to_keep = 2, .async = true});
  NamedTensors plain_copy{{}, snap.data.metadata};
  for (std::size_t i = 0; i < copies.size(); ++i) plain_copy.tensors.emplace_back(snap.data.tensors[i].first, copies[i]);
  std::vector<double> call, without, extra, baseline_extra, cold_copy;
  step();
  for (int i = 0; i < 4 * samples; ++i) {  // the pairs' differences are small against their spread
    without.push_back(ten_steps());
    double t0 = bench::now();
    manager.save();
    call.push_back(bench::now() - t0);
    for (int k = 0; k < kSteps; ++k) step();
    extra.push_back(bench::now() - t0 - without.back());
    manager.sync();  // finished long before; a sync here keeps saves from overlapping

    const double base = ten_steps();
    t0 = bench::now();
    for (std::size_t k = 0; k < copies.size(); ++k) copies[k].copy_from(snap.data.tensors[k].second);
    cold_copy.push_back(bench::now() - t0);  // the yardstick where save() is called: after steps
    std::thread writer([&] {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
      save_checked(dir + "/baseline.safetensors", plain_copy, /*sync_folder=*/false);
    });
    for (int k = 0; k < kSteps; ++k) step();
    baseline_extra.push_back(bench::now() - t0 - base);
    writer.join();
  }
  std::filesystem::remove_all(dir);
  const double plain = bench::median(without) / kSteps;
  const double stall = bench::median(extra);  // the median of the pairs' differences

  // BackupAndRestore(save_freq=100) on 10 epochs of Fashion-MNIST (784-256-128-10, Adam,
  // batch 128): training seconds with and without it, in pairs in this process, each pair's
  // order the other way round from the last.
  const data::Classification fm = data::load_fashion_mnist();
  std::vector<double> costs, in_save, waiting, writer_cpu;  // fractions of the fit's seconds
  auto fashion = [&](bool backup) {
    set_random_seed(0);
    Sequential m;
    m.add<nn::Dense>(256, "relu");
    m.add<nn::Dense>(128, "relu");
    m.add<nn::Dense>(10);
    m.build(Shape{784});
    m.compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, /*from_logits=*/true);
    FitOptions o{.epochs = 10, .batch_size = 128, .verbose = 0};
    if (backup)
      o.callbacks = {std::make_shared<train::BackupAndRestore>(dir + "/backup",
                                                               train::BackupAndRestoreOptions{.save_freq = 100, .out = nullptr})};
    const History h = m.fit(fm.train.x, fm.train.y, o);
    double s = 0;
    for (double e : h.epoch_seconds) s += e;
    if (backup) {
      const auto* b = static_cast<const train::BackupAndRestore*>(o.callbacks[0].get());
      const train::SaveStatistics st = b->save_statistics();
      // All a save can take from training, apart from its effect on the caches: the time
      // the training thread spends in save(), and the writer's CPU time, which is taken
      // from the training threads at most once.
      costs.push_back((st.seconds_in_save + st.writer_cpu_seconds) / s);
      in_save.push_back(st.seconds_in_save / s);
      waiting.push_back(st.seconds_waiting / s);
      writer_cpu.push_back(st.writer_cpu_seconds / s);
    }
    return s;
  };
  std::vector<double> ratios, with_backup, plain_fit;
  for (int pair = 0; pair < 4; ++pair) {
    // Which run of a pair goes first alternates: the second of two runs is often faster.
    if (pair % 2 == 0) {
      plain_fit.push_back(fashion(false));
      with_backup.push_back(fashion(true));
    } else {
      with_backup.push_back(fashion(true));
      plain_fit.push_back(fashion(false));
    }
    ratios.push_back(with_backup.back() / plain_fit.back());
  }
  std::filesystem::remove_all(dir);

  std::printf("state: %.1f MB (%zu tensors), folder %s\n", mb, snap.data.tensors.size(), folder.c_str());
  std::printf("%-44s %10s %10s\n", "what", "ms", "MB/s");
  auto row = [&](const char* what, double s) { std::printf("%-44s %10.2f %10.0f\n", what, s * 1e3, mb / s); };
  row("copy the state once", copy);
  row("  the same on every compute thread", copy_threads);
  row("snapshot (what save() copies)", snapshot);
  row("synchronous save (checksums, fsync, rename)", save);
  row("write+fsync of the same bytes (the disk)", disk);
  row("commit to memory (ElasticState::commit)", commit);
  row("restore from memory (ElasticState::restore)", restore_memory);
  row("restore (read, verify, assign)", restore);
  row("async save(): the call on the training thread", bench::median(call));
  const train::SaveStatistics& st = manager.statistics();
  std::printf("%-44s %10.2f\n", "  its writer's CPU time per save", st.writer_cpu_seconds / static_cast<double>(st.saves) * 1e3);
  std::printf("%-44s %10.2f\n", "  its writer's wall time per save", st.writer_seconds / static_cast<double>(st.saves) * 1e3);
  row("copy the state once, right after 10 steps", bench::median(cold_copy));
  std::printf("%-44s %10.2f\n", "training step (batch 64)", plain * 1e3);
  std::printf("%-44s %10.2f\n", "10 steps with a background save, extra", stall * 1e3);
  std::printf("%-44s %10.2f\n", "  the same, page-cache writer (baseline)", bench::median(baseline_extra) * 1e3);
  std::printf("stall (all it costs training) %.2f ms against %.2f ms to copy the state once; save at %.0f%% of the disk's rate\n",
              stall * 1e3, copy * 1e3, 100.0 * disk / save);
  std::printf("  against the copy right after steps: the call %.2fx, all it costs %.2fx\n",
              bench::median(call) / bench::median(cold_copy), stall / bench::median(cold_copy));
  std::printf("Fashion-MNIST, 10 epochs: %.2f s, with BackupAndRestore(save_freq=100) %.2f s; overhead %+.1f%% "
              "(median of %zu pairs' ratios)\n",
              bench::median(plain_fit), bench::median(with_backup), 100.0 * (bench::median(ratios) - 1.0), ratios.size());
  std::printf("  its saves' own cost: %.2f%% of the fit (in save() %.2f%%, of which waiting %.2f%%; writer CPU %.2f%%), "
              "median of %zu fits\n",
              100.0 * bench::median(costs), 100.0 * bench::median(in_save), 100.0 * bench::median(waiting),
              100.0 * bench::median(writer_cpu), costs.size());
  return 0;
}
