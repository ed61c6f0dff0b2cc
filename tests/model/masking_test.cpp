// Keras's implicit masks: Embedding(mask_zero) marks padding, MultiHeadAttention,
// GlobalAveragePooling1D, the loss and accuracy leave it out. A padded batch must give what
// the same weights give on the unpadded one (outputs, loss, metrics and a training step);
// an attention mask can be a tensor of the graph
// (from C++, from Keras's JSON); a mask of the keys alone is read for every query.
// (MirroredStrategy on a masked encoder: distribute/strategy_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>

#include "common/gradcheck.h"
#include "common/masked_encoder.h"
#include "common/quiet_fit.h"
#include "dtrain/model/sequential.h"
#include "dtrain/model/serialization.h"

namespace dtrain {
namespace {

using testing::encoder;
using testing::kPadded;
using testing::kReal;
using testing::kVocabulary;
using testing::Padded;
using testing::quiet;
using testing::random_tensor;
using testing::token_rows;

// Each row's first kReal steps of a [rows, kPadded, ...] tensor.
std::vector<float> real_steps(const Tensor& x) {
  const std::int64_t rows = x.dim(0), per_step = x.numel() / (rows * x.dim(1));
  const std::vector<float> v = x.to_vector();
  std::vector<float> out;
  for (std::int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), v.begin() + r * x.dim(1) * per_step, v.begin() + (r * x.dim(1) + kReal) * per_step);
  return out;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b, float tolerance, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tolerance) << what << " [" << i << "]";
}

TEST(Masking, PaddingStepsChangeNoOutput) {
  const Padded d = token_rows(5, 3);
  for (const bool causal : {false, true}) {
    const std::string what = causal ? "causal" : "bidirectional";
    auto masked = encoder(kPadded, true, false, causal), plain = encoder(kReal, false, false, causal);
    expect_near((*masked)(d.padded).to_vector(), (*plain)(d.ids).to_vector(), 1e-5f, what + " classes");
    // Without the mask, the padding is attended to and averaged: the test can tell.
    auto unmasked = encoder(kPadded, false, false, causal);
    const std::vector<float> a = (*unmasked)(d.padded).to_vector(), b = (*plain)(d.ids).to_vector();
    double differs = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differs = std::max(differs, double(std::abs(a[i] - b[i])));
    EXPECT_GT(differs, 1e-3) << what;
    // A sequence's outputs at its real steps, and the mask the model's output carries.
    auto steps = encoder(kPadded, true, true, causal), plain_steps = encoder(kReal, false, true, causal);
    std::vector<Tensor> masks;
    const Tensor in[] = {d.padded};
    const Tensor out = (*steps)(in, false, &masks).front();
    expect_near(real_steps(out), (*plain_steps)(d.ids).to_vector(), 1e-5f, what + " steps");
    ASSERT_EQ(masks.size(), 1u);
    ASSERT_TRUE(masks[0].defined());
    EXPECT_EQ(masks[0].shape(), (Shape{5, kPadded}));
    const std::vector<float> m = masks[0].to_vector();
    for (std::int64_t i = 0; i < 5 * kPadded; ++i) EXPECT_EQ(m[i], i % kPadded < kReal ? 1.0f : 0.0f) << i;
  }
}

TEST(Masking, LossMetricsAndTrainingCountOnlyRealSteps) {
  const Padded d = token_rows(6, 5);
  // Next-token labels; at the padding steps labels no step could predict, which must not count.
  Tensor labels = Tensor::empty(Shape{6, kReal}), padded_labels = Tensor::full(Shape{6, kPadded}, 7.0f);
  Generator g(11);
  for (std::int64_t r = 0; r < 6; ++r)
    for (std::int64_t t = 0; t < kReal; ++t) {
      const auto y = static_cast<float>(g.below(kVocabulary));
      labels.data<float>()[r * kReal + t] = y;
      padded_labels.data<float>()[r * kPadded + t] = y;
    }
  auto compiled = [](std::unique_ptr<Model> m) {
    m->compile(std::make_shared<optim::SGD>(0.5f), std::make_shared<losses::SparseCategoricalCrossentropy>(true),
               {"accuracy"});
    return m;
  };
  auto masked = compiled(encoder(kPadded, true, true)), plain = compiled(encoder(kReal, false, true));
  const Logs a = masked->evaluate(d.padded, padded_labels, {.batch_size = 4, .verbose = 0});
  const Logs b = plain->evaluate(d.ids, labels, {.batch_size = 4, .verbose = 0});
  EXPECT_NEAR(a.at("loss"), b.at("loss"), 1e-5);
  EXPECT_NEAR(a.at("accuracy"), b.at("accuracy"), 1e-9);
  // Steps of the same gradients: the same weights after them.
  masked->fit(d.padded, padded_labels, quiet(3, 2));
  plain->fit(d.ids, labels, quiet(3, 2));
  for (std::size_t i = 0; i < plain->variables().size(); ++i)
    expect_near(masked->variables()[i]->value().to_vector(), plain->variables()[i]->value().to_vector(), 2e-5f,
                plain->variables()[i]->name());
}

