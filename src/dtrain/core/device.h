// Devices: where a tensor's values live (the CPU or a CUDA GPU), TensorFlow's names for
// them, the runtime behind each kind of non-CPU device (its memory, copies to and from it,
// the order of the work queued on it), and where new weights are placed. It holds no
// kernels: computing on a device is kernels/'s business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/clock.h"

namespace dtrain {

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // always 0 for the CPU: its memory is one

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
  // "cpu:0", "cuda:1" (PyTorch's spelling, used in dtrain's messages).
  std::string to_string() const;
  // "/device:CPU:0", "/device:GPU:1" (TensorFlow's).
  std::string tf_name() const;
};

// A device named as TensorFlow or PyTorch names it: "/GPU:0", "/gpu:0", "GPU:0", "gpu",
// "cuda", "cuda:1", "/device:GPU:1", "/job:localhost/replica:0/task:0/device:GPU:0", and the
// same for the CPU ("/cpu:0", "cpu", ...). Every CPU index names the CPU's one memory, cpu:0.
// Where a GPU is split into logical GPUs (set_logical_device_configuration), TensorFlow's
// GPU names count logical GPUs and give the physical GPU under them; "cuda:N" and
// "/physical_device:GPU:N" always name physical GPUs. Whether the device exists is not
// checked here (check_device), except a logical GPU's number. Throws InvalidArgument
// naming the text.
Device parse_device(std::string_view name);

// TensorFlow's tf.config.LogicalDeviceConfiguration: one logical GPU carved out of a
// physical one, as TensorFlow users test multi-GPU code on one GPU.
struct LogicalDeviceConfiguration {
  std::size_t memory_limit_mb = 0;  // its memory in MiB, as TensorFlow counts it; 0: none of its own
};

// tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(...)] * N):
// the physical GPU `gpu` becomes N logical GPUs, numbered after those of the GPUs before
// it ("/gpu:0" ... "/gpu:N-1" on the first GPU). They share the GPU's memory, which its
// cache then holds no more of than the sum of their memory_limit (where each has one);
// MirroredStrategy's replicas on them share one copy of the weights and sum their
// gradients on the device. An empty list makes the GPU one device again. Unlike
// TensorFlow, it may be called at any time: names parsed afterwards follow it, and a
// strategy keeps the devices it was made with. InvalidArgument where the GPU is not here,
// the limits add up to more than the GPU has, or its tensors hold more already.
//
// Process-wide, as TensorFlow's tf.config is: device names are parsed in every layer, by
// code that has no configuration to pass on (docs/architecture.md lists it).
void set_logical_device_configuration(Device gpu, const std::vector<LogicalDeviceConfiguration>& logical);
// What was set for `gpu` (empty: it is one device).
std::vector<LogicalDeviceConfiguration> logical_device_configuration(Device gpu);

// One logical GPU, as TensorFlow's list_logical_devices("GPU") lists them in order.
struct LogicalGpu {
  Device physical;
  int part = 0;   // its place among the logical GPUs of `physical`
  int parts = 1;  // how many `physical` was split into
  std::size_t memory_limit = 0;  // bytes; 0: none of its own
};
// Every GPU's logical GPUs in order: a GPU not split is one.
std::vector<LogicalGpu> logical_gpus();

struct DeviceProperties {
  std::string name;                // "NVIDIA H200"
  std::size_t total_memory = 0;    // bytes
  int multiprocessors = 0;
  int compute_capability = 0;      // 90 for 9.0 (Hopper)
  // The GPU's UUID in hex, the same in every process that sees it (whatever its index
  // there); empty where the runtime has none (the tests' stand-in).
  std::string uuid;
};

// A device's memory as its caching allocator sees it.
struct DeviceMemoryStats {
  std::size_t bytes_in_use = 0;       // handed out to live tensors
  std::size_t bytes_cached = 0;       // held by the cache for reuse, not in use
  std::size_t peak_bytes_in_use = 0;
  std::size_t device_free = 0;        // the device's own count of free bytes
  std::size_t device_total = 0;
  std::uint64_t device_allocations = 0;  // calls that reached the device's allocator
  std::uint64_t allocations = 0;         // all allocations
};

