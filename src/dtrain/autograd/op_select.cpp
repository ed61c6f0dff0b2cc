// Selection ops: where, slice_axis, gather, and the max/min/prod reductions, each with its
// gradient. slice_axis copies through the backend (any device); the others loop on the host.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dtrain/autograd/op_util.h"

namespace dtrain {
namespace {

void check_host(const Tensor& t, const char* op) {
  if (!t.on_cpu())
    DTRAIN_THROW(InvalidArgument, op, ": runs on the CPU; the tensor is on ", t.device().to_string(),
                 " (copy it with .to(Device{}) first)");
}

// A condition's truth per element, whatever its dtype.
bool truth_at(const Tensor& c, std::int64_t i) {
  switch (c.dtype()) {
    case DType::i32: return c.data<std::int32_t>()[i] != 0;
    case DType::u8: return c.data<std::uint8_t>()[i] != 0;
    case DType::f32: return c.data<float>()[i] != 0.0f;
    default: DTRAIN_THROW(InvalidArgument, "where: condition must be int32, uint8 or float32, got ", dtype_name(c.dtype()));
  }
}

// Axis `axis` (negative from the end) of a tensor of `rank`, checked.
int axis_of(int axis, int rank, const char* op) {
  const int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) DTRAIN_THROW(InvalidArgument, op, ": axis ", axis, " is outside a tensor of rank ", rank);
  return a;
}

}  // namespace

Tensor where(const Tensor& condition, const Tensor& x, const Tensor& y) {
  for (const Tensor* t : {&condition, &x, &y}) {
    t->check_defined("where");
    check_host(*t, "where");
  }
  detail::check_float(x, "where");
  detail::check_float(y, "where");
  const Shape& shape = condition.shape();
  for (const Tensor* t : {&x, &y})
    if (t->shape() != shape && t->numel() != 1)
      DTRAIN_THROW(InvalidArgument, "where: x ", x.shape().to_string(), " and y ", y.shape().to_string(),
                   " must have condition's shape ", shape.to_string(), " (or be scalars)");
  const std::int64_t n = condition.numel();
  Tensor mask = Tensor::empty(shape, DType::u8);
  Tensor out = Tensor::empty(shape);
  const float* xs = x.data<float>();
  const float* ys = y.data<float>();
  const bool x_one = x.numel() == 1 && x.shape() != shape, y_one = y.numel() == 1 && y.shape() != shape;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool pick = truth_at(condition, i);
    mask.data<std::uint8_t>()[i] = pick ? 1 : 0;
    out.data<float>()[i] = pick ? xs[x_one ? 0 : i] : ys[y_one ? 0 : i];
  }
  detail::record(out, [&] {
    return [mask, x_shape = x.shape(), y_shape = y.shape(), x_one, y_one, n](const Tensor& dy, BackwardContext& ctx) {
      for (int input : {1, 2}) {
        if (!ctx.needs(input)) continue;
        const bool want = input == 1, one = want ? x_one : y_one;
        Tensor d = Tensor::zeros(want ? x_shape : y_shape);
        for (std::int64_t i = 0; i < n; ++i)
          if ((mask.data<std::uint8_t>()[i] != 0) == want) d.data<float>()[one ? 0 : i] += dy.data<float>()[i];
        ctx.add(input, d);
      }
    };
  }, condition, x, y);
  return out;
}

Tensor slice_axis(const Tensor& x, int axis, std::int64_t begin, std::int64_t size) {
  x.check_defined("slice");
  const int a = axis_of(axis, x.rank(), "slice");
  const std::int64_t dim = x.dim(a);
  if (begin < 0 || size < 0 || begin > dim || size > dim - begin)
    DTRAIN_THROW(InvalidArgument, "slice: [", begin, ", ", begin + size, ") is outside axis ", a, " of ",
                 x.shape().to_string());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= x.dim(d);
  for (int d = a + 1; d < x.rank(); ++d) inner *= x.dim(d);
  Tensor y = detail::empty_on(x, x.shape().with_dim(a, size), x.dtype());
  if (y.numel() > 0)
    detail::backend_of(x).copy_block(x, {begin * inner, dim * inner, 0}, y, {0, size * inner, 0}, outer, 1, size * inner);
  detail::record(y, [&] {
    return [shape = x.shape(), begin, size, dim, outer, inner](const Tensor& dy, BackwardContext& ctx) {
      Tensor dx = Tensor::zeros(shape, dy.dtype(), dy.device());
      if (dy.numel() > 0)
        detail::backend_of(dy).copy_block(dy, {0, size * inner, 0}, dx, {begin * inner, dim * inner, 0}, outer, 1,
                                          size * inner);
      ctx.add(0, dx);
    };
  }, x);
  return y;
}

