// `dtrain launch --workers MIN:MAX`, an elastic job, with workers killed for real: the
// others go on from their last commit and end with the weights of a fixed-size run (each
// global batch has the same rows; only the order of the gradients' sums differs); a worker
// started again joins at a commit and receives it; with fewer than MIN left, the job ends
// naming the worker lost; a worker stopped (hung) is left out at the collective timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>

#include "common/cli_process.h"
#include "common/temp_dir.h"
#include "dtrain/model/safetensors.h"

namespace {

using Result = dtrain::testing::CliResult;
constexpr int kSeconds = 120;  // each launch's deadline

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::int64_t random_step(std::int64_t lo, std::int64_t hi) {
  std::random_device device;
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(device);
}

// "at the commit after N batches" of the line saying round `round`: N, or -1.
std::int64_t resumed_after(const std::string& output, int round) {
  std::smatch m;
  const std::regex line("elastic: round " + std::to_string(round) + R"(, [^\n]*at the commit after (\d+) batches)");
  return std::regex_search(output, m, line) ? std::stoll(m[1].str()) : -1;
}

class ElasticCli : public dtrain::testing::TempDirTest {
 protected:
  // An MLP trained by Adam (lr 0.01: a step moves a weight by up to about 0.01, so a step
  // lost or applied twice shows a thousand times above the tolerance below) on `samples`
  // synthetic rows in batches of 12, for `epochs` epochs.
  std::string config(int samples, int epochs) {
    return write("mlp_" + std::to_string(samples) + ".json", R"({
      "model": {"input_shape": [16], "layers": [
        {"class_name": "Dense", "config": {"units": 32, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 4}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"name": "adam", "learning_rate": 0.01},
      "metrics": ["accuracy"],
      "data": {"source": "synthetic", "samples": )" + std::to_string(samples) + R"(, "features": 16, "classes": 4},
      "epochs": )" + std::to_string(epochs) + R"(, "batch_size": 12, "seed": 11})");
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  Result launch(const std::string& config, const std::string& launch_flags, const std::string& name,
                const std::string& fit_flags = "", const std::string& env = "") {
    return dtrain::testing::run_cli("launch --timeout " + std::to_string(kSeconds) + " " + launch_flags + " fit " +
                                        config + " --threads 1 --verbose 0 --save-weights " + path(name + ".safetensors") +
                                        " --summary " + path(name + ".json") + " " + fit_flags,
                                    env);
  }
  nlohmann::json summary(const std::string& name) {
    std::ifstream in(path(name + ".json"));
    return in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json::object();
  }
  // The fixed 3-worker run, then the elastic 2:3 one with worker 2 sent `signal` (by
  // `flags`, which end in its fault flag) at a batch drawn at random, committing every 5
  // batches. What every loss of a worker gives is checked here: round 1 without worker 2,
  // from a commit at or before the batch, and the fixed run's 36 steps and weights.
  Result lose_worker_2(const std::string& signal, const std::string& flags) {
    const std::string cfg = config(144, 3);  // 36 batches
    const Result fixed = launch(cfg, "--workers 3", "fixed");
    EXPECT_EQ(fixed.code, 0) << fixed.output;
    const std::int64_t step = random_step(2, 33);
    SCOPED_TRACE("worker 2 sent " + signal + " at training batch " + std::to_string(step) + " (drawn at random)");
    const Result r = launch(cfg, "--workers 2:3", "elastic", flags + " worker:2:" + std::to_string(step),
                            "DTRAIN_ELASTIC_COMMIT_EVERY=5");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "[worker:2] fault injection: sending " + signal +
                                       " to this process at the start of training batch " + std::to_string(step)))
        << r.output;
    EXPECT_TRUE(contains(r.output, "[worker:0] elastic: round 1, 2 worker(s) (worker:0, worker:1); gone: worker:2"))
        << r.output;
    const std::int64_t back_to = resumed_after(r.output, 1);
    EXPECT_GE(back_to, 0) << r.output;
    EXPECT_LE(back_to, step) << "a commit after the batch the fault came at";
    EXPECT_TRUE(back_to % 5 == 0 || back_to == 12 || back_to == 24)
        << "a commit other than those every 5 batches and at the epochs' ends: " << back_to;
    const nlohmann::json j = summary("elastic");
    EXPECT_EQ(j.value("optimizer_iterations", std::int64_t{-1}), 36) << j.dump();
    EXPECT_LT(largest_difference("elastic", "fixed"), 1e-5);
    return r;
  }
  // The largest difference between two runs' weights, over every variable.
  double largest_difference(const std::string& a, const std::string& b) {
    const dtrain::NamedTensors x = dtrain::load_safetensors(path(a + ".safetensors"));
    const dtrain::NamedTensors y = dtrain::load_safetensors(path(b + ".safetensors"));
    EXPECT_EQ(x.tensors.size(), y.tensors.size());
    double most = 0;
    for (const auto& [name, t] : x.tensors) {
      const dtrain::Tensor* u = y.find(name);
      if (!u || u->numel() != t.numel()) {
        ADD_FAILURE() << name << " is not in both runs' weights, or not alike";
        return INFINITY;
      }
      for (std::int64_t i = 0; i < t.numel(); ++i)
        most = std::max(most, static_cast<double>(std::fabs(t.data<float>()[i] - u->data<float>()[i])));
    }
    return most;
  }
};

// Worker 2 of 3 dies at a random batch: the others agree on round 1 without it, go back to
// their last commit (every 5 batches and at each epoch's end: up to 4 batches they
// trained are undone) and train
// every batch from there once more, each global batch split over 2; the weights are those
// of the fixed 3-worker run to the rounding of the sums' order (6e-8 here), and the
// optimizer took exactly one step a batch.
TEST_F(ElasticCli, AWorkerKilledLeavesTheOthersToEndWhereAFixedRunEnds) {
  const Result r = lose_worker_2("SIGKILL", "--fault-kill");
  EXPECT_TRUE(contains(r.output, "worker:2 was killed by signal 9 (SIGKILL); the elastic job goes on without it"))
      << r.output;
}

// Worker 2 of 3 hangs (SIGSTOP) at a random batch: alive, its connections open. The others'
// all-reduce fails at the collective timeout, naming it; the next round leaves it out once
// it has not come within the timeout; they end where the fixed run ends. The launcher then
// ends the stopped worker, which would never end by itself, and the job succeeds.
TEST_F(ElasticCli, AWorkerStoppedIsLeftOutAtTheTimeoutAndTheOthersEndWhereAFixedRunEnds) {
  const Result r = lose_worker_2("SIGSTOP", "--collective-timeout 4 --fault-stop");
  EXPECT_TRUE(contains(r.output, "no answer within the 4 s timeout")) << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain launch: worker:2 is stopped (SIGSTOP) and the elastic job ended without it; ending it"))
      << r.output;
}

// --elastic-keep worker_batch: each worker keeps its 4 rows, so the 2 left train global
// batches of 8 (the learning rate scaled by 2/3) from the row their commit stood at; every
// row of every epoch is trained once: the batches are those of 12 rows up to the commit,
// then of 8 to the epoch's end and through the next epochs.
TEST_F(ElasticCli, KeepingEachWorkersBatchTrainsTheRestInSmallerGlobalBatches) {
  const std::int64_t step = random_step(2, 33);
  SCOPED_TRACE("worker 2 killed at training batch " + std::to_string(step) + " (drawn at random)");
  const Result r = launch(config(144, 3), "--workers 2:3 --elastic-keep worker_batch", "elastic",
                          "--fault-kill worker:2:" + std::to_string(step), "DTRAIN_ELASTIC_COMMIT_EVERY=5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "each worker keeps its batch: the global batch and the learning rate are 2/3 of fit's"))
      << r.output;
  const std::int64_t back_to = resumed_after(r.output, 1);
  ASSERT_GE(back_to, 0) << r.output;
  const std::int64_t epoch = back_to / 12, rows_done = back_to % 12 * 12;
  const std::int64_t expected = back_to + (144 - rows_done + 7) / 8 + 18 * (2 - epoch);
  const nlohmann::json j = summary("elastic");
  EXPECT_EQ(j.value("optimizer_iterations", std::int64_t{-1}), expected) << "back at the commit after " << back_to << " batches";
  EXPECT_NEAR(j.value("final_learning_rate_scale", 0.0), 8.0 / 12.0, 1e-6) << j.dump();
}

// With a restart allowed, the killed worker starts again and joins the job at the others'
// next commit, which it receives; the run still ends where the fixed one does.
TEST_F(ElasticCli, AWorkerStartedAgainJoinsAtACommitAndReceivesIt) {
  const std::string cfg = config(4800, 1);  // 400 batches: time for a process to start
  const Result fixed = launch(cfg, "--workers 3", "fixed");
  ASSERT_EQ(fixed.code, 0) << fixed.output;
  const Result r = launch(cfg, "--workers 2:3 --max-restarts 1", "elastic", "--fault-kill worker:2:3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the elastic job goes on, and worker:2 starts again (restart 1 of 1)")) << r.output;
  // The new worker:2 comes to round 1 itself where it started before the others noticed
  // the old one's death, else to round 2, at a later commit.
  const bool in_round_1 = contains(r.output, "elastic: round 1, 3 worker(s) (worker:0, worker:1, worker:2)");
  if (!in_round_1) {
    EXPECT_TRUE(contains(r.output, "elastic: round 1, 2 worker(s) (worker:0, worker:1); gone: worker:2")) << r.output;
    EXPECT_TRUE(contains(r.output, "elastic: round 2, 3 worker(s) (worker:0, worker:1, worker:2); joined: worker:2"))
        << r.output;
    EXPECT_GT(resumed_after(r.output, 2), resumed_after(r.output, 1)) << r.output;
  }
  EXPECT_TRUE(contains(r.output, "commit sent to worker:2 (")) << r.output;
  EXPECT_EQ(summary("elastic").value("optimizer_iterations", std::int64_t{-1}), 400);
  EXPECT_LT(largest_difference("elastic", "fixed"), 1e-5);
}

// --workers 3:3 cannot lose one: the launcher ends the job at once, naming the worker lost
// and why the others cannot go on. (Where no launcher watches, the others' next round
// fails below MIN instead: tests/comm/elastic_rendezvous_test.cpp.)
TEST_F(ElasticCli, FewerThanMinWorkersLeftEndsTheJobNamingTheWorkerLost) {
  const Result r = launch(config(144, 3), "--workers 3:3", "elastic", "--fault-kill worker:2:4");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "worker:2 was killed by signal 9 (SIGKILL); the elastic job cannot go on with 2 "
                                 "worker(s), fewer than its 3"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "dtrain launch: failed: worker:2 was killed by signal 9 (SIGKILL)")) << r.output;
}

TEST_F(ElasticCli, AnElasticRangeIsCheckedBeforeAnythingStarts) {
  const Result r = dtrain::testing::run_cli("launch --workers 3:2 -- true", "", kSeconds);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--workers '3:2': an elastic job needs 1 <= MIN <= MAX")) << r.output;
  const Result chief = dtrain::testing::run_cli("launch --workers 1:2 --chief -- true", "", kSeconds);
  EXPECT_TRUE(contains(chief.output, "an elastic job (--workers MIN:MAX) needs 1 <= MIN <= MAX and no --chief")) << chief.output;
}

}  // namespace