TEST(Masking, ASequentialCarriesTheMaskToItsPooling) {
  const Padded d = token_rows(4, 13);
  auto stack = [](bool mask_zero) {
    auto m = std::make_unique<Sequential>();
    m->add<nn::Embedding>(kVocabulary, 6, nn::EmbeddingOptions{.seed = 1, .mask_zero = mask_zero});
    m->add<nn::Dense>(6, "relu", nn::DenseOptions{.seed = 2});
    m->add<nn::GlobalAveragePooling1D>();
    m->add<nn::Dense>(2, "", nn::DenseOptions{.seed = 3});
    return m;
  };
  auto masked = stack(true), plain = stack(false);
  expect_near((*masked)(d.padded).to_vector(), (*plain)(d.ids).to_vector(), 1e-6f, "sequential");
  // A row of padding alone pools to zeros (Keras divides by zero there): the bias comes out.
  const Tensor all_padding = Tensor::zeros(Shape{1, kPadded});
  const std::vector<float> y = (*masked)(all_padding).to_vector();
  expect_near(y, masked->layers()[3]->variables()[1]->value().to_vector(), 0.0f, "padding only");
}

TEST(Masking, ASequentialSelfAttentionTakesTheMaskOrNone) {
  // MultiHeadAttention in a Sequential attends over its one input, masked or not, as the
  // same layers called in a graph on [x, x].
  const Padded d = token_rows(3, 19);
  for (const bool mask_zero : {false, true}) {
    auto stack = std::make_unique<Sequential>();
    stack->add<nn::Embedding>(kVocabulary, 8, nn::EmbeddingOptions{.seed = 1, .mask_zero = mask_zero});
    stack->add<nn::MultiHeadAttention>(2, 4, nn::MultiHeadAttentionOptions{.seed = 2});
    stack->add<nn::GlobalAveragePooling1D>();
    KerasTensor ids = Input({kPadded}, "ids");
    KerasTensor x = layer<nn::Embedding>(kVocabulary, 8, nn::EmbeddingOptions{.seed = 1, .mask_zero = mask_zero})(ids);
    x = layer<nn::MultiHeadAttention>(2, 4, nn::MultiHeadAttentionOptions{.seed = 2})({x, x});
    Model graph(ids, layer<nn::GlobalAveragePooling1D>()(x));
    expect_near((*stack)(d.padded).to_vector(), graph(d.padded).to_vector(), 1e-6f,
                mask_zero ? "masked" : "unmasked");
  }
}

TEST(Masking, KerasThreeNodesThatRecordTheImplicitMasksLoad) {
  // Keras 3 writes the masks it passed a layer into the node's kwargs; dtrain makes them
  // again from the Embedding, so a padded row pools its real steps only.
  const std::string keras3 = R"({"class_name": "Functional", "config": {"name": "m", "trainable": true, "layers": [
    {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [null, 5], "dtype": "int32",
     "sparse": false, "name": "ids"}, "registered_name": null, "name": "ids", "inbound_nodes": []},
    {"module": "keras.layers", "class_name": "Embedding", "config": {"name": "embedding", "trainable": true,
     "dtype": "float32", "input_dim": 10, "output_dim": 4, "embeddings_initializer": {"module": "keras.initializers",
     "class_name": "RandomUniform", "config": {"minval": -0.05, "maxval": 0.05, "seed": 7}, "registered_name": null},
     "embeddings_regularizer": null, "activity_regularizer": null, "embeddings_constraint": null, "mask_zero": true},
     "registered_name": null, "name": "embedding", "inbound_nodes": [{"args": [{"class_name": "__keras_tensor__",
     "config": {"shape": [null, 5], "dtype": "int32", "keras_history": ["ids", 0, 0]}}], "kwargs": {}}]},
    {"module": "keras.layers", "class_name": "GlobalAveragePooling1D", "config": {"name": "pool", "trainable": true,
     "dtype": "float32", "data_format": "channels_last", "keepdims": false}, "registered_name": null, "name": "pool",
     "inbound_nodes": [{"args": [{"class_name": "__keras_tensor__", "config": {"shape": [null, 5, 4],
     "dtype": "float32", "keras_history": ["embedding", 0, 0]}}], "kwargs": {"mask": {"class_name":
     "__keras_tensor__", "config": {"shape": [null, 5], "dtype": "bool", "keras_history": ["embedding", 0, 1]}}}}]}],
    "input_layers": [["ids", 0, 0]], "output_layers": [["pool", 0, 0]]}})";
  auto model = model_from_json(keras3);
  const Tensor ids = Tensor::from_vector(Shape{1, 5}, std::vector<float>{3, 4, 0, 0, 0});
  const Tensor table = model->layers()[0]->variables()[0]->value();
  const std::vector<float> t = table.to_vector(), y = (*model)(ids).to_vector();
  for (std::int64_t f = 0; f < 4; ++f) EXPECT_NEAR(y[f], (t[3 * 4 + f] + t[4 * 4 + f]) / 2, 1e-7f) << f;
}

