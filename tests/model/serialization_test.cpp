#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/data/datasets.h"
#include "dtrain/model/json_reader.h"
#include "dtrain/model/safetensors.h"
#include "dtrain/model/sequential.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

using dtrain::testing::temp_path;
using dtrain::testing::message_of;

std::unique_ptr<Sequential> make_model() {
  auto m = std::make_unique<Sequential>("clf");
  m->add<nn::Flatten>();
  m->add<nn::Dense>(8, "gelu", nn::DenseOptions{.seed = 3});
  m->add<nn::Dropout>(0.25f, 4);
  m->add<nn::Dense>(4, "softmax", nn::DenseOptions{.use_bias = false, .seed = 5});
  m->add<nn::Activation>("linear");
  m->build({2, 3});
  return m;
}

TEST(ModelJson, RoundTripsStructure) {
  auto m = make_model();
  const std::string json = m->to_json();
  EXPECT_NE(json.find("\"class_name\": \"Sequential\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"build_input_shape\""), std::string::npos) << json;
  auto back = model_from_json(json);
  EXPECT_EQ(back->to_json(), json);
  EXPECT_EQ(back->count_params(), m->count_params());
  EXPECT_EQ(back->layers()[1]->name(), "dense");
}

TEST(ModelJson, AcceptsKerasInitializerObjects) {
  auto m = model_from_json(R"({"class_name": "Sequential", "config": {"name": "k", "layers": [
      {"class_name": "Dense", "config": {"units": 3, "activation": "relu",
        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}}}}],
      "build_input_shape": [null, 5]}})");
  EXPECT_EQ(m->count_params(), 18);
}

// A seeded initializer object fixes the kernel whatever the global seed, as in Keras: the
// same kernel as the layer's own "seed", kept as that in the model's JSON.
TEST(ModelJson, ASeededInitializerFixesTheKernel) {
  auto model_with = [](const std::string& dense_config) {
    auto m = model_from_json(R"({"class_name": "Sequential", "config": {"name": "k", "layers": [
        {"class_name": "Dense", "config": {"units": 3, )" + dense_config + R"(}}], "build_input_shape": [null, 5]}})");
    return m->variables()[0]->value().to_vector();
  };
  const std::string seeded = R"("kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": 3}})";
  set_random_seed(1);
  const auto first = model_with(seeded);
  set_random_seed(2);
  EXPECT_EQ(model_with(seeded), first);
  EXPECT_EQ(model_with(R"("seed": 3)"), first);
  set_random_seed(2);
  const auto unseeded = model_with(R"("kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}})");
  EXPECT_NE(unseeded, first);
  const std::string e = message_of<InvalidArgument>(
      [&] { model_with(R"("kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": "x"}})"); });
  EXPECT_NE(e.find("kernel_initializer.config.seed: expected a whole number >= 0 or null, got \"x\""),
            std::string::npos)
      << e;
}

TEST(ModelJson, DTypePoliciesRoundTripAndAreChecked) {
  auto m = model_from_json(R"({"class_name": "Sequential", "config": {"name": "k", "layers": [
      {"class_name": "Dense", "config": {"units": 3, "dtype": "mixed_bfloat16"}},
      {"class_name": "Dense", "config": {"units": 2,
        "dtype": {"class_name": "DTypePolicy", "config": {"name": "mixed_bfloat16"}}}},
      {"class_name": "Dense", "config": {"units": 2}}],
      "build_input_shape": [null, 5]}})");
  EXPECT_EQ(m->layers()[0]->dtype_policy().name, "mixed_bfloat16");
  EXPECT_EQ(m->layers()[1]->dtype_policy().name, "mixed_bfloat16");
  EXPECT_EQ(m->layers()[2]->dtype_policy().name, "float32");  // the global policy
  const std::string json = m->to_json();
  EXPECT_NE(json.find("\"dtype\": \"mixed_bfloat16\""), std::string::npos) << json;
  EXPECT_EQ(model_from_json(json)->to_json(), json);
  const std::string bad = message_of([] {
    model_from_json(R"({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "Dense", "config": {"units": 3, "dtype": "float16"}}]}})");
  });
  EXPECT_NE(bad.find("config.layers[0].config.dtype"), std::string::npos) << bad;
  EXPECT_NE(bad.find("'float16' is not supported"), std::string::npos) << bad;
}

