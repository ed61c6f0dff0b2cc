// Shape: the extents of a dense tensor, a small value type with checked access.
// {3,1} and {3} are different shapes; nothing is squeezed or broadcast implicitly here.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace dtrain {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims)
      : Shape(std::span<const std::int64_t>(dims)) {}

  int rank() const { return rank_; }
  // Checked: a bad axis throws InvalidArgument naming the axis and the rank.
  // Negative axes count from the end, as in NumPy.
  std::int64_t operator[](int axis) const { return dims_[normalize_axis(axis)]; }
  void set(int axis, std::int64_t extent);
  int normalize_axis(int axis) const;

  std::int64_t numel() const;
  std::span<const std::int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  std::vector<std::int64_t> to_vector() const { return {dims_.begin(), dims_.begin() + rank_}; }

  // Row-major strides in elements: stride[rank-1] = 1, stride[i] = stride[i+1] * dim[i+1].
  std::array<std::int64_t, kMaxRank> strides() const;

  // The same shape with axis 0 replaced: used when slicing a batch.
  Shape with_dim(int axis, std::int64_t extent) const;

  std::string to_string() const;  // "[64, 1024]"

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// NumPy broadcasting of two shapes; throws InvalidArgument naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Where each element of a tensor of `shape` lands when the axes d with reduced[d] are
// reduced away: its row-major offset among the kept axes' coordinates (a reduction's
// output, or a per-feature statistic), element by element.
std::vector<std::int64_t> reduced_offsets(const Shape& shape, const std::vector<bool>& reduced);

}  // namespace dtrain