TEST(Masking, AnAttentionMaskIsATensorOfTheGraph) {
  const std::int64_t T = 5;
  KerasTensor ids = Input({T}, "ids"), allowed = Input({T, T}, "allowed");
  auto embedding = layer<nn::Embedding>(kVocabulary, 8, nn::EmbeddingOptions{.seed = 1});
  KerasTensor x = embedding(ids);
  auto mha = std::make_shared<nn::MultiHeadAttention>(2, 4, nn::MultiHeadAttentionOptions{.seed = 2});
  KerasTensor y = call_attention(mha, x, x, KerasTensor(), allowed);
  Model model({ids, allowed}, {layer<nn::GlobalAveragePooling1D>()(y)}, "masked");
  // A band mask: each query sees itself and its two neighbours.
  Tensor band = Tensor::zeros(Shape{3, T, T});
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t s = std::max<std::int64_t>(0, t - 1); s <= std::min(T - 1, t + 1); ++s)
        band.data<float>()[(b * T + t) * T + s] = 1.0f;
  Tensor five = Tensor::empty(Shape{3, T});
  for (std::int64_t i = 0; i < 3 * T; ++i) five.data<float>()[i] = 1.0f + static_cast<float>(i % (kVocabulary - 1));
  const Tensor in[] = {five, band};
  const std::vector<float> got = model(in).front().to_vector();
  const Tensor eager = reduce_mean(mha->attend((*embedding)(five), (*embedding)(five), Tensor(), band), {1});
  expect_near(got, eager.to_vector(), 1e-6f, "graph against eager");
  // The mask matters here, and travels through the model's JSON.
  const Tensor open[] = {five, Tensor::full(Shape{3, T, T}, 1.0f)};
  EXPECT_NE(model(open).front().to_vector(), got);
  const std::string text = model.to_json();
  EXPECT_NE(text.find("\"attention_mask\""), std::string::npos);
  auto again = model_from_json(text);
  expect_near((*again)(in).front().to_vector(), got, 0.0f, "reloaded");
}

TEST(Masking, KerasJsonWithMaskZeroAndAnAttentionMaskLoads) {
  // tf.keras 2's nodes: mha(x, x, attention_mask=allowed) after Embedding(mask_zero=True).
  const std::string keras2 = R"({"class_name": "Functional", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 6], "dtype": "int32", "name": "ids"},
     "name": "ids", "inbound_nodes": []},
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 6, 6], "dtype": "float32", "name": "allowed"},
     "name": "allowed", "inbound_nodes": []},
    {"class_name": "Embedding", "config": {"name": "embedding", "trainable": true, "dtype": "float32",
     "input_dim": 20, "output_dim": 8, "embeddings_initializer": {"class_name": "RandomUniform",
     "config": {"minval": -0.05, "maxval": 0.05, "seed": 3}}, "embeddings_regularizer": null,
     "activity_regularizer": null, "embeddings_constraint": null, "mask_zero": true, "input_length": 6},
     "name": "embedding", "inbound_nodes": [[["ids", 0, 0, {}]]]},
    {"class_name": "MultiHeadAttention", "config": {"name": "mha", "trainable": true, "dtype": "float32",
     "num_heads": 2, "key_dim": 4, "value_dim": 4, "dropout": 0.0, "use_bias": true, "output_shape": null,
     "attention_axes": [1], "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": 4}},
     "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null,
     "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null},
     "name": "mha", "inbound_nodes": [[["embedding", 0, 0, {"value": ["embedding", 0, 0],
                                                             "attention_mask": ["allowed", 0, 0]}]]]},
    {"class_name": "GlobalAveragePooling1D", "config": {"name": "pool", "trainable": true, "dtype": "float32",
     "data_format": "channels_last", "keepdims": false}, "name": "pool", "inbound_nodes": [[["mha", 0, 0, {}]]]}],
    "input_layers": [["ids", 0, 0], ["allowed", 0, 0]], "output_layers": [["pool", 0, 0]]},
    "keras_version": "2.15.0", "backend": "tensorflow"})";
  auto model = model_from_json(keras2);
  auto* embedding = dynamic_cast<nn::Embedding*>(model->layers()[0].get());
  ASSERT_NE(embedding, nullptr);
  EXPECT_TRUE(embedding->options().mask_zero);
  // Rows [a b c 0 0 0]: the padding is masked on top of the given mask, so its ids change nothing.
  Tensor ids = Tensor::zeros(Shape{2, 6}), other = Tensor::zeros(Shape{2, 6});
  for (std::int64_t r = 0; r < 2; ++r)
    for (std::int64_t t = 0; t < 3; ++t) ids.data<float>()[r * 6 + t] = other.data<float>()[r * 6 + t] = 1.0f + float(r + t);
  const Tensor allowed = Tensor::full(Shape{2, 6, 6}, 1.0f);
  const Tensor in[] = {ids, allowed};
  const std::vector<float> y = (*model)(in).front().to_vector();
  EXPECT_EQ(y.size(), 16u);
  const std::string text = model->to_json();
  EXPECT_NE(text.find("\"mask_zero\": true"), std::string::npos);
  auto again = model_from_json(text);
  expect_near((*again)(in).front().to_vector(), y, 0.0f, "reloaded");
  // What dtrain cannot honour is named.
  std::string bad = keras2;
  bad.replace(bad.find("\"attention_mask\": [\"allowed\", 0, 0]"), 35, "\"return_attention_scores\": true     ");
  try {
    model_from_json(bad);
    FAIL() << "return_attention_scores true was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("return_attention_scores"), std::string::npos) << e.what();
  }
}

