// Convolutional layers and the functional API: shapes as Keras gives them, batch
// normalization's moving statistics by hand, graphs that run, train, save and load.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/small_cnn.h"
#include "common/temp_dir.h"
#include "dtrain/model/saving.h"
#include "dtrain/model/sequential.h"

namespace dtrain {
namespace {

using testing::random_images;
using testing::small_cnn;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ConvLayers, OutputShapesFollowKeras) {
  // "same" keeps ceil(size / stride); "valid" drops the border.
  nn::Conv2D same(8, 3, nn::Conv2DOptions{.strides = {2, 2}, .padding = "same"});
  EXPECT_EQ(same.compute_output_shape({4, 28, 27, 3}), (Shape{4, 14, 14, 8}));
  nn::Conv2D valid(8, nn::Pair{3, 5});
  EXPECT_EQ(valid.compute_output_shape({4, 28, 27, 3}), (Shape{4, 26, 23, 8}));
  nn::Conv2D dilated(2, 3, nn::Conv2DOptions{.dilation_rate = {2, 2}});
  EXPECT_EQ(dilated.compute_output_shape({1, 9, 9, 1}), (Shape{1, 5, 5, 2}));
  nn::DepthwiseConv2D depthwise(3, 2, nn::Conv2DOptions{.padding = "same"});
  EXPECT_EQ(depthwise.compute_output_shape({2, 7, 7, 5}), (Shape{2, 7, 7, 10}));
  EXPECT_EQ(nn::MaxPooling2D().compute_output_shape({2, 7, 7, 5}), (Shape{2, 3, 3, 5}));
  EXPECT_EQ(nn::AveragePooling2D({3, 3}, nn::Pair{2, 2}, "same").compute_output_shape({2, 7, 7, 5}),
            (Shape{2, 4, 4, 5}));
  EXPECT_EQ(nn::GlobalAveragePooling2D().compute_output_shape({2, 7, 7, 5}), (Shape{2, 5}));
  EXPECT_EQ(nn::ZeroPadding2D(nn::ZeroPadding2D::Padding2{{{1, 2}, {0, 3}}}).compute_output_shape({2, 7, 7, 5}),
            (Shape{2, 10, 10, 5}));
  EXPECT_EQ(nn::Reshape({-1, 7}).compute_output_shape({2, 7, 7, 5}), (Shape{2, 35, 7}));
  // Mistakes name the layer and the shapes.
  EXPECT_NE(error_of([] { nn::Conv2D(8, 3).compute_output_shape({4, 28, 3}); }).find("'conv2d' (Conv2D)"),
            std::string::npos);
  EXPECT_NE(error_of([] { nn::Conv2D(8, 5).compute_output_shape({1, 3, 3, 1}); }).find("larger than the input"),
            std::string::npos);
  EXPECT_NE(error_of([] { nn::Conv2D(8, 3, nn::Conv2DOptions{.padding = "full"}); }).find("unknown padding 'full'"),
            std::string::npos);
  EXPECT_NE(error_of([] { nn::Reshape({4, 4}).compute_output_shape({2, 7, 5}); }).find("cannot reshape"),
            std::string::npos);
}

TEST(ConvLayers, DepthwiseKernelIsKerasLayout) {
  // Keras's depthwise kernel [KH, KW, C, M]: output channel c * M + m convolves input
  // channel c with kernel[:, :, c, m]. A 1x1 kernel makes that a per-channel scale.
  nn::DepthwiseConv2D layer(1, 2);
  const Tensor x = Tensor::from_vector({1, 1, 1, 2}, {3.0f, 5.0f});
  layer.build(x.shape());
  layer.kernel().assign(Tensor::from_vector({1, 1, 2, 2}, {1.0f, 10.0f, 100.0f, 1000.0f}));
  const Tensor y = layer(x);
  EXPECT_EQ(y.to_vector(), (std::vector<float>{3.0f, 30.0f, 500.0f, 5000.0f}));
}

TEST(ConvLayers, BatchNormMovingStatisticsAfterStepsByHand) {
  nn::BatchNormalization bn(nn::BatchNormalizationOptions{.momentum = 0.8f, .epsilon = 1e-3f});
  double mean = 0.0, var = 1.0;  // the initial moving statistics
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::from_vector({4, 1}, {1.0f * step, 2.0f, 4.0f + step, 9.0f});
    bn(x, /*training=*/true);
    const std::vector<float> v = x.to_vector();
    double m = 0, s = 0;
    for (float e : v) m += e / 4.0;
    for (float e : v) s += (e - m) * (e - m) / 4.0;
    mean = mean * 0.8 + m * 0.2;
    var = var * 0.8 + s * 0.2;
  }
  EXPECT_NEAR(bn.moving_mean().value().item(), mean, 1e-5);
  EXPECT_NEAR(bn.moving_variance().value().item(), var, 1e-5);
  // Inference normalizes by them.
  const Tensor y = bn(Tensor::from_vector({1, 1}, {2.0f}), /*training=*/false);
  EXPECT_NEAR(y.item(), (2.0 - mean) / std::sqrt(var + 1e-3), 1e-5);
}

