// A small transformer classifier (token ids -> embedding + learned positions -> a pre-norm block of
// multi-head self-attention and a GELU feed-forward -> mean over positions -> classes), and
// token data whose class a transformer can read, for the tests of the transformer layers.
#pragma once

#include <memory>

#include "dtrain/core/rng.h"
#include "dtrain/model/sequential.h"

namespace dtrain::testing {

inline std::unique_ptr<Model> tiny_transformer(std::int64_t length = 12, std::int64_t vocabulary = 16,
                                               bool causal = false, float dropout = 0.0f) {
  KerasTensor ids = Input({length}, "ids");
  KerasTensor x = layer<nn::Embedding>(vocabulary, 16, nn::EmbeddingOptions{.seed = 1, .name = "tokens"})(ids);
  x = layer<nn::Add>()({x, layer<nn::PositionEmbedding>(length, "glorot_uniform", 6)(x)});
  KerasTensor h = layer<nn::LayerNormalization>()(x);
  h = layer<nn::MultiHeadAttention>(2, 8, nn::MultiHeadAttentionOptions{.dropout = dropout, .seed = 2,
                                                                         .use_causal_mask = causal})({h, h});
  x = layer<nn::Add>()({x, h});
  h = layer<nn::LayerNormalization>()(x);
  h = layer<nn::Dense>(32, "gelu", nn::DenseOptions{.seed = 3})(h);
  h = layer<nn::Dense>(16, "", nn::DenseOptions{.seed = 4})(h);
  x = layer<nn::Add>()({x, h});
  x = layer<nn::GlobalAveragePooling1D>()(x);
  return std::make_unique<Model>(ids, layer<nn::Dense>(2, "", nn::DenseOptions{.seed = 5, .name = "classes"})(x),
                                 "tiny_transformer");
}

// Sequences of ids in [1, vocabulary); class 1 where token 1 comes before token 2 (both
// appear once in every sequence), which needs positions compared: attention's job.
struct TokenData {
  Tensor ids, labels;
};
inline TokenData ordered_pairs(std::int64_t rows, std::int64_t length = 12, std::int64_t vocabulary = 16,
                               std::uint64_t seed = 7) {
  Generator g(seed);
  TokenData d{Tensor::empty(Shape{rows, length}), Tensor::empty(Shape{rows}, DType::i32)};
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = d.ids.data<float>() + r * length;
    for (std::int64_t t = 0; t < length; ++t) row[t] = static_cast<float>(3 + g.below(static_cast<std::uint64_t>(vocabulary - 3)));
    const auto a = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(length)));
    auto b = static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(length - 1)));
    if (b >= a) ++b;
    row[a] = 1.0f;
    row[b] = 2.0f;
    d.labels.data<std::int32_t>()[r] = a < b ? 1 : 0;
  }
  return d;
}

}  // namespace dtrain::testing
