// Shape checks and broadcasting rules.
#include "dtrain/core/shape.h"

#include <algorithm>

#include "dtrain/core/error.h"

namespace dtrain {

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    DTRAIN_THROW(InvalidArgument, "Shape: rank ", dims.size(), " exceeds the maximum ", kMaxRank);
  rank_ = static_cast<int>(dims.size());
  // The product of the non-zero extents must fit too: strides() multiplies them even when
  // another extent is 0.
  std::int64_t count = 1;
  for (int i = 0; i < rank_; ++i) {
    if (dims[i] < 0)
      DTRAIN_THROW(InvalidArgument, "Shape: extent ", dims[i], " at axis ", i, " is negative");
    if (__builtin_mul_overflow(count, std::max<std::int64_t>(dims[i], 1), &count))
      DTRAIN_THROW(InvalidArgument, "Shape: the extents overflow a 64-bit element count at axis ", i);
    dims_[i] = dims[i];
  }
}

int Shape::normalize_axis(int axis) const {
  int a = axis < 0 ? axis + rank_ : axis;
  if (a < 0 || a >= rank_)
    DTRAIN_THROW(InvalidArgument, "axis ", axis, " is out of range for a tensor of rank ", rank_,
                 " (shape ", to_string(), ")");
  return a;
}

void Shape::set(int axis, std::int64_t extent) {
  if (extent < 0) DTRAIN_THROW(InvalidArgument, "Shape::set: extent ", extent, " is negative");
  const int a = normalize_axis(axis);
  std::int64_t count = 1;
  for (int i = 0; i < rank_; ++i)
    if (__builtin_mul_overflow(count, std::max<std::int64_t>(i == a ? extent : dims_[i], 1), &count))
      DTRAIN_THROW(InvalidArgument, "Shape::set: the extents overflow a 64-bit element count");
  dims_[a] = extent;
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

std::array<std::int64_t, Shape::kMaxRank> Shape::strides() const {
  std::array<std::int64_t, kMaxRank> s{};
  std::int64_t acc = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= dims_[i];
  }
  return s;
}

Shape Shape::with_dim(int axis, std::int64_t extent) const {
  Shape s = *this;
  s.set(axis, extent);
  return s;
}

std::string Shape::to_string() const {
  std::string out = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) out += ", ";
    out += std::to_string(dims_[i]);
  }
  return out + "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int rank = std::max(a.rank(), b.rank());
  std::array<std::int64_t, Shape::kMaxRank> out{};
  for (int i = 0; i < rank; ++i) {
    const int ia = a.rank() - rank + i;
    const int ib = b.rank() - rank + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1;
    const std::int64_t db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      DTRAIN_THROW(InvalidArgument, op, ": shapes ", a.to_string(), " and ", b.to_string(),
                   " cannot be broadcast together (axis ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return Shape(std::span<const std::int64_t>(out.data(), static_cast<size_t>(rank)));
}

std::vector<std::int64_t> reduced_offsets(const Shape& shape, const std::vector<bool>& reduced) {
  const int rank = shape.rank();
  std::vector<std::int64_t> strides(static_cast<std::size_t>(rank), 0);
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d)
    if (!reduced[static_cast<std::size_t>(d)]) {
      strides[static_cast<std::size_t>(d)] = stride;
      stride *= shape[d];
    }
  std::vector<std::int64_t> where(static_cast<std::size_t>(shape.numel()));
  std::vector<std::int64_t> coord(static_cast<std::size_t>(rank), 0);
  for (std::int64_t& o : where) {
    o = 0;
    for (int d = 0; d < rank; ++d) o += coord[static_cast<std::size_t>(d)] * strides[static_cast<std::size_t>(d)];
    for (int d = rank - 1; d >= 0; --d) {
      if (++coord[static_cast<std::size_t>(d)] < shape[d]) break;
      coord[static_cast<std::size_t>(d)] = 0;
    }
  }
  return where;
}

}  // namespace dtrain
