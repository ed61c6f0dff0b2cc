// model.save and load_model: the loaded model takes the step the saved one would have
// taken, bit for bit; the compile settings round-trip through their JSON; files that are
// not saved models, damaged ones and ones whose parts disagree are errors naming the file.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error_message.h"
#include "common/temp_dir.h"
#include "dtrain/core/files.h"
#include "dtrain/data/datasets.h"
#include "dtrain/model/compile_config.h"
#include "dtrain/model/safetensors.h"
#include "dtrain/model/saving.h"
#include "dtrain/model/sequential.h"

namespace dtrain {
namespace {

using dtrain::testing::message_of;
using nlohmann::json;

class ModelSaving : public dtrain::testing::TempDirTest {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

std::unique_ptr<Sequential> mlp() {
  auto m = std::make_unique<Sequential>("mlp");
  m->add<nn::Dense>(12, "relu", nn::DenseOptions{.seed = 1});
  m->add<nn::Dropout>(0.25f, 11);
  m->add<nn::Dense>(3, "", nn::DenseOptions{.seed = 2});
  m->build(Shape{5});
  return m;
}

// Every weight's bits, so that -0 and 0 (or two NaNs) are not taken for each other.
std::vector<std::vector<std::uint32_t>> bits(const Model& m) {
  std::vector<std::vector<std::uint32_t>> out;
  for (Variable* v : m.variables()) {
    out.emplace_back();
    for (float x : v->value().to_vector()) out.back().push_back(std::bit_cast<std::uint32_t>(x));
  }
  return out;
}

struct OptimizerCase {
  const char* name;
  std::function<std::shared_ptr<optim::Optimizer>()> make;
};

void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

class NextStep : public ModelSaving, public ::testing::WithParamInterface<OptimizerCase> {};

// Train a few steps, save, load; then one more identical epoch on each. Any state the file
// dropped (Adam's moments, the iteration count behind its bias correction and the
// schedule, SGD's momentum, the dropout masks' position) makes the weights differ.
TEST_P(NextStep, AfterLoadIsTheStepTheSavedModelWouldTake) {
  const data::Split d = data::make_synthetic(64, 5, 3, 7, data::SyntheticLabels::teacher);
  auto a = mlp();
  a->compile(GetParam().make(), std::make_shared<losses::SparseCategoricalCrossentropy>(true), {"accuracy"});
  a->fit(d.x, d.y, {.epochs = 2, .batch_size = 16, .seed = 3, .verbose = 0});
  ASSERT_EQ(a->optimizer().iterations(), 8);
  a->save(path("model.safetensors"));

  auto b = models::load_model(path("model.safetensors"));
  ASSERT_TRUE(b->compiled());
  EXPECT_EQ(b->to_json(), a->to_json());
  EXPECT_EQ(bits(*b), bits(*a));
  EXPECT_EQ(b->optimizer().iterations(), 8);
  EXPECT_EQ(b->optimizer().name(), a->optimizer().name());
  EXPECT_EQ(b->optimizer().learning_rate(), a->optimizer().learning_rate());

  const History ha = a->fit(d.x, d.y, {.epochs = 1, .batch_size = 16, .seed = 4, .verbose = 0});
  const History hb = b->fit(d.x, d.y, {.epochs = 1, .batch_size = 16, .seed = 4, .verbose = 0});
  EXPECT_EQ(bits(*b), bits(*a));
  EXPECT_EQ(hb.history.at("loss"), ha.history.at("loss"));
  EXPECT_EQ(hb.history.at("accuracy"), ha.history.at("accuracy"));
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, NextStep,
    ::testing::Values(
        OptimizerCase{"AdamWithADecaySchedule",
                      [] {
                        return std::make_shared<optim::Adam>(
                            std::make_shared<optim::ExponentialDecay>(0.02f, 3, 0.7f, true),
                            optim::AdamOptions{.beta_1 = 0.8f, .beta_2 = 0.99f, .epsilon = 1e-6f});
                      }},
        OptimizerCase{"SgdNesterovClipnorm",
                      [] {
                        return std::make_shared<optim::SGD>(0.05f, 0.9f, true, optim::OptimizerOptions{.clipnorm = 0.5f});
                      }},
        OptimizerCase{"AdamWWarmupGlobalClipnorm",
                      [] {
                        return std::make_shared<optim::AdamW>(
                            std::make_shared<optim::LinearWarmup>(std::make_shared<optim::CosineDecay>(0.01f, 20, 0.1f), 4),
                            0.01f, optim::AdamOptions{}, optim::OptimizerOptions{.global_clipnorm = 1.0f});
                      }}),
    [](const ::testing::TestParamInfo<OptimizerCase>& p) { return std::string(p.param.name); });

// mixed_float16: the loss scale and its count of good steps come back with the model, so
// the next steps scale, skip and grow as the saved model's would.
TEST_F(ModelSaving, AMixedFloat16ModelKeepsItsLossScale) {
  const data::Split d = data::make_synthetic(64, 5, 3, 7, data::SyntheticLabels::teacher);
  std::unique_ptr<Sequential> a;
  {
    nn::ScopedGlobalPolicy policy("mixed_float16");
    a = mlp();
  }
  auto adam = std::make_shared<optim::Adam>(0.01f);
  adam->set_loss_scale(optim::LossScale{.initial_scale = 1024.0f, .dynamic_growth_steps = 3});
  a->compile(adam, std::make_shared<losses::SparseCategoricalCrossentropy>(true), {"accuracy"});
  a->fit(d.x, d.y, {.epochs = 2, .batch_size = 16, .seed = 3, .verbose = 0});
  ASSERT_EQ(a->optimizer().loss_scale(), 4096.0f);  // 8 finite steps: doubled at the 3rd and 6th
  ASSERT_EQ(a->optimizer().loss_scale_good_steps(), 2);
  a->save(path("model.safetensors"));

  auto b = models::load_model(path("model.safetensors"));
  EXPECT_EQ(b->layers()[0]->dtype_policy().name, "mixed_float16");
  EXPECT_EQ(b->optimizer().loss_scale(), 4096.0f);
  EXPECT_EQ(b->optimizer().loss_scale_good_steps(), 2);
  EXPECT_EQ(b->optimizer().loss_scale_options()->dynamic_growth_steps, 3);
  a->fit(d.x, d.y, {.epochs = 1, .batch_size = 16, .seed = 4, .verbose = 0});
  b->fit(d.x, d.y, {.epochs = 1, .batch_size = 16, .seed = 4, .verbose = 0});
  EXPECT_EQ(bits(*b), bits(*a));
  EXPECT_EQ(b->optimizer().loss_scale(), a->optimizer().loss_scale());
}

// Each writer's JSON reads back into an object that writes the same JSON, floats exact.
TEST(CompileConfig, OptimizersSchedulesAndLossesRoundTrip) {
  const std::vector<std::shared_ptr<optim::Optimizer>> optimizers = {
      std::make_shared<optim::SGD>(0.1f, 0.3f, false, optim::OptimizerOptions{.weight_decay = 0.01f}),
      std::make_shared<optim::Adam>(std::make_shared<optim::PiecewiseConstantDecay>(
          std::vector<std::int64_t>{10, 20}, std::vector<float>{0.1f, 0.01f, 0.001f})),
      std::make_shared<optim::AdamW>(
          std::make_shared<optim::LinearWarmup>(std::make_shared<optim::ExponentialDecay>(0.3f, 7, 0.123456789f), 5, 0.01f),
          0.02f, optim::AdamOptions{.epsilon = 3e-8f}, optim::OptimizerOptions{.global_clipnorm = 1.1f}),
      std::make_shared<optim::RMSprop>(0.002f, optim::RMSpropOptions{.rho = 0.8f, .momentum = 0.25f, .centered = true},
                                       optim::OptimizerOptions{.clipnorm = 2.0f}),
      std::make_shared<optim::Adagrad>(0.05f, 0.3f, 1e-6f),
      std::make_shared<optim::Adam>(0.001f),  // given a loss scale below
  };
  optimizers.back()->set_loss_scale(optim::LossScale{.initial_scale = 512.0f, .dynamic_growth_steps = 7});
  for (const auto& o : optimizers) {
    const json j = optimizer_to_json(*o);
    const auto back = optimizer_from_json(j, "optimizer");
    EXPECT_EQ(optimizer_to_json(*back), j) << j.dump();
    EXPECT_EQ(back->name(), o->name());
    EXPECT_EQ(back->options().clipnorm, o->options().clipnorm);
    EXPECT_EQ(back->options().global_clipnorm, o->options().global_clipnorm);
    EXPECT_EQ(back->options().weight_decay, o->options().weight_decay);
    EXPECT_EQ(back->loss_scale(), o->loss_scale());
    EXPECT_EQ(back->loss_scale_options().has_value(), o->loss_scale_options().has_value());
    for (std::int64_t step : {0, 3, 6, 11, 25}) {
      back->set_iterations(step);
      o->set_iterations(step);
      EXPECT_EQ(back->learning_rate(), o->learning_rate()) << j.dump() << " at step " << step;
    }
  }
  // Short decimals, not a float's double expansion.
  EXPECT_EQ(optimizer_to_json(*optimizers[0]).at("momentum").dump(), "0.3");

  const std::vector<std::shared_ptr<losses::Loss>> ls = {
      std::make_shared<losses::SparseCategoricalCrossentropy>(true, losses::Reduction::sum),
      std::make_shared<losses::CategoricalCrossentropy>(false, 0.1f),
      std::make_shared<losses::MeanSquaredError>(losses::Reduction::none),
  };
  for (const auto& l : ls) {
    const json j = loss_to_json(*l);
    const auto back = loss_from_json(j, "loss");
    EXPECT_EQ(loss_to_json(*back), j);
    EXPECT_EQ(typeid(*back), typeid(*l));
    EXPECT_EQ(back->reduction(), l->reduction());
  }
  EXPECT_TRUE(loss_to_json(*ls[0]).at("from_logits").get<bool>());
}

// A class the JSON does not know is an error naming it, not a silent stand-in.
TEST(CompileConfig, UnknownClassesAreNamed) {
  struct Halved final : optim::LearningRateSchedule {
    float operator()(std::int64_t) const override { return 0.5f; }
    std::string describe() const override { return "Halved()"; }
  };
  EXPECT_NE(message_of<InvalidArgument>([] { schedule_to_json(Halved()); }).find("Halved()"), std::string::npos);
  struct Scaled final : losses::MeanSquaredError {
    Scaled() : MeanSquaredError(losses::Reduction::sum_over_batch_size, "scaled_mse") {}
  };
  EXPECT_NE(message_of<InvalidArgument>([] { loss_to_json(Scaled()); }).find("'scaled_mse'"), std::string::npos);
  EXPECT_NE(message_of<InvalidArgument>([] { optimizer_from_json(json{{"name", "sgd"}, {"beta_1", 0.9}}, "x.opt"); })
                .find("x.opt.beta_1: unknown key"),
            std::string::npos);
}

// A path that is a FIFO (or a device such as /dev/null) is written through, never renamed
// over: writing through a file beside it replaced /dev/null with a regular file.
TEST_F(ModelSaving, AFifoIsWrittenThroughAndStaysAFifo) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto read_all = [&] {
    std::ifstream in(fifo, std::ios::binary);  // waits for the writer
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  auto m = mlp();
  std::string weights, summary;
  {
    std::thread reader([&] { weights = read_all(); });
    m->save_weights(fifo);
    reader.join();
  }
  {
    std::thread reader([&] { summary = read_all(); });
    write_file_replacing(fifo, "{\"a\": 1}", "the summary");
    reader.join();
  }
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_FALSE(std::filesystem::exists(fifo + ".partial"));
  // The whole safetensors file came through: its header's length, the header, the weights.
  ASSERT_GT(weights.size(), 8u);
  std::uint64_t header = 0;
  std::memcpy(&header, weights.data(), 8);
  std::size_t values = 0;
  for (Variable* v : m->variables()) values += static_cast<std::size_t>(v->value().numel());
  EXPECT_EQ(weights.size(), 8 + header + 4 * values);
  EXPECT_EQ(summary, "{\"a\": 1}");
}

TEST_F(ModelSaving, LoadWithoutCompileGivesTheWeightsAndNoOptimizer) {
  auto a = mlp();
  a->compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, /*from_logits=*/true);
  const data::Split d = data::make_synthetic(32, 5, 3, 7);
  a->fit(d.x, d.y, {.epochs = 1, .batch_size = 8, .verbose = 0});
  a->save(path("m.safetensors"));

