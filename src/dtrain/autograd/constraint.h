// Keras's weight constraints (tf.keras.constraints), which the optimizers apply to a variable
// after each update of it: MaxNorm, NonNeg, UnitNorm, MinMaxNorm. Norms are taken over
// `axis` (a Dense kernel's axis 0: each unit's incoming weights; a Conv2D kernel's
// [0, 1, 2]: each filter), with Keras's epsilon 1e-7 beside them.
#pragma once

#include <string>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain {

struct Constraint {
  enum class Kind : std::uint8_t { max_norm, non_neg, unit_norm, min_max_norm };
  Kind kind = Kind::non_neg;
  float max_value = 2.0f;  // max_norm (Keras's default 2), min_max_norm (1)
  float min_value = 0.0f;  // min_max_norm
  float rate = 1.0f;       // min_max_norm: how far toward the clipped norm each application goes
  std::vector<int> axis{0};

  static Constraint max_norm(float max_value = 2.0f, std::vector<int> axis = {0});
  static Constraint non_neg();
  static Constraint unit_norm(std::vector<int> axis = {0});
  static Constraint min_max_norm(float min_value = 0.0f, float max_value = 1.0f, float rate = 1.0f,
                                 std::vector<int> axis = {0});
  // "max_norm", "non_neg", "unit_norm", "min_max_norm" (Keras's aliases) with Keras's defaults.
  static Constraint from_name(const std::string& name);
  const char* class_name() const;  // "MaxNorm", ...
  friend bool operator==(const Constraint&, const Constraint&) = default;
};

// w's values with the constraint applied (on w's device; no tape records it).
Tensor constrained(const Constraint& c, const Tensor& w);

}  // namespace dtrain
