// `dtrain launch --workers N --ps M fit CONFIG`: every task runs the same command under
// ParameterServerStrategy; the chief reports. A worker killed mid-job is restarted alone
// while the job goes on, or the job goes on without it; what the strategy cannot do yet is
// refused by name.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_process.h"
#include "common/temp_dir.h"

namespace {

using Result = dtrain::testing::CliResult;

constexpr int kSeconds = 120;  // each launch's deadline (--timeout)
// 600 samples in batches of 32: 19 steps an epoch, 3 epochs.
constexpr std::int64_t kStepsPerEpoch = 19, kEpochs = 3;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class ParameterServerCli : public dtrain::testing::TempDirTest {
 protected:
  std::string config() { return write("tiny.json", dtrain::testing::tiny_config_json()); }
  Result launch(const std::string& launch_flags, const std::string& fit_flags) {
    return dtrain::testing::run_cli("launch --timeout " + std::to_string(kSeconds) + " " + launch_flags + " fit " +
                                    config() + " --threads 1 " + fit_flags);
  }
  nlohmann::json summary() { return nlohmann::json::parse(std::ifstream(dir_ / "s.json")); }
  std::string summary_flag() { return " --summary " + (dir_ / "s.json").string(); }
};

TEST_F(ParameterServerCli, LaunchWithParameterServersTrainsEveryStepOnceAndTheChiefReports) {
  const Result r = launch("--workers 2 --ps 1", "--verbose 2 --steps-per-execution 2" + summary_flag());
  ASSERT_EQ(r.code, 0) << r.output;
  // Every task ran the command; the chief alone trained to the end and tested.
  for (const char* task : {"chief:0", "worker:0", "worker:1", "ps:0"})
    EXPECT_TRUE(contains(r.output, std::string("[") + task + "] dtrain fit ")) << task << "\n" << r.output;
  EXPECT_TRUE(contains(r.output, "ParameterServerStrategy (2 workers, 1 ps, async; this is chief:0)")) << r.output;
  EXPECT_TRUE(contains(r.output, "[chief:0] Epoch 3/3")) << r.output;
  EXPECT_TRUE(contains(r.output, "[chief:0] test: loss")) << r.output;
  EXPECT_FALSE(contains(r.output, "[worker:0] test:")) << r.output;
  const nlohmann::json s = summary();
  EXPECT_EQ(s["strategy"], "ParameterServerStrategy");
  EXPECT_EQ(s["workers"], 2);
  EXPECT_EQ(s["ps"], 1);
  EXPECT_EQ(s["consistency"], "async");
  EXPECT_EQ(s["updates_applied"], kEpochs * kStepsPerEpoch);  // one push per step, each applied once
  EXPECT_EQ(s["closures"], kEpochs * ((kStepsPerEpoch + 1) / 2));
  EXPECT_EQ(s["closures_rerun"], 0);
  EXPECT_EQ(s["history"]["loss"].size(), 3u);
  EXPECT_EQ(s["ps_phases"]["steps"], kEpochs * kStepsPerEpoch);
  EXPECT_GT(s["ps_phases"]["pull_seconds"].get<double>(), 0.0);
  EXPECT_GT(s.at("ps_phases").at("dispatch_seconds").get<double>(), 0.0);
  EXPECT_TRUE(contains(r.output, "; a step on a worker: pull ")) << r.output;
  // fit's end-of-training tables: a row per worker with its pull and push, a row per ps.
  EXPECT_TRUE(contains(r.output, "[chief:0] Where the workers' steps' time went:")) << r.output;
  EXPECT_TRUE(contains(r.output, "| push | pull |")) << r.output;
  EXPECT_TRUE(contains(r.output, "[chief:0] | ps | updates applied |")) << r.output;
  EXPECT_TRUE(contains(r.output, "[chief:0] | 0 | " + std::to_string(kEpochs * kStepsPerEpoch) + " | 0 | 0 | "))
      << r.output;
  ASSERT_EQ(s["profile"].size(), 2u) << s.dump();
  ASSERT_EQ(s["ps_phases"]["per_ps"].size(), 1u) << s.dump();
  EXPECT_EQ(s["ps_phases"]["per_ps"][0]["updates_applied"], kEpochs * kStepsPerEpoch);
  // The teacher's labels are learnable: a model that trained at all is far above chance (1/3).
  EXPECT_GT(s["test"]["accuracy"].get<double>(), 0.6) << s.dump();

  // The doctor reads the run beside one at one worker. A ps run all-reduces nothing, so
  // no link comes with it: the model is checked only once a link is given.
  const std::string one = (dir_ / "one.json").string(), runs = one + "," + (dir_ / "s.json").string();
  ASSERT_EQ(dtrain::testing::run_cli("fit " + config() + " --threads 1 --verbose 0 --summary " + one).code, 0);
  Result doctor = dtrain::testing::run_cli("doctor --runs " + runs);
  ASSERT_EQ(doctor.code, 0) << doctor.output;
  EXPECT_FALSE(contains(doctor.output, "Model check")) << doctor.output;
  doctor = dtrain::testing::run_cli("doctor --runs " + runs + " --what-if link=1Gbit");
  ASSERT_EQ(doctor.code, 0) << doctor.output;
  EXPECT_TRUE(contains(doctor.output, "| 2, 1 ps async | 1 | ")) << doctor.output;
}

// --partitioner splits each variable over the ps on its first axis: two ps then move
// nearly the same bytes, where whole variables dealt in turn put the 8 x 16 kernel and the
// 16 x 3 kernel both on ps:0.
TEST_F(ParameterServerCli, APartitionerSplitsTheBytesEvenlyOverTheParameterServers) {
  auto shares = [&](const std::string& flags) {
    const Result r = launch("--workers 1 --ps 2", "--strategy parameter_server --verbose 0" + flags + summary_flag());
    EXPECT_EQ(r.code, 0) << r.output;
    std::vector<double> bytes;
    const nlohmann::json s = summary();
    for (const auto& p : s.at("ps_phases").at("per_ps"))
      bytes.push_back(p.at("shared_memory_bytes").get<double>() + p.at("message_bytes").get<double>());
    return bytes;
  };
  const std::vector<double> whole = shares(""), split = shares(" --partitioner fixed:2");
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(split.size(), 2u);
  EXPECT_GT(whole[0], 2 * whole[1]);  // kernels (128 + 48 floats) against biases (16 + 3)
  EXPECT_NEAR(split[0] / (split[0] + split[1]), 0.5, 0.05);
  const nlohmann::json s = summary();
  EXPECT_EQ(s["partitioner"], "FixedShardsPartitioner(num_shards=2)");
  // Each ps applies its part of every update: the job's count is the updates, not their
  // sum over the ps.
  EXPECT_EQ(s["updates_applied"], kEpochs * kStepsPerEpoch);
  for (const auto& p : s["ps_phases"]["per_ps"]) EXPECT_EQ(p["updates_applied"], kEpochs * kStepsPerEpoch);
}

// The worker kills itself at its 4th step (ssp:1 keeps the other from taking every step
// first): the launcher starts it again alone, the chief reruns its closure, and every step
// of the job is applied exactly once.
TEST_F(ParameterServerCli, AKilledWorkerIsRestartedAloneAndTheJobFinishes) {
  const Result r =
      launch("--workers 2 --ps 1 --max-restarts 1", "--verbose 0 --consistency ssp:1 --fault-kill worker:1:3" + summary_flag());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain launch: worker:1 was killed by signal 9 (SIGKILL); the parameter-server job "
                                 "goes on, and worker:1 starts again (restart 1 of 1)"))
      << r.output;
  const nlohmann::json s = summary();
  EXPECT_EQ(s["consistency"], "ssp(1)");
  EXPECT_EQ(s["updates_applied"], kEpochs * kStepsPerEpoch);
  EXPECT_EQ(s["closures"], kEpochs * kStepsPerEpoch);
  EXPECT_EQ(s["workers_lost"], 1);
  EXPECT_EQ(s["closures_rerun"], 1);
  EXPECT_EQ(s["updates_refused"], 0);  // it died before its push
}