Tensor gather(const Tensor& params, const Tensor& indices, int axis, int batch_dims) {
  params.check_defined("gather");
  indices.check_defined("gather");
  check_host(params, "gather");
  check_host(indices, "gather");
  indices.check_dtype(DType::i32, "gather (indices)");
  if (params.dtype() == DType::string) DTRAIN_THROW(InvalidArgument, "gather: params must be numbers, got strings");
  const int a = axis_of(axis, params.rank(), "gather");
  const int b = batch_dims < 0 ? batch_dims + indices.rank() : batch_dims;
  if (b < 0 || b > indices.rank() || b > a)
    DTRAIN_THROW(InvalidArgument, "gather: batch_dims ", batch_dims, " must be in [0, ", std::min(indices.rank(), a),
                 "] for indices of rank ", indices.rank(), " and axis ", a);
  // The leading batch_dims dimensions pair each batch of indices with its batch of params.
  std::int64_t batches = 1, outer = 1, inner = 1;
  for (int d = 0; d < b; ++d) {
    if (params.dim(d) != indices.dim(d))
      DTRAIN_THROW(InvalidArgument, "gather: with batch_dims ", b, ", params ", params.shape().to_string(), " and indices ",
                   indices.shape().to_string(), " differ in dimension ", d);
    batches *= params.dim(d);
  }
  for (int d = b; d < a; ++d) outer *= params.dim(d);
  for (int d = a + 1; d < params.rank(); ++d) inner *= params.dim(d);
  const std::int64_t dim = params.dim(a), count = batches ? indices.numel() / batches : 0;
  const std::int32_t* idx = indices.data<std::int32_t>();
  for (std::int64_t i = 0; i < indices.numel(); ++i)
    if (idx[i] < 0 || idx[i] >= dim)
      DTRAIN_THROW(InvalidArgument, "gather: indices[", i, "] = ", idx[i], " is not in [0, ", dim, ") (axis ", a, " of ",
                   params.shape().to_string(), ")");
  std::vector<std::int64_t> dims(params.shape().dims().begin(), params.shape().dims().begin() + a);
  for (int d = b; d < indices.rank(); ++d) dims.push_back(indices.dim(d));
  for (int d = a + 1; d < params.rank(); ++d) dims.push_back(params.dim(d));
  Tensor out = Tensor::empty(Shape(dims), params.dtype());
  const std::size_t width = static_cast<std::size_t>(inner) * dtype_size(params.dtype());
  const auto* from = static_cast<const char*>(params.raw_data());
  auto* to = static_cast<char*>(out.raw_data());
  // Row (batch n, outer o, index i) of the output reads row (n, o, idx[n, i]) of params.
  for (std::int64_t n = 0; n < batches; ++n)
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < count; ++i)
        std::memcpy(to + static_cast<std::size_t>((n * outer + o) * count + i) * width,
                    from + static_cast<std::size_t>((n * outer + o) * dim + idx[n * count + i]) * width, width);
  detail::record(out, [&] {
    return [shape = params.shape(), indices, batches, outer, inner, dim, count](const Tensor& dy, BackwardContext& ctx) {
      if (!ctx.needs(0)) return;
      Tensor d = Tensor::zeros(shape);
      const std::int32_t* ix = indices.data<std::int32_t>();
      float* rows = d.data<float>();
      const float* up = dy.data<float>();
      for (std::int64_t n = 0; n < batches; ++n)
        for (std::int64_t o = 0; o < outer; ++o)
          for (std::int64_t i = 0; i < count; ++i) {
            float* row = rows + ((n * outer + o) * dim + ix[n * count + i]) * inner;
            const float* g = up + ((n * outer + o) * count + i) * inner;
            for (std::int64_t k = 0; k < inner; ++k) row[k] += g[k];
          }
      ctx.add(0, d);
    };
  }, params, indices);
  return out;
}

