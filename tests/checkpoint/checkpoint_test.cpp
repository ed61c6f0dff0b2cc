// Checkpoint, CheckpointManager and BackupAndRestore within one process: what a checkpoint
// holds comes back exactly, damage of any kind is found, and an interrupted fit resumed
// through BackupAndRestore ends with the uninterrupted run's weights, bit for bit.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/temp_dir.h"
#include "dtrain/checkpoint/backup_and_restore.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/elastic_state.h"
#include "dtrain/checkpoint/manager.h"
#include "dtrain/data/datasets.h"
#include "dtrain/distribute/strategy.h"

namespace dtrain::train {
namespace {

using testing::TempDirTest;

std::unique_ptr<Sequential> mlp(std::uint64_t seed = 1) {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(16, "relu", nn::DenseOptions{.seed = seed});
  m->add<nn::Dropout>(0.25f, seed + 10);
  m->add<nn::Dense>(3, "", nn::DenseOptions{.seed = seed + 1});
  m->build(Shape{6});
  m->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true),
             {"accuracy"});
  return m;
}

std::vector<std::vector<float>> weights(const Sequential& m) {
  std::vector<std::vector<float>> out;
  for (Variable* v : m.variables()) out.push_back(v->value().to_vector());
  return out;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Data {
  data::Split d = data::make_synthetic(96, 6, 3, 7, data::SyntheticLabels::teacher);
};

TEST_F(TempDirTest, AdamMomentsAndIterationsSurviveSoTheNextUpdateIsTheSame) {
  Data data;
  auto a = mlp();
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .verbose = 0});
  Checkpoint saved{{"model", *a}, {"optimizer", a->optimizer()}};
  const std::string path = saved.save((dir_ / "ckpt").string());
  EXPECT_EQ(path, (dir_ / "ckpt-1.safetensors").string());

  auto b = mlp(/*seed=*/99);  // other weights, no slots, iteration 0
  Checkpoint loaded{{"model", *b}, {"optimizer", b->optimizer()}};
  loaded.restore(path).assert_consumed();
  EXPECT_EQ(weights(*b), weights(*a));
  EXPECT_EQ(b->optimizer().iterations(), a->optimizer().iterations());
  EXPECT_EQ(loaded.save_counter(), 1);
  // One more epoch on each: the same updates (Adam's m, v and bias correction, and the
  // dropout masks), so the same bits.
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .seed = 5, .verbose = 0});
  b->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .seed = 5, .verbose = 0});
  EXPECT_EQ(weights(*b), weights(*a));
}

// A loss scale (mixed_float16's) comes back with its count of good steps, also into an
// optimizer not given one yet (restored before compile), which then keeps it.
TEST_F(TempDirTest, ALossScaleComesBackWithItsGoodSteps) {
  Data data;
  auto a = mlp();
  a->optimizer().set_loss_scale(optim::LossScale{.initial_scale = 256.0f, .dynamic_growth_steps = 4});
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .verbose = 0});  // 6 steps
  ASSERT_EQ(a->optimizer().loss_scale(), 512.0f);
  Checkpoint saved{{"model", *a}, {"optimizer", a->optimizer()}};
  const std::string path = saved.save((dir_ / "ckpt").string());

  auto b = mlp(/*seed=*/99);
  b->optimizer().set_loss_scale(optim::LossScale{.initial_scale = 256.0f, .dynamic_growth_steps = 4});
  Checkpoint{{"model", *b}, {"optimizer", b->optimizer()}}.restore(path).assert_consumed();
  EXPECT_EQ(b->optimizer().loss_scale(), 512.0f);
  EXPECT_EQ(b->optimizer().loss_scale_good_steps(), 2);
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .seed = 5, .verbose = 0});
  b->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .seed = 5, .verbose = 0});
  EXPECT_EQ(weights(*b), weights(*a));
  EXPECT_EQ(b->optimizer().loss_scale(), a->optimizer().loss_scale());

  auto c = mlp();
  Checkpoint{{"model", *c}, {"optimizer", c->optimizer()}}.restore(path).assert_consumed();
  ASSERT_TRUE(c->optimizer().loss_scale_options().has_value());
  EXPECT_EQ(c->optimizer().loss_scale(), 512.0f);
  EXPECT_EQ(c->optimizer().loss_scale_options()->dynamic_growth_steps, 4);
}

