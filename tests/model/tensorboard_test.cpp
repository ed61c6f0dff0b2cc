// TensorBoard's event files: CRC-32C as TFRecord masks it, every record checked on the way
// back, the Event protocol buffers decoded here by a reader of their wire format that knows
// nothing of the writer; and the callback's run folders and tags after a real fit.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/data/datasets.h"
#include "dtrain/model/sequential.h"
#include "dtrain/model/tensorboard.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;
using dtrain::testing::message_of;
using dtrain::testing::TempDirTest;

// A protocol buffer's fields: number -> raw values (varints as numbers, fixed64 and fixed32
// as their bytes, length-delimited as bytes).
struct Fields {
  std::multimap<int, std::string> bytes;
  std::multimap<int, std::uint64_t> varints;
  std::string first(int field) const {
    auto it = bytes.find(field);
    return it == bytes.end() ? std::string() : it->second;
  }
  double as_double(int field) const {
    const std::string b = first(field);
    double v = 0;
    if (b.size() == 8) std::memcpy(&v, b.data(), 8);
    return v;
  }
  float as_float(int field) const {
    const std::string b = first(field);
    float v = 0;
    if (b.size() == 4) std::memcpy(&v, b.data(), 4);
    return v;
  }
};

Fields decode(const std::string& message) {
  Fields f;
  std::size_t at = 0;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0; at < message.size(); shift += 7) {
      const auto b = static_cast<unsigned char>(message[at++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (at < message.size()) {
    const std::uint64_t key = varint();
    const int field = static_cast<int>(key >> 3);
    switch (key & 7) {
      case 0: f.varints.emplace(field, varint()); break;
      case 1: f.bytes.emplace(field, message.substr(at, 8)); at += 8; break;
      case 5: f.bytes.emplace(field, message.substr(at, 4)); at += 4; break;
      case 2: {
        const std::uint64_t n = varint();
        f.bytes.emplace(field, message.substr(at, n));
        at += n;
        break;
      }
      default: ADD_FAILURE() << "wire type " << (key & 7); return f;
    }
  }
  return f;
}

std::vector<double> packed_doubles(const std::string& b) {
  std::vector<double> out(b.size() / 8);
  std::memcpy(out.data(), b.data(), out.size() * 8);
  return out;
}

struct Summary {
  std::int64_t step;
  std::string tag;
  Fields value;  // Summary.Value
};

// Every summary value of an event file, after its first event (the file version).
std::vector<Summary> summaries(const std::string& path, std::string* version = nullptr) {
  const std::vector<std::string> records = tensorboard::read_records(path);
  std::vector<Summary> out;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Fields event = decode(records[i]);
    EXPECT_GT(event.as_double(1), 1.7e9);  // wall time, seconds since 1970
    if (i == 0) {
      if (version) *version = event.first(3);
      continue;
    }
    const Fields summary = decode(event.first(5));
    const auto step = static_cast<std::int64_t>(event.varints.count(2) ? event.varints.find(2)->second : 0);
    for (auto [it, end] = summary.bytes.equal_range(1); it != end; ++it) {
      Fields value = decode(it->second);
      out.push_back({step, value.first(1), value});
    }
  }
  return out;
}

TEST_F(TempDirTest, EventFilesHoldScalarsHistogramsAndTextThatReadBack) {
  const std::string dir = (dir_ / "run").string();
  std::string path;
  {
    tensorboard::EventWriter w(dir);
    path = w.path();
    EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
    w.scalar("epoch_loss", 0.25, 3);
    const std::vector<float> values{-1.0f, 0.0f, 0.5f, 2.0f, 2.0f};
    w.histogram("dense/kernel/histogram", values, 4);
    w.text("run_config", "### model", 0);
  }
  std::string version;
  const std::vector<Summary> s = summaries(path, &version);
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].tag, "epoch_loss");
  EXPECT_EQ(s[0].step, 3);
  EXPECT_FLOAT_EQ(s[0].value.as_float(2), 0.25f);
  const Fields h = decode(s[1].value.first(5));
  EXPECT_EQ(s[1].step, 4);
  EXPECT_DOUBLE_EQ(h.as_double(1), -1.0);
  EXPECT_DOUBLE_EQ(h.as_double(2), 2.0);
  EXPECT_DOUBLE_EQ(h.as_double(3), 5.0);
  EXPECT_DOUBLE_EQ(h.as_double(4), 3.5);
  EXPECT_DOUBLE_EQ(h.as_double(5), 1 + 0.25 + 4 + 4);
  const std::vector<double> limits = packed_doubles(h.first(6)), counts = packed_doubles(h.first(7));
  ASSERT_EQ(limits.size(), 30u);
  ASSERT_EQ(counts.size(), 30u);
  EXPECT_DOUBLE_EQ(limits.back(), 2.0);
  EXPECT_DOUBLE_EQ(counts[0], 1.0);   // -1
  EXPECT_DOUBLE_EQ(counts[10], 1.0);  // 0 (width 0.1)
  EXPECT_DOUBLE_EQ(counts[15], 1.0);  // 0.5
  EXPECT_DOUBLE_EQ(counts[29], 2.0);  // the maximum, twice
  const Fields tensor = decode(s[2].value.first(8));
  EXPECT_EQ(tensor.varints.find(1)->second, 7u);  // DT_STRING
  EXPECT_EQ(tensor.first(8), "### model");
  EXPECT_EQ(decode(decode(s[2].value.first(9)).first(1)).first(1), "text");
}