TEST(ConvLayers, AFrozenBatchNormRunsInInferenceMode) {
  nn::BatchNormalization bn;
  const Tensor x = Tensor::from_vector({2, 1}, {1.0f, 3.0f});
  bn.build(x.shape());
  bn.set_trainable(false);
  // As Keras: normalized by the moving statistics (0 and 1), which do not move.
  const Tensor y = bn(x, /*training=*/true);
  EXPECT_NEAR(y.data<float>()[1], 3.0 / std::sqrt(1.0 + 1e-3), 1e-5);
  EXPECT_EQ(bn.moving_mean().value().item(), 0.0f);
}

TEST(Functional, ResidualGraphRunsAsItsLayersComposed) {
  auto model = small_cnn(false);
  ASSERT_TRUE(model->functional());
  const auto [x, y] = random_images(5, 1);
  const Tensor out = (*model)(x);
  // The same layers called by hand, in the graph's order.
  const auto& l = model->layers();
  ASSERT_EQ(l.size(), 10u);
  Tensor h = (*l[2])((*l[1])((*l[0])(x)));
  Tensor r = (*l[4])((*l[3])(h));
  const Tensor sum = (*l[5])(std::vector<Tensor>{h, r});
  const Tensor expected = (*l[9])((*l[8])((*l[7])((*l[6])(sum))));
  EXPECT_EQ(out.to_vector(), expected.to_vector());
  const std::string summary = model->summary();
  EXPECT_NE(summary.find("Connected to"), std::string::npos) << summary;
  EXPECT_NE(summary.find("add (Add)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("activation, batch_normalization_1"), std::string::npos) << summary;
  EXPECT_NE(summary.find("(None, 8, 8, 4)"), std::string::npos) << summary;
}

TEST(Functional, SharedLayerHasOneSetOfWeightsAndSumsBothUses) {
  const KerasTensor a = Input({3}, "a"), b = Input({3}, "b");
  auto shared = layer<nn::Dense>(2, "", nn::DenseOptions{.use_bias = false, .seed = 5});
  const KerasTensor sum = layer<nn::Add>()({shared(a), shared(b)});
  Model model({a, b}, {sum});
  EXPECT_EQ(model.trainable_variables().size(), 1u);
  EXPECT_EQ(model.calls_of(shared.get().get()), 2);
  const Tensor xa = Tensor::from_vector({1, 3}, {1, 2, 3}), xb = Tensor::from_vector({1, 3}, {-1, 0, 4});
  GradientTape tape;
  const std::vector<Tensor> inputs{xa, xb};
  const Tensor out = model(std::span<const Tensor>(inputs)).front();
  const auto grads = tape.gradient(reduce_sum(out), model.trainable_variables());
  // d sum / d W[i][j] = xa[i] + xb[i].
  const std::vector<float> g = grads[0].to_vector();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_FLOAT_EQ(g[i * 2 + j], xa.data<float>()[i] + xb.data<float>()[i]);
}

TEST(Functional, GraphMistakesAreNamed) {
  const KerasTensor a = Input({4}, "a"), b = Input({4}, "b");
  const KerasTensor out = layer<nn::Dense>(2)(b);
  EXPECT_NE(error_of([&] { Model({a}, {out}); }).find("depend on Input 'b'"), std::string::npos);
  const KerasTensor c = Input({5}, "c");
  EXPECT_NE(error_of([&] { layer<nn::Add>()({a, c}); }).find("'add' (Add): takes inputs of one shape"),
            std::string::npos);
  // Two layers named alike: the later one takes the next free name, its weights too.
  const KerasTensor x = layer<nn::Dense>(2)(a), z = layer<nn::Dense>(2)(x);
  Model m(a, z);
  EXPECT_EQ(m.layers()[1]->name(), "dense_1");
  EXPECT_EQ(m.variables()[2]->name(), "dense_1/kernel");
  const KerasTensor a2 = Input({4}, "a");
  EXPECT_NE(error_of([&] { Model({a, a2}, {layer<nn::Add>()({z, layer<nn::Dense>(2)(a2)})}); })
                .find("two Inputs are named 'a'"),
            std::string::npos);
}

TEST(Functional, JsonRoundTripGivesTheSameModel) {
  auto model = small_cnn(true);
  const std::string json = model->to_json();
  EXPECT_NE(json.find("\"class_name\": \"Functional\""), std::string::npos);
  EXPECT_NE(json.find("\"inbound_nodes\""), std::string::npos);
  auto again = model_from_json(json);
  ASSERT_TRUE(again->functional());
  EXPECT_EQ(again->to_json(), json);
  const auto path = dtrain::testing::temp_path("functional_weights.safetensors").string();
  model->save_weights(path);
  again->load_weights(path);
  std::filesystem::remove(path);
  const auto [x, y] = random_images(3, 2);
  EXPECT_EQ((*again)(x).to_vector(), (*model)(x).to_vector());
  // A shared layer's second node survives the trip.
  const KerasTensor a = Input({3}, "a");
  auto shared = layer<nn::Dense>(3, "relu", nn::DenseOptions{.seed = 2});
  Model twice(a, shared(shared(a)));
  auto loaded = model_from_json(twice.to_json());
  EXPECT_EQ(loaded->calls_of(loaded->layers()[0].get()), 2);
}

TEST(Functional, ReadsKeras3NodesAndNamesAMalformedOne) {
  // Keras 3 writes each node as {"args": [keras tensors], "kwargs": {}}, and module,
  // registered_name and build_config beside each layer's config.
  const std::string keras3 = R"({"class_name": "Functional", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "dtype": "float32", "name": "x"}, "name": "x", "inbound_nodes": []},
    {"module": "keras.layers", "class_name": "Dense", "config": {"name": "d", "units": 3}, "registered_name": null,
     "build_config": {"input_shape": [null, 4]}, "name": "d",
     "inbound_nodes": [{"args": [{"class_name": "__keras_tensor__", "config": {"shape": [null, 4], "dtype": "float32", "keras_history": ["x", 0, 0]}}], "kwargs": {}}]},
    {"class_name": "Add", "config": {"name": "sum"}, "name": "sum",
     "inbound_nodes": [{"args": [[{"class_name": "__keras_tensor__", "config": {"keras_history": ["d", 0, 0]}},
                                  {"class_name": "__keras_tensor__", "config": {"keras_history": ["d", 0, 0]}}]], "kwargs": {}}]}],
    "input_layers": [["x", 0, 0]], "output_layers": [["sum", 0, 0]]}})";
  auto model = model_from_json(keras3);
  EXPECT_EQ(model->output_shape(), (Shape{1, 3}));
  std::string broken = keras3;
  broken.replace(broken.find(R"("keras_history": ["x", 0, 0])"), 28, R"("keras_history": ["x"])");
  EXPECT_NE(error_of([&] { model_from_json(broken); }).find("config.layers[1].inbound_nodes[0]"), std::string::npos)
      << error_of([&] { model_from_json(broken); });
}