// An elastic job's commit in memory: restored after more training, the run goes on as if
// that training never happened, bit for bit (weights, Adam's moments and iteration count,
// the dropout masks' streams, the step counter).
TEST(ElasticState, ARestoredCommitTrainsOnAsIfNothingHappenedSinceIt) {
  Data data;
  auto a = mlp();
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .verbose = 0});
  std::int64_t step = 6;
  Checkpoint tracked{{"model", *a}, {"optimizer", a->optimizer()}, {"step", step}};
  ElasticState state(tracked);
  EXPECT_FALSE(state.committed());
  EXPECT_THROW(state.restore(), InvalidArgument);
  state.commit(step);
  EXPECT_EQ(state.committed_step(), 6);
  EXPECT_GT(state.bytes(), 0u);
  const auto committed = weights(*a);
  const std::int64_t iterations = a->optimizer().iterations();
  const std::uint64_t digest = state.digest();

  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .seed = 5, .verbose = 0});
  step = 12;
  const auto after_once = weights(*a);
  ASSERT_NE(after_once, committed);
  EXPECT_EQ(state.restore(), 6);
  EXPECT_EQ(weights(*a), committed);
  EXPECT_EQ(a->optimizer().iterations(), iterations);
  EXPECT_EQ(step, 6);
  EXPECT_EQ(state.digest(), digest);
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 16, .seed = 5, .verbose = 0});
  EXPECT_EQ(weights(*a), after_once) << "the epoch after the restore differs from the epoch after the commit";
}

