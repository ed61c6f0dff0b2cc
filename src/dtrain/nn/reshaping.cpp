// Reshape and ZeroPadding2D.
#include "dtrain/nn/reshaping.h"

namespace dtrain::nn {
namespace {

// "[-1, 4, 1]", as Shape writes one: a target shape may hold -1, which Shape refuses.
std::string target_text(const std::vector<std::int64_t>& target) {
  std::string text = "[";
  for (std::size_t i = 0; i < target.size(); ++i) text += (i ? ", " : "") + std::to_string(target[i]);
  return text + "]";
}

}  // namespace

Reshape::Reshape(std::vector<std::int64_t> target_shape, std::string name)
    : Layer(std::move(name)), target_(std::move(target_shape)) {
  int unknown = 0;
  for (std::int64_t d : target_) {
    if (d == -1) ++unknown;
    else if (d <= 0) fail("target_shape extents must be positive (or one -1), got " + target_text(target_));
  }
  if (unknown > 1) fail("target_shape may hold one -1, got " + target_text(target_));
}

Shape Reshape::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() < 1) fail("expects inputs with a batch axis, got a scalar");
  std::int64_t rest = 1, known = 1;
  for (int i = 1; i < input_shape.rank(); ++i) rest *= input_shape[i];
  for (std::int64_t d : target_)
    if (d != -1 && __builtin_mul_overflow(known, d, &known))
      fail("target_shape " + target_text(target_) + " holds more values than a tensor can");
  std::vector<std::int64_t> dims{input_shape[0]};
  for (std::int64_t d : target_) dims.push_back(d == -1 ? (known ? rest / known : 0) : d);
  const bool fits = std::find(target_.begin(), target_.end(), -1) != target_.end() ? known && rest % known == 0
                                                                                     : known == rest;
  if (!fits)
    fail("cannot reshape " + input_shape.to_string() + " (" + std::to_string(rest) + " values a row) to " +
         target_text(target_));
  return Shape(dims);
}

Tensor Reshape::call(const Tensor& x, bool /*training*/) { return reshape(x, compute_output_shape(x.shape())); }

ZeroPadding2D::ZeroPadding2D(Padding2 padding, std::string name) : Layer(std::move(name)), padding_(padding) {
  for (const auto& p : padding_)
    if (p[0] < 0 || p[1] < 0) fail("padding must be >= 0");
}

Shape ZeroPadding2D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4)
    fail("expects images [batch, height, width, channels] (channels last), got " + input_shape.to_string());
  return {input_shape[0], input_shape[1] + padding_[0][0] + padding_[0][1],
          input_shape[2] + padding_[1][0] + padding_[1][1], input_shape[3]};
}

Tensor ZeroPadding2D::call(const Tensor& x, bool /*training*/) {
  return zero_pad2d(x, padding_[0][0], padding_[0][1], padding_[1][0], padding_[1][1]);
}

}  // namespace dtrain::nn
