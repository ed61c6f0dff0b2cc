// The transformer's layers: MultiHeadAttention against attention written out from its
// Keras-layout weights, gradients of every layer's weights and inputs against finite
// differences, Keras-written JSON (tf.keras 2's value-as-keyword nodes, Keras 3's), a
// small transformer that learns what needs attention, and ids outside the table named.
#include <gtest/gtest.h>

#include <cmath>

#include "common/gradcheck.h"
#include "common/tiny_transformer.h"
#include "dtrain/model/sequential.h"
#include "dtrain/model/serialization.h"

namespace dtrain {
namespace {

using testing::expect_gradients_match;
using testing::random_tensor;

// Keras's MultiHeadAttention written out in double from the layer's weights.
std::vector<double> mha_reference(nn::MultiHeadAttention& layer, const Tensor& query, const Tensor& value, bool causal) {
  const std::vector<Variable*> w = layer.variables();  // q/k/v kernel and bias, then the output's
  const std::int64_t B = query.dim(0), T = query.dim(1), S = value.dim(1), F = query.dim(2), Fv = value.dim(2);
  const std::int64_t H = layer.num_heads(), D = layer.key_dim(), O = w[6]->shape()[2];
  auto project = [&](const Tensor& x, const Variable* kernel, const Variable* bias, std::int64_t len, std::int64_t in) {
    const auto xv = x.to_vector(), kv = kernel->value().to_vector(), bv = bias->value().to_vector();
    std::vector<double> out(static_cast<std::size_t>(B * len * H * D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < len; ++t)
        for (std::int64_t hd = 0; hd < H * D; ++hd) {
          double s = bv[hd];
          for (std::int64_t f = 0; f < in; ++f) s += double(xv[(b * len + t) * in + f]) * kv[f * H * D + hd];
          out[(b * len + t) * H * D + hd] = s;
        }
    return out;
  };
  const auto q = project(query, w[0], w[1], T, F), k = project(value, w[2], w[3], S, Fv), v = project(value, w[4], w[5], S, Fv);
  const auto ok = w[6]->value().to_vector(), ob = w[7]->value().to_vector();
  std::vector<double> out(static_cast<std::size_t>(B * T * O));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<double> heads(static_cast<std::size_t>(H * D), 0.0);
      for (std::int64_t h = 0; h < H; ++h) {
        std::vector<double> score(static_cast<std::size_t>(S));
        double top = -INFINITY, sum = 0;
        for (std::int64_t s = 0; s < S; ++s) {
          double x = 0;
          for (std::int64_t d = 0; d < D; ++d) x += q[((b * T + t) * H + h) * D + d] * k[((b * S + s) * H + h) * D + d];
          score[s] = (causal && s > t) ? -INFINITY : x / std::sqrt(double(D));
          top = std::max(top, score[s]);
        }
        for (double& x : score) sum += (x = std::exp(x - top));
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t d = 0; d < D; ++d) heads[h * D + d] += score[s] / sum * v[((b * S + s) * H + h) * D + d];
      }
      for (std::int64_t o = 0; o < O; ++o) {
        double s = ob[o];
        for (std::int64_t hd = 0; hd < H * D; ++hd) s += heads[hd] * ok[hd * O + o];
        out[(b * T + t) * O + o] = s;
      }
    }
  return out;
}

TEST(Transformer, MultiHeadAttentionIsKerasAttentionFromItsWeights) {
  for (const bool causal : {false, true}) {
    nn::MultiHeadAttention mha(3, 4, {.output_shape = 5, .bias_initializer = "random_normal", .seed = 9});
    const Tensor query = random_tensor({2, 7, 6}, 1), value = random_tensor({2, 9, 8}, 2);
    const Tensor got = mha.attend(query, value, Tensor(), Tensor(), causal);
    EXPECT_EQ(got.shape(), (Shape{2, 7, 5}));
    // Keras's layout and names.
    const std::vector<Variable*> w = mha.variables();
    ASSERT_EQ(w.size(), 8u);
    EXPECT_EQ(w[0]->name(), "multi_head_attention/query/kernel");
    EXPECT_EQ(w[0]->shape(), (Shape{6, 3, 4}));
    EXPECT_EQ(w[2]->shape(), (Shape{8, 3, 4}));
    EXPECT_EQ(w[6]->shape(), (Shape{3, 4, 5}));
    const std::vector<float> g = got.to_vector();
    const std::vector<double> want = mha_reference(mha, query, value, causal);
    for (std::size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], 2e-5) << i << (causal ? " causal" : "");
  }
}

