// Pooling layers: one pooling op per call.
#include "dtrain/nn/pooling.h"

namespace dtrain::nn {

Pooling2D::Pooling2D(kernels::Pool kind, Pair pool_size, std::optional<Pair> strides, std::string padding,
                     std::string name)
    : Layer(std::move(name)), kind_(kind), pool_size_(pool_size), strides_(strides ? *strides : pool_size),
      padding_(std::move(padding)) {
  if (pool_size_[0] < 1 || pool_size_[1] < 1)
    fail("pool_size must be positive, got (" + std::to_string(pool_size_[0]) + ", " + std::to_string(pool_size_[1]) + ")");
  if (strides_[0] < 1 || strides_[1] < 1)
    fail("strides must be positive, got (" + std::to_string(strides_[0]) + ", " + std::to_string(strides_[1]) + ")");
  try {
    padding_from_name(padding_);
  } catch (const InvalidArgument& e) {
    fail(e.what());
  }
}

Pool2dOptions Pooling2D::pool_options(const Shape& input_shape) const {
  Pool2dOptions o;
  o.kind = kind_;
  const bool same = padding_from_name(padding_) == Padding::same;
  for (int i = 0; i < 2; ++i) {
    const std::int64_t size = input_shape[1 + i];
    o.window[i] = pool_size_[i];
    o.stride[i] = strides_[i];
    if (same) {
      // A window as wide as `whole` covers all of the axis for every output, and so does a
      // wider one: padding is never pooled, so the narrower gives the same values, where
      // oneDNN's time grows with the window (2^28 ran for minutes on an 8 x 8 image).
      const std::int64_t whole = size + (same_outputs(size, o.stride[i]) - 1) * o.stride[i] + 1;
      if (size > 0) o.window[i] = std::min(o.window[i], whole);
      const auto pad = same_padding(size, o.window[i], o.stride[i], 1);
      o.pad_begin[i] = pad[0];
      o.pad_end[i] = pad[1];
    }
    o.stride[i] = stride_within(o.stride[i], input_shape[1 + i] + o.pad_begin[i] + o.pad_end[i]);
  }
  return o;
}

Shape Pooling2D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4)
    fail("expects images [batch, height, width, channels] (channels last), got " + input_shape.to_string());
  const Pool2dOptions o = pool_options(input_shape);
  std::int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const std::int64_t padded = input_shape[1 + i] + o.pad_begin[i] + o.pad_end[i];
    if (padded < o.window[i])
      fail("its pool_size (" + std::to_string(pool_size_[0]) + ", " + std::to_string(pool_size_[1]) +
           ") is larger than the input " + input_shape.to_string());
    out[i] = (padded - o.window[i]) / o.stride[i] + 1;
  }
  return {input_shape[0], out[0], out[1], input_shape[3]};
}

Tensor Pooling2D::call(const Tensor& x, bool /*training*/) { return pool2d(x, pool_options(x.shape())); }

Shape Pooling1D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 3) fail("expects sequences [batch, steps, channels], got " + input_shape.to_string());
  const Shape out = Pooling2D::compute_output_shape({input_shape[0], 1, input_shape[1], input_shape[2]});
  return {out[0], out[2], out[3]};
}

Tensor Pooling1D::call(const Tensor& x, bool /*training*/) {
  const Shape image{x.dim(0), 1, x.dim(1), x.dim(2)};
  const Tensor y = pool2d(reshape(x, image), pool_options(image));
  return reshape(y, {y.dim(0), y.dim(2), y.dim(3)});
}

Shape GlobalAveragePooling2D::compute_output_shape(const Shape& input_shape) const {
  if (input_shape.rank() != 4)
    fail("expects images [batch, height, width, channels] (channels last), got " + input_shape.to_string());
  if (keepdims_) return {input_shape[0], 1, 1, input_shape[3]};
  return {input_shape[0], input_shape[3]};
}

Tensor GlobalAveragePooling2D::call(const Tensor& x, bool /*training*/) {
  // One average-pooling window over the whole image: oneDNN's pooling runs it in its JIT
  // kernels (its reduction primitive takes a reference path for these axes, 30x slower).
  Pool2dOptions o;
  o.kind = kernels::Pool::average;
  o.window[0] = o.stride[0] = x.dim(1);
  o.window[1] = o.stride[1] = x.dim(2);
  const Tensor y = pool2d(x, o);
  return keepdims_ ? y : reshape(y, compute_output_shape(x.shape()));
}

}  // namespace dtrain::nn
