// A small encoder over token ids with Keras's padding mask (Embedding(mask_zero) on), and
// rows of ids with and without padding, for the tests of masking.
#pragma once

#include <memory>

#include "dtrain/core/rng.h"
#include "dtrain/model/sequential.h"

namespace dtrain::testing {

constexpr std::int64_t kVocabulary = 12, kReal = 4, kPadded = 7;

// An encoder block over token ids, seeded: two of them built for different lengths hold the
// same weights. Its output is the classes of the mean over the steps, or (sequence) the
// next token's logits at every step.
inline std::unique_ptr<Model> encoder(std::int64_t length, bool mask_zero, bool sequence = false, bool causal = false) {
  KerasTensor ids = Input({length}, "ids");
  KerasTensor x = layer<nn::Embedding>(kVocabulary, 8, nn::EmbeddingOptions{.seed = 1, .mask_zero = mask_zero})(ids);
  KerasTensor h = layer<nn::LayerNormalization>()(x);
  h = layer<nn::MultiHeadAttention>(2, 4, nn::MultiHeadAttentionOptions{.seed = 2, .use_causal_mask = causal})({h, h});
  x = layer<nn::Add>()({x, h});
  h = layer<nn::Dense>(16, "gelu", nn::DenseOptions{.seed = 3})(x);
  x = layer<nn::Add>()({x, layer<nn::Dense>(8, "", nn::DenseOptions{.seed = 4})(h)});
  if (sequence) return std::make_unique<Model>(ids, layer<nn::Dense>(kVocabulary, "", nn::DenseOptions{.seed = 5})(x));
  x = layer<nn::GlobalAveragePooling1D>()(x);
  return std::make_unique<Model>(ids, layer<nn::Dense>(3, "", nn::DenseOptions{.seed = 5})(x));
}

// Rows of kReal ids in [1, kVocabulary), and the same rows padded with 0 to kPadded.
struct Padded {
  Tensor ids, padded;
};
inline Padded token_rows(std::int64_t rows, std::uint64_t seed) {
  Generator g(seed);
  Padded p{Tensor::empty(Shape{rows, kReal}), Tensor::zeros(Shape{rows, kPadded})};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < kReal; ++t) {
      const auto id = static_cast<float>(1 + g.below(kVocabulary - 1));
      p.ids.data<float>()[r * kReal + t] = id;
      p.padded.data<float>()[r * kPadded + t] = id;
    }
  return p;
}

}  // namespace dtrain::testing