TEST_F(TempDirTest, EveryDamagedByteOfAnEventFileIsFoundAndNamed) {
  const std::string dir = (dir_ / "damaged").string();
  std::string path;
  {
    tensorboard::EventWriter w(dir);
    path = w.path();
    w.scalar("a", 1.0, 0);
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x10);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
    const std::string m = message_of<IoError>([&] { tensorboard::read_records(path); });
    EXPECT_NE(m.find(path), std::string::npos) << "byte " << i << ": " << m;
    EXPECT_NE(m.find("offset"), std::string::npos) << "byte " << i << ": " << m;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  EXPECT_NE(message_of<IoError>([&] { tensorboard::read_records(path); }).find("more than the file holds"),
            std::string::npos);
}

std::string only_event_file(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) found.push_back(e.path().string());
  EXPECT_EQ(found.size(), 1u) << dir;
  return found.empty() ? std::string() : found[0];
}

TEST_F(TempDirTest, TensorBoardCallbackWritesTheRunsKerasWrites) {
  const data::Split d = data::make_synthetic(96, 6, 3, 2, data::SyntheticLabels::teacher);
  Sequential model;
  model.add<nn::Dense>(8, "relu", nn::DenseOptions{.seed = 1});
  model.add<nn::Dense>(3, "softmax", nn::DenseOptions{.seed = 2});
  model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  model.build(Shape{6});
  const std::string log_dir = (dir_ / "logs").string();
  auto board = std::make_shared<TensorBoard>(TensorBoardOptions{
      .log_dir = log_dir, .histogram_freq = 2, .update_freq = 2, .profile_first = 1, .profile_last = 2});
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;  // 5 batches of training (80 rows), 16 rows of validation
  o.validation_split = 1.0 / 6;
  o.verbose = 0;
  o.callbacks = {board};
  const History h = model.fit(d.x, d.y, o);

  std::map<std::string, std::vector<std::int64_t>> steps;
  std::map<std::string, std::vector<double>> values;
  for (const Summary& s : summaries(only_event_file(log_dir + "/train"))) {
    steps[s.tag].push_back(s.step);
    values[s.tag].push_back(s.value.as_float(2));
  }
  EXPECT_EQ(steps["epoch_loss"], (std::vector<std::int64_t>{0, 1, 2}));
  for (int e = 0; e < 3; ++e) EXPECT_FLOAT_EQ(values["epoch_loss"][e], static_cast<float>(h.history.at("loss")[e]));
  EXPECT_EQ(steps["epoch_accuracy"].size(), 3u);
  // Every second of the 15 batches.
  EXPECT_EQ(steps["batch_loss"], (std::vector<std::int64_t>{2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(steps["dense/kernel/histogram"], (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(steps["dense_1/bias/histogram"], (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(steps["run_config"], (std::vector<std::int64_t>{0}));
  EXPECT_EQ(steps.count("epoch_val_loss"), 0u);
  std::map<std::string, std::vector<double>> validation;
  for (const Summary& s : summaries(only_event_file(log_dir + "/validation")))
    validation[s.tag].push_back(s.value.as_float(2));
  ASSERT_EQ(validation["epoch_loss"].size(), 3u);
  EXPECT_FLOAT_EQ(validation["epoch_loss"][2], static_cast<float>(h.history.at("val_loss")[2]));

  // The first two steps' trace, gzipped where the profile plugin looks.
  std::vector<fs::path> traces;
  for (const auto& e : fs::recursive_directory_iterator(log_dir + "/train/plugins/profile"))
    if (e.is_regular_file()) traces.push_back(e.path());
  ASSERT_EQ(traces.size(), 1u);
  EXPECT_EQ(traces[0].filename().string(), "dtrain.trace.json.gz");
  gzFile in = gzopen(traces[0].c_str(), "rb");
  ASSERT_NE(in, nullptr);
  char buffer[64] = {};
  EXPECT_GT(gzread(in, buffer, sizeof buffer - 1), 0);
  gzclose(in);
  EXPECT_NE(std::string(buffer).find("\"traceEvents\": ["), std::string::npos) << buffer;
}

TEST_F(TempDirTest, TensorBoardsBadArgumentsAreNamed) {
  EXPECT_NE(message_of([] { TensorBoard(TensorBoardOptions{.log_dir = ""}); }).find("log_dir"), std::string::npos);
  EXPECT_NE(message_of([] { TensorBoard(TensorBoardOptions{.histogram_freq = -1}); }).find("histogram_freq"),
            std::string::npos);
  EXPECT_NE(message_of([this] {
              TensorBoard(TensorBoardOptions{.log_dir = (dir_ / "p").string(), .profile_first = 5, .profile_last = 2});
            }).find("profile_batch"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain
