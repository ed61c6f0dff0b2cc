// The dtrain command run as a process: exit codes, one-line errors naming the key, and the
// machine-readable summary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "common/temp_dir.h"

namespace {

namespace fs = std::filesystem;


struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

// `env`: VAR=value words put before the command.
Result run(const std::string& args, const std::string& env = "") {
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(DTRAIN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class Cli : public dtrain::testing::TempDirTest {
 protected:
  std::string tiny_config(const std::string& extra = "") {
    return write("tiny.json", R"({
      "model": {"input_shape": [8], "layers": [
        {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 3}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"name": "adam", "learning_rate": 0.01},
      "metrics": ["accuracy"],
      "data": {"source": "synthetic", "samples": 600, "test_samples": 200, "features": 8, "classes": 3, "labels": "teacher"},
      "epochs": 3, "batch_size": 32, "seed": 4)" + extra + "}");
  }
};

TEST_F(Cli, HelpAndUsage) {
  Result r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("Examples:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fit"), std::string::npos);
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("fit").code, 2);  // config missing
  EXPECT_EQ(run("fit x.json --batch-size 0").code, 2);
  EXPECT_EQ(run("fit x.json --epochs -3").code, 2);
}

TEST_F(Cli, FitWritesSummaryAndIsDeterministic) {
  const std::string cfg = tiny_config();
  const auto s1 = (dir_ / "s1.json").string(), s2 = (dir_ / "s2.json").string();
  Result r = run("fit " + cfg + " --verbose 2 --summary " + s1);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Epoch 3/3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test: loss"), std::string::npos) << r.output;
  ASSERT_EQ(run("fit " + cfg + " --verbose 0 --summary " + s2).code, 0);
  const auto a = nlohmann::json::parse(std::ifstream(s1)), b = nlohmann::json::parse(std::ifstream(s2));
  for (const char* k : {"history", "test", "samples_per_second", "wall_seconds", "first_epoch_samples_per_second"})
    EXPECT_TRUE(a.contains(k)) << k;
  EXPECT_EQ(a["history"]["loss"].size(), 3u);
  EXPECT_GT(a["samples_per_second"].get<double>(), 0.0);
  EXPECT_GT(a["test"]["accuracy"].get<double>(), 0.8);
  EXPECT_EQ(a["history"], b["history"]);  // same seed, same numbers
  EXPECT_EQ(a["test"], b["test"]);
}

TEST_F(Cli, FlagsOverrideTheFile) {
  const auto s = (dir_ / "s.json").string();
  ASSERT_EQ(run("fit " + tiny_config() + " --epochs 1 --batch-size 100 --threads 1 --seed 9 --verbose 0 --summary " + s).code, 0);
  const auto j = nlohmann::json::parse(std::ifstream(s));
  EXPECT_EQ(j["history"]["loss"].size(), 1u);
  EXPECT_EQ(j["batch_size"], 100);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["seed"], 9);
}