// A snapshot's bytes that change in memory are found before anything is restored; a
// snapshot taken without a copy (no checksums) is refused.
TEST(ElasticState, ASnapshotChangedInMemoryIsRefusedNamingTheTensor) {
  auto a = mlp();
  Checkpoint tracked{{"model", *a}};
  Snapshot snapshot;
  tracked.snapshot(snapshot);
  const auto before = weights(*a);
  snapshot.data.tensors[0].second.data<float>()[0] += 1.0f;
  try {
    tracked.restore(snapshot, "the commit of step 3");
    ADD_FAILURE() << "a changed snapshot was restored";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("the commit of step 3: tensor '" + snapshot.data.tensors[0].first +
                                         "' changed in memory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(weights(*a), before);
  Snapshot live;
  tracked.snapshot(live, /*copy=*/false);
  EXPECT_THROW(tracked.restore(live, "a live snapshot"), InvalidArgument);
}

TEST_F(TempDirTest, IteratorGeneratorAndCountersComeBack) {
  data::Dataset ds = data::Dataset::range(100).shuffle(16, 3).batch(4);
  data::Iterator it = ds.make_iterator();
  for (int i = 0; i < 5; ++i) it.next();
  Generator g(42, 7);
  std::int64_t step = 123;
  Checkpoint c{{"it", it}, {"g", g}, {"step", step}};
  const std::string path = c.write((dir_ / "state.safetensors").string());
  const std::vector<float> expected = it.next()->at(0).to_vector();

  data::Iterator fresh = ds.make_iterator();
  Generator g2;
  std::int64_t step2 = 0;
  Checkpoint r{{"it", fresh}, {"g", g2}, {"step", step2}};
  r.restore(path).assert_consumed();
  EXPECT_EQ(fresh.next()->at(0).to_vector(), expected);
  EXPECT_EQ(g2.seed(), 42u);
  EXPECT_EQ(g2.counter(), 7u);
  EXPECT_EQ(step2, 123);
}

TEST_F(TempDirTest, AnotherModelsCheckpointIsRefusedAndNothingChanges) {
  auto a = mlp();
  const std::string path = Checkpoint{{"model", *a}}.write((dir_ / "a.safetensors").string());
  Sequential other;
  other.add<nn::Dense>(5, "relu", nn::DenseOptions{.seed = 3});
  other.add<nn::Dense>(3, "", nn::DenseOptions{.seed = 4});
  other.build(Shape{6});
  const auto before = weights(other);
  Checkpoint c{{"model", other}};
  try {
    c.restore(path);
    FAIL() << "restored another model's checkpoint";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("dense/kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("[6, 16]"), std::string::npos) << what;  // the file's shape
    EXPECT_NE(what.find("[6, 5]"), std::string::npos) << what;   // the model's
  }
  EXPECT_EQ(weights(other), before);
  // Entries nothing takes are listed, and assert_consumed names them.
  auto same = mlp(7);
  Checkpoint partial{{"model", *same}, {"extra", same->optimizer()}};
  EXPECT_THROW(partial.restore(path), IoError);  // the file has no optimizer 'extra'
  EXPECT_NO_THROW(partial.restore(path, {.partial = true}).expect_partial());
}

// Every kind of damage: truncation at 20 offsets across header and data, one flipped bit
// at every header byte and at sampled data bytes, a deleted file. Each is found (all of
// them), the error names the file, and a flip in the data names the tensor.
// Damage of every kind to `path`, a checkpoint of mlp() and its optimizer, is refused with
// an error naming the file, and the tensor where the damage is in a tensor's bytes.
void expect_every_truncation_and_flipped_bit_detected(const std::filesystem::path& dir_, const std::string& path) {
  const std::string good = read_bytes(path);
  std::uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<std::uint64_t>(static_cast<unsigned char>(good[i])) << (8 * i);
  const std::size_t data_start = 8 + header;
  ASSERT_LT(data_start, good.size());
  const std::string bad = (dir_ / "bad.safetensors").string();
  auto expect_refused = [&](const std::string& bytes, const std::string& what, bool names_tensor) {
    write_bytes(bad, bytes);
    auto b = mlp(5);
    const auto before = weights(*b);
    Checkpoint c{{"model", *b}, {"optimizer", b->optimizer()}};
    try {
      c.restore(bad);
      ADD_FAILURE() << what << ": not detected";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(bad), std::string::npos) << what << ": " << msg;
      if (names_tensor) {
        EXPECT_NE(msg.find("tensor '"), std::string::npos) << what << ": " << msg;
      }
    }
    EXPECT_EQ(weights(*b), before) << what;
  };
  // Truncation: 10 offsets in the header (length field included), 10 in the data.
  for (int i = 0; i < 10; ++i) {
    const std::size_t at = i * data_start / 10;
    expect_refused(good.substr(0, at), "truncated at " + std::to_string(at), false);
  }
  for (int i = 0; i < 10; ++i) {
    const std::size_t at = data_start + i * (good.size() - data_start) / 10;
    expect_refused(good.substr(0, at), "truncated at " + std::to_string(at), false);
  }
  // A flipped bit at every byte of the header (bit chosen by position) up to the end of its
  // JSON, at every 31st byte of the padding after it, and in the data.
  std::mt19937 rng(11);
  const std::size_t padding = good.find_last_not_of(' ', data_start - 1) + 1;
  for (std::size_t at = 0; at < data_start; at += at < padding ? 1 : 31) {
    std::string flipped = good;
    flipped[at] = static_cast<char>(flipped[at] ^ (1 << (at % 8)));
    expect_refused(flipped, "bit " + std::to_string(at % 8) + " of header byte " + std::to_string(at), false);
  }
  for (int i = 0; i < 64; ++i) {
    const std::size_t at = data_start + rng() % (good.size() - data_start);
    std::string flipped = good;
    flipped[at] = static_cast<char>(flipped[at] ^ (1 << (rng() % 8)));
    expect_refused(flipped, "a bit of data byte " + std::to_string(at), true);
  }
  std::filesystem::remove(bad);
  auto b = mlp(5);
  EXPECT_THROW((Checkpoint{{"model", *b}}.restore(bad)), IoError);
}

TEST_F(TempDirTest, EveryTruncationAndFlippedBitIsDetected) {
  auto a = mlp();
  Data data;
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  Checkpoint c{{"model", *a}, {"optimizer", a->optimizer()}};
  SCOPED_TRACE("written by write()");
  expect_every_truncation_and_flipped_bit_detected(dir_, c.write((dir_ / "good.safetensors").string()));
}

TEST_F(TempDirTest, EveryTruncationAndFlippedBitIsDetectedInABackgroundSavesFile) {
  // A copied snapshot is written from its block, with direct I/O where the disk has it and
  // the header padded to 4096 bytes.
  auto a = mlp();
  Data data;
  a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  Checkpoint c{{"model", *a}, {"optimizer", a->optimizer()}};
  Snapshot snapshot;
  c.snapshot(snapshot, /*copy=*/true);
  const std::string path = (dir_ / "good.safetensors").string();
  Checkpoint::write_snapshot(snapshot, path);
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + header) % 4096, 0u);
  SCOPED_TRACE("written from a copied snapshot");
  expect_every_truncation_and_flipped_bit_detected(dir_, path);
}

