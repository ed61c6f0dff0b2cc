// Model files as Keras writes them: tf.keras 2.4, 2.11 and 2.13 (to_json), Keras 3.3, 3.5
// and 3.15 (get_config and a .keras archive's config.json), one file per form in
// keras_files/, every layer class dtrain has among them. Each loads, builds, runs, keeps
// its regularizers and constraints, and writes itself back; a value dtrain cannot honour
// is one line naming the key and the value.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error_message.h"
#include "dtrain/model/sequential.h"
#include "dtrain/nn/conv.h"
#include "dtrain/nn/dense.h"

namespace dtrain {
namespace {

using dtrain::testing::message_of;

std::string read_file(const std::string& name) {
  std::ifstream in(std::string(DTRAIN_KERAS_FILES) + "/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct KerasFile {
  const char* name;
  std::int64_t params;                 // as Keras's model.count_params() gives them
  std::vector<Shape> inputs;           // one row each
  Shape output;
};

void PrintTo(const KerasFile& f, std::ostream* os) { *os << f.name; }

class KerasFiles : public ::testing::TestWithParam<KerasFile> {};

TEST_P(KerasFiles, LoadRunAndWriteBack) {
  const KerasFile& file = GetParam();
  auto model = model_from_json(read_file(file.name));
  EXPECT_EQ(model->count_params(), file.params);
  std::vector<Tensor> inputs;
  for (const Shape& s : file.inputs) inputs.push_back(Tensor::full(s, 1.0f));
  const std::vector<Tensor> out = (*model)(std::span<const Tensor>(inputs));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), file.output);
  for (float v : out[0].to_vector()) EXPECT_TRUE(std::isfinite(v));

