// The constraints' formulas, as Keras writes them, from the differentiable ops (on a
// tensor that no tape watches).
#include "dtrain/autograd/constraint.h"

#include "dtrain/autograd/ops.h"

namespace dtrain {

Constraint Constraint::max_norm(float max_value, std::vector<int> axis) {
  return {Kind::max_norm, max_value, 0.0f, 1.0f, std::move(axis)};
}
Constraint Constraint::non_neg() { return {Kind::non_neg, 0.0f, 0.0f, 1.0f, {0}}; }
Constraint Constraint::unit_norm(std::vector<int> axis) { return {Kind::unit_norm, 1.0f, 0.0f, 1.0f, std::move(axis)}; }
Constraint Constraint::min_max_norm(float min_value, float max_value, float rate, std::vector<int> axis) {
  return {Kind::min_max_norm, max_value, min_value, rate, std::move(axis)};
}

Constraint Constraint::from_name(const std::string& name) {
  if (name == "max_norm" || name == "MaxNorm" || name == "maxnorm") return max_norm();
  if (name == "non_neg" || name == "NonNeg" || name == "nonneg") return non_neg();
  if (name == "unit_norm" || name == "UnitNorm" || name == "unitnorm") return unit_norm();
  if (name == "min_max_norm" || name == "MinMaxNorm" || name == "minmaxnorm") return min_max_norm();
  DTRAIN_THROW(InvalidArgument, "unknown constraint '", name, "'; expected max_norm, non_neg, unit_norm or min_max_norm");
}

const char* Constraint::class_name() const {
  switch (kind) {
    case Kind::max_norm: return "MaxNorm";
    case Kind::non_neg: return "NonNeg";
    case Kind::unit_norm: return "UnitNorm";
    case Kind::min_max_norm: return "MinMaxNorm";
  }
  return "?";
}

namespace {

constexpr float kEpsilon = 1e-7f;  // Keras's backend epsilon

}  // namespace

Tensor constrained(const Constraint& c, const Tensor& value) {
  const Tensor w = stop_gradient(value);
  if (c.kind == Constraint::Kind::non_neg) return relu(w);
  std::vector<int> axes;
  for (int a : c.axis) {
    const int n = a < 0 ? a + w.rank() : a;
    if (n < 0 || n >= w.rank())
      DTRAIN_THROW(InvalidArgument, c.class_name(), ": axis ", a, " is outside a weight of shape ",
                   w.shape().to_string());
    axes.push_back(n);
  }
  const Tensor norms = sqrt(reduce_sum(square(w), axes, /*keepdims=*/true));
  const Tensor below = affine(norms, 1.0f, kEpsilon);  // epsilon + norms
  switch (c.kind) {
    case Constraint::Kind::unit_norm: return div(w, below);
    case Constraint::Kind::max_norm: return mul(w, div(clip_by_value(norms, 0.0f, c.max_value), below));
    case Constraint::Kind::min_max_norm: {
      const Tensor desired =
          add(affine(clip_by_value(norms, c.min_value, c.max_value), c.rate), affine(norms, 1.0f - c.rate));
      return mul(w, div(desired, below));
    }
    case Constraint::Kind::non_neg: break;
  }
  return w;
}

}  // namespace dtrain
