// `dtrain fit --checkpoint-dir` killed for real and run again: a process that sends itself
// SIGKILL (or a SIGTERM preemption notice) at a batch chosen at random, then the same
// command again, must end with the weight bytes and the optimizer iterations of a run left
// alone: on one device, under MirroredStrategy, and with launched workers that `dtrain
// launch` restarts. Not tested here: the checkpoint files' format (tests/checkpoint).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/cli_process.h"
#include "common/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Result = dtrain::testing::CliResult;

// Every fit below: 3 epochs of 12 batches of 12 rows (36 steps), one thread per process.
constexpr std::int64_t kSteps = 36;
constexpr int kSeconds = 120;  // each command's bound (timeout(1), or the launcher's --timeout)

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `count` distinct training batches in [lo, hi], drawn afresh each run (std::random_device);
// every test prints the ones it used (SCOPED_TRACE), so a failure names the step to rerun.
std::vector<std::int64_t> random_steps(int count, std::int64_t lo, std::int64_t hi) {
  std::random_device device;
  std::mt19937_64 g((static_cast<std::uint64_t>(device()) << 32) ^ device());
  std::uniform_int_distribution<std::int64_t> pick(lo, hi);
  std::set<std::int64_t> steps;
  while (static_cast<int>(steps.size()) < count) steps.insert(pick(g));
  std::vector<std::int64_t> out(steps.begin(), steps.end());
  std::shuffle(out.begin(), out.end(), g);
  return out;
}

// "BackupAndRestore: resuming from PATH (N training batches done)": N, or -1 without the line.
std::int64_t resumed_steps(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(resuming from \S+ \((\d+) training batches done\))"))) return -1;
  return std::stoll(m[1].str());
}