TEST(ModelJson, ErrorsNameThePath) {
  const std::string unknown = message_of([] {
    model_from_json(R"({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "Dense", "config": {"units": 3}}, {"class_name": "Dense", "config": {"unitz": 3}}]}})");
  });
  EXPECT_NE(unknown.find("config.layers[1].config.unitz"), std::string::npos) << unknown;
  const std::string type = message_of([] {
    model_from_json(R"({"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense", "config": {"units": "3"}}]}})");
  });
  EXPECT_NE(type.find("config.layers[0].config.units"), std::string::npos) << type;
  EXPECT_NE(type.find("expected an integer"), std::string::npos) << type;
  const std::string cls = message_of([] {
    model_from_json(R"({"class_name": "Sequential", "config": {"layers": [{"class_name": "Conv9D"}]}})");
  });
  EXPECT_NE(cls.find("Conv9D"), std::string::npos) << cls;
  EXPECT_NE(message_of([] { model_from_json("{not json"); }).find("invalid JSON"), std::string::npos);
}

TEST(Weights, SaveLoadGivesTheSamePredictions) {
  auto m = make_model();
  const auto path = temp_path("w.safetensors");
  m->save_weights(path.string());
  auto other = model_from_json(m->to_json());
  Tensor x = data::make_synthetic(5, 6, 2, 1).x.reshape({5, 2, 3});
  for (Variable* v : other->variables()) v->assign(Tensor::zeros(v->shape()));
  EXPECT_NE(other->predict(x).to_vector(), m->predict(x).to_vector());
  other->load_weights(path.string());
  EXPECT_EQ(other->predict(x).to_vector(), m->predict(x).to_vector());
  fs::remove(path);
}

TEST(Weights, LayoutIsSafetensors) {
  const auto path = temp_path("layout.safetensors");
  NamedTensors t;
  t.tensors.emplace_back("a", Tensor::from_vector({2}, {1.5f, -2}));
  t.tensors.emplace_back("b", Tensor::from_vector({1}, std::vector<std::int32_t>{7}));
  save_safetensors(path.string(), t);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find(R"("a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]})"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("b":{"data_offsets":[8,12],"dtype":"I32","shape":[1]})"), std::string::npos) << header;
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  float f;
  std::memcpy(&f, bytes.data() + 8 + n, 4);
  EXPECT_EQ(f, 1.5f);
  NamedTensors back = load_safetensors(path.string());
  EXPECT_EQ(back.find("a")->to_vector(), (std::vector<float>{1.5f, -2}));
  EXPECT_EQ(back.find("b")->dtype(), DType::i32);
  fs::remove(path);
}

