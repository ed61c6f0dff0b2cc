// Keras's regularizers (tf.keras.regularizers): a penalty l1 * Σ|x| + l2 * Σx² on a weight
// (added to model.losses and fit's loss while the weight exists) or on a layer's output
// (activity, added for the last call). L1, L2, L1L2 as objects; "l1", "l2", "l1_l2" as
// strings, with Keras's factor 0.01.
#pragma once

#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::nn {

struct Regularizer {
  enum class Kind : std::uint8_t { l1, l2, l1_l2 };
  Kind kind = Kind::l2;
  float l1 = 0.0f;
  float l2 = 0.0f;

  static Regularizer L1(float l1 = 0.01f) { return {Kind::l1, l1, 0.0f}; }
  static Regularizer L2(float l2 = 0.01f) { return {Kind::l2, 0.0f, l2}; }
  static Regularizer L1L2(float l1 = 0.0f, float l2 = 0.0f) { return {Kind::l1_l2, l1, l2}; }
  // "l1", "l2", "l1_l2" (Keras's strings, each factor 0.01) and the class names.
  static Regularizer from_name(const std::string& name);
  const char* class_name() const;  // "L1", "L2", "L1L2"
  friend bool operator==(const Regularizer&, const Regularizer&) = default;
};

// The penalty on x, a scalar on x's device, recorded by live tapes.
Tensor regularization(const Regularizer& r, const Tensor& x);

}  // namespace dtrain::nn
