// Tensor: a dense, contiguous, row-major array with a Shape and a DType over shared
// storage on one device: 64-byte-aligned host memory from the CPU's caching allocator, or
// a GPU's memory from its runtime's cache (core/device.h). Copying a Tensor copies the
// handle (both refer to the same values and keep the same id); clone() copies the values.
// Host code reads values through data<T>(), which refuses a tensor on another device;
// kernels of that device take device_data<T>(). Copies between devices are explicit: to(),
// copy_from(), to_vector(). It is not differentiable by itself: autograd records
// operations on tensors by id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/allocator.h"
#include "dtrain/core/device.h"
#include "dtrain/core/dtype.h"
#include "dtrain/core/error.h"
#include "dtrain/core/shape.h"

namespace dtrain {

// A block of memory owned by one allocator, freed back to it when the last view goes; or
// memory something else owns (a shared memory segment), kept alive by `owner` as long.
class Storage {
 public:
  // `bytes` on `device`, from its caching allocator; pinned: page-locked host memory
  // (device must be the CPU) that a GPU copies from and to without staging.
  Storage(std::size_t bytes, Device device, bool pinned = false);
  Storage(void* data, std::size_t bytes, std::shared_ptr<const void> owner, Device device);
  // `count` empty strings on the CPU (a string tensor's elements).
  static std::shared_ptr<Storage> strings(std::size_t count);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return source_ == Source::pinned; }

 private:
  enum class Source : std::uint8_t { cpu_cache, device, pinned, owner, strings };
  Storage() = default;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Source source_ = Source::owner;
  DeviceRuntime* runtime_ = nullptr;  // what gave device or pinned memory
  std::shared_ptr<const void> owner_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = {});  // values unset
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = {});
  // A CPU tensor in page-locked memory, which a GPU copies from and to asynchronously (the
  // input pipeline's last stage). Where no GPU runtime is present, ordinary memory.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
  // A tensor over memory that `owner` keeps alive (at least shape's bytes at `data`).
  static Tensor over(void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner,
                     Device device = {});
  static Tensor full(const Shape& shape, float value);
  static Tensor scalar(float value) { return full(Shape{}, value); }
  static Tensor from_vector(const Shape& shape, std::span<const float> values);
  static Tensor from_vector(const Shape& shape, std::span<const std::int32_t> values);
  static Tensor from_vector(const Shape& shape, std::vector<std::string> values);  // a string tensor
  static Tensor from_vector(const Shape& shape, std::initializer_list<float> values) {
    return from_vector(shape, std::span<const float>(values.begin(), values.size()));
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  bool on_cpu() const { return !storage_ || storage_->device().is_cpu(); }
  bool pinned() const { return storage_ && storage_->pinned(); }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t dim(int axis) const { return shape_[axis]; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Identity used by GradientTape: shared by copies of this handle, new for every
  // freshly computed tensor and every view.
  std::uint64_t id() const { return id_; }

  // The values, for host code: a tensor on another device is an InvalidArgument naming it
  // (copy it to the CPU first). A string tensor's are std::string objects: data<std::string>().
  template <typename T>
  T* data() {
    check_dtype(dtype_of<T>(), "data");
    return static_cast<T*>(host_values());
  }
  template <typename T>
  const T* data() const {
    check_dtype(dtype_of<T>(), "data");
    return static_cast<const T*>(host_values());
  }
  // The values as bytes, for code that copies any dtype but string (whose elements are
  // objects, not bytes: such code refuses a string tensor by name).
  void* raw_data() const {
    if (dtype_ == DType::string) refuse_bytes_of_strings();
    return host_values();
  }
  // The values where they are, for the kernels and copies of the tensor's own device.
  template <typename T>
  T* device_data() const {
    check_dtype(dtype_of<T>(), "device_data");
    return static_cast<T*>(values());
  }
  void* raw_device_data() const {
    if (dtype_ == DType::string) refuse_bytes_of_strings();
    return values();
  }

  // Rows [begin, end) along axis 0, sharing storage (no copy).
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // Row i along axis 0 without that axis, sharing storage: `row_shape` must be this
  // tensor's shape minus its first axis (passed in so hot loops build it once).
  Tensor row(std::int64_t i, const Shape& row_shape) const;
  // Same values seen with another shape of equal element count (no copy).
  Tensor reshape(const Shape& shape) const;
  // A copy of the values on the same device.
  Tensor clone() const;
  // The tensor on `device`: this one where it is there already, else a copy.
  Tensor to(Device device) const;
  // A converted copy on the same device (f32 <-> bf16 rounds to nearest even; f32 -> i32
  // truncates; f32 -> u8 truncates into [0, 255]). On a GPU it goes through host memory:
  // not for a training step.
  Tensor astype(DType dtype) const;
  // Copies values from a tensor of the same shape and dtype into this one's storage; the
  // two may be on different devices (an explicit copy between them).
  void copy_from(const Tensor& src);
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }
  // Before an in-place write: where another tensor holds this one's storage (a tape's
  // record of a read, a value kept elsewhere), moves this handle to a copy of the values,
  // keeping its identity, so that the write changes no one else's values.
  void unshare();

  // Any dtype but string, converted to float; a tensor on a GPU is copied to the host first
  // (after the work queued on it).
  std::vector<float> to_vector() const;
  float item() const;                     // the value of a one-element tensor
  std::string to_string(std::int64_t max_values = 16) const;

  void check_dtype(DType expected, const char* op) const;
  void check_defined(const char* op) const;

 private:
  [[noreturn]] void refuse_host_access() const;
  [[noreturn]] void refuse_bytes_of_strings() const;
  void* values() const { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }
  void* host_values() const {
    if (!on_cpu()) refuse_host_access();
    return values();
  }
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