TEST(Weights, BadFilesAreNamedErrorsAndLeaveTheModelAlone) {
  auto m = make_model();
  const auto path = temp_path("bad.safetensors");
  m->save_weights(path.string());
  const auto before = m->variables()[0]->value().to_vector();

  fs::resize_file(path, fs::file_size(path) - 10);  // truncated data
  std::string e = message_of([&] { m->load_weights(path.string()); });
  EXPECT_NE(e.find(path.string()), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  std::ofstream(path, std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) << "{}";
  e = message_of([&] { m->load_weights(path.string()); });
  EXPECT_NE(e.find("header length"), std::string::npos) << e;

  NamedTensors wrong;
  wrong.tensors.emplace_back("dense/kernel", Tensor::zeros({6, 9}));
  save_safetensors(path.string(), wrong);
  e = message_of([&] { m->load_weights(path.string()); });
  EXPECT_NE(e.find("dense/kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("[6, 9]"), std::string::npos) << e;

  wrong.tensors[0].second = Tensor::zeros({6, 8});
  save_safetensors(path.string(), wrong);
  e = message_of([&] { m->load_weights(path.string()); });
  EXPECT_NE(e.find("has no tensor 'dense/bias'"), std::string::npos) << e;
  EXPECT_EQ(m->variables()[0]->value().to_vector(), before);  // nothing was half-loaded

  // Every variable's tensor and more: another model's weights, refused whole.
  m->save_weights(path.string());
  NamedTensors more = load_safetensors(path.string());
  more.tensors.emplace_back("dense_9/bias", Tensor::zeros({3}));
  save_safetensors(path.string(), more);
  e = message_of([&] { m->load_weights(path.string()); });
  EXPECT_NE(e.find("holds 1 tensor(s) model '" + m->name() + "' has no variable for ('dense_9/bias')"),
            std::string::npos) << e;
  EXPECT_EQ(m->variables()[0]->value().to_vector(), before);
  fs::remove(path);
}

// A safetensors file as its layout has it: the header's length (8 bytes, little-endian),
// the JSON header, then `data_bytes` zero bytes of tensor data.
void write_safetensors_bytes(const fs::path& path, const std::string& header, std::size_t data_bytes) {
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(header.size() >> (8 * i));
  std::ofstream(path, std::ios::binary) << length << header << std::string(data_bytes, '\0');
}

TEST(Weights, ImpossibleShapesAreRejected) {
  const auto path = temp_path("huge.safetensors");
  const std::string header = R"({"w":{"dtype":"F32","shape":[4611686018427387905,4],"data_offsets":[0,16]}})";
  write_safetensors_bytes(path, header, 16);
  const std::string e = message_of([&] { load_safetensors(path.string()); });
  EXPECT_NE(e.find("tensor 'w'"), std::string::npos) << e;
  fs::remove(path);
}

// A header naming one tensor twice (a hand-edited or concatenated file) is named so, not
// read as one of them, nor as two tensors that overlap.
TEST(Weights, ATensorNamedTwiceIsNamed) {
  const auto path = temp_path("twice.safetensors");
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  write_safetensors_bytes(path, header, 8);
  const std::string e = message_of<IoError>([&] { load_safetensors(path.string()); });
  EXPECT_NE(e.find(path.string() + ": header names tensor 'w' twice"), std::string::npos) << e;
  const std::string metadata = R"({"__metadata__":{"a":"1"},"__metadata__":{"a":"2"}})";
  write_safetensors_bytes(path, metadata, 0);
  const std::string m = message_of<IoError>([&] { load_safetensors(path.string()); });
  EXPECT_NE(m.find(path.string() + ": header names the key '__metadata__' twice"), std::string::npos) << m;
  fs::remove(path);
}

// Like fuzz/regressions/fuzz_tf_config/number-overflow: a number too large for a double
// in the header is an IoError naming the file, not the JSON library's out_of_range.
TEST(Weights, HeaderNumberTooLargeForADoubleIsAnIoError) {
  const auto path = temp_path("overflow.safetensors");
  const std::string header = R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})";
  write_safetensors_bytes(path, header, 4);
  const std::string e = message_of<IoError>([&] { load_safetensors(path.string()); });
  EXPECT_NE(e.find(path.string() + ": header is not valid JSON"), std::string::npos) << e;
  fs::remove(path);
  try {
    parse_json(R"({"epochs": 1e999})", "run.json");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("run.json: invalid JSON"), std::string::npos) << err.what();
  }
}

TEST(ModelJson, TrainableFalseFreezesTheLayer) {
  auto m = model_from_json(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"units": 3, "trainable": false}},
      {"class_name": "Dense", "config": {"units": 2}}], "build_input_shape": [null, 4]}})");
  EXPECT_EQ(m->trainable_variables().size(), 2u);  // only the second layer's kernel and bias
  EXPECT_EQ(m->variables().size(), 4u);
  EXPECT_NE(m->to_json().find("\"trainable\": false"), std::string::npos);
}