TEST_F(TempDirTest, TheManagerKeepsTheNewestAndFallsBackToTheLastGoodOne) {
  auto a = mlp();
  Data data;
  Checkpoint c{{"model", *a}, {"optimizer", a->optimizer()}};
  std::ostringstream log;
  CheckpointManager manager(c, (dir_ / "run").string(), {.max_to_keep = 3, .log = &log});
  std::vector<std::vector<std::vector<float>>> saved;
  for (int i = 0; i < 5; ++i) {
    a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
    manager.save();
    saved.push_back(weights(*a));
  }
  ASSERT_EQ(manager.checkpoints().size(), 3u);
  EXPECT_EQ(*manager.latest_checkpoint(), (dir_ / "run" / "ckpt-5.safetensors").string());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run" / "ckpt-2.safetensors"));
  // A new manager reads the index; the newest file is damaged, so the one before comes back.
  const std::string newest = *manager.latest_checkpoint();
  std::string bytes = read_bytes(newest);
  bytes.resize(bytes.size() - 100);
  write_bytes(newest, bytes);
  auto b = mlp(9);
  Checkpoint cb{{"model", *b}, {"optimizer", b->optimizer()}};
  CheckpointManager reader(cb, (dir_ / "run").string(), {.log = &log});
  EXPECT_EQ(reader.checkpoints().size(), 3u);
  const RestoredCheckpoint r = reader.restore_latest();
  ASSERT_TRUE(r.path.has_value());
  EXPECT_EQ(r.number, 4);
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].path, newest);
  EXPECT_NE(log.str().find("skipped " + newest), std::string::npos) << log.str();
  EXPECT_EQ(weights(*b), saved[3]);
  EXPECT_EQ(b->optimizer().iterations(), 4 * 3);
}

TEST_F(TempDirTest, AsyncSavesWriteWhatWasThereAtTheStep) {
  auto a = mlp();
  Data data;
  Checkpoint c{{"model", *a}};
  CheckpointManager manager(c, (dir_ / "async").string(), {.max_to_keep = 0, .async = true});
  std::vector<std::vector<std::vector<float>>> at_save;
  for (int i = 0; i < 3; ++i) {
    manager.save();
    at_save.push_back(weights(*a));
    // Training goes on while the file is written: the file must still hold the snapshot.
    a->fit(data.d.x, data.d.y, {.epochs = 1, .batch_size = 32, .verbose = 0});
  }
  manager.sync();
  ASSERT_EQ(manager.checkpoints().size(), 3u);
  // Every save counted, and the writer's time taken in once its writes have ended.
  const SaveStatistics& st = manager.statistics();
  EXPECT_EQ(st.saves, 3);
  EXPECT_GT(st.seconds_in_save, 0.0);
  EXPECT_GT(st.writer_seconds, 0.0);
  EXPECT_GT(st.writer_cpu_seconds, 0.0);
  for (int i = 0; i < 3; ++i) {
    auto b = mlp(9);
    Checkpoint cb{{"model", *b}};
    cb.restore(manager.checkpoints()[static_cast<std::size_t>(i)]);
    EXPECT_EQ(weights(*b), at_save[static_cast<std::size_t>(i)]) << "checkpoint " << i;
  }
}

