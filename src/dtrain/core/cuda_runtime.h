// The CUDA runtime behind DeviceRuntime: per device, one compute stream that every kernel,
// copy and zeroing joins in order (and a transfer stream beside it for an input pipeline's
// copies), and a BlockCache of its memory; one cache of pinned host
// memory; CUDA's status codes turned into dtrain's errors. Only code built with the CUDA
// toolkit (DTRAIN_CUDA) includes this header.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/block_cache.h"
#include "dtrain/core/device.h"

namespace dtrain::detail {

// Throws DeviceError naming `call` (with its arguments, as the caller spells them), the
// device and CUDA's own name for `status`, unless it is cudaSuccess. An error that leaves
// the device unusable (an illegal address) says so, with how to find the kernel at fault.
void check_cuda(cudaError_t status, std::string_view call, int device);

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime();
  ~CudaRuntime() override;

  const char* name() const override { return "CUDA"; }
  int count() override;
  std::string absence() override;
  DeviceProperties properties(int index) override;
  void* allocate(int index, std::size_t bytes) override;
  void deallocate(int index, void* data, std::size_t bytes) override;
  DeviceMemoryStats memory_stats(int index) override;
  void release_cached(int index) override;
  void set_memory_limit(int index, std::size_t bytes, const std::string& why) override;
  void* allocate_host(std::size_t bytes) override;
  void deallocate_host(void* data, std::size_t bytes) override;
  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) override;
  void zero(int index, void* data, std::size_t bytes) override;
  void synchronize(int index) override;
  std::uint64_t host_waits(int index) override;
  DeviceEvent record(int index) override;
  DeviceEvent copy_beside(int index, void* dst, const void* src, std::size_t bytes, const DeviceEvent& after) override;
  void wait(int index, const DeviceEvent& event) override;
  DeviceEvent record_timed(int index, const DeviceEvent& reuse) override;
  double seconds_between(int index, const DeviceEvent& from, const DeviceEvent& to) override;
  void trace_copies(int index, bool on) override;
  void take_copy_spans(int index, std::vector<CopySpan>& out) override;
  bool can_capture(int index) override;
  void begin_capture(int index) override;
  DeviceGraph end_capture(int index, bool keep) override;
  bool capturing(int index) override;
  void replay(int index, const DeviceGraph& graph) override;

  // The device's compute stream (made on first use, non-blocking with the legacy stream);
  // also makes the device current on the calling thread.
  cudaStream_t stream(int index);
  // The device's transfer stream (made on first use): copies beside the compute stream.
  cudaStream_t transfer_stream(int index);
  // Counts a wait for the device's compute stream made outside this runtime's own calls
  // (the backend's synchronize), for host_waits(); while the calling thread captures a
  // graph, throws NotCapturable naming `call` instead.
  void count_wait(int index, std::string_view call = "a wait for the device");
  // Throws NotCapturable naming `call` while the calling thread captures on `index`.
  void refuse_while_capturing(int index, std::string_view call);
  // For a call that queues work on the compute stream: while another thread captures on
  // `index`, waits for its capture's end (CUDA would record the work into that graph), and
  // holds the next capture off until the returned lock goes. On the capturing thread the
  // work joins its graph, unless the call is `refused` (named: NotCapturable). Kernels that
  // other threads launch meanwhile are not held off: one thread trains on a device at a time.
  std::shared_lock<std::shared_mutex> hold_off_capture(int index, std::string_view refused = {});
  // Makes `index` the calling thread's current device.
  void use(int index);

 private:
  struct PerDevice;
  PerDevice& device(int index);
  void probe();

  std::once_flag probed_;
  int count_ = 0;
  std::string absence_;
  std::vector<std::unique_ptr<PerDevice>> devices_;
  std::mutex host_mutex_;
  std::unique_ptr<BlockCache> host_;
};

CudaRuntime& cuda_runtime();

}  // namespace dtrain::detail