TEST(CheckedFiles, APackedCopyIsWrittenWithItsDataAtA4096ByteOffsetAndReadsBackTheSame) {
  // An odd-sized u8 tensor in the middle puts the tensors after it at unaligned offsets.
  std::vector<float> big(3000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f - 7.0f;
  NamedTensors live;
  live.tensors.emplace_back("a", Tensor::from_vector({3}, {1.5f, -2, 4}));
  live.tensors.emplace_back("it", Tensor::zeros({5}, DType::u8));
  live.tensors.emplace_back("big", Tensor::from_vector({3000}, big));
  live.tensors.emplace_back("n", Tensor::from_vector({1}, std::vector<std::int32_t>{7}));
  live.metadata["dtrain.state"] = "{}";
  static_cast<unsigned char*>(live.tensors[1].second.raw_data())[4] = 9;
  CheckedTensors packed;
  pack(live, packed);
  const void* block = packed.block.get();
  pack(live, packed);  // a second snapshot of the same size reuses the block
  EXPECT_EQ(packed.block.get(), block);
  // The copy is the state at the snapshot, whatever the live tensors do next.
  live.tensors[2].second.data<float>()[10] = 1e6f;
  live.tensors[0].second.data<float>()[0] = 0;
  ASSERT_EQ(packed.checksums.size(), 4u);  // computed as the tensors were copied
  add_checksums(packed);  // nothing left to compute
  ASSERT_EQ(packed.checksums.size(), 4u);
  EXPECT_EQ(packed.checksums[0], tensor_checksum(Tensor::from_vector({3}, {1.5f, -2, 4})));
  EXPECT_EQ(packed.checksums[1], tensor_checksum(live.tensors[1].second));
  EXPECT_EQ(packed.checksums[2], tensor_checksum(Tensor::from_vector({3000}, big)));

  // The disk (direct I/O) and, where there is one, a tmpfs (which may refuse direct I/O).
  std::vector<fs::path> folders = {fs::temp_directory_path()};
  if (fs::is_directory("/dev/shm")) folders.emplace_back("/dev/shm");
  for (const fs::path& folder : folders) {
    SCOPED_TRACE(folder.string());
    const fs::path path = folder / ("dtrain_" + std::to_string(::getpid()) + "_packed.safetensors");
    save_checked(path.string(), packed, /*sync_folder=*/false);
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    ASSERT_GE(bytes.size(), 8u);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    const std::size_t data_bytes = 12 + 5 + 12000 + 4;
    EXPECT_EQ((8 + n) % 4096, 0u) << n;
    EXPECT_EQ(bytes.size(), 8 + n + data_bytes);
    const NamedTensors back = load_checked(path.string());
    ASSERT_EQ(back.tensors.size(), 4u);
    EXPECT_EQ(back.find("a")->to_vector(), (std::vector<float>{1.5f, -2, 4}));
    EXPECT_EQ(static_cast<const unsigned char*>(back.find("it")->raw_data())[4], 9);
    EXPECT_EQ(back.find("big")->to_vector(), big);
    EXPECT_EQ(back.find("n")->dtype(), DType::i32);
    EXPECT_EQ(back.metadata.at("dtrain.state"), "{}");
    fs::remove(path);
  }
}

TEST(CheckedFiles, APackedCopyOfSeveralMegabytesHasEachTensorsBytesAndItsOneShotChecksum) {
  // Tensors that end inside a 64 KB chunk, a u8 tensor of odd length, an empty one: a state
  // large enough to be shared among the compute threads and held in huge pages.
  NamedTensors live;
  auto filled = [](std::int64_t n, float scale) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977) * scale - 3.0f;
    return v;
  };
  live.tensors.emplace_back("w0", Tensor::from_vector({700, 1001}, filled(700 * 1001, 0.25f)));
  live.tensors.emplace_back("odd", Tensor::zeros({(1 << 20) + 3}, DType::u8));
  live.tensors.emplace_back("empty", Tensor::zeros({0}));
  live.tensors.emplace_back("w1", Tensor::from_vector({16411}, filled(16411, -0.5f)));
  live.tensors.emplace_back("w2", Tensor::from_vector({300, 1000}, filled(300 * 1000, 2.0f)));
  auto* odd = static_cast<unsigned char*>(live.tensors[1].second.raw_data());
  for (int i = 0; i < (1 << 20) + 3; i += 4099) odd[i] = static_cast<unsigned char>(i);
  CheckedTensors packed;
  pack(live, packed);
  ASSERT_EQ(packed.checksums.size(), live.tensors.size());
  for (std::size_t i = 0; i < live.tensors.size(); ++i) {
    SCOPED_TRACE(live.tensors[i].first);
    const Tensor& want = live.tensors[i].second;
    const Tensor& got = packed.data.tensors[i].second;
    ASSERT_EQ(got.nbytes(), want.nbytes());
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), static_cast<std::size_t>(want.nbytes())), 0);
    EXPECT_EQ(packed.checksums[i], tensor_checksum(want));
  }
  // One changed byte, and the next snapshot's checksum of that tensor alone changes.
  const std::vector<std::uint64_t> before = packed.checksums;
  live.tensors[3].second.data<float>()[16410] = 1e9f;
  pack(live, packed);
  for (std::size_t i = 0; i < live.tensors.size(); ++i)
    EXPECT_EQ(packed.checksums[i] == before[i], i != 3) << live.tensors[i].first;
}

TEST(Weights, FailedSaveKeepsThePreviousFile) {
  auto m = make_model();
  const auto path = temp_path("keep.safetensors");
  m->save_weights(path.string());
  const auto size = fs::file_size(path);
  NamedTensors dup;
  dup.tensors.emplace_back("x", Tensor::zeros({1}));
  dup.tensors.emplace_back("x", Tensor::zeros({1}));
  EXPECT_THROW(save_safetensors(path.string(), dup), InvalidArgument);
  EXPECT_EQ(fs::file_size(path), size);
  EXPECT_THROW(save_safetensors((temp_path("no_such_dir") / "w.safetensors").string(), dup), Error);
  fs::remove(path);
}

}  // namespace
}  // namespace dtrain
