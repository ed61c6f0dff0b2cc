// Tensor: a dense, contiguous, row-major array with a Shape and a DType over shared,
// 64-byte-aligned storage from the caching allocator. Copying a Tensor copies the handle
// (both refer to the same values and keep the same id); clone() copies the values.
// It is not differentiable by itself: autograd records operations on tensors by id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/allocator.h"
#include "dtrain/core/dtype.h"
#include "dtrain/core/error.h"
#include "dtrain/core/shape.h"

namespace dtrain {

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
  std::string to_string() const;
};

// A block of memory owned by one allocator, freed back to it when the last view goes; or
// memory something else owns (a shared memory segment), kept alive by `owner` as long.
class Storage {
 public:
  Storage(std::size_t bytes, CachingAllocator& allocator, Device device);
  Storage(void* data, std::size_t bytes, std::shared_ptr<const void> owner, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  std::size_t bytes_;
  CachingAllocator* allocator_;  // null: owner_'s memory
  std::shared_ptr<const void> owner_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(const Shape& shape, DType dtype = DType::f32);  // values unset
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  // A tensor over memory that `owner` keeps alive (at least shape's bytes at `data`).
  static Tensor over(void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner);
  static Tensor full(const Shape& shape, float value);
  static Tensor scalar(float value) { return full(Shape{}, value); }
  static Tensor from_vector(const Shape& shape, std::span<const float> values);
  static Tensor from_vector(const Shape& shape, std::span<const std::int32_t> values);
  static Tensor from_vector(const Shape& shape, std::initializer_list<float> values) {
    return from_vector(shape, std::span<const float>(values.begin(), values.size()));
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t dim(int axis) const { return shape_[axis]; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Identity used by GradientTape: shared by copies of this handle, new for every
  // freshly computed tensor and every view.
  std::uint64_t id() const { return id_; }

  template <typename T>
  T* data() {
    check_dtype(dtype_of<T>(), "data");
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    check_dtype(dtype_of<T>(), "data");
    return static_cast<const T*>(raw_data());
  }
  void* raw_data() const {
    return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr;
  }

  // Rows [begin, end) along axis 0, sharing storage (no copy).
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // Row i along axis 0 without that axis, sharing storage: `row_shape` must be this
  // tensor's shape minus its first axis (passed in so hot loops build it once).
  Tensor row(std::int64_t i, const Shape& row_shape) const;
  // Same values seen with another shape of equal element count (no copy).
  Tensor reshape(const Shape& shape) const;
  Tensor clone() const;
  // A converted copy (f32 <-> bf16 rounds to nearest even; f32 -> i32 truncates).
  Tensor astype(DType dtype) const;
  // Copies values from a tensor of the same shape and dtype into this one's storage.
  void copy_from(const Tensor& src);
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
  // Before an in-place write: where another tensor holds this one's storage (a tape's
  // record of a read, a value kept elsewhere), moves this handle to a copy of the values,
  // keeping its identity, so that the write changes no one else's values.
  void unshare();

  std::vector<float> to_vector() const;  // any dtype, converted to float
  float item() const;                     // the value of a one-element tensor
  std::string to_string(std::int64_t max_values = 16) const;

  void check_dtype(DType expected, const char* op) const;
  void check_defined(const char* op) const;

 private:
  Tensor(std::shared_ptr<Storage> storage, std::size_t offset, Shape shape, DType dtype);

  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;  // bytes from the start of storage_
  Shape shape_;
  DType dtype_ = DType::f32;
  std::uint64_t id_ = 0;
};

// Throws InvalidArgument naming `op` and both shapes unless they are equal.
void check_same_shape(const Tensor& a, const Tensor& b, const char* op);

}  // namespace dtrain