// A point in a device's queued work, to wait for; null where the runtime has nothing to
// wait for (its work is done when queued).
using DeviceEvent = std::shared_ptr<void>;

// A device's work recorded once and queued again whole (a CUDA graph): a training step's
// hundreds of kernel launches become one. Null where nothing was recorded.
using DeviceGraph = std::shared_ptr<void>;

// A copy to a device on its transfer stream, placed on the host's clock for the trace.
struct CopySpan {
  Clock::time_point begin, end;
};

// The runtime behind one kind of device. Work for a device is queued in order (one queue a
// device: its compute stream); copies and zeroing join that order. Every call names the
// device by index; errors name the device and the call that failed.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual const char* name() const = 0;  // "CUDA"
  virtual int count() = 0;
  // Why count() is 0, in one line (empty when it is not 0).
  virtual std::string absence() = 0;
  virtual DeviceProperties properties(int index) = 0;
  // At least `bytes` of the device's memory; a ResourceExhausted naming the bytes asked,
  // in use, cached and free, and the current allocation tag (a layer) when it cannot.
  virtual void* allocate(int index, std::size_t bytes) = 0;
  // Returns memory to the cache; work already queued that uses it may still run (the
  // cache hands it out again only to work queued after it).
  virtual void deallocate(int index, void* data, std::size_t bytes) = 0;
  virtual DeviceMemoryStats memory_stats(int index) = 0;
  // Gives the cache's unused memory back to the device.
  virtual void release_cached(int index) = 0;
  // At most `bytes` of the device's memory held by its cache at once (0: no limit): the sum
  // of its logical GPUs' memory_limit. An allocation beyond it fails as on a full device,
  // saying `why`. InvalidArgument where live tensors hold more already.
  virtual void set_memory_limit(int index, std::size_t bytes, const std::string& why) = 0;
  // Page-locked host memory, which the devices copy from and to without staging (cached
  // too); deallocate_host takes what allocate_host gave, with its size.
  virtual void* allocate_host(std::size_t bytes) = 0;
  virtual void deallocate_host(void* data, std::size_t bytes) = 0;
  // Copies `bytes` between any two of the CPU and this runtime's devices, after the work
  // queued on the device before it; returns once the host memory involved may be read or
  // reused.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) = 0;
  // Sets `bytes` at `data` to zero, queued on the device.
  virtual void zero(int index, void* data, std::size_t bytes) = 0;
  // Waits for everything queued on the device.
  virtual void synchronize(int index) = 0;
  // How many times the host has waited for the device's queued work so far (a copy to the
  // host, a copy from pinned memory, synchronize): a step that waits cannot run ahead of
  // the device, nor be captured whole as a CUDA graph.
  virtual std::uint64_t host_waits(int index) = 0;

  // The point that the work queued so far on the device's compute stream reaches.
  virtual DeviceEvent record(int index) = 0;
  // Copies `bytes` of page-locked host memory (allocate_host's) to the device on its
  // transfer stream, which runs beside the compute stream: an input pipeline's copy
  // overlaps the step before. The copy starts once `after` has run (the compute work that
  // last read dst; null: at once). Returns the copy's end.
  virtual DeviceEvent copy_beside(int index, void* dst, const void* src, std::size_t bytes,
                                  const DeviceEvent& after) = 0;
  // The calling thread waits until `event` has run. A prefetching thread's wait for its own
  // copy, not counted in host_waits.
  virtual void wait(int index, const DeviceEvent& event) = 0;
  // A point of the compute stream that also keeps the time the device reached it, for
  // the profile's GPU track. `reuse` (one record_timed gave, on this device, that has run)
  // is recorded again and returned, so that a step's marks make no new events.
  virtual DeviceEvent record_timed(int index, const DeviceEvent& reuse) = 0;
  // Seconds the device took from `from` to `to` (record_timed's, `to` recorded later);
  // waits for `to` where it has not run yet.
  virtual double seconds_between(int index, const DeviceEvent& from, const DeviceEvent& to) = 0;
  // For the trace: while on, copy_beside times each of its copies on the device, and
  // take_copy_spans() gives those whose wait() has returned since its last call, each
  // ending where its wait saw it end and as long as the device took (it may have waited
  // for `after` before starting). Off, it forgets what it timed and not taken.
  virtual void trace_copies(int /*index*/, bool /*on*/) {}
  virtual void take_copy_spans(int /*index*/, std::vector<CopySpan>& out) { out.clear(); }

  // Graphs. While the calling thread captures (begin_capture to end_capture), the work it
  // queues on the device's compute stream is recorded, not run, and the memory it
  // allocates is the graph's own (a BlockCache pool): each replay writes to it again, so
  // nothing else gets it while the graph lives. A call that would make the host wait for
  // the device, copy between the device and the host, or record an event on the compute
  // stream throws NotCapturable naming the call. Other threads (an input pipeline's copies
  // beside) go on as before.
  virtual bool can_capture(int /*index*/) { return false; }
  virtual void begin_capture(int index);
  // Ends the calling thread's capture: the graph, ready to replay; null where `keep` is
  // false (abandoned after an error: its memory goes back). A capture the device itself
  // refused (a library's call it cannot record) throws NotCapturable with its reason.
  virtual DeviceGraph end_capture(int index, bool keep);
  // Whether the calling thread is capturing on the device.
  virtual bool capturing(int /*index*/) { return false; }
  // Queues the graph's work on the compute stream, as it was recorded.
  virtual void replay(int index, const DeviceGraph& graph);
};

