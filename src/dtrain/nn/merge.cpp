// Add and Concatenate.
#include "dtrain/nn/merge.h"

#include <algorithm>

namespace dtrain::nn {
namespace {

std::string shapes_text(std::span<const Shape> shapes) {
  std::string out;
  for (const Shape& s : shapes) out += (out.empty() ? "" : ", ") + s.to_string();
  return out;
}

// The product of the masks given (1 where every one is 1); undefined where none is.
Tensor masks_and(std::span<const Tensor> masks) {
  Tensor out;
  for (const Tensor& m : masks)
    if (m.defined()) out = out.defined() ? mul(out, m) : m;
  return out;
}

}  // namespace

Tensor Add::compute_mask(std::span<const Tensor> /*inputs*/, std::span<const Tensor> masks) const {
  return masks_and(masks);
}

Shape Add::compute_output_shape(const Shape& input_shape) const {
  fail("takes a list of at least two inputs, got one of shape " + input_shape.to_string());
}

Shape Add::compute_output_shape_of(std::span<const Shape> input_shapes) const {
  if (input_shapes.size() < 2) fail("takes a list of at least two inputs, got " + std::to_string(input_shapes.size()));
  for (const Shape& s : input_shapes)
    if (!(s == input_shapes[0])) fail("takes inputs of one shape, got " + shapes_text(input_shapes));
  return input_shapes[0];
}

Tensor Add::call(const Tensor& x, bool /*training*/) { return x; }

Tensor Add::call_several(std::span<const Tensor> inputs, bool /*training*/) {
  Tensor y = add(inputs[0], inputs[1]);
  for (std::size_t i = 2; i < inputs.size(); ++i) y = add(y, inputs[i]);
  return y;
}

Shape Concatenate::compute_output_shape(const Shape& input_shape) const {
  fail("takes a list of at least two inputs, got one of shape " + input_shape.to_string());
}

Shape Concatenate::compute_output_shape_of(std::span<const Shape> input_shapes) const {
  if (input_shapes.size() < 2) fail("takes a list of at least two inputs, got " + std::to_string(input_shapes.size()));
  const int rank = input_shapes[0].rank();
  const int a = axis_ < 0 ? axis_ + rank : axis_;
  if (a < 1 || a >= rank)
    fail("axis " + std::to_string(axis_) + " is not a non-batch axis of inputs of rank " + std::to_string(rank));
  std::int64_t total = 0;
  for (const Shape& s : input_shapes) {
    bool fits = s.rank() == rank;
    for (int d = 1; fits && d < rank; ++d) fits = d == a || s[d] == input_shapes[0][d];
    if (!fits)
      fail("joins along axis " + std::to_string(a) + " inputs equal on every other axis, got " +
           shapes_text(input_shapes));
    total += s[a];
  }
  return input_shapes[0].with_dim(a, total);
}

Tensor Concatenate::compute_mask(std::span<const Tensor> inputs, std::span<const Tensor> masks) const {
  // Any given mask says the rank and device the others take.
  const auto given = std::find_if(masks.begin(), masks.end(), [](const Tensor& m) { return m.defined(); });
  if (given == masks.end()) return Tensor();
  const Tensor& any = *given;
  const int rank = inputs[0].rank(), a = axis_ < 0 ? axis_ + rank : axis_;
  if (a >= any.rank()) {
    // Along the features, as Keras 3: a step is real where any input calls it real (an
    // input without a mask calls every step real, and so leaves no mask).
    Tensor out;
    for (const Tensor& m : masks) {
      if (!m.defined()) return Tensor();
      out = out.defined() ? sub(add(out, m), mul(out, m)) : m;  // 1 − (1 − a)(1 − b)
    }
    return out;
  }
  std::vector<Tensor> parts;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (masks[i].defined()) {
      parts.push_back(masks[i]);
      continue;
    }
    std::vector<std::int64_t> dims(inputs[i].shape().dims().begin(), inputs[i].shape().dims().begin() + any.rank());
    parts.push_back(Tensor::full(Shape(dims), 1.0f).to(any.device()));
  }
  return concatenate(parts, a);
}

Tensor Concatenate::call(const Tensor& x, bool /*training*/) { return x; }

Tensor Concatenate::call_several(std::span<const Tensor> inputs, bool /*training*/) {
  return concatenate(inputs, axis_);
}

}  // namespace dtrain::nn