TEST(Transformer, GradientsOfTheLayersMatchFiniteDifferences) {
  // Attention, through its projections, for its query and value inputs.
  auto mha = std::make_shared<nn::MultiHeadAttention>(2, 3, nn::MultiHeadAttentionOptions{.seed = 4});
  expect_gradients_match([&](const std::vector<Tensor>& in) { return mha->attend(in[0], in[1], Tensor(), Tensor(), true); },
                         {random_tensor({2, 5, 4}, 3), random_tensor({2, 6, 4}, 4)}, {0, 1});
  // ... and for its weights, against a difference in each of their values.
  const Tensor query = random_tensor({2, 5, 4}, 5), value = random_tensor({2, 6, 4}, 6);
  const Tensor r = random_tensor({2, 5, 4}, 7, 0.5f, 1.5f);
  auto loss = [&] { return reduce_sum(mul(mha->attend(query, value, Tensor(), Tensor(), true), r)); };
  const std::vector<Variable*> weights = mha->variables();
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    analytic = tape.gradient(loss(), weights);
  }
  for (std::size_t i = 0; i < weights.size(); ++i) {
    ASSERT_TRUE(analytic[i].defined()) << weights[i]->name();
    const std::vector<float> a = analytic[i].to_vector();
    Tensor values = weights[i]->value().clone();
    for (std::int64_t j = 0; j < values.numel(); ++j) {
      const float saved = values.data<float>()[j];
      values.data<float>()[j] = saved + 1e-2f;
      weights[i]->assign(values);
      const double up = loss().item();
      values.data<float>()[j] = saved - 1e-2f;
      weights[i]->assign(values);
      const double down = loss().item();
      values.data<float>()[j] = saved;
      weights[i]->assign(values);
      const double numeric = (up - down) / 2e-2;
      EXPECT_NEAR(a[static_cast<std::size_t>(j)], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << weights[i]->name() << " [" << j << "]";
    }
  }
  // Embedding: the table's gradient adds up repeated ids.
  nn::Embedding embedding(5, 3, {.seed = 2});
  const Tensor ids = Tensor::from_vector(Shape{2, 3}, std::vector<float>{0, 4, 4, 2, 0, 4});
  embedding(ids);
  Variable& table = embedding.embeddings();
  {
    GradientTape tape;
    const Tensor y = embedding(ids);
    const Tensor g = tape.gradient(reduce_sum(y), std::vector<Variable*>{&table})[0];
    // Each row's gradient counts its id's uses: 0 twice, 4 three times, 2 once, 1 and 3 never.
    const std::vector<float> want{2, 2, 2, 0, 0, 0, 1, 1, 1, 0, 0, 0, 3, 3, 3};
    EXPECT_EQ(g.to_vector(), want);
  }
  nn::PositionEmbedding positions(3, "glorot_uniform", 1);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return add(in[0], positions(in[0])); },
                         {random_tensor({2, 3, 4}, 8)}, {0});
}

TEST(Transformer, ASmallTransformerLearnsWhichTokenComesFirst) {
  const testing::TokenData train = testing::ordered_pairs(512), test = testing::ordered_pairs(256, 12, 16, 8);
  auto model = testing::tiny_transformer();
  model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(true),
                 {"accuracy"});
  model->fit(train.ids, train.labels, {.epochs = 12, .batch_size = 32, .seed = 1, .verbose = 0});
  const double accuracy = model->evaluate(test.ids, test.labels).at("accuracy");
  EXPECT_GT(accuracy, 0.9) << "order of two tokens, which attention over positions can read (chance: 0.5)";
}