TEST_F(ParameterServerCli, WithoutRestartsTheJobGoesOnWithoutTheKilledWorker) {
  const Result r = launch("--workers 2 --ps 1", "--verbose 0 --consistency ssp:1 --fault-kill worker:1:3" + summary_flag());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain launch: worker:1 was killed by signal 9 (SIGKILL); the parameter-server job "
                                 "goes on without it (--max-restarts 0)"))
      << r.output;
  const nlohmann::json s = summary();
  EXPECT_EQ(s["updates_applied"], kEpochs * kStepsPerEpoch);
  EXPECT_EQ(s["closures_per_worker"][1], 3);  // the three steps before its death
}

// The ps kills itself at its 29th update, in the second epoch: the launcher starts the
// whole job again, the chief restores the backup of epoch 1 (values, Adam's slots and
// iteration count) onto the new ps, and the job trains epochs 2 and 3 again. The updates
// the dead ps applied in epoch 2 are lost with it and made again, so the optimizer has
// taken exactly one update per step of the job.
TEST_F(ParameterServerCli, AKilledPsRestartsTheJobFromItsLatestBackup) {
  const Result r = launch("--workers 2 --ps 1 --max-restarts 1",
                          "--verbose 2 --fault-kill ps:0:29 --checkpoint-dir " + (dir_ / "ckpt").string() + summary_flag());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "fault injection: sending SIGKILL to this parameter server after 29 updates")) << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain launch: ps:0 was killed by signal 9 (SIGKILL); restarting the job (restart 1 of 1)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[chief:0] BackupAndRestore: resuming from ")) << r.output;
  const nlohmann::json s = summary();
  EXPECT_EQ(s["updates_applied"], (kEpochs - 1) * kStepsPerEpoch);  // this start's: epochs 2 and 3
  EXPECT_EQ(s["optimizer_iterations"], kEpochs * kStepsPerEpoch);
  EXPECT_GT(s["test"]["accuracy"].get<double>(), 0.6) << s.dump();
}