TEST_F(Cli, MixedPrecisionFromTheFileOrTheFlag) {
  const auto s1 = (dir_ / "s1.json").string(), s2 = (dir_ / "s2.json").string(), s3 = (dir_ / "s3.json").string();
  ASSERT_EQ(run("fit " + tiny_config(R"(, "dtype_policy": "mixed_bfloat16")") + " --verbose 0 --summary " + s1).code, 0);
  ASSERT_EQ(run("fit " + tiny_config() + " --dtype-policy mixed_bfloat16 --verbose 0 --summary " + s2).code, 0);
  ASSERT_EQ(run("fit " + tiny_config() + " --verbose 0 --summary " + s3).code, 0);
  const auto a = nlohmann::json::parse(std::ifstream(s1)), b = nlohmann::json::parse(std::ifstream(s2)),
             f32 = nlohmann::json::parse(std::ifstream(s3));
  EXPECT_EQ(a["dtype_policy"], "mixed_bfloat16");
  EXPECT_EQ(f32["dtype_policy"], "float32");
  EXPECT_EQ(a["history"], b["history"]);     // the file and the flag mean the same
  EXPECT_NE(a["history"], f32["history"]);   // and bfloat16 matmuls change the numbers a little
  EXPECT_GT(a["test"]["accuracy"].get<double>(), 0.8);
  EXPECT_EQ(run("fit " + tiny_config() + " --dtype-policy float16").code, 2);
  // The flag is every layer's policy, also over a layer's own "dtype"; the summary says
  // what the layers ran.
  const std::string own = write("own.json", R"({
      "model": {"input_shape": [8], "layers": [
        {"class_name": "Dense", "config": {"units": 3, "dtype": "float32"}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "data": {"source": "synthetic", "samples": 64, "features": 8, "classes": 3}, "epochs": 1})");
  const auto s4 = (dir_ / "s4.json").string(), s5 = (dir_ / "s5.json").string();
  ASSERT_EQ(run("fit " + own + " --verbose 0 --dtype-policy mixed_bfloat16 --summary " + s4).code, 0);
  ASSERT_EQ(run("fit " + own + " --verbose 0 --summary " + s5).code, 0);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(s4))["dtype_policy"], "mixed_bfloat16");
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(s5))["dtype_policy"], "float32");
}

TEST_F(Cli, MirroredFromTheFileOrTheFlagMatchesOneDevice) {
  const auto s1 = (dir_ / "s1.json").string(), s2 = (dir_ / "s2.json").string(), s3 = (dir_ / "s3.json").string();
  Result r = run("fit " + tiny_config(R"(, "strategy": "mirrored", "replicas": 2)") + " --verbose 0 --summary " + s1);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("MirroredStrategy 2 replicas x "), std::string::npos) << r.output;
  ASSERT_EQ(run("fit " + tiny_config() + " --strategy mirrored --replicas 2 --verbose 0 --summary " + s2).code, 0);
  ASSERT_EQ(run("fit " + tiny_config() + " --verbose 0 --summary " + s3).code, 0);
  const auto a = nlohmann::json::parse(std::ifstream(s1)), b = nlohmann::json::parse(std::ifstream(s2)),
             one = nlohmann::json::parse(std::ifstream(s3));
  EXPECT_EQ(a["strategy"], "MirroredStrategy");
  EXPECT_EQ(a["replicas"], 2);
  EXPECT_EQ(one["replicas"], 1);
  EXPECT_EQ(a["history"], b["history"]);  // the file and the flag mean the same
  // The same global batches on two replicas: the same training, up to rounding.
  for (std::size_t e = 0; e < 3; ++e)
    EXPECT_NEAR(a["history"]["loss"][e].get<double>(), one["history"]["loss"][e].get<double>(), 1e-4) << "epoch " << e;
  // Accumulation from the flag: 3 batches per update.
  const auto s4 = (dir_ / "s4.json").string();
  ASSERT_EQ(run("fit " + tiny_config() + " --replicas 2 --gradient-accumulation-steps 3 --verbose 0 --summary " + s4).code, 0);
  const auto acc = nlohmann::json::parse(std::ifstream(s4));
  EXPECT_EQ(acc["gradient_accumulation_steps"], 3);
  EXPECT_EQ(acc["strategy"], "MirroredStrategy");
  EXPECT_NE(acc["history"], a["history"]);
  EXPECT_EQ(run("fit " + tiny_config() + " --strategy parameter_server").code, 2);
}

