#include "dtrain/core/device_staging.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "dtrain/core/error.h"

namespace dtrain {

// The buffers of one device. A buffer given back carries the point of the compute stream
// after which nothing reads it; the next copy into it waits for that point on the device
// (the host does not wait).
struct DeviceStaging::Ring {
  struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    DeviceEvent released;
  };

  Device device;
  DeviceRuntime* runtime = nullptr;
  std::mutex mutex;  // guards free and made, held briefly (the training thread gives back)
  std::vector<Buffer> free;
  std::size_t made = 0;
  std::mutex copying;  // one copy at a time, through `pinned`
  Tensor pinned;       // the page-locked bounce buffer (u8), grown as needed

  ~Ring() {
    for (const Buffer& b : free) drop(b);
  }

  // The smallest free buffer of at least `bytes`, or a new one (which waits for the compute
  // work queued so far: the device's cache lent its memory to work queued in that order).
  Buffer take(std::size_t bytes) {
    std::unique_lock lock(mutex);
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->bytes >= bytes && (best == free.end() || it->bytes < best->bytes)) best = it;
    if (best != free.end()) {
      Buffer b = std::move(*best);
      free.erase(best);
      return b;
    }
    lock.unlock();
    Buffer b{runtime->allocate(device.index, std::max<std::size_t>(bytes, 1)), std::max<std::size_t>(bytes, 1), {}};
    try {
      b.released = runtime->record(device.index);
    } catch (...) {
      runtime->deallocate(device.index, b.data, b.bytes);
      throw;
    }
    lock.lock();
    ++made;
    return b;
  }

  // A buffer the staging will not use again goes back to the device's cache (which lends
  // it only to compute work queued after the work that read it).
  void drop(const Buffer& b) noexcept {
    try {
      runtime->deallocate(device.index, b.data, b.bytes);
    } catch (...) {
    }
  }

  // Called when the last view of a staged tensor goes, on whatever thread that is.
  // At most kKept buffers wait for reuse; beyond them the smallest goes back to the cache
  // (batches of changing sizes would otherwise leave ever more small ones behind).
  static constexpr std::size_t kKept = 8;
  void give_back(Buffer b) noexcept {
    Buffer spare;
    try {
      b.released = runtime->record(device.index);
    } catch (...) {
      drop(b);  // the device failed
      return;
    }
    {
      std::lock_guard lock(mutex);
      free.push_back(std::move(b));
      if (free.size() <= kKept) return;
      auto smallest = std::min_element(free.begin(), free.end(),
                                       [](const Buffer& x, const Buffer& y) { return x.bytes < y.bytes; });
      spare = std::move(*smallest);
      free.erase(smallest);
    }
    drop(spare);
  }
};

DeviceStaging::DeviceStaging(Device device) : ring_(std::make_shared<Ring>()) {
  check_device(device);
  if (device.is_cpu()) DTRAIN_THROW(InvalidArgument, "prefetch_to_device: stages tensors to a GPU, not to the CPU");
  ring_->device = device;
  ring_->runtime = device_runtime(device.type);
}

DeviceStaging::~DeviceStaging() = default;

std::size_t DeviceStaging::buffers_made() const {
  std::lock_guard lock(ring_->mutex);
  return ring_->made;
}

Tensor DeviceStaging::stage(const Tensor& t) {
  t.check_defined("prefetch_to_device");
  Ring& r = *ring_;
  if (t.device() == r.device) return t;
  if (t.dtype() == DType::string) return t;  // strings live on the CPU, for every device
  if (!t.on_cpu()) return t.to(r.device);
  const std::size_t bytes = t.nbytes();
  std::unique_lock lock(r.copying);
  if (bytes > 0 && (!r.pinned.defined() || r.pinned.nbytes() < bytes))
    r.pinned = Tensor::empty_pinned({static_cast<std::int64_t>(bytes)}, DType::u8);
  Ring::Buffer b = r.take(bytes);
  if (bytes > 0) {
    std::memcpy(r.pinned.raw_data(), t.raw_data(), bytes);
    try {
      r.runtime->wait(r.device.index, r.runtime->copy_beside(r.device.index, b.data, r.pinned.raw_data(), bytes,
                                                             b.released));
    } catch (...) {
      r.drop(b);  // a copy may still be under way into it: not reused by the staging
      throw;
    }
  }
  lock.unlock();
  b.released.reset();
  // The tensor owns the buffer: the ring takes it back when the last view goes.
  auto holder = std::shared_ptr<void>(b.data, [ring = ring_, b](void*) mutable { ring->give_back(std::move(b)); });
  return Tensor::over(b.data, t.shape(), t.dtype(), std::move(holder), r.device);
}

}  // namespace dtrain