  auto b = models::load_model(path("m.safetensors"), /*compile=*/false);
  EXPECT_FALSE(b->compiled());
  EXPECT_EQ(bits(*b), bits(*a));
  EXPECT_EQ(b->predict(d.x).to_vector(), a->predict(d.x).to_vector());

  auto c = models::load_model(path("m.safetensors"));
  ASSERT_TRUE(c->compiled());
  const auto* loss = dynamic_cast<const losses::SparseCategoricalCrossentropy*>(&c->loss());
  ASSERT_NE(loss, nullptr);
  EXPECT_TRUE(loss->from_logits());
  ASSERT_EQ(c->metrics().size(), 1u);
  EXPECT_EQ(c->metrics()[0]->name(), "accuracy");
}

TEST_F(ModelSaving, AnUncompiledOrUnbuiltModelLoadsAsItWasSaved) {
  auto a = mlp();
  a->save(path("uncompiled.safetensors"));
  auto b = models::load_model(path("uncompiled.safetensors"));
  EXPECT_FALSE(b->compiled());
  EXPECT_EQ(bits(*b), bits(*a));

  Sequential unbuilt("later");
  unbuilt.add<nn::Dense>(4);
  unbuilt.save(path("unbuilt.safetensors"));
  auto c = models::load_model(path("unbuilt.safetensors"));
  EXPECT_FALSE(c->built());
  EXPECT_EQ(c->name(), "later");
  EXPECT_EQ(c->layers().size(), 1u);
}

TEST_F(ModelSaving, AWeightsOnlyFileIsNotASavedModel) {
  auto a = mlp();
  a->save_weights(path("weights.safetensors"));
  const std::string m = message_of<IoError>([&] { models::load_model(path("weights.safetensors")); });
  EXPECT_NE(m.find(path("weights.safetensors") + ": not a saved model"), std::string::npos) << m;
  EXPECT_NE(m.find("dtrain.model"), std::string::npos) << m;
  EXPECT_NE(m.find("weights only"), std::string::npos) << m;
}

TEST_F(ModelSaving, ADamagedFileIsReportedAsDamaged) {
  auto a = mlp();
  a->compile("adam", "sparse_categorical_crossentropy", {}, true);
  a->save(path("m.safetensors"));
  std::string bytes;
  {
    std::ifstream in(path("m.safetensors"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 3] ^= 0x10;  // the last tensor's bytes
  write("m.safetensors", bytes);
  const std::string m = message_of<IoError>([&] { models::load_model(path("m.safetensors")); });
  EXPECT_NE(m.find(path("m.safetensors") + ": tensor '"), std::string::npos) << m;
  EXPECT_NE(m.find("do not match their checksum"), std::string::npos) << m;
}

// Parts written by hand that disagree: each error names the file and the tensor.
TEST_F(ModelSaving, ArchitectureAndTensorsThatDisagreeAreNamed) {
  auto a = mlp();
  a->compile(std::make_shared<optim::Adam>(), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  const data::Split d = data::make_synthetic(16, 5, 3, 7);
  a->fit(d.x, d.y, {.epochs = 1, .batch_size = 8, .verbose = 0});
  a->save(path("good.safetensors"));
  const NamedTensors good = load_checked(path("good.safetensors"));

  const auto rewrite = [&](const std::function<void(NamedTensors&)>& change) {
    NamedTensors t = good;
    t.metadata.erase("dtrain.crc32");
    t.metadata.erase("dtrain.header_crc32");
    change(t);
    save_checked(path("bad.safetensors"), t);
    return message_of<IoError>([&] { models::load_model(path("bad.safetensors")); });
  };
  const auto drop = [](NamedTensors& t, const std::string& name) {
    std::erase_if(t.tensors, [&](const auto& e) { return e.first == name; });
  };
  std::string m = rewrite([&](NamedTensors& t) { drop(t, "dense_1/bias"); });
  EXPECT_NE(m.find("has no tensor 'dense_1/bias' (the model's variable)"), std::string::npos) << m;
  m = rewrite([&](NamedTensors& t) { drop(t, "optimizer/dense/kernel/v"); });
  EXPECT_NE(m.find("has no tensor 'optimizer/dense/kernel/v'"), std::string::npos) << m;
  m = rewrite([&](NamedTensors& t) { t.tensors.emplace_back("extra/kernel", Tensor::zeros(Shape{2})); });
  EXPECT_NE(m.find("holds tensor 'extra/kernel'"), std::string::npos) << m;
  m = rewrite([&](NamedTensors& t) {
    for (auto& [name, x] : t.tensors)
      if (name == "dense/kernel") x = Tensor::zeros(Shape{5, 13});
  });
  EXPECT_NE(m.find("tensor 'dense/kernel' is float32 [5, 13]"), std::string::npos) << m;
  m = rewrite([&](NamedTensors& t) { t.metadata["dtrain.optimizer_iterations"] = "-3"; });
  EXPECT_NE(m.find("dtrain.optimizer_iterations is '-3'"), std::string::npos) << m;
  m = rewrite([&](NamedTensors& t) { t.metadata["dtrain.compile"] = R"({"optimizer": "nadam", "loss": "mse"})"; });
  EXPECT_NE(m.find(path("bad.safetensors") + ": __metadata__.dtrain.compile.optimizer: unknown optimizer 'nadam'"),
            std::string::npos)
      << m;
  m = rewrite([&](NamedTensors& t) { t.metadata["dtrain.model"] = "{"; });
  EXPECT_NE(m.find(path("bad.safetensors") + ": __metadata__.dtrain.model: invalid JSON"), std::string::npos) << m;
  // The unchanged parts load.
  EXPECT_EQ(rewrite([](NamedTensors&) {}), "no error");
}

// A model whose loss has no JSON form cannot be saved, and nothing is written.
TEST_F(ModelSaving, AnUnsavableLossFailsTheSaveAndWritesNothing) {
  struct Scaled final : losses::MeanSquaredError {
    Scaled() : MeanSquaredError(losses::Reduction::sum_over_batch_size, "scaled_mse") {}
  };
  auto a = mlp();
  a->compile(std::make_shared<optim::SGD>(), std::make_shared<Scaled>());
  const std::string m = message_of<InvalidArgument>([&] { a->save(path("m.safetensors")); });
  EXPECT_NE(m.find("'scaled_mse' has no JSON form"), std::string::npos) << m;
  EXPECT_FALSE(std::filesystem::exists(path("m.safetensors")));
}

}  // namespace
}  // namespace dtrain
