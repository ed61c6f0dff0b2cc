// Tensor construction, views and conversions.
#include "dtrain/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace dtrain {
namespace {

std::uint64_t next_tensor_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

namespace {

DeviceRuntime& runtime_of(Device device) {
  DeviceRuntime* r = device_runtime(device.type);
  if (r == nullptr) check_device(device);  // names what was found
  return *r;
}

}  // namespace

Storage::Storage(std::size_t bytes, Device device, bool pinned)
    : data_(nullptr), bytes_(bytes), source_(Source::cpu_cache), device_(device) {
  if (!device.is_cpu()) {
    check_device(device);
    runtime_ = &runtime_of(device);
    data_ = runtime_->allocate(device.index, bytes);
    source_ = Source::device;
  } else if (DeviceRuntime* r = pinned ? device_runtime(DeviceType::cuda) : nullptr; r && r->count() > 0) {
    runtime_ = r;
    data_ = r->allocate_host(bytes);
    source_ = Source::pinned;
  } else {
    data_ = cpu_allocator().allocate(bytes);
  }
}

Storage::Storage(void* data, std::size_t bytes, std::shared_ptr<const void> owner, Device device)
    : data_(data), bytes_(bytes), source_(Source::owner), owner_(std::move(owner)), device_(device) {}

std::shared_ptr<Storage> Storage::strings(std::size_t count) {
  std::shared_ptr<Storage> s(new Storage);
  s->data_ = new std::string[count];
  s->bytes_ = count * sizeof(std::string);
  s->source_ = Source::strings;
  return s;
}

Storage::~Storage() {
  switch (source_) {
    case Source::cpu_cache: cpu_allocator().deallocate(data_, bytes_); break;
    case Source::device: runtime_->deallocate(device_.index, data_, bytes_); break;
    case Source::pinned: runtime_->deallocate_host(data_, bytes_); break;
    case Source::owner: break;
    case Source::strings: delete[] static_cast<std::string*>(data_); break;
  }
}

Tensor::Tensor(std::shared_ptr<Storage> storage, std::size_t offset, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(offset), shape_(shape), dtype_(dtype), id_(next_tensor_id()) {}

namespace {

// A tensor's bytes, refused where they pass what memory can address (a wrapped count would
// allocate a few bytes and write far beyond them).
std::size_t bytes_of(const Shape& shape, DType dtype) {
  const auto numel = static_cast<std::size_t>(shape.numel());
  if (numel > std::numeric_limits<std::size_t>::max() / 2 / dtype_size(dtype))
    DTRAIN_THROW(ResourceExhausted, "a ", dtype_name(dtype), " tensor of shape ", shape.to_string(),
                 " holds more bytes than memory can address");
  return numel * dtype_size(dtype);
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const std::size_t bytes = bytes_of(shape, dtype);
  if (dtype == DType::string) {
    if (!device.is_cpu())
      DTRAIN_THROW(InvalidArgument, "a string tensor of shape ", shape.to_string(), " cannot be on ", device.to_string(),
                   ": strings live on the CPU (turn them into numbers, with a tokenizer or TextVectorization, first)");
    return Tensor(Storage::strings(bytes / sizeof(std::string)), 0, shape, dtype);
  }
  return Tensor(std::make_shared<Storage>(bytes, device), 0, shape, dtype);
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  if (dtype == DType::string) return empty(shape, dtype);
  const std::size_t bytes = bytes_of(shape, dtype);
  return Tensor(std::make_shared<Storage>(bytes, Device{}, /*pinned=*/true), 0, shape, dtype);
}

Tensor Tensor::over(void* data, const Shape& shape, DType dtype, std::shared_ptr<const void> owner, Device device) {
  DTRAIN_CHECK(dtype != DType::string);  // strings are objects another owner cannot lay out
  const std::size_t bytes = bytes_of(shape, dtype);
  return Tensor(std::make_shared<Storage>(data, bytes, std::move(owner), device), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (dtype == DType::string) return t;  // empty strings
  if (device.is_cpu()) std::memset(t.raw_data(), 0, t.nbytes());
  else if (t.nbytes()) runtime_of(device).zero(device.index, t.raw_device_data(), t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::f32);
  float* p = t.data<float>();
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = value;
  return t;
}

namespace {

template <typename T>
Tensor tensor_from_values(const Shape& shape, std::span<const T> values) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel())
    DTRAIN_THROW(InvalidArgument, "Tensor::from_vector: ", values.size(), " values given for shape ",
                 shape.to_string(), " which holds ", shape.numel());
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

}  // namespace

Tensor Tensor::from_vector(const Shape& shape, std::span<const float> values) {
  return tensor_from_values(shape, values);
}

Tensor Tensor::from_vector(const Shape& shape, std::span<const std::int32_t> values) {
  return tensor_from_values(shape, values);
}

Tensor Tensor::from_vector(const Shape& shape, std::vector<std::string> values) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel())
    DTRAIN_THROW(InvalidArgument, "Tensor::from_vector: ", values.size(), " strings given for shape ",
                 shape.to_string(), " which holds ", shape.numel());
  Tensor t = empty(shape, DType::string);
  std::move(values.begin(), values.end(), t.data<std::string>());
  return t;
}

void Tensor::refuse_bytes_of_strings() const {
  DTRAIN_THROW(InvalidArgument, "a string tensor of shape ", shape_.to_string(),
               " holds strings, not bytes a numeric operation or a copy of raw memory can use (turn them into numbers, "
               "with a tokenizer or TextVectorization, first)");
}

void Tensor::refuse_host_access() const {
  DTRAIN_THROW(InvalidArgument, "a ", dtype_name(dtype_), " tensor of shape ", shape_.to_string(), " is on ",
               device().to_string(), ", where host code cannot read or write it; copy it to the CPU first (to(cpu))");
}

void Tensor::check_defined(const char* op) const {
  if (!defined()) DTRAIN_THROW(InvalidArgument, op, ": the tensor is undefined (empty handle)");
}

void Tensor::check_dtype(DType expected, const char* op) const {
  check_defined(op);
  if (dtype_ != expected)
    DTRAIN_THROW(InvalidArgument, op, ": expected a ", dtype_name(expected), " tensor, got ",
                 dtype_name(dtype_), " with shape ", shape_.to_string());
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  check_defined("Tensor::slice");
  if (rank() == 0) DTRAIN_THROW(InvalidArgument, "Tensor::slice: cannot slice a scalar");
  const std::int64_t n = shape_[0];
  if (begin < 0 || end < begin || end > n)
    DTRAIN_THROW(InvalidArgument, "Tensor::slice: rows [", begin, ", ", end,
                 ") are out of range for shape ", shape_.to_string());
  const std::size_t row_bytes = n == 0 ? 0 : nbytes() / static_cast<std::size_t>(n);
  return Tensor(storage_, offset_ + static_cast<std::size_t>(begin) * row_bytes,
                shape_.with_dim(0, end - begin), dtype_);
}

Tensor Tensor::row(std::int64_t i, const Shape& row_shape) const {
  check_defined("Tensor::row");
  if (rank() == 0 || i < 0 || i >= shape_[0])
    DTRAIN_THROW(InvalidArgument, "Tensor::row: row ", i, " is out of range for shape ", shape_.to_string());
  if (row_shape.numel() * shape_[0] != numel())
    DTRAIN_THROW(InvalidArgument, "Tensor::row: row shape ", row_shape.to_string(), " does not fit shape ", shape_.to_string());
  const std::size_t row_bytes = static_cast<std::size_t>(row_shape.numel()) * dtype_size(dtype_);
  return Tensor(storage_, offset_ + static_cast<std::size_t>(i) * row_bytes, row_shape, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  check_defined("Tensor::reshape");
  if (shape.numel() != numel())
    DTRAIN_THROW(InvalidArgument, "Tensor::reshape: cannot view shape ", shape_.to_string(), " (",
                 numel(), " values) as ", shape.to_string(), " (", shape.numel(), " values)");
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::clone() const {
  check_defined("Tensor::clone");
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device target) const {
  check_defined("Tensor::to");
  if (device() == target) return *this;
  Tensor t = empty(shape_, dtype_, target);
  t.copy_from(*this);
  return t;
}

void Tensor::unshare() {
  if (!storage_ || storage_.use_count() == 1) return;
  Tensor own = clone();
  storage_ = std::move(own.storage_);
  offset_ = 0;
}

void Tensor::copy_from(const Tensor& src) {
  check_defined("Tensor::copy_from");
  src.check_dtype(dtype_, "Tensor::copy_from");
  check_same_shape(*this, src, "Tensor::copy_from");
  if (dtype_ == DType::string) {
    const std::string* from = src.data<std::string>();
    std::string* to = data<std::string>();
    if (from == to) return;
    if (to > from && to < from + numel()) std::copy_backward(from, from + numel(), to + numel());  // overlapping views
    else std::copy(from, from + numel(), to);
    return;
  }
  if (nbytes() == 0 || raw_device_data() == src.raw_device_data()) return;
  if (on_cpu() && src.on_cpu()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  const Device other = on_cpu() ? src.device() : device();
  runtime_of(other).copy(raw_device_data(), device(), src.raw_device_data(), src.device(), nbytes());
}

Tensor Tensor::astype(DType dtype) const {
  check_defined("Tensor::astype");
  if (dtype == dtype_) return clone();
  if (dtype == DType::string || dtype_ == DType::string)
    DTRAIN_THROW(InvalidArgument, "Tensor::astype: a ", dtype_name(dtype_), " tensor of shape ", shape_.to_string(),
                 " cannot become ", dtype_name(dtype), " (strings and numbers do not convert into each other)");
  if (!on_cpu()) return to(Device::cpu()).astype(dtype).to(device());
  Tensor out = empty(shape_, dtype);
  const std::int64_t n = numel();
  if (dtype_ == DType::f32 && dtype == DType::bf16) {
    const float* s = data<float>();
    bfloat16* d = out.data<bfloat16>();
    for (std::int64_t i = 0; i < n; ++i) d[i] = bfloat16(s[i]);
  } else if (dtype_ == DType::f32 && dtype == DType::f16) {
    to_f16(data<float>(), static_cast<std::uint16_t*>(out.raw_data()), static_cast<std::size_t>(n));
  } else if (dtype == DType::f32) {
    std::vector<float> v = to_vector();
    if (n) std::memcpy(out.raw_data(), v.data(), out.nbytes());
  } else if (dtype_ == DType::f32 && dtype == DType::i32) {
    const float* s = data<float>();
    std::int32_t* d = out.data<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<std::int32_t>(s[i]);
  } else if (dtype_ == DType::f32 && dtype == DType::u8) {  // truncated and kept in [0, 255]
    const float* s = data<float>();
    std::uint8_t* d = out.data<std::uint8_t>();
    for (std::int64_t i = 0; i < n; ++i)
      d[i] = static_cast<std::uint8_t>(std::clamp(std::isnan(s[i]) ? 0.0f : s[i], 0.0f, 255.0f));
  } else {
    return astype(DType::f32).astype(dtype);
  }
  return out;
}

std::vector<float> Tensor::to_vector() const {
  check_defined("Tensor::to_vector");
  if (!on_cpu()) return to(Device::cpu()).to_vector();
  const std::int64_t n = numel();
  std::vector<float> v(static_cast<std::size_t>(n));
  switch (dtype_) {
    case DType::f32:
      if (n) std::memcpy(v.data(), raw_data(), nbytes());
      break;
    case DType::bf16: {
      const bfloat16* s = data<bfloat16>();
      for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(s[i]);
      break;
    }
    case DType::f16:
      from_f16(static_cast<const std::uint16_t*>(raw_data()), v.data(), static_cast<std::size_t>(n));
      break;
    case DType::i32: {
      const std::int32_t* s = data<std::int32_t>();
      for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(s[i]);
      break;
    }
    case DType::u8: {
      const std::uint8_t* s = data<std::uint8_t>();
      for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(s[i]);
      break;
    }
    case DType::string: refuse_bytes_of_strings();
  }
  return v;
}

float Tensor::item() const {
  check_defined("Tensor::item");
  if (numel() != 1)
    DTRAIN_THROW(InvalidArgument, "Tensor::item: the tensor has shape ", shape_.to_string(),
                 ", not exactly one value");
  return to_vector()[0];
}

std::string Tensor::to_string(std::int64_t max_values) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(" << dtype_name(dtype_) << ", " << shape_.to_string() << ", [";
  if (dtype_ == DType::string) {
    const std::string* v = data<std::string>();
    for (std::int64_t i = 0; i < numel() && i < max_values; ++i) out << (i ? ", " : "") << '"' << v[i] << '"';
    if (numel() > max_values) out << ", ...";
    out << "])";
    return out.str();
  }
  std::vector<float> v = to_vector();
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(v.size()) && i < max_values; ++i)
    out << (i ? ", " : "") << v[i];
  if (static_cast<std::int64_t>(v.size()) > max_values) out << ", ...";
  out << "])";
  return out.str();
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (!(a.shape() == b.shape()))
    DTRAIN_THROW(InvalidArgument, op, ": shapes ", a.shape().to_string(), " and ",
                 b.shape().to_string(), " differ");
}

}  // namespace dtrain
