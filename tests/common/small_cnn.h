// A small residual CNN built with the functional API, for tests of convolutional models
// under each strategy: conv-BN-relu, a residual conv-BN block, max pooling, global average
// pooling and a dense classifier, with fixed seeds (the same weights every time).
#pragma once

#include <memory>

#include "dtrain/core/rng.h"
#include "dtrain/model/functional.h"
#include "dtrain/model/model.h"

namespace dtrain::testing {

inline std::unique_ptr<Model> small_cnn(bool synchronized, std::int64_t size = 8, std::int64_t channels = 2,
                                        std::int64_t classes = 3) {
  const KerasTensor in = Input({size, size, channels}, "image");
  nn::BatchNormalizationOptions bn{.momentum = 0.9f, .synchronized = synchronized};
  KerasTensor x = layer<nn::Conv2D>(4, 3, nn::Conv2DOptions{.padding = "same", .use_bias = false, .seed = 11})(in);
  x = layer<nn::BatchNormalization>(bn)(x);
  x = layer<nn::Activation>("relu")(x);
  // No bias before a batch norm (it would cancel it): under Adam a bias whose gradient is
  // rounding noise moves by the learning rate each step, whichever way the noise points.
  KerasTensor y = layer<nn::Conv2D>(4, 3, nn::Conv2DOptions{.padding = "same", .use_bias = false, .seed = 12})(x);
  bn.name = "batch_normalization_1";
  y = layer<nn::BatchNormalization>(bn)(y);
  x = layer<nn::Add>()({x, y});
  x = layer<nn::Activation>("relu", "activation_1")(x);
  x = layer<nn::MaxPooling2D>()(x);
  x = layer<nn::GlobalAveragePooling2D>()(x);
  const KerasTensor out = layer<nn::Dense>(classes, "", nn::DenseOptions{.seed = 13})(x);
  auto model = std::make_unique<Model>(in, out, "small_cnn");
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, /*from_logits=*/true);
  return model;
}

// n images [n, size, size, channels] in [-1, 1] and labels in [0, classes).
inline std::pair<Tensor, Tensor> random_images(std::int64_t n, std::uint64_t seed, std::int64_t size = 8,
                                               std::int64_t channels = 2, std::int64_t classes = 3) {
  Generator g(seed);
  Tensor x = Tensor::empty({n, size, size, channels});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = g.uniform(-1.0f, 1.0f);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (auto& l : labels) l = static_cast<std::int32_t>(g.next_u64() % static_cast<std::uint64_t>(classes));
  return {x, Tensor::from_vector({n}, labels)};
}

}  // namespace dtrain::testing