// The numbers of the backups in a folder (backup-N.safetensors), in order.
std::vector<std::int64_t> backups_in(const fs::path& dir) {
  std::vector<std::int64_t> out;
  if (!fs::exists(dir)) return out;
  const std::regex name(R"(backup-(\d+)\.safetensors)");
  for (const auto& f : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = f.path().filename().string();
    if (std::regex_match(file, m, name)) out.push_back(std::stoll(m[1].str()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class CheckpointCli : public dtrain::testing::TempDirTest {
 protected:
  // A Dense-Dropout-Dense MLP (the masks' random streams must resume too) trained by Adam
  // (its slots and iteration count) on 144 synthetic rows.
  std::string config() {
    return write("mlp.json", R"({
      "model": {"input_shape": [16], "layers": [
        {"class_name": "Dense", "config": {"units": 32, "activation": "relu"}},
        {"class_name": "Dropout", "config": {"rate": 0.25}},
        {"class_name": "Dense", "config": {"units": 4}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"name": "adam", "learning_rate": 0.01},
      "metrics": ["accuracy"],
      "data": {"source": "synthetic", "samples": 144, "features": 16, "classes": 4},
      "epochs": 3, "batch_size": 12, "seed": 11})");
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Backups every 3 batches in `dir`, the weights and summary under `name`.
  std::string backup_flags(const std::string& dir, const std::string& name) const {
    return "--checkpoint-dir " + dir + " --checkpoint-every 3 --save-weights " + path(name + ".safetensors") +
           " --summary " + path(name + ".json");
  }

  // `dtrain fit` in this process's place (bounded by timeout(1)).
  Result fit(const std::string& flags, const std::string& env = "") {
    return dtrain::testing::run_cli("fit " + config() + " --threads 1 --verbose 0 " + flags, env, kSeconds);
  }
  // `dtrain launch [launch_flags] fit CONFIG ...` (bounded by the launcher's deadline).
  Result launch(const std::string& launch_flags, const std::string& fit_flags) {
    return dtrain::testing::run_cli("launch --timeout " + std::to_string(kSeconds) + " " + launch_flags + " fit " +
                                    config() + " --threads 1 --verbose 0 " + fit_flags);
  }

  nlohmann::json summary(const std::string& file) {
    std::ifstream in(path(file));
    if (!in) return nlohmann::json::object();
    return nlohmann::json::parse(in, nullptr, false);
  }

  struct Reference {
    std::string weights;
    std::int64_t iterations = -1;
  };
  // The run left alone, without checkpoints.
  Reference uninterrupted(const std::string& name, bool launched, const std::string& launch_flags,
                          const std::string& fit_flags) {
    const std::string flags = fit_flags + " --save-weights " + path(name + ".safetensors") + " --summary " + path(name + ".json");
    const Result r = launched ? launch(launch_flags, flags) : fit(flags);
    EXPECT_EQ(r.code, 0) << r.output;
    return {bytes_of(path(name + ".safetensors")), summary(name + ".json").value("optimizer_iterations", std::int64_t{-1})};
  }

  // After the fault: the same command without it resumes from a backup and ends as the
  // reference did, each step trained once (the backup's steps plus this run's are all).
  void expect_resumed_run_matches(const Result& r, const std::string& name, const Reference& reference) {
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "resuming from")) << r.output;
    const std::int64_t before = resumed_steps(r.output);
    const nlohmann::json j = summary(name + ".json");
    ASSERT_TRUE(j.contains("steps_trained")) << j.dump();
    EXPECT_EQ(bytes_of(path(name + ".safetensors")), reference.weights) << "the resumed run's weights differ";
    EXPECT_EQ(j["optimizer_iterations"], reference.iterations);
    EXPECT_EQ(j["steps_done"], kSteps);
    EXPECT_TRUE(j["resumed_from"].is_string()) << j.dump();
    ASSERT_TRUE(j.contains("checkpoint_saves")) << j.dump();
    EXPECT_GT(j["checkpoint_saves"]["saves"].get<std::int64_t>(), 0) << j.dump();  // the run saved as it went
    EXPECT_EQ(before + j["steps_trained"].get<std::int64_t>(), kSteps)
        << "resumed after " << before << " steps and trained " << j["steps_trained"];
  }

  // One device or mirrored: killed at each of two random steps, then run again.
  void kill_and_resume(const std::string& strategy_flags) {
    const Reference reference = uninterrupted("reference", false, "", strategy_flags);
    ASSERT_FALSE(reference.weights.empty());
    ASSERT_EQ(reference.iterations, kSteps);
    // From step 6 on the backup of step 3 is complete (the save at step 6 waits for the one
    // before), so a killed run always leaves one to resume from; at most 33 leaves training.
    for (const std::int64_t step : random_steps(2, 6, kSteps - 3)) {
      const std::string name = "killed_at_" + std::to_string(step), dir = path(name + "_ckpt");
      const std::string flags = strategy_flags + " " + backup_flags(dir, name);
      SCOPED_TRACE("killed at training batch " + std::to_string(step) + " (drawn at random): dtrain fit CONFIG --threads 1 " +
                   flags + " --fault-kill worker:0:" + std::to_string(step));
      const Result killed = fit(flags + " --fault-kill worker:0:" + std::to_string(step));
      EXPECT_EQ(killed.signal, SIGKILL) << "code " << killed.code << ": " << killed.output;
      EXPECT_TRUE(contains(killed.output, "fault injection: sending SIGKILL to this process at the start of training batch " +
                                              std::to_string(step)))
          << killed.output;
      EXPECT_FALSE(fs::exists(path(name + ".safetensors")));
      ASSERT_FALSE(backups_in(dir).empty());
      const Result resumed = fit(flags);
      expect_resumed_run_matches(resumed, name, reference);
      const std::int64_t before = resumed_steps(resumed.output);
      EXPECT_LE(before, step);
      EXPECT_EQ(before % 3, 0) << "a backup between the saves every 3 batches";
      EXPECT_TRUE(backups_in(dir).empty()) << "the backups are deleted when fit ends (no --keep-checkpoints)";
    }
  }
};

TEST_F(CheckpointCli, OneDeviceKilledTwiceAtRandomResumesToTheSameBytes) { kill_and_resume(""); }

TEST_F(CheckpointCli, MirroredKilledTwiceAtRandomResumesToTheSameBytes) {
  kill_and_resume("--strategy mirrored --replicas 2");
}

// `launch --max-restarts 1`: worker 1 kills itself, the launcher restarts the whole job
// (DTRAIN_RESTART_COUNT=1, so the fault does not fire again), and it resumes.
TEST_F(CheckpointCli, LaunchRestartsAJobWhoseWorkerWasKilledAndItEndsAsIfLeftAlone) {
  const Reference reference = uninterrupted("reference", true, "--workers 3", "");
  ASSERT_FALSE(reference.weights.empty());
  ASSERT_EQ(reference.iterations, kSteps);
  for (const std::int64_t step : random_steps(2, 6, kSteps - 3)) {
    const std::string name = "killed_at_" + std::to_string(step), dir = path(name + "_ckpt");
    const std::string flags = backup_flags(dir, name) + " --fault-kill worker:1:" + std::to_string(step);
    SCOPED_TRACE("worker 1 killed at training batch " + std::to_string(step) +
                 " (drawn at random): dtrain launch --workers 3 --max-restarts 1 fit CONFIG --threads 1 " + flags);
    const Result r = launch("--workers 3 --max-restarts 1", flags);
    EXPECT_TRUE(contains(r.output, "[worker:1] fault injection: sending SIGKILL to this process at the start of training batch " +
                                       std::to_string(step)))
        << r.output;
    EXPECT_TRUE(contains(r.output, "; restarting the job (restart 1 of 1)")) << r.output;
    EXPECT_TRUE(contains(r.output, "[worker:0] BackupAndRestore: resuming from " + dir + "/backup-")) << r.output;
    expect_resumed_run_matches(r, name, reference);
    EXPECT_LE(resumed_steps(r.output), step);
  }
}

// SIGTERM on one worker of two: every worker saves at the next step they agree on and
// exits 75; the job run again resumes there. Then the same with a restart in one launch.
TEST_F(CheckpointCli, APreemptedWorkerSavesAtAnAgreedStepAndTheJobResumesThere) {
  const Reference reference = uninterrupted("reference", true, "--workers 2", "");
  ASSERT_FALSE(reference.weights.empty());
  const std::vector<std::int64_t> steps = random_steps(2, 2, kSteps - 3);
  {
    const std::int64_t step = steps[0];
    const std::string name = "preempted", dir = path("preempted_ckpt");
    const std::string flags = backup_flags(dir, name);
    SCOPED_TRACE("worker 1 preempted at training batch " + std::to_string(step) +
                 " (drawn at random): dtrain launch --workers 2 fit CONFIG --threads 1 " + flags +
                 " --fault-term worker:1:" + std::to_string(step));
    const Result first = launch("--workers 2", flags + " --fault-term worker:1:" + std::to_string(step));
    EXPECT_EQ(first.code, 1) << first.output;
    EXPECT_TRUE(contains(first.output, "[worker:1] fault injection: sending SIGTERM")) << first.output;
    EXPECT_TRUE(contains(first.output, "[worker:1] dtrain: preempted: training was asked to stop")) << first.output;
    EXPECT_TRUE(contains(first.output, "exited with code 75 (preempted: saved a checkpoint and stopped)")) << first.output;
    EXPECT_TRUE(contains(first.output, "dtrain launch: failed: worker:")) << first.output;
    EXPECT_FALSE(fs::exists(path(name + ".safetensors")));
    const std::vector<std::int64_t> saved = backups_in(dir);
    ASSERT_FALSE(saved.empty());
    const std::int64_t at = saved.back();
    EXPECT_TRUE(at == step || at == step + 1) << "the newest backup is of step " << at;
    EXPECT_TRUE(contains(first.output, "/backup-" + std::to_string(at) + ".safetensors after " + std::to_string(at) +
                                           " training batches"))
        << first.output;
    const Result second = launch("--workers 2", flags);
    expect_resumed_run_matches(second, name, reference);
    EXPECT_EQ(resumed_steps(second.output), at) << second.output;
  }
  {
    const std::int64_t step = steps[1];
    const std::string name = "preempted_and_restarted", dir = path("restarted_ckpt");
    const std::string flags = backup_flags(dir, name) + " --fault-term worker:1:" + std::to_string(step);
    SCOPED_TRACE("worker 1 preempted at training batch " + std::to_string(step) +
                 " (drawn at random): dtrain launch --workers 2 --max-restarts 1 fit CONFIG --threads 1 " + flags);
    const Result r = launch("--workers 2 --max-restarts 1", flags);
    EXPECT_TRUE(contains(r.output, "exited with code 75 (preempted: saved a checkpoint and stopped); restarting the job "
                                   "(restart 1 of 1)"))
        << r.output;
    expect_resumed_run_matches(r, name, reference);
    const std::int64_t at = resumed_steps(r.output);
    EXPECT_TRUE(at == step || at == step + 1) << "resumed after " << at << " steps";
  }
}

// A preempted single process exits 75 with one line, and resumes where it stopped.
TEST_F(CheckpointCli, APreemptedProcessExits75AndResumes) {
  const Reference reference = uninterrupted("reference", false, "", "");
  const std::int64_t step = random_steps(1, 2, kSteps - 3)[0];
  const std::string dir = path("ckpt");
  const std::string flags = "--checkpoint-dir " + dir + " --save-weights " + path("resumed.safetensors") + " --summary " +
                            path("resumed.json");
  SCOPED_TRACE("preempted at training batch " + std::to_string(step) + " (drawn at random)");
  const Result first = fit(flags + " --fault-term worker:0:" + std::to_string(step));
  EXPECT_EQ(first.code, 75) << first.output;
  EXPECT_TRUE(contains(first.output, "dtrain: preempted: training was asked to stop")) << first.output;
  const std::vector<std::int64_t> saved = backups_in(dir);  // per epoch, and the preemption's
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(saved.back(), step + 1);
  expect_resumed_run_matches(fit(flags), "resumed", reference);
}

// A backup made by 2 workers is not resumed by 3, nor by one process: the error names both.
TEST_F(CheckpointCli, ResumingWithAnotherNumberOfWorkersIsRefused) {
  const std::string dir = path("ckpt");
  const Result two = launch("--workers 2", "--checkpoint-dir " + dir + " --checkpoint-every 6 --keep-checkpoints");
  ASSERT_EQ(two.code, 0) << two.output;
  const std::vector<std::int64_t> kept = backups_in(dir);
  ASSERT_FALSE(kept.empty()) << "--keep-checkpoints keeps them";
  const Result three = launch("--workers 3", "--checkpoint-dir " + dir);
  EXPECT_EQ(three.code, 1) << three.output;
  EXPECT_TRUE(contains(three.output, "BackupAndRestore: the backup in " + dir + " was made by 2 worker(s) with 2 replicas "
                                     "in sync; this job has 3 with 3"))
      << three.output;
  const Result one = fit("--checkpoint-dir " + dir);
  EXPECT_EQ(one.code, 1) << one.output;
  EXPECT_TRUE(contains(one.output, "dtrain: error: BackupAndRestore: the backup in " + dir + " was made by 2 worker(s) "
                                   "with 2 replicas in sync; this job has 1 with 1"))
      << one.output;
  EXPECT_FALSE(contains(one.output, "skipped")) << one.output;
  EXPECT_EQ(backups_in(dir), kept) << "a refused backup is left as it was";
}

// Backups of another model, or of another batch size, are not resumed from, written over
// or deleted: the run is refused naming the first, and the files stay. Nor is another program's index written
// over.
TEST_F(CheckpointCli, AnotherModelsOrBatchSizesBackupsAndAnotherProgramsIndexAreRefusedAndKept) {
  const std::string dir = path("ckpt");
  const Result killed = fit(backup_flags(dir, "first") + " --fault-kill worker:0:17");
  ASSERT_EQ(killed.signal, SIGKILL) << killed.output;
  const std::vector<std::int64_t> kept = backups_in(dir);
  ASSERT_FALSE(kept.empty());
  std::string wider = bytes_of(config());
  const std::string narrow = "\"units\": 32";
  wider.replace(wider.find(narrow), narrow.size(), "\"units\": 48");
  const std::string other = write("wider.json", wider);
  const Result refused = dtrain::testing::run_cli(
      "fit " + other + " --threads 1 --verbose 0 --checkpoint-dir " + dir + " --checkpoint-every 3", "", kSeconds);
  EXPECT_EQ(refused.code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "BackupAndRestore: " + dir + " holds " + std::to_string(kept.size()) +
                                           " backup(s), none of which model 'sequential' can resume from (" + dir +
                                           "/backup-" + std::to_string(kept.back()) + ".safetensors: "))
      << refused.output;
  EXPECT_TRUE(contains(refused.output, "they are left as they are")) << refused.output;
  EXPECT_EQ(backups_in(dir), kept) << "another model's backups are kept";
  // The same model with another batch size: its epochs have other batches, and the saved
  // position would fall in another epoch.
  const Result rebatched = fit("--checkpoint-dir " + dir + " --checkpoint-every 3 --batch-size 24");
  EXPECT_EQ(rebatched.code, 1) << rebatched.output;
  EXPECT_TRUE(contains(rebatched.output, "the backup was made by a fit of 12 batches an epoch, and this fit has 6"))
      << rebatched.output;
  EXPECT_EQ(backups_in(dir), kept);

  const std::string foreign = path("tf_ckpt");
  fs::create_directories(foreign);
  { std::ofstream(foreign + "/checkpoint") << "model_checkpoint_path: \"ckpt-3\"\n"; }
  const Result not_ours = fit("--checkpoint-dir " + foreign + " --checkpoint-every 3");
  EXPECT_EQ(not_ours.code, 1) << not_ours.output;
  EXPECT_TRUE(contains(not_ours.output, foreign + "/checkpoint: not a dtrain checkpoint index (it begins "
                                                  "'model_checkpoint_path: \"ckpt-3\"'; another program's?)"))
      << not_ours.output;
  EXPECT_EQ(bytes_of(foreign + "/checkpoint"), "model_checkpoint_path: \"ckpt-3\"\n");
}

// The newest backup cut short: the run says it skipped it and resumes from the one before.
TEST_F(CheckpointCli, ADamagedNewestBackupIsSkippedForTheOneBefore) {
  const Reference reference = uninterrupted("reference", false, "", "");
  // From step 9 on two backups are complete (each save waits for the one before).
  const std::int64_t step = random_steps(1, 9, kSteps - 3)[0];
  const std::string dir = path("ckpt");
  const std::string flags = backup_flags(dir, "resumed");
  SCOPED_TRACE("killed at training batch " + std::to_string(step) + " (drawn at random)");
  const Result killed = fit(flags + " --fault-kill worker:0:" + std::to_string(step));
  ASSERT_EQ(killed.signal, SIGKILL) << killed.output;
  // Two are kept (three for a moment, between a new one's rename and the oldest's removal).
  const std::vector<std::int64_t> saved = backups_in(dir);
  ASSERT_GE(saved.size(), 2u);
  const std::string newest = dir + "/backup-" + std::to_string(saved.back()) + ".safetensors";
  const std::string older = dir + "/backup-" + std::to_string(saved[saved.size() - 2]) + ".safetensors";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  const Result resumed = fit(flags);
  EXPECT_TRUE(contains(resumed.output, "skipped " + newest)) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resuming from " + older))
      << resumed.output;
  expect_resumed_run_matches(resumed, "resumed", reference);
}

// The config's "checkpoint", the flags that override it, the errors naming either, the
// faults' first-start-only rule, and the progress file the launcher reads.
TEST_F(CheckpointCli, ConfigKeyFlagsFaultsAndTheProgressFile) {
  const std::string base = config();
  std::ifstream in(base);
  nlohmann::json doc = nlohmann::json::parse(in);
  auto with_checkpoint = [&](const std::string& name, const nlohmann::json& checkpoint) {
    nlohmann::json d = doc;
    d["checkpoint"] = checkpoint;
    return write(name + ".json", d.dump());
  };
  auto run = [&](const std::string& args, const std::string& env = "") {
    return dtrain::testing::run_cli(args + " --threads 1 --verbose 0", env, kSeconds);
  };
  // The config's folder, every 4 batches, kept: the last backup is of step 36.
  const std::string dir = path("from_config");
  Result r = run("fit " + with_checkpoint("keeping", {{"dir", dir}, {"every", 4}, {"keep", true}}) + " --summary " +
                 path("keep.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(backups_in(dir), (std::vector<std::int64_t>{32, 36}));
  EXPECT_EQ(summary("keep.json")["resumed_from"], nullptr);
  // Run again, it resumes at the end: nothing left to train.
  r = run("fit " + with_checkpoint("keeping", {{"dir", dir}, {"every", 4}, {"keep", true}}) + " --summary " + path("again.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(resumed_steps(r.output), kSteps) << r.output;
  EXPECT_EQ(summary("again.json")["steps_trained"], 0);
  EXPECT_EQ(summary("again.json")["optimizer_iterations"], kSteps);
  // Flags override the config: another folder, per epoch.
  const std::string flag_dir = path("from_flags");
  r = run("fit " + with_checkpoint("keeping", {{"dir", dir}, {"every", 4}}) + " --checkpoint-dir " + flag_dir +
          " --checkpoint-every epoch --keep-checkpoints");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(backups_in(flag_dir), (std::vector<std::int64_t>{24, 36}));

  // Bad values name the key or the flag.
  const std::vector<std::pair<nlohmann::json, std::string>> bad_keys{
      {{{"dir", dir}, {"every", 0}}, "checkpoint.every: expected a number of training batches (1 or more) or \"epoch\", got 0"},
      {{{"dir", dir}, {"every", "daily"}}, "checkpoint.every: expected"},
      {{{"dir", ""}}, "checkpoint.dir: must name a folder"},
      {{{"every", 3}}, "checkpoint.dir"},
      {{{"dir", dir}, {"often", 3}}, "checkpoint.often: unknown key"},
      {dir, "checkpoint: expected an object"},
  };
  for (const auto& [value, message] : bad_keys) {
    r = run("fit " + with_checkpoint("bad", value));
    EXPECT_EQ(r.code, 1) << value.dump() << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "dtrain: error: " + path("bad.json") + ": " + message)) << value.dump() << ": " << r.output;
  }
  const std::vector<std::pair<std::string, std::string>> bad_flags{
      {"--checkpoint-dir " + dir + " --checkpoint-every 0", "--checkpoint-every '0': expected a number of training batches"},
      {"--checkpoint-dir " + dir + " --checkpoint-every 3x", "--checkpoint-every '3x'"},
      {"--checkpoint-every 3", "--checkpoint-every needs a folder to save in: --checkpoint-dir DIR or the config's checkpoint.dir"},
      {"--keep-checkpoints", "--keep-checkpoints needs a folder"},
      {"--fault-kill worker:1", "--fault-kill 'worker:1': expected worker:INDEX:STEP"},
      {"--fault-kill worker:0:-2", "--fault-kill 'worker:0:-2'"},
      {"--fault-term 0:5", "--fault-term '0:5': expected worker:INDEX:STEP"},
  };
  for (const auto& [flags, message] : bad_flags) {
    r = run("fit " + base + " " + flags);
    EXPECT_EQ(r.code, 1) << flags << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "dtrain: error: " + message)) << flags << ": " << r.output;
  }

  // A restarted job (DTRAIN_RESTART_COUNT=1) is not faulted again; the summary counts it.
  r = run("fit " + base + " --fault-kill worker:0:3 --fault-term worker:0:4 --summary " + path("restarted.json"),
          "DTRAIN_RESTART_COUNT=1");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = summary("restarted.json");
  EXPECT_EQ(j["fault_kill"], (nlohmann::json{{"worker", 0}, {"step", 3}, {"armed", false}, {"fired", 0}}));
  EXPECT_EQ(j["fault_term"], (nlohmann::json{{"worker", 0}, {"step", 4}, {"armed", false}, {"fired", 0}}));
  EXPECT_FALSE(contains(r.output, "fault injection")) << r.output;
  // A fault for a worker the job lacks would plant nothing: it is refused.
  r = run("fit " + base + " --fault-kill worker:1:3");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--fault-kill worker:1:3: the job has 1 worker(s), numbered from 0")) << r.output;

  // DTRAIN_PROGRESS_FILE: replaced at every save with the steps done.
  const std::string progress = path("progress");
  r = run("fit " + base + " --checkpoint-dir " + path("progress_ckpt") + " --checkpoint-every 5",
          "DTRAIN_PROGRESS_FILE=" + progress);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(bytes_of(progress), "35\n");
}

}  // namespace