// A fit that fails at a chosen batch, resumed by a second fit with the same callback,
// ends where the uninterrupted fit ends: same weights, same optimizer iterations.
struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

std::shared_ptr<Callback> fail_at(std::int64_t total_batch) {
  auto cb = std::make_shared<LambdaCallback>();
  auto seen = std::make_shared<std::int64_t>(0);
  cb->batch_begin = [seen, total_batch](std::int64_t, const Logs&) {
    if ((*seen)++ == total_batch) throw Interrupted();
  };
  return cb;
}

void expect_resume_equals_uninterrupted(const std::filesystem::path& dir, int replicas, bool dataset, std::int64_t kill_at,
                                        SaveFreq freq) {
  SCOPED_TRACE("replicas " + std::to_string(replicas) + (dataset ? ", a Dataset" : ", tensors") + ", interrupted at batch " +
               std::to_string(kill_at) + ", saving every " + freq.to_string());
  Data data;
  std::optional<distribute::MirroredStrategy> strategy;
  if (replicas > 1) strategy.emplace(replicas);
  auto make = [&] {
    std::optional<dtrain::detail::ScopedStrategy> scope;
    if (strategy) scope.emplace(strategy->scope());
    return mlp();
  };
  const FitOptions base{.epochs = 3, .batch_size = 16, .seed = 4, .verbose = 0};
  const data::Dataset ds = data::Dataset::from_tensor_slices({data.d.x, data.d.y}).shuffle(96, 8).batch(16);
  auto run = [&](Sequential& m, FitOptions o) {
    if (dataset) m.fit(ds, o);
    else m.fit(data.d.x, data.d.y, o);
  };
  set_random_seed(3);
  auto reference = make();
  run(*reference, base);

  const std::string backups = (dir / ("backup_" + std::to_string(replicas) + std::to_string(dataset) + std::to_string(kill_at))).string();
  set_random_seed(3);
  auto first = make();
  FitOptions o = base;
  o.callbacks = {std::make_shared<BackupAndRestore>(backups, BackupAndRestoreOptions{.save_freq = freq, .out = nullptr}),
                 fail_at(kill_at)};
  EXPECT_THROW(run(*first, o), Interrupted);

  set_random_seed(3);
  auto second = make();  // a new process would build fresh weights; they are overwritten
  auto resume = std::make_shared<BackupAndRestore>(backups, BackupAndRestoreOptions{.save_freq = freq, .out = nullptr});
  o.callbacks = {resume};
  run(*second, o);
  EXPECT_EQ(weights(*second), weights(*reference));
  EXPECT_EQ(second->optimizer().iterations(), reference->optimizer().iterations());
  EXPECT_EQ(resume->steps_done(), 3 * 6);
  EXPECT_FALSE(std::filesystem::exists(backups + "/checkpoint"));  // deleted at the end
}

TEST_F(TempDirTest, ResumedFitEqualsUninterruptedOnOneDevice) {
  for (const std::int64_t at : {2, 7, 11, 16}) expect_resume_equals_uninterrupted(dir_, 1, false, at, 3);
  expect_resume_equals_uninterrupted(dir_, 1, false, 13, "epoch");
}

TEST_F(TempDirTest, ResumedFitEqualsUninterruptedOnADataset) {
  for (const std::int64_t at : {5, 14}) expect_resume_equals_uninterrupted(dir_, 1, true, at, 2);
}

TEST_F(TempDirTest, ResumedFitEqualsUninterruptedUnderMirroredStrategy) {
  for (const std::int64_t at : {4, 9}) expect_resume_equals_uninterrupted(dir_, 2, false, at, 2);
}