TEST(Masking, AMaskOfTheKeysIsReadForEveryQuery) {
  // [B, 1, S] against the same mask written out for every query: equal outputs and gradients.
  const std::int64_t B = 2, T = 5, S = 6, H = 2, D = 3;
  Tensor keys = Tensor::full(Shape{B, 1, S}, 1.0f), whole = Tensor::full(Shape{B, T, S}, 1.0f);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = S - 1 - b; s < S; ++s) {
      keys.data<float>()[b * S + s] = 0.0f;
      for (std::int64_t t = 0; t < T; ++t) whole.data<float>()[(b * T + t) * S + s] = 0.0f;
    }
  const std::vector<Tensor> qkv{random_tensor({B, T, H, D}, 1), random_tensor({B, S, H, D}, 2),
                                random_tensor({B, S, H, D}, 3)};
  for (const bool causal : {false, true}) {
    auto run = [&](const Tensor& mask, const std::vector<Tensor>& in) {
      return scaled_dot_product_attention(in[0], in[1], in[2], AttentionCall{.scale = 0.5f, .causal = causal, .mask = mask});
    };
    expect_near(run(keys, qkv).to_vector(), run(whole, qkv).to_vector(), 0.0f, "forward");
    testing::expect_gradients_match([&](const std::vector<Tensor>& in) { return run(keys, in); }, qkv, {0, 1, 2});
  }
}

TEST(Masking, AttentionScoresAreTheWeightsEachQueryGives) {
  nn::MultiHeadAttention mha(2, 3, {.seed = 5});
  const Tensor x = random_tensor({2, 4, 6}, 3);
  Tensor padding = Tensor::full(Shape{2, 4}, 1.0f);
  padding.data<float>()[3] = 0.0f;  // row 0's last step
  const Tensor masks[] = {padding, padding, Tensor()};
  const Tensor scores = mha.attention_scores(x, x, Tensor(), Tensor(), /*use_causal_mask=*/true, masks);
  ASSERT_EQ(scores.shape(), (Shape{2, 2, 4, 4}));
  const std::vector<float> p = scores.to_vector();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t t = 0; t < 4; ++t) {
        const float* row = p.data() + ((b * 2 + h) * 4 + t) * 4;
        double sum = 0;
        for (std::int64_t s = 0; s < 4; ++s) {
          sum += row[s];
          if (s > t || (b == 0 && s == 3)) {
            EXPECT_EQ(row[s], 0.0f) << b << h << t << s << ": a hidden key";
          }
        }
        EXPECT_NEAR(sum, b == 0 && t == 3 ? 0.0 : 1.0, 1e-6) << b << h << t << ": a padding query gives nothing";
      }
  EXPECT_NEAR(p[0], 1.0f, 1e-6f) << "causal: the first query sees only itself";
}

TEST(Masking, BatchStatisticsOfAMaskedSequenceAreRefusedByName) {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Embedding>(kVocabulary, 4, nn::EmbeddingOptions{.seed = 1, .mask_zero = true});
  m->add<nn::BatchNormalization>(nn::BatchNormalizationOptions{.name = "bn"});
  const Tensor ids = token_rows(2, 1).padded;
  EXPECT_EQ((*m)(ids, /*training=*/false).shape(), (Shape{2, kPadded, 4}));
  try {
    (*m)(ids, /*training=*/true);
    FAIL() << "batch statistics over padding were taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'bn'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain
