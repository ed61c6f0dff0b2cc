// Copies host tensors to a device beside its compute stream: an input pipeline's last
// stage (Dataset::prefetch_to_device). Each tensor goes through a page-locked buffer and the
// device's transfer stream into device memory that the staging keeps for itself, in
// buffers it reuses once the compute work that read them has run. stage() returns when
// the copy is done, so it belongs on a background thread: the training thread then finds
// its batch on the device, copied while the step before computed.
#pragma once

#include <cstddef>
#include <memory>

#include "dtrain/core/tensor.h"

namespace dtrain {

class DeviceStaging {
 public:
  explicit DeviceStaging(Device device);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // `t` on the device, its copy done. A tensor already there is returned as it is, and so
  // is a string tensor (strings live on the CPU, whatever the device). Thread-safe; the
  // tensors it returns may be freed on any thread, and after the staging.
  Tensor stage(const Tensor& t);
  // Device buffers made so far. Each is reused for a tensor it fits once the tensor over
  // it is gone; at most 8 wait for reuse, the smallest others going back to the device's
  // cache.
  std::size_t buffers_made() const;

 private:
  struct Ring;
  std::shared_ptr<Ring> ring_;  // shared with the tensors staged, which give their buffer back
};

}  // namespace dtrain