TEST_F(TempDirTest, KeepCheckpointEveryNHoursKeepsOneOfThemOnDisk) {
  auto a = mlp();
  Checkpoint c{{"model", *a}};
  double now = 1e9;
  CheckpointManager manager(c, (dir_ / "hours").string(),
                            {.max_to_keep = 1, .keep_checkpoint_every_n_hours = 1.0, .clock = [&] { return now; }});
  for (int i = 1; i <= 6; ++i) {
    now += 1800;  // half an hour between saves
    manager.save();
  }
  // Only the newest is managed; of the ones pushed out, those an hour or more after the
  // last one kept stay on disk: the saves at 1 h, 2 h and 3 h after the manager began.
  EXPECT_EQ(manager.checkpoints().size(), 1u);
  for (int i = 1; i <= 6; ++i) {
    const bool kept = i == 2 || i == 4 || i == 6;
    EXPECT_EQ(std::filesystem::exists(dir_ / "hours" / ("ckpt-" + std::to_string(i) + ".safetensors")), kept) << i;
  }
}

// SIGTERM during fit: a save at the next batch's end, then Preempted; the run started again
// resumes there, and no batch is trained twice or lost.
TEST_F(TempDirTest, SigtermSavesAtTheNextBatchAndTheResumedRunIsTheSame) {
  Data data;
  const FitOptions base{.epochs = 2, .batch_size = 16, .seed = 4, .verbose = 0};
  set_random_seed(3);
  auto reference = mlp();
  reference->fit(data.d.x, data.d.y, base);

  const std::string backups = (dir_ / "preempted").string();
  set_random_seed(3);
  auto first = mlp();
  auto term = std::make_shared<LambdaCallback>();
  std::int64_t seen = 0;
  term->batch_begin = [&](std::int64_t, const Logs&) {
    if (seen++ == 7) std::raise(SIGTERM);  // arrives while batch 7 trains
  };
  auto backup = std::make_shared<BackupAndRestore>(backups, BackupAndRestoreOptions{.save_freq = 100, .out = nullptr});
  FitOptions o = base;
  o.callbacks = {term, backup};
  EXPECT_THROW(first->fit(data.d.x, data.d.y, o), Preempted);
  EXPECT_EQ(backup->steps_done(), 8);  // batch 7 finished, then the save
  EXPECT_EQ(first->optimizer().iterations(), 8);
  // The handler is gone with the fit: SIGTERM is the default again (checked without raising it).
  struct sigaction now{};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);

  set_random_seed(3);
  auto second = mlp();
  auto resume = std::make_shared<BackupAndRestore>(backups, BackupAndRestoreOptions{.save_freq = 100, .out = nullptr});
  o.callbacks = {resume};
  second->fit(data.d.x, data.d.y, o);
  EXPECT_EQ(weights(*second), weights(*reference));
  EXPECT_EQ(resume->steps_done(), 12);
  EXPECT_EQ(second->optimizer().iterations(), 12);
}

// Two "workers" whose second one holds other state: the comparison names it.
class TwoWorkers : public StrategyBackend {
 public:
  explicit TwoWorkers(std::vector<double> others) : others_(std::move(others)) {}
  std::string name() const override { return "TwoWorkers"; }
  int num_replicas() const override { return 1; }
  int num_workers() const override { return 2; }
  void sum_over_workers(std::span<double> values) override {
    // This process is worker 0; worker 1 adds what it holds: its slot of the same layout.
    if (others_.empty()) {
      for (std::size_t i = 0; i < values.size() / 2; ++i) values[values.size() / 2 + i] += values[i];
    } else {
      for (std::size_t i = 0; i < values.size() / 2; ++i) values[values.size() / 2 + i] += others_[i];
    }
  }
  void run(const std::function<void(int)>& fn) override { fn(0); }
  std::unique_ptr<GradientReducer> gradient_reducer(std::span<Variable* const>, std::span<const DenseVariables>,
                                                    bool) override {
    return nullptr;
  }

 private:
  std::vector<double> others_;
};

TEST(WorkerState, ADifferentDigestOnAnotherWorkerIsAPeerFailureNamingIt) {
  TwoWorkers same({});
  EXPECT_NO_THROW(check_same_state_on_every_worker(same, 0x123456789abcdefull, "checkpoint x"));
  TwoWorkers other({1.0, 2.0, 3.0});
  try {
    check_same_state_on_every_worker(other, 0x123456789abcdefull, "checkpoint x");
    FAIL() << "a different state was not noticed";
  } catch (const PeerFailure& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint x: worker(s) 1 hold different state"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain::train