// The runtime of `type`'s devices: null for the CPU and where this build has none.
DeviceRuntime* device_runtime(DeviceType type);
// Replaces the runtime of `type` until called again with null (the build's own again):
// the tests' stand-in GPU over host memory. Not thread-safe against tensors in use.
void set_device_runtime(DeviceType type, DeviceRuntime* runtime);

// Whether the calling thread is capturing a graph on any device: work whose values the
// host draws at each call (a dropout mask's seed) must refuse to be recorded then.
bool capturing_a_graph();

// How many devices of `type` this process can use (1 for the CPU).
int device_count(DeviceType type);
// One line on what was found: "cuda:0 (NVIDIA H200, 139.7 GiB, compute capability 9.0)",
// or why there is no GPU ("no GPU: this build of dtrain has no CUDA backend").
std::string describe_devices(DeviceType type);
// Throws InvalidArgument naming what was found unless `device` exists.
void check_device(Device device);

// "cpu", "gpu" or "auto" (also any name parse_device takes): auto is the first GPU where
// one is present, else the CPU, as TensorFlow places its variables and ops by default.
// Asking for a GPU where there is none is an InvalidArgument naming what was found.
Device resolve_device(std::string_view spec);

// Where new weights are created and where fit() trains: the calling thread's placement,
// TensorFlow's `with tf.device(...)`. It is ambient state, not a parameter, because layers
// create their weights lazily, at their first call, deep inside code (a model's call, a
// functional graph's build) that has no device to pass on; docs/architecture.md lists it.
// The innermost DevicePlacement guard's device on this thread; where there is none, the
// process's default placement.
Device placement();

// The placement of threads without a guard, as resolve_device takes it ("cpu", "auto",
// "/GPU:0", ...): the CPU unless set. The dtrain command and the Python package set "auto",
// TensorFlow's default; "auto" is resolved when a placement is first asked for.
void set_default_placement(std::string_view spec);

namespace detail {
// The GPU the calling thread captures a graph on (-1: none): set by its runtime from
// begin_capture to end_capture, and read by the runtime and by capturing_a_graph().
int capturing_device();
void set_capturing_device(int index);
// Sets the calling thread's guarded placement (nullopt: no guard) and returns the one it
// replaces: for scopes that are not a DevicePlacement object (a strategy's scope()).
std::optional<Device> exchange_placement(std::optional<Device> device);
}  // namespace detail

class DevicePlacement {
 public:
  explicit DevicePlacement(Device device);
  ~DevicePlacement();
  DevicePlacement(const DevicePlacement&) = delete;
  DevicePlacement& operator=(const DevicePlacement&) = delete;

 private:
  Device saved_;
  bool saved_set_;
};

}  // namespace dtrain
