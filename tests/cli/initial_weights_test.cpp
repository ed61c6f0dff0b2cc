// The command's initial weights are a function of the seed alone: `dtrain fit --epochs 0
// --save-weights` writes the same bytes under every --strategy, multi_worker without
// TF_CONFIG (one local worker that trains at once) and two launched workers included.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "common/temp_dir.h"

namespace {

struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

Result run(const std::string& args, const std::string& env = "") {
  const std::string cmd = "env -u TF_CONFIG " + env + " " + std::string(DTRAIN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class CliInitialWeights : public dtrain::testing::TempDirTest {};

TEST_F(CliInitialWeights, AreTheSameBytesUnderEveryStrategy) {
  const std::string cfg = write("tiny.json", R"({
      "model": {"input_shape": [8], "layers": [
        {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 3}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"name": "adam", "learning_rate": 0.01},
      "data": {"source": "synthetic", "samples": 64, "features": 8, "classes": 3},
      "epochs": 1, "batch_size": 16, "seed": 7})");
  auto weights = [&](const std::string& name, const std::string& flags) {
    const std::string path = (dir_ / (name + ".safetensors")).string();
    const Result r = run("fit " + cfg + " --epochs 0 --verbose 0 --save-weights " + path + " " + flags);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return bytes_of(path);
  };
  const std::string reference = weights("default", "");
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(weights("one_device", "--strategy one_device"), reference);
  EXPECT_EQ(weights("mirrored_1", "--strategy mirrored --replicas 1"), reference);
  EXPECT_EQ(weights("mirrored_2", "--strategy mirrored --replicas 2"), reference);
  // Without TF_CONFIG: one worker, at once (were it to wait for a chief, the collective
  // timeout would end it).
  EXPECT_EQ(weights("multi_worker", "--strategy multi_worker --collective-timeout 20"), reference);
  // Two launched workers: the chief writes the file.
  const std::string two = (dir_ / "two.safetensors").string();
  const Result r = run("launch --workers 2 --timeout 120 fit " + cfg + " --epochs 0 --verbose 0 --save-weights " + two);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(bytes_of(two), reference);
}

}  // namespace
