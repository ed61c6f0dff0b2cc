// A functional CNN from a config file: one device, MirroredStrategy and launched
// MultiWorkerMirroredStrategy workers train it alike (synchronized batch norm), the trace
// names the batch norm's sums, the doctor runs it, and ParameterServerStrategy trains it as
// one device does.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_process.h"
#include "common/temp_dir.h"
#include "dtrain/model/functional.h"
#include "dtrain/model/model.h"

namespace {

using namespace dtrain;
using Result = dtrain::testing::CliResult;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Rows of 64 synthetic features seen as 8x8 images: conv-BN-relu, a residual conv-BN
// block, global average pooling, 3 classes.
std::string cnn_json() {
  const KerasTensor in = Input({64}, "row");
  KerasTensor x = layer<nn::Reshape>(std::vector<std::int64_t>{8, 8, 1})(in);
  x = layer<nn::Conv2D>(4, 3, nn::Conv2DOptions{.padding = "same", .use_bias = false})(x);
  x = layer<nn::Activation>("relu")(layer<nn::BatchNormalization>(nn::BatchNormalizationOptions{.synchronized = true})(x));
  KerasTensor y = layer<nn::Conv2D>(4, 3, nn::Conv2DOptions{.padding = "same", .use_bias = false})(x);
  y = layer<nn::BatchNormalization>(nn::BatchNormalizationOptions{.synchronized = true})(y);
  x = layer<nn::Activation>("relu")(layer<nn::Add>()({x, y}));
  const KerasTensor out = layer<nn::Dense>(3)(layer<nn::GlobalAveragePooling2D>()(x));
  const Model model(in, out, "cnn");
  nlohmann::json config = nlohmann::json::parse(dtrain::testing::tiny_config_json());
  config["model"] = nlohmann::json::parse(model.to_json());
  config["data"]["features"] = 64;
  config["epochs"] = 2;
  return config.dump();
}

class ConvCli : public dtrain::testing::TempDirTest {
 protected:
  std::string config() { return write("cnn.json", cnn_json()); }
  std::string summary_flag(const std::string& name) { return " --summary " + (dir_ / name).string(); }
  nlohmann::json summary(const std::string& name) { return nlohmann::json::parse(std::ifstream(dir_ / name)); }
};

TEST_F(ConvCli, EveryStrategyTrainsTheFunctionalCnnAsOneDevice) {
  Result r = dtrain::testing::run_cli("fit " + config() + " --threads 1 --verbose 0" + summary_flag("one.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = dtrain::testing::run_cli("fit " + config() + " --threads 1 --strategy mirrored --replicas 2 --verbose 0" +
                       summary_flag("mirrored.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = dtrain::testing::run_cli("launch --timeout 120 --workers 2 fit " + config() +
                       " --threads 1 --strategy multi_worker --verbose 0" + summary_flag("workers.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json one = summary("one.json"), mirrored = summary("mirrored.json"), workers = summary("workers.json");
  EXPECT_EQ(mirrored["replicas"], 2);
  EXPECT_EQ(workers["strategy"], "MultiWorkerMirroredStrategy");
  for (std::size_t e = 0; e < 2; ++e) {
    const double loss = one["history"]["loss"][e].get<double>();
    EXPECT_NEAR(mirrored["history"]["loss"][e].get<double>(), loss, 1e-4) << "epoch " << e;
    EXPECT_NEAR(workers["history"]["loss"][e].get<double>(), loss, 1e-4) << "epoch " << e;
  }
}

TEST_F(ConvCli, TheTraceNamesTheBatchNormSumsAndTheDoctorRunsIt) {
  const std::string trace = (dir_ / "trace.json").string();
  Result r = dtrain::testing::run_cli("fit " + config() + " --replicas 2 --epochs 1 --steps-per-epoch 4 --verbose 0 --profile " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream t(trace);
  const std::string events((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(events, "sync batch norm (statistics)")) << events.substr(0, 2000);
  EXPECT_TRUE(contains(events, "sync batch norm (gradient sums)"));
  r = dtrain::testing::run_cli("doctor " + config() + " --replicas 1,2 --steps 3");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Under ParameterServerStrategy the moving statistics live on the ps with the weights: a
// worker pushes what its steps changed in them, so one worker trains as one device does.
TEST_F(ConvCli, ParameterServersTrainTheBatchNormCnnAsOneDevice) {
  Result r = dtrain::testing::run_cli("fit " + config() + " --threads 1 --verbose 0" + summary_flag("one.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = dtrain::testing::run_cli("launch --timeout 120 --workers 1 --ps 1 fit " + config() +
                               " --threads 1 --strategy parameter_server --verbose 0" + summary_flag("ps.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json one = summary("one.json"), ps = summary("ps.json");
  EXPECT_EQ(ps["strategy"], "ParameterServerStrategy");
  for (const auto& [key, values] : one.at("history").items()) {
    ASSERT_TRUE(ps.at("history").contains(key)) << key << "\n" << ps.dump();
    ASSERT_EQ(ps["history"][key].size(), values.size()) << key << "\n" << ps.dump();
    for (std::size_t e = 0; e < values.size(); ++e)
      EXPECT_NEAR(ps["history"][key][e].get<double>(), values[e].get<double>(), 1e-4) << key << " epoch " << e;
  }
}

}  // namespace