  const std::string written = model->to_json();
  auto back = model_from_json(written);
  EXPECT_EQ(back->to_json(), written);
  EXPECT_EQ(back->count_params(), file.params);
  (*back)(std::span<const Tensor>(inputs));  // the activity penalties are the last call's
  EXPECT_EQ(back->losses().size(), model->losses().size());
}

INSTANTIATE_TEST_SUITE_P(
    Keras, KerasFiles,
    ::testing::Values(KerasFile{"tf_keras_2_4_sequential.json", 2242, {{2, 32}}, {2, 2}},
                      KerasFile{"tf_keras_2_11_image_layers.json", 242, {{2, 8, 8, 1}}, {2, 10}},
                      KerasFile{"tf_keras_2_13_functional.json", 163, {{2, 6}, {2, 6}}, {2, 3}},
                      KerasFile{"keras_3_3_functional.json", 220, {{2, 10}}, {2, 4}},
                      KerasFile{"keras_3_5_sequential.json", 205, {{2, 8, 8, 2}}, {2, 5}},
                      KerasFile{"keras_3_15_sequential.json", 16, {{2, 3}}, {2, 2}}),
    [](const ::testing::TestParamInfo<KerasFile>& param) {
      std::string name = param.param.name;
      return name.substr(0, name.find('.'));
    });

Variable& weight(Model& model, const std::string& name) {
  for (Variable* v : model.variables())
    if (v->name() == name) return *v;
  ADD_FAILURE() << "no variable " << name;
  return *model.variables().front();
}

double sum_of(const Tensor& t, double (*f)(double)) {
  double s = 0.0;
  for (float v : t.to_vector()) s += f(v);
  return s;
}

// tf.keras 2.11's image stack names a regularizer or a constraint of every kind; each lands
// on its weight, and model.losses holds the weights' penalties (and, after a call, Dense's
// activity penalty) with Keras's formulas.
TEST(KerasFilesRegularizers, TheFilesPenaltiesAndConstraintsLandOnTheirWeights) {
  auto model = model_from_json(read_file("tf_keras_2_11_image_layers.json"));
  const Tensor conv = weight(*model, "conv2d/kernel").value();
  const Tensor gamma = weight(*model, "batch_normalization/gamma").value();
  const Tensor depthwise = weight(*model, "depthwise_conv2d/kernel").value();

  std::vector<Tensor> losses = model->losses();
  ASSERT_EQ(losses.size(), 3u);  // conv kernel, BN gamma, depthwise kernel; no call yet
  const double conv_l2 = 0.009999999776482582 * sum_of(conv, [](double v) { return v * v; });
  const double gamma_l2 = 0.0005000000237487257 * sum_of(gamma, [](double v) { return v * v; });
  const double depthwise_l1 = 0.0010000000474974513 * sum_of(depthwise, [](double v) { return std::abs(v); });
  EXPECT_NEAR(losses[0].item(), conv_l2, 1e-6 * conv_l2 + 1e-9);
  EXPECT_NEAR(losses[1].item(), gamma_l2, 1e-6 * gamma_l2 + 1e-9);
  EXPECT_NEAR(losses[2].item(), depthwise_l1, 1e-6 * depthwise_l1 + 1e-9);

  const Tensor x = Tensor::full({3, 8, 8, 1}, 1.0f);
  const Tensor y = (*model)(x);
  losses = model->losses();
  ASSERT_EQ(losses.size(), 4u);
  // tf.keras divides an activity penalty by the batch's rows.
  const double activity = 0.009999999776482582 * sum_of(y, [](double v) { return std::abs(v); }) / 3.0;
  EXPECT_NEAR(losses[3].item(), activity, 1e-6);

  EXPECT_EQ(weight(*model, "conv2d/kernel").constraint(), Constraint::max_norm(2.0f, {0, 1, 2}));
  EXPECT_EQ(weight(*model, "batch_normalization/gamma").constraint(), Constraint::non_neg());
  EXPECT_EQ(weight(*model, "layer_normalization/gamma").constraint(), Constraint::unit_norm({0}));
  EXPECT_EQ(weight(*model, "dense/bias").constraint(), Constraint::min_max_norm(0.0f, 1.0f, 1.0f, {0}));
  EXPECT_FALSE(weight(*model, "dense/kernel").constraint().has_value());
}

// Keras 3 writes string regularizers and constraints ("l2", "non_neg") and objects with
// module and registered_name; the strings take Keras's defaults.
TEST(KerasFilesRegularizers, StringsTakeKerasDefaults) {
  auto model = model_from_json(read_file("keras_3_3_functional.json"));
  const Tensor kernel = weight(*model, "dense/kernel").value();
  const std::vector<Tensor> losses = model->losses();
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_NEAR(losses[0].item(), 0.01 * sum_of(kernel, [](double v) { return v * v; }), 1e-6);
  EXPECT_EQ(weight(*model, "dense/kernel").constraint(), Constraint::non_neg());

  auto k35 = model_from_json(read_file("keras_3_5_sequential.json"));
  const Tensor conv = weight(*k35, "conv2d/kernel").value();
  const double l1l2 = 0.001 * sum_of(conv, [](double v) { return std::abs(v); }) +
                      0.01 * sum_of(conv, [](double v) { return v * v; });
  ASSERT_EQ(k35->losses().size(), 1u);
  EXPECT_NEAR(k35->losses()[0].item(), l1l2, 1e-5 * l1l2);
  EXPECT_EQ(weight(*k35, "dense/kernel").constraint(), Constraint::unit_norm({0}));
}

// Each file's JSON with one value changed to something dtrain cannot honour.
std::string changed(const std::string& file, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = nlohmann::json::parse(read_file(file));
  change(j);
  return j.dump();
}

void expect_named(const std::string& text, const std::vector<std::string>& parts) {
  const std::string message = message_of([&] { model_from_json(text); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

TEST(KerasFilesErrors, AValueDtrainCannotHonourIsOneLineNamingKeyAndValue) {
  const char* image = "tf_keras_2_11_image_layers.json";
  // layers: [input, rescaling, conv2d, batch_normalization, activation, depthwise, max_pool,
  //          zero_padding, average_pool, layer_normalization, dropout, gap, reshape, flatten, dense]
  expect_named(changed(image, [](auto& j) { j["config"]["layers"][10]["config"]["noise_shape"] = {1, nullptr}; }),
               {"layers[10].config.noise_shape", "[1,null]"});
  expect_named(changed(image, [](auto& j) { j["config"]["layers"][3]["config"]["renorm"] = true; }),
               {"layers[3].config.renorm", "true"});
  expect_named(changed(image,
                       [](auto& j) {
                         j["config"]["layers"][2]["config"]["kernel_regularizer"] = {
                             {"class_name", "OrthogonalRegularizer"}, {"config", {{"factor", 0.01}}}};
                       }),
               {"layers[2].config.kernel_regularizer", "OrthogonalRegularizer"});
  expect_named(changed(image,
                       [](auto& j) {
                         j["config"]["layers"][14]["config"]["kernel_constraint"] = "radial_constraint";
                       }),
               {"layers[14].config.kernel_constraint", "radial_constraint"});
  expect_named(changed(image, [](auto& j) { j["config"]["layers"][13]["config"]["data_format"] = "channels_first"; }),
               {"layers[13].config.data_format", "channels_first"});
  expect_named(changed(image, [](auto& j) { j["config"]["layers"][14]["class_name"] = "LSTM"; }), {"LSTM"});
  expect_named(changed("keras_3_15_sequential.json",
                       [](auto& j) { j["config"]["layers"][1]["config"]["quantization_config"] = {{"mode", "int8"}}; }),
               {"layers[1].config.quantization_config"});
  expect_named(changed("keras_3_3_functional.json",
                       [](auto& j) { j["config"]["layers"][3]["inbound_nodes"][0]["kwargs"]["training"] = true; }),
               {"training", "true"});
}

// The regularizers and constraints dtrain writes are Keras's objects, read back the same.
TEST(KerasFilesRegularizers, WrittenAsKerasObjects) {
  auto model = model_from_json(read_file("tf_keras_2_11_image_layers.json"));
  const nlohmann::json j = nlohmann::json::parse(model->to_json());
  const nlohmann::json& conv = j["config"]["layers"][1]["config"];  // dtrain writes no InputLayer entry
  ASSERT_EQ(conv["name"], "conv2d") << conv.dump();
  EXPECT_EQ(conv["kernel_regularizer"]["class_name"], "L2");
  EXPECT_NEAR(conv["kernel_regularizer"]["config"]["l2"].get<double>(), 0.01, 1e-8);
  EXPECT_EQ(conv["kernel_constraint"]["class_name"], "MaxNorm");
  EXPECT_EQ(conv["kernel_constraint"]["config"]["axis"], nlohmann::json({0, 1, 2}));
  EXPECT_TRUE(conv["bias_regularizer"].is_null());
}

}  // namespace
}  // namespace dtrain