namespace {

// A reduction over `axes` (empty: all of them): the output's shape and each element's
// output offset.
struct Reduction {
  Shape out;
  std::vector<std::int64_t> where;
};

Reduction reduction_of(const Tensor& x, const std::vector<int>& axes, bool keepdims, const char* op) {
  const int rank = x.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (int axis : axes) reduced[static_cast<std::size_t>(axis_of(axis, rank, op))] = true;
  std::vector<std::int64_t> kept;
  for (int d = 0; d < rank; ++d)
    if (keepdims || !reduced[static_cast<std::size_t>(d)]) kept.push_back(reduced[static_cast<std::size_t>(d)] ? 1 : x.dim(d));
  return {Shape(kept), reduced_offsets(x.shape(), reduced)};
}

// The largest (or smallest) value over `axes`. The gradient is shared among the elements
// equal to the result.
Tensor reduce_extreme(const Tensor& x, std::vector<int> axes, bool keepdims, bool largest) {
  const char* op = largest ? "reduce_max" : "reduce_min";
  x.check_defined(op);
  check_host(x, op);
  detail::check_float(x, op);
  const std::int64_t n = x.numel();
  if (n == 0) DTRAIN_THROW(InvalidArgument, op, ": of an empty tensor ", x.shape().to_string());
  Reduction r = reduction_of(x, axes, keepdims, op);
  Tensor out = Tensor::full(r.out, largest ? -std::numeric_limits<float>::infinity()
                                           : std::numeric_limits<float>::infinity());
  float* y = out.data<float>();
  const float* v = x.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    float& m = y[r.where[static_cast<std::size_t>(i)]];
    if (std::isnan(v[i]) || std::isnan(m)) m = std::numeric_limits<float>::quiet_NaN();  // a NaN wins, as in TensorFlow
    else m = largest ? std::max(m, v[i]) : std::min(m, v[i]);
  }
  detail::record(out, [&] {
    return [x, out, where = std::move(r.where), n](const Tensor& dy, BackwardContext& ctx) {
      std::vector<float> ties(static_cast<std::size_t>(out.numel()), 0.0f);
      const float* in = x.data<float>();
      const float* result = out.data<float>();
      for (std::int64_t i = 0; i < n; ++i) {
        const auto o = static_cast<std::size_t>(where[static_cast<std::size_t>(i)]);
        if (in[i] == result[o]) ties[o] += 1.0f;
      }
      Tensor d = Tensor::zeros(x.shape());
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t o = where[static_cast<std::size_t>(i)];
        if (in[i] == result[o]) d.data<float>()[i] = dy.data<float>()[o] / ties[static_cast<std::size_t>(o)];
      }
      ctx.add(0, d);
    };
  }, x);
  return out;
}

}  // namespace

Tensor reduce_max(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce_extreme(x, std::move(axes), keepdims, true);
}
Tensor reduce_min(const Tensor& x, std::vector<int> axes, bool keepdims) {
  return reduce_extreme(x, std::move(axes), keepdims, false);
}

Tensor reduce_prod(const Tensor& x, std::vector<int> axes, bool keepdims) {
  x.check_defined("reduce_prod");
  check_host(x, "reduce_prod");
  detail::check_float(x, "reduce_prod");
  Reduction r = reduction_of(x, axes, keepdims, "reduce_prod");
  Tensor out = Tensor::full(r.out, 1.0f);
  const std::int64_t n = x.numel();
  const float* v = x.data<float>();
  float* y = out.data<float>();
  for (std::int64_t i = 0; i < n; ++i) y[r.where[static_cast<std::size_t>(i)]] *= v[i];
  detail::record(out, [&] {
    return [x, outputs = out.numel(), where = std::move(r.where), n](const Tensor& dy, BackwardContext& ctx) {
      // Each element's gradient is the product of the others of its group: the product of
      // those before it times those after it (no division, so a zero is no special case).
      const float* in = x.data<float>();
      Tensor d = Tensor::empty(x.shape());
      float* g = d.data<float>();
      std::vector<float> running(static_cast<std::size_t>(outputs), 1.0f);
      for (std::int64_t i = 0; i < n; ++i) {
        float& before = running[static_cast<std::size_t>(where[static_cast<std::size_t>(i)])];
        g[i] = before;
        before *= in[i];
      }
      std::fill(running.begin(), running.end(), 1.0f);
      const float* up = dy.data<float>();
      for (std::int64_t i = n - 1; i >= 0; --i) {
        const std::int64_t o = where[static_cast<std::size_t>(i)];
        float& after = running[static_cast<std::size_t>(o)];
        g[i] *= after * up[o];
        after *= in[i];
      }
      ctx.add(0, d);
    };
  }, x);
  return out;
}

}  // namespace dtrain
