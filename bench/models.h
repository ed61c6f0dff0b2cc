// Models the benchmarks share.
#pragma once

#include <memory>

#include "dtrain/dtrain.h"

namespace dtrain::bench {

// The seeds' large MLP: 1024 -> Dense 1024 relu -> Dense 1024 relu -> Dense 10 softmax,
// Adam, sparse categorical cross-entropy, fixed seeds.
inline std::unique_ptr<Sequential> large_mlp() {
  auto m = std::make_unique<Sequential>();
  m->add<nn::Dense>(1024, "relu", nn::DenseOptions{.seed = 1});
  m->add<nn::Dense>(1024, "relu", nn::DenseOptions{.seed = 2});
  m->add<nn::Dense>(10, "softmax", nn::DenseOptions{.seed = 3});
  m->compile("adam", "sparse_categorical_crossentropy");
  m->build(Shape{1024});
  return m;
}

}  // namespace dtrain::bench