TEST(Transformer, JsonRoundTripAndKerasNodesWithValueAsAKeyword) {
  auto model = testing::tiny_transformer(12, 16, /*causal=*/true);
  const std::string text = model->to_json();
  EXPECT_NE(text.find("\"use_causal_mask\": true"), std::string::npos);
  auto again = model_from_json(text);
  const Tensor ids = testing::ordered_pairs(4).ids;
  // The same weights (seeded), the same causal attention.
  EXPECT_EQ((*again)(ids).to_vector(), (*model)(ids).to_vector());

  // tf.keras 2 writes a MultiHeadAttention call mha(x, x) with the value as a keyword.
  const std::string keras2 = R"({"class_name": "Functional", "config": {"name": "m", "layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 6], "dtype": "float32", "name": "ids"},
     "name": "ids", "inbound_nodes": []},
    {"class_name": "Embedding", "config": {"name": "embedding", "trainable": true, "batch_input_shape": [null, 6],
     "dtype": "float32", "input_dim": 20, "output_dim": 8, "embeddings_initializer": {"class_name": "RandomUniform",
     "config": {"minval": -0.05, "maxval": 0.05, "seed": null}}, "embeddings_regularizer": null,
     "activity_regularizer": null, "embeddings_constraint": null, "mask_zero": false, "input_length": 6},
     "name": "embedding", "inbound_nodes": [[["ids", 0, 0, {}]]]},
    {"class_name": "MultiHeadAttention", "config": {"name": "mha", "trainable": true, "dtype": "float32",
     "num_heads": 2, "key_dim": 4, "value_dim": 4, "dropout": 0.1, "use_bias": true, "output_shape": null,
     "attention_axes": [1], "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
     "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null,
     "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null,
     "query_shape": [null, 6, 8], "key_shape": [null, 6, 8], "value_shape": [null, 6, 8]},
     "name": "mha", "inbound_nodes": [[["embedding", 0, 0, {"value": ["embedding", 0, 0], "use_causal_mask": true}]]]},
    {"class_name": "GlobalAveragePooling1D", "config": {"name": "pool", "trainable": true, "dtype": "float32",
     "data_format": "channels_last", "keepdims": false}, "name": "pool", "inbound_nodes": [[["mha", 0, 0, {}]]]}],
    "input_layers": [["ids", 0, 0]], "output_layers": [["pool", 0, 0]]}, "keras_version": "2.15.0",
    "backend": "tensorflow"})";
  auto loaded = model_from_json(keras2);
  auto* mha = dynamic_cast<nn::MultiHeadAttention*>(loaded->layers()[1].get());
  ASSERT_NE(mha, nullptr);
  EXPECT_TRUE(mha->options().use_causal_mask);
  EXPECT_FLOAT_EQ(mha->options().dropout, 0.1f);
  EXPECT_EQ((*loaded)(Tensor::full(Shape{3, 6}, 2.0f)).shape(), (Shape{3, 8}));
}

TEST(Transformer, PositionsForASequenceShorterThanTheTableAreItsFirstRows) {
  // keras_hub's sequence_length is the longest sequence: shorter ones take the first rows.
  nn::PositionEmbedding positions(5, "glorot_uniform", 3, "positions");
  const Tensor x = random_tensor({2, 3, 4}, 1);
  const Tensor y = positions(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  const std::vector<float> table = positions.variables()[0]->value().to_vector(), got = y.to_vector();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 12; ++i) EXPECT_EQ(got[b * 12 + i], table[i]) << b << " " << i;
  {
    GradientTape tape;
    const Tensor g = tape.gradient(reduce_sum(positions(x)), positions.variables())[0];
    const std::vector<float> want{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT_EQ(g.to_vector(), want) << "rows 3 and 4 are not used";
  }
  // Built for one length, it takes another.
  EXPECT_EQ(positions(random_tensor({1, 5, 4}, 2)).shape(), (Shape{1, 5, 4}));
  nn::PositionEmbedding short_table(2, "glorot_uniform", 3, "short");
  try {
    short_table(x);
    FAIL() << "3 steps were taken by a table of 2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'short'"), std::string::npos) << e.what();
  }
}

TEST(Transformer, AnIdOutsideTheTableIsNamed) {
  nn::Embedding embedding(10, 4, {.name = "tokens"});
  try {
    embedding(Tensor::from_vector(Shape{1, 3}, std::vector<float>{1, 10, 2}));
    FAIL() << "id 10 of a table of 10 was taken";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    for (const char* part : {"'tokens'", "id 10", "position 1", "[0, 10)"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
  EXPECT_THROW(embedding(Tensor::from_vector(Shape{1, 1}, std::vector<float>{1.5f})), InvalidArgument);
}

}  // namespace
}  // namespace dtrain
