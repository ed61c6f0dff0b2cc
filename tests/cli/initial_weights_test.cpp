// The command's initial weights are a function of the seed alone: `dtrain fit --epochs 0
// --save-weights` writes the same bytes under every --strategy, multi_worker without
// TF_CONFIG (one local worker that trains at once) and two launched workers included, and
// whatever the data source and its splits.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "common/cli_process.h"
#include "common/temp_dir.h"

namespace {

using Result = dtrain::testing::CliResult;

Result run(const std::string& args, const std::string& env = "") { return dtrain::testing::run_cli(args, env); }

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class CliInitialWeights : public dtrain::testing::TempDirTest {};

using dtrain::testing::be32;

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

// Reading the data draws no seed: the model's weights are the same bytes whether its rows
// come from the synthetic generator, a csv file or an IDX pair, with a test split or
// without (checking a file's labels against the model's classes once built the model again
// after the seed was set, once per split).
TEST_F(CliInitialWeights, AreTheSameBytesWhateverTheDataSource) {
  // 12 rows of 8 features (an IDX image of 2 x 4 bytes) and labels 0, 1, 2.
  std::string csv = "f0,f1,f2,f3,f4,f5,f6,f7,label\n";
  std::string images = be32(0x803) + be32(12) + be32(2) + be32(4), labels = be32(0x801) + be32(12);
  for (int row = 0; row < 12; ++row) {
    for (int col = 0; col < 8; ++col) {
      const int byte = (row * 37 + col * 11) % 256;
      csv += std::to_string(byte) + ",";
      images.push_back(static_cast<char>(byte));
    }
    csv += std::to_string(row % 3) + "\n";
    labels.push_back(static_cast<char>(row % 3));
  }
  const std::string csv_file = write("rows.csv", csv), images_file = write("images.idx", images),
                    labels_file = write("labels.idx", labels);
  auto weights = [&](const std::string& name, const std::string& data) {
    const std::string cfg = write(name + ".json", R"({
        "model": {"input_shape": [8], "layers": [
          {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
          {"class_name": "Dense", "config": {"units": 3}}]},
        "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "data": )" + data + R"(, "epochs": 1, "batch_size": 4, "seed": 7})");
    const std::string path = (dir_ / (name + ".safetensors")).string();
    const Result r = run("fit " + cfg + " --epochs 0 --verbose 0 --save-weights " + path);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return bytes_of(path);
  };
  const std::string reference =
      weights("synthetic", R"({"source": "synthetic", "samples": 12, "features": 8, "classes": 3})");
  ASSERT_FALSE(reference.empty());
  const std::string csv_train = R"({"source": "csv", "label_column": "label", "train": ")" + csv_file + "\"";
  EXPECT_EQ(weights("csv", csv_train + "}"), reference);
  EXPECT_EQ(weights("csv_test", csv_train + R"(, "test": ")" + csv_file + "\"}"), reference);
  const std::string idx_train =
      R"({"source": "idx", "train_images": ")" + images_file + R"(", "train_labels": ")" + labels_file + "\"";
  EXPECT_EQ(weights("idx", idx_train + "}"), reference);
  EXPECT_EQ(weights("idx_test", idx_train + R"(, "test_images": ")" + images_file + R"(", "test_labels": ")" +
                                    labels_file + "\"}"),
            reference);
}

}  // namespace