// A ps holds variables and never a batch: of the data it reads the rows' shape (a csv's
// first row), so its host needs no copy of the data set. Here the ps's copy of the
// training file breaks after its first row, and the job trains all the same.
TEST_F(ParameterServerCli, APsReadsOnlyTheRowsShapeOfTheData) {
  const std::string first = "a,b,label\n0,0,0\n";  // the header and the first of the rows below
  std::string rows = "a,b,label\n";
  for (int i = 0; i < 64; ++i) {
    const int a = i % 8, b = i / 8;
    rows += std::to_string(a) + "," + std::to_string(b) + "," + (a > b ? "1" : "0") + "\n";
  }
  const auto config_of = [&](const std::string& name, const std::string& csv) {
    return write(name + ".json", R"({"model": {"layers": [
        {"class_name": "Dense", "config": {"units": 8, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 2}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"name": "adam", "learning_rate": 0.05},
      "data": {"source": "csv", "train": ")" + write(name + ".csv", csv) + R"(", "label_column": "label"},
      "epochs": 2, "batch_size": 16, "seed": 3})");
  };
  const std::string whole = config_of("whole", rows), broken = config_of("broken", first + "1,2,3,4\n");
  // Read whole, the ps's copy is refused by name.
  Result r = dtrain::testing::run_cli("fit " + broken + " --verbose 0");
  ASSERT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "broken.csv")) << r.output;
  // The ps runs on the broken copy, the chief and the worker on the whole file.
  const std::string fit = std::string(DTRAIN_BINARY) + " fit \"$c\" --threads 1 --strategy parameter_server " +
                          "--verbose 0" + summary_flag();
  r = dtrain::testing::run_cli("launch --timeout " + std::to_string(kSeconds) +
                               " --workers 1 --ps 1 --chief -- sh -c 'case \"$TF_CONFIG\" in *\\\"type\\\":\\\"ps\\\"*) c=" +
                               broken + ";; *) c=" + whole + ";; esac; exec " + fit + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[ps:0] dtrain fit " + broken + ": the training samples stay with the workers"))
      << r.output;
  const nlohmann::json s = summary();
  EXPECT_EQ(s["updates_applied"], 2 * 4);  // 64 rows in batches of 16, 2 epochs
  EXPECT_EQ(s["history"]["loss"].size(), 2u);
}

TEST_F(ParameterServerCli, WhatItCannotDoIsRefusedByName) {
  Result r = dtrain::testing::run_cli("fit " + config() + " --fault-kill ps:0:3");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "a ps task exists only under --strategy parameter_server")) << r.output;
  r = dtrain::testing::run_cli("fit " + config() + " --consistency sync:1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--consistency needs --strategy parameter_server")) << r.output;
  r = dtrain::testing::run_cli("fit " + config() + " --strategy parameter_server --consistency ssp:x");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--consistency 'ssp:x'")) << r.output;
  r = dtrain::testing::run_cli("fit " + config() + " --partitioner fixed:2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--partitioner needs --strategy parameter_server")) << r.output;
  for (const char* bad : {"fixed:0", "fixed", "min_size:1x", "max_size:4k:2:3", "even:2"}) {
    r = dtrain::testing::run_cli("fit " + config() + " --strategy parameter_server --partitioner " + bad);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, std::string("--partitioner '") + bad + "'")) << r.output;
  }
  r = dtrain::testing::run_cli("fit " + config() + " --strategy parameter_server");  // no TF_CONFIG
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "TF_CONFIG")) << r.output;
}

}  // namespace