TEST_F(Cli, LaunchRunsTasksWithPrefixedOutputAndReportsAFailure) {
  Result r = run("launch --workers 2 -- sh -c 'echo task says hi'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[worker:0] task says hi"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[worker:1] task says hi"), std::string::npos) << r.output;
  // `launch ... fit CONFIG` runs this dtrain in every task.
  r = run("launch --workers 1 --chief fit " + tiny_config() + " --epochs 1 --verbose 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[chief:0] dtrain fit"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[worker:0] dtrain fit"), std::string::npos) << r.output;
  r = run("launch --workers 2 --grace-seconds 2 -- sh -c 'case \"$TF_CONFIG\" in *\\\"index\\\":0*) exit 4;; esac; exec sleep 60'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("dtrain launch: failed: worker:0 exited with code 4"), std::string::npos) << r.output;
  EXPECT_EQ(run("launch --workers 2").code, 1);  // no program
}

TEST_F(Cli, FitProfileWritesATraceAndTheSummaryHasTheProfile) {
  const std::string trace = (dir_ / "trace.json").string(), summary = (dir_ / "s.json").string();
  Result r = run("fit " + tiny_config() + " --replicas 2 --epochs 2 --steps-per-epoch 5 --verbose 2 --profile " + trace +
                 " --summary " + summary);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Where the training steps' time went:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("forward"), std::string::npos) << r.output;
  std::ifstream t(trace);
  const nlohmann::json events = nlohmann::json::parse(t).at("traceEvents");
  EXPECT_GT(events.size(), 20u);
  std::ifstream s(summary);
  const nlohmann::json j = nlohmann::json::parse(s);
  ASSERT_EQ(j.at("profile").size(), 1u);
  // --steps-per-epoch 5: the steady-state profile is the second epoch's 5 steps.
  EXPECT_EQ(j["profile"][0].at("steps"), 5);
  EXPECT_GT(j["profile"][0].at("phase_seconds_per_step").at("forward").get<double>(), 0.0);
  // A trace that cannot be written fails before training.
  r = run("fit " + tiny_config() + " --profile /nonexistent-dir/t.json");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent-dir/t.json"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Epoch 1"), std::string::npos) << r.output;
}

TEST_F(Cli, DoctorRunsEachScaleAndNamesAPlantedStraggler) {
  Result r = run("doctor " + tiny_config() + " --replicas 1,2 --steps 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("| 1 | 1 | 32 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| 1 | 2 | 64 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Diagnosis"), std::string::npos) << r.output;
  // Worker 1 made five times slower (forward and backward) is named; worker 0 is not.
  r = run("doctor " + tiny_config() + " --replicas 1 --workers 2 --steps 10", "DTRAIN_FAULT_SLOW=worker:1:5x");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("- straggler: worker:1 computes"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("straggler: worker:0"), std::string::npos) << r.output;
  // A malformed fault option, or a bad scale, is an error naming it.
  r = run("doctor " + tiny_config() + " --replicas 1 --workers 2 --steps 2", "DTRAIN_FAULT_SLOW=worker:1:slow");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("DTRAIN_FAULT_SLOW"), std::string::npos) << r.output;
  EXPECT_EQ(run("doctor " + tiny_config() + " --replicas 0").code, 2);
}

TEST_F(Cli, ProbeLinkMeasuresTheLinkBetweenWorkers) {
  const auto out = (dir_ / "link.json").string();
  Result r = run("launch --workers 2 probe-link --output " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[worker:0] link between 2 workers:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--what-if link="), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(j["workers"], 2);
  EXPECT_GT(j["bytes_per_second"].get<double>(), 0.0);
  EXPECT_GE(j["latency_seconds"].get<double>(), 0.0);
  ASSERT_EQ(j["samples"].size(), 3u);
  EXPECT_EQ(j["samples"][0]["bytes"], 1024);
  EXPECT_EQ(j["samples"][1]["bytes"], 1 << 20);
  EXPECT_GE(j["samples"][2]["bytes"].get<double>(), 1 << 20);
  // Alone there is no link to measure.
  r = run("probe-link", "-u TF_CONFIG");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("at least 2"), std::string::npos) << r.output;
}

TEST_F(Cli, DoctorPredictsOtherScalesChecksItsModelAndWritesAReport) {
  const std::string cfg = tiny_config();
  const auto html = (dir_ / "r.html").string(), one = (dir_ / "one.json").string();
  Result r = run("doctor " + cfg + " --replicas 1 --workers 1,2 --steps 3 --threads-per-worker 1 "
                 "--what-if workers=8,link=1Gbit,latency=20us --report " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1 thread(s) per worker"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Model check"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(1.0 Gbit/s (125.0 MB/s), 20 us latency, as given)"), std::string::npos) << r.output;
  // 195 float32 parameters in one bucket.
  EXPECT_NE(r.output.find("What if: 8 worker(s) x 1 replica(s), 32 rows per worker per step"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("0.0 MB of gradients in 1 bucket(s)"), std::string::npos) << r.output;
  std::ifstream page(html);
  const std::string text((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("Model check"), std::string::npos);

  // Runs made elsewhere, diagnosed from their summaries.
  ASSERT_EQ(run("fit " + cfg + " --verbose 0 --epochs 2 --summary " + one).code, 0);
  const auto j = nlohmann::json::parse(std::ifstream(one));
  EXPECT_EQ(j["trainable_parameters"], 195);
  EXPECT_EQ(j["gradient_bytes_per_step"], 780);
  EXPECT_EQ(j["gradient_buckets"], 1);
  r = run("doctor --runs " + one + " --what-if workers=4,link=1Gbit");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("| 1 | 1 | 32 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("What if: 4 worker(s)"), std::string::npos) << r.output;
  // What it cannot do, it says.
  r = run("doctor --runs " + one + " --what-if workers=4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("needs link="), std::string::npos) << r.output;
  r = run("doctor --runs " + (dir_ / "none.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("none.json"), std::string::npos) << r.output;
  r = run("doctor --runs " + one + " --what-if workers=4,link=fast");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("link rate 'fast'"), std::string::npos) << r.output;
  EXPECT_EQ(run("doctor").code, 1);
}

TEST_F(Cli, MergeTracesGivesOneTraceWithAProcessPerWorker) {
  const auto t = (dir_ / "t.json").string(), t1 = (dir_ / "t.worker-1.json").string();
  const auto all = (dir_ / "all.json").string(), shifted = (dir_ / "shifted.json").string();
  Result r = run("launch --workers 2 fit " + tiny_config() + " --epochs 1 --steps-per-epoch 4 --verbose 0 --profile " + t);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("merge-traces " + all + " " + t + " " + t1);
  ASSERT_EQ(r.code, 0) << r.output;
  auto parse = [](const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); };
  const auto a = parse(t), b = parse(t1), merged = parse(all);
  ASSERT_EQ(merged["traceEvents"].size(), a["traceEvents"].size() + b["traceEvents"].size());
  // Both workers wrote pid = their index; each stays a process of its own, named.
  std::set<int> pids;
  std::set<std::string> names;
  for (const auto& e : merged["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e["name"] == "process_name") names.insert(e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_EQ(names.size(), 2u);

  // A trace whose clock is a day off (another host's) is put back on the first's by its
  // steps: the first step both have ends at the same moment in both.
  auto moved = b;
  for (auto& e : moved["traceEvents"])
    if (e.contains("ts")) e["ts"] = e["ts"].get<double>() + 86400e6;
  std::ofstream(shifted) << moved.dump();
  ASSERT_EQ(run("merge-traces " + all + " " + t + " " + shifted + " --align-steps").code, 0);
  std::map<int, double> step0_end;
  const auto aligned = parse(all);
  for (const auto& e : aligned["traceEvents"])
    if (e.value("name", "") == "step 0") step0_end[e["pid"].get<int>()] = e["ts"].get<double>() + e["dur"].get<double>();
  ASSERT_EQ(step0_end.size(), 2u);
  EXPECT_NEAR(step0_end[0], step0_end[1], 1e-3);

  // Bad input names the file.
  std::ofstream(dir_ / "bad.json") << R"({"events": []})";
  r = run("merge-traces " + all + " " + t + " " + (dir_ / "bad.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("bad.json has no \"traceEvents\""), std::string::npos) << r.output;
}

TEST_F(Cli, SaveWeightsThenEvaluateGivesTheSameTestFigures) {
  const std::string cfg = tiny_config();
  const auto w = (dir_ / "w.safetensors").string(), s = (dir_ / "s.json").string(), e = (dir_ / "e.json").string();
  ASSERT_EQ(run("fit " + cfg + " --verbose 0 --save-weights " + w + " --summary " + s).code, 0);
  Result r = run("evaluate " + cfg + " --weights " + w + " --summary " + e);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto fit = nlohmann::json::parse(std::ifstream(s)), ev = nlohmann::json::parse(std::ifstream(e));
  EXPECT_NEAR(fit["test"]["loss"].get<double>(), ev["test"]["loss"].get<double>(), 1e-6);
  EXPECT_EQ(fit["test"]["accuracy"], ev["test"]["accuracy"]);
  Result missing = run("evaluate " + cfg + " --weights " + (dir_ / "none.safetensors").string());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("none.safetensors"), std::string::npos) << missing.output;
}

TEST_F(Cli, SummaryPrintsTheTable) {
  Result r = run("summary " + tiny_config());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Total params: 195"), std::string::npos) << r.output;  // 8*16+16 + 16*3+3
}

TEST_F(Cli, BadConfigsNameTheKey) {
  struct Case {
    std::string extra, expect;
  };
  const Case cases[] = {
      {R"(, "epoch": 3)", "epoch: unknown key"},
      {R"(, "verbose": "loud")", "verbose: expected an integer"},
      {R"(, "validation_split": 1.5)", "validation_split: must be in [0, 1)"},
      {R"(, "threads": -2)", "threads: must be in [0, 4096]"},
      {R"(, "epochs": 4294967297)", "epochs: must be in [0, 1000000]"},
      {R"(, "seed": 18446744073709551615)", "seed: the integer 18446744073709551615 is too large"},
      {R"(, "dtype_policy": "mixed_float16")", "dtype_policy: dtype policy 'mixed_float16' is not supported"},
      {R"(, "strategy": "tpu")", "strategy: expected \"default\", \"one_device\", \"mirrored\" or \"multi_worker\""},
      {R"(, "replicas": 2)", "replicas: replicas 2 needs strategy \"mirrored\""},
      {R"(, "gradient_accumulation_steps": 0)", "gradient_accumulation_steps: must be in [1, 1000000]"},
  };
  for (const auto& c : cases) {
    Result r = run("fit " + tiny_config(c.extra));
    EXPECT_EQ(r.code, 1) << c.extra;
    EXPECT_NE(r.output.find("dtrain: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("tiny.json"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  }
  const std::string layers = write("layers.json", R"({"model": {"layers": [{"class_name": "Dense", "config": {"units": "8"}}]},
      "loss": "mse"})");
  Result r = run("fit " + layers);
  EXPECT_NE(r.output.find("model.config.layers[0].config.units: expected an integer"), std::string::npos) << r.output;
  r = run("fit " + write("mom.json", R"({"model": {"layers": []}, "loss": "mse", "optimizer": {"name": "adam", "momentum": 0.9}})"));
  EXPECT_NE(r.output.find("optimizer.momentum: unknown key"), std::string::npos) << r.output;
  const std::string opt = write("opt.json", R"({"model": {"layers": []}, "loss": "mse", "optimizer": {"name": "adagrad"}})");
  r = run("fit " + opt);
  EXPECT_NE(r.output.find("optimizer.name: unknown optimizer 'adagrad'"), std::string::npos) << r.output;
  r = run("fit " + write("broken.json", "{\"model\": "));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("invalid JSON"), std::string::npos) << r.output;
  r = run("fit " + (dir_ / "absent.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("absent.json: cannot open"), std::string::npos) << r.output;
}

TEST_F(Cli, MissingDatasetNamesTheFile) {
  const std::string cfg = write("fm.json", R"({"model": {"input_shape": [784], "layers": [
      {"class_name": "Dense", "config": {"units": 10}}]}, "loss": "sparse_categorical_crossentropy",
      "data": {"source": "fashion_mnist", "path": ")" + dir_.string() + R"("}})");
  Result r = run("fit " + cfg);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("train-images-idx3-ubyte"), std::string::npos) << r.output;
}

}  // namespace
