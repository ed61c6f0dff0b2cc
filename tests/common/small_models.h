// Small fixed-seed models the strategy tests train on several devices and compare with one.
#pragma once

#include <cstdint>
#include <memory>

#include "dtrain/dtrain.h"

namespace dtrain::testing {

// Three dense layers (32 relu, 16 tanh, 4 logits) under Adam, classifying 4 classes.
inline std::unique_ptr<Sequential> three_layer_classifier() {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(32, "relu", nn::DenseOptions{.seed = 1});
  m->add<nn::Dense>(16, "tanh", nn::DenseOptions{.seed = 2});
  m->add<nn::Dense>(4, "", nn::DenseOptions{.seed = 3});
  m->compile("adam", "sparse_categorical_crossentropy", {"accuracy"}, /*from_logits=*/true);
  return m;
}

// Dense 16, a batch norm (momentum 0.9), relu, and a softmax over 10 classes, built for
// `features` inputs: moving statistics that each training step's forward pass changes.
inline std::unique_ptr<Sequential> mlp_with_batch_norm(std::int64_t features) {
  auto model = std::make_unique<Sequential>();
  model->add<nn::Dense>(16, "linear", nn::DenseOptions{.seed = 1});
  model->add<nn::BatchNormalization>(nn::BatchNormalizationOptions{.momentum = 0.9f});
  model->add<nn::Activation>("relu");
  model->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 2});
  model->build(Shape{features});
  model->compile(std::make_shared<optim::Adam>(0.01f), std::make_shared<losses::SparseCategoricalCrossentropy>(),
                 {"accuracy"});
  return model;
}

}  // namespace dtrain::testing
