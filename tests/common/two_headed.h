// A functional model of two inputs and two outputs, and data for it, for the tests of
// models with several inputs and outputs.
#pragma once

#include <memory>

#include "dtrain/core/rng.h"
#include "dtrain/model/sequential.h"

namespace dtrain::testing {

// Two inputs (4 and 3 features) into a shared hidden layer, out to a 3-class head
// ("kind", logits) and a regression head ("size").
inline std::unique_ptr<Model> two_headed() {
  KerasTensor a = Input({4}, "a"), b = Input({3}, "b");
  KerasTensor h = layer<nn::Concatenate>()({a, b});
  h = layer<nn::Dense>(8, "relu", nn::DenseOptions{.seed = 1, .name = "hidden"})(h);
  KerasTensor kind = layer<nn::Dense>(3, "", nn::DenseOptions{.seed = 2, .name = "kind"})(h);
  KerasTensor size = layer<nn::Dense>(1, "", nn::DenseOptions{.seed = 3, .name = "size"})(h);
  return std::make_unique<Model>(std::vector<KerasTensor>{a, b}, std::vector<KerasTensor>{kind, size}, "two_headed");
}

inline void compile_two_headed(Model& m, float learning_rate = 0.1f) {
  m.compile(std::make_shared<optim::SGD>(learning_rate),
            {std::make_shared<losses::SparseCategoricalCrossentropy>(true), std::make_shared<losses::MeanSquaredError>()},
            {{"accuracy"}, {}}, {1.0, 0.5});
}

inline Tensor random_uniform(Shape shape, std::uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = g.uniform(-1.0f, 1.0f);
  return t;
}

inline TensorData two_headed_data(std::int64_t rows) {
  Tensor labels = Tensor::empty(Shape{rows}, DType::i32);
  Generator g(9);
  for (std::int64_t i = 0; i < rows; ++i) labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(g.below(3));
  return TensorData({random_uniform(Shape{rows, 4}, 5), random_uniform(Shape{rows, 3}, 6)}, {labels, random_uniform(Shape{rows, 1}, 7)});
}

}  // namespace dtrain::testing