TEST(Functional, SavedModelLoadsWithoutTheCode) {
  auto model = small_cnn(false);
  const auto [x, y] = random_images(16, 3);
  FitOptions o;
  o.batch_size = 8;
  o.verbose = 0;
  model->fit(x, y, o);
  const auto path = dtrain::testing::temp_path("functional_model.safetensors").string();
  model->save(path);
  auto loaded = models::load_model(path);
  std::filesystem::remove(path);
  EXPECT_EQ((*loaded)(x).to_vector(), (*model)(x).to_vector());
  EXPECT_EQ(loaded->optimizer().iterations(), model->optimizer().iterations());
}

TEST(Functional, FitLearnsAndSequentialCnnToo) {
  // Labels that a CNN can read off the images: the sign of the mean of channel 0.
  auto [x, y] = random_images(256, 4);
  for (std::int64_t i = 0; i < 256; ++i) {
    double m = 0;
    for (std::int64_t p = 0; p < 64; ++p) m += x.data<float>()[i * 128 + p * 2];
    y.data<std::int32_t>()[i] = m > 0 ? 1 : 0;
  }
  FitOptions o;
  o.batch_size = 32;
  o.epochs = 6;
  o.verbose = 0;
  auto model = small_cnn(false);
  model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  const History h = model->fit(x, y, o);
  EXPECT_LT(h.history.at("loss").back(), h.history.at("loss").front() * 0.7);
  Sequential seq;
  seq.add<nn::Conv2D>(4, 3, nn::Conv2DOptions{.padding = "same", .activation = "relu", .seed = 1});
  seq.add<nn::BatchNormalization>();
  seq.add<nn::AveragePooling2D>();
  seq.add<nn::Flatten>();
  seq.add<nn::Dense>(2, "", nn::DenseOptions{.seed = 2});
  seq.compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true));
  const History hs = seq.fit(x, y, o);
  EXPECT_LT(hs.history.at("loss").back(), hs.history.at("loss").front() * 0.7);
  EXPECT_NE(seq.to_json().find("\"class_name\": \"Sequential\""), std::string::npos);
  EXPECT_EQ(model_from_json(seq.to_json())->to_json(), seq.to_json());
}

}  // namespace
}  // namespace dtrain
