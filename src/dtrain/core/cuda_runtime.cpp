// CUDA's runtime API behind DeviceRuntime. The runtime is linked statically, so a binary
// built with CUDA runs where no driver is installed: count() is then 0, with CUDA's reason.
#include "dtrain/core/cuda_runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "dtrain/core/error.h"

namespace dtrain::detail {

void check_cuda(cudaError_t status, std::string_view call, int device) {
  if (status == cudaSuccess) return;
  // Clears the error where it is not sticky, so the next call does not report it again.
  (void)cudaGetLastError();
  const bool sticky = status == cudaErrorIllegalAddress || status == cudaErrorLaunchFailure ||
                      status == cudaErrorIllegalInstruction || status == cudaErrorMisalignedAddress ||
                      status == cudaErrorHardwareStackError || status == cudaErrorAssert;
  const std::string where = Device::cuda(device).to_string();
  if (status == cudaErrorMemoryAllocation)
    DTRAIN_THROW(ResourceExhausted, "out of memory on ", where, " in ", call, " (", cudaGetErrorName(status), ")");
  // A call that a graph's capture cannot record (a library's synchronous work, say).
  if (status == cudaErrorStreamCaptureUnsupported || status == cudaErrorStreamCaptureInvalidated ||
      status == cudaErrorStreamCaptureImplicit || status == cudaErrorStreamCaptureIsolation ||
      status == cudaErrorStreamCaptureUnjoined || status == cudaErrorCapturedEvent)
    DTRAIN_THROW(NotCapturable, call, " on ", where, " cannot be part of a CUDA graph: ", cudaGetErrorString(status),
                 " (", cudaGetErrorName(status), ")");
  DTRAIN_THROW(DeviceError, "CUDA error on ", where, " in ", call, ": ", cudaGetErrorString(status), " (",
               cudaGetErrorName(status), ")",
               sticky ? "; a kernel queued before this call failed and the device can run nothing more in this "
                        "process (run with CUDA_LAUNCH_BLOCKING=1 to stop at the kernel at fault)"
                      : "");
}

struct CudaRuntime::PerDevice {
  std::once_flag made;  // the stream and the cache
  int index = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<BlockCache> cache;
  DeviceProperties properties;
  std::atomic<std::uint64_t> waits{0};  // host_waits()
  std::once_flag transfer_made;
  cudaStream_t transfer = nullptr;
  // The transfer stream's copies, timed for the trace (trace_copies): queued ones by the
  // event of their end, then their spans once a wait saw them end.
  struct TimedCopy {
    DeviceEvent start, end;
  };
  std::mutex copies_mutex;
  bool timing_copies = false;
  std::vector<TimedCopy> timed;
  std::vector<CopySpan> spans;
  // A graph's capture takes everything queued on the compute stream, from any thread: the
  // capturing thread holds `capture_gate` from begin_capture to end_capture, and another
  // thread's call that queues work there (an input pipeline's event, a copy) holds it
  // shared, so it waits for the capture's end instead of joining the graph.
  std::shared_mutex capture_gate;
  int capture_pool = 0;  // the cache's pool the capture allocates from
};

namespace {

// A captured graph, instantiated; its memory pool closes with it.
struct CudaGraph {
  cudaGraphExec_t exec = nullptr;
  BlockCache* cache = nullptr;
  int pool = 0;
  ~CudaGraph() {
    if (exec) (void)cudaGraphExecDestroy(exec);  // at exit CUDA may be gone before it
    cache->close_pool(pool);
  }
};

}  // namespace

CudaRuntime::CudaRuntime() = default;

CudaRuntime::~CudaRuntime() {
  // Leaked on purpose by cuda_runtime(): tensors in static objects may be freed at exit,
  // after CUDA's own teardown, where a call would fail.
}

void CudaRuntime::probe() {
  std::call_once(probed_, [this] {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      absence_ = std::string("cudaGetDeviceCount says '") + cudaGetErrorString(status) + "' (" +
                 cudaGetErrorName(status) + ")";
      n = 0;
    } else if (n == 0) {
      absence_ = "cudaGetDeviceCount found no CUDA device";
    }
    count_ = n;
    for (int i = 0; i < n; ++i) {
      auto d = std::make_unique<PerDevice>();
      d->index = i;
      cudaDeviceProp p{};
      check_cuda(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties", i);
      d->properties.name = p.name;
      d->properties.total_memory = p.totalGlobalMem;
      d->properties.multiprocessors = p.multiProcessorCount;
      d->properties.compute_capability = p.major * 10 + p.minor;
      static constexpr char kHex[] = "0123456789abcdef";
      for (char b : p.uuid.bytes) {
        d->properties.uuid += kHex[(static_cast<unsigned char>(b) >> 4) & 15];
        d->properties.uuid += kHex[static_cast<unsigned char>(b) & 15];
      }
      devices_.push_back(std::move(d));
    }
  });
}

int CudaRuntime::count() {
  probe();
  return count_;
}

std::string CudaRuntime::absence() {
  probe();
  return absence_;
}

CudaRuntime::PerDevice& CudaRuntime::device(int index) {
  probe();
  if (index < 0 || index >= count_)
    DTRAIN_THROW(InvalidArgument, "device cuda:", index, " is not here; found ", describe_devices(DeviceType::cuda));
  return *devices_[static_cast<std::size_t>(index)];
}

DeviceProperties CudaRuntime::properties(int index) { return device(index).properties; }

void CudaRuntime::use(int index) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice", index);
  if (current != index) check_cuda(cudaSetDevice(index), "cudaSetDevice", index);
}

cudaStream_t CudaRuntime::stream(int index) {
  PerDevice& d = device(index);
  use(index);
  std::call_once(d.made, [this, &d, index] {
    check_cuda(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", index);
    d.cache = std::make_unique<BlockCache>(
        Device::cuda(index).to_string(),
        BlockCache::Source{
            [index](std::size_t bytes) -> void* {
              void* p = nullptr;
              // A graph's capture may need fresh memory: cudaMalloc is not part of the
              // graph, and the block stays the graph's (the cache's pool), so the capture
              // may let it through.
              cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
              (void)cudaThreadExchangeStreamCaptureMode(&mode);
              const cudaError_t status = cudaMalloc(&p, bytes);
              (void)cudaThreadExchangeStreamCaptureMode(&mode);
              if (status == cudaErrorMemoryAllocation) {
                (void)cudaGetLastError();
                return nullptr;
              }
              check_cuda(status, "cudaMalloc", index);
              return p;
            },
            [index](void* p) { check_cuda(cudaFree(p), "cudaFree", index); },
            [index]() -> std::pair<std::size_t, std::size_t> {
              std::size_t free = 0, total = 0;
              check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", index);
              return {free, total};
            },
            [this, &d, index] {
              refuse_while_capturing(index, "freeing the memory cache (the device's memory ran out)");
              ++d.waits;
              check_cuda(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize", index);
            }});
  });
  return d.stream;
}

void* CudaRuntime::allocate(int index, std::size_t bytes) {
  stream(index);  // makes the device current and its cache
  PerDevice& d = device(index);
  if (detail::capturing_device() == index) return d.cache->allocate_in(d.capture_pool, bytes);
  // Its cache may wait for the compute stream (to free blocks when the device is full).
  const auto held = hold_off_capture(index);
  return d.cache->allocate(bytes);
}

void CudaRuntime::deallocate(int index, void* data, std::size_t bytes) {
  device(index).cache->deallocate(data, bytes);
}

DeviceMemoryStats CudaRuntime::memory_stats(int index) {
  stream(index);
  return device(index).cache->stats();
}

void CudaRuntime::release_cached(int index) {
  stream(index);
  device(index).cache->release_cached();
}

void CudaRuntime::set_memory_limit(int index, std::size_t bytes, const std::string& why) {
  stream(index);
  device(index).cache->set_limit(bytes, why);
}

void* CudaRuntime::allocate_host(std::size_t bytes) {
  {
    std::lock_guard lock(host_mutex_);
    if (!host_) {
      host_ = std::make_unique<BlockCache>(
          "pinned host memory",
          BlockCache::Source{
              [](std::size_t n) -> void* {
                void* p = nullptr;
                const cudaError_t status = cudaHostAlloc(&p, n, cudaHostAllocPortable);
                if (status == cudaErrorMemoryAllocation) {
                  (void)cudaGetLastError();
                  return nullptr;
                }
                check_cuda(status, "cudaHostAlloc", 0);
                return p;
              },
              [](void* p) { check_cuda(cudaFreeHost(p), "cudaFreeHost", 0); },
              []() -> std::pair<std::size_t, std::size_t> {
                const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
                return {static_cast<std::size_t>(sysconf(_SC_AVPHYS_PAGES)) * page,
                        static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * page};
              },
              // Pinned blocks are read by copies queued on the devices' streams.
              [this] {
                for (int i = 0; i < count_; ++i) synchronize(i);
              }});
    }
  }
  return host_->allocate(bytes);
}

void CudaRuntime::deallocate_host(void* data, std::size_t bytes) { host_->deallocate(data, bytes); }

namespace {

bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace

void CudaRuntime::copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (dst_device.is_cpu() || src_device.is_cpu()) {
    const int index = dst_device.is_cpu() ? src_device.index : dst_device.index;
    refuse_while_capturing(index, detail::concat("a copy of ", bytes, " bytes from ", src_device.to_string(), " to ",
                                                 dst_device.to_string(), " (the host's side is read now, or wanted now)"));
  } else if (src_device.index != dst_device.index) {
    refuse_while_capturing(src_device.index, "a copy between GPUs");
    refuse_while_capturing(dst_device.index, "a copy between GPUs");
  }
  // Another thread's capture on either device waits (the capturing thread's own copies
  // were refused above, but one within its device, which joins its graph).
  std::shared_lock<std::shared_mutex> held_src, held_dst;
  if (!src_device.is_cpu()) held_src = hold_off_capture(src_device.index);
  if (!dst_device.is_cpu() && !(dst_device == src_device)) held_dst = hold_off_capture(dst_device.index);
  if (dst_device.is_cpu()) {  // device to host: the host wants the values now
    cudaStream_t s = stream(src_device.index);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s),
               detail::concat("cudaMemcpyAsync(device to host, ", bytes, " bytes)"), src_device.index);
    ++device(src_device.index).waits;
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (after a copy to the host)", src_device.index);
    return;
  }
  if (src_device.is_cpu()) {
    // From pageable memory CUDA returns once the bytes are staged, so the source may be
    // reused at once; from pinned memory the copy runs later, so it is waited for.
    cudaStream_t s = stream(dst_device.index);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s),
               detail::concat("cudaMemcpyAsync(host to device, ", bytes, " bytes)"), dst_device.index);
    if (is_pinned(src)) {
      ++device(dst_device.index).waits;
      check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (after a copy from pinned memory)", dst_device.index);
    }
    return;
  }
  if (dst_device.index == src_device.index) {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(dst_device.index)),
               detail::concat("cudaMemcpyAsync(device to device, ", bytes, " bytes)"), dst_device.index);
    return;
  }
  // Between GPUs: after the source's queued work, and done before returning, so that the
  // source's memory may be reused by its own device's next work at once.
  synchronize(src_device.index);
  check_cuda(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, stream(dst_device.index)),
             detail::concat("cudaMemcpyPeerAsync(", src_device.to_string(), " to ", dst_device.to_string(), ", ",
                            bytes, " bytes)"),
             dst_device.index);
  synchronize(dst_device.index);
}

void CudaRuntime::zero(int index, void* data, std::size_t bytes) {
  const auto held = hold_off_capture(index);
  check_cuda(cudaMemsetAsync(data, 0, bytes, stream(index)), detail::concat("cudaMemsetAsync(", bytes, " bytes)"),
             index);
}

void CudaRuntime::synchronize(int index) {
  const auto held = hold_off_capture(index, "synchronize (a wait for the device)");
  ++device(index).waits;
  check_cuda(cudaStreamSynchronize(stream(index)), "cudaStreamSynchronize", index);
}

std::uint64_t CudaRuntime::host_waits(int index) { return device(index).waits.load(); }
void CudaRuntime::count_wait(int index, std::string_view call) {
  refuse_while_capturing(index, call);
  ++device(index).waits;
}

void CudaRuntime::refuse_while_capturing(int index, std::string_view call) {
  if (detail::capturing_device() == index)
    DTRAIN_THROW(NotCapturable, call, " on cuda:", index, " cannot be part of a CUDA graph");
}

bool CudaRuntime::can_capture(int index) { return index >= 0 && index < count(); }

bool CudaRuntime::capturing(int index) { return detail::capturing_device() == index; }

std::shared_lock<std::shared_mutex> CudaRuntime::hold_off_capture(int index, std::string_view refused) {
  if (detail::capturing_device() == index) {
    if (!refused.empty()) refuse_while_capturing(index, refused);
    return {};  // the capturing thread's own work joins the graph
  }
  return std::shared_lock(device(index).capture_gate);
}

void CudaRuntime::begin_capture(int index) {
  cudaStream_t s = stream(index);
  PerDevice& d = device(index);
  if (capturing_a_graph())
    DTRAIN_THROW(InternalError, "begin_capture: this thread is capturing on cuda:", detail::capturing_device(),
                 " already");
  d.capture_gate.lock();
  d.capture_pool = d.cache->open_pool();
  // Thread-local: the input pipeline's thread may still call CUDA (cudaMalloc, copies
  // beside) meanwhile.
  const cudaError_t status = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    d.cache->close_pool(d.capture_pool);
    d.capture_gate.unlock();
    check_cuda(status, "cudaStreamBeginCapture", index);
  }
  detail::set_capturing_device(index);
}

DeviceGraph CudaRuntime::end_capture(int index, bool keep) {
  PerDevice& d = device(index);
  if (detail::capturing_device() != index) DTRAIN_THROW(InternalError, "end_capture: this thread is not capturing on cuda:", index);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(d.stream, &graph);
  detail::set_capturing_device(-1);
  d.capture_gate.unlock();
  (void)cudaGetLastError();  // a call the capture refused left its error behind
  auto owned = std::make_unique<CudaGraph>();
  owned->cache = d.cache.get();
  owned->pool = d.capture_pool;  // closed with `owned`, whatever happens next
  if (!keep) {
    if (graph) (void)cudaGraphDestroy(graph);
    return nullptr;
  }
  if (ended != cudaSuccess || graph == nullptr)
    DTRAIN_THROW(NotCapturable, "CUDA refused to capture the step on cuda:", index, ": ", cudaGetErrorString(ended),
                 " (", cudaGetErrorName(ended), "; a library's call that cannot be recorded)");
  const cudaError_t made = cudaGraphInstantiateWithFlags(&owned->exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    DTRAIN_THROW(NotCapturable, "cudaGraphInstantiate on cuda:", index, ": ", cudaGetErrorString(made), " (",
                 cudaGetErrorName(made), ")");
  }
  return DeviceGraph(owned.release(), [](void* p) { delete static_cast<CudaGraph*>(p); });
}

void CudaRuntime::replay(int index, const DeviceGraph& graph) {
  const auto held = hold_off_capture(index, "a graph's replay");
  check_cuda(cudaGraphLaunch(static_cast<CudaGraph*>(graph.get())->exec, stream(index)), "cudaGraphLaunch", index);
}

cudaStream_t CudaRuntime::transfer_stream(int index) {
  PerDevice& d = device(index);
  use(index);
  std::call_once(d.transfer_made, [&d, index] {
    check_cuda(cudaStreamCreateWithFlags(&d.transfer, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (transfer)",
               index);
  });
  return d.transfer;
}

namespace {

// An event recorded on `stream`, destroyed with its last holder (ignoring a failure then:
// at exit CUDA may be gone before it).
// `flags`: cudaEventDisableTiming, with cudaEventBlockingSync where a thread waits for it (it
// then sleeps instead of spinning on a core the compute threads want).
DeviceEvent record_on(cudaStream_t stream, int index, unsigned flags) {
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags", index);
  DeviceEvent event(static_cast<void*>(e), [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  check_cuda(cudaEventRecord(e, stream), "cudaEventRecord", index);
  return event;
}

}  // namespace

DeviceEvent CudaRuntime::record(int index) {
  const auto held = hold_off_capture(index, "an event recorded on the compute stream");
  return record_on(stream(index), index, cudaEventDisableTiming);
}

DeviceEvent CudaRuntime::copy_beside(int index, void* dst, const void* src, std::size_t bytes,
                                     const DeviceEvent& after) {
  refuse_while_capturing(index, "a copy beside the compute stream");
  cudaStream_t s = transfer_stream(index);
  PerDevice& d = device(index);
  bool timed = false;
  {
    std::lock_guard lock(d.copies_mutex);
    timed = d.timing_copies;
  }
  if (after)
    check_cuda(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(after.get()), 0), "cudaStreamWaitEvent (transfer)",
               index);
  // Timed from after the wait for `after`: the copy's own time.
  const DeviceEvent start = timed ? record_on(s, index, cudaEventDefault) : nullptr;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s),
             detail::concat("cudaMemcpyAsync(host to device beside the compute stream, ", bytes, " bytes)"), index);
  DeviceEvent end = record_on(s, index, timed ? cudaEventBlockingSync : cudaEventDisableTiming | cudaEventBlockingSync);
  if (timed) {
    std::lock_guard lock(d.copies_mutex);
    // Copies nobody waits for are not kept beyond this many: later ones go untimed.
    constexpr std::size_t kMaxTimed = 1024;
    if (d.timing_copies && d.timed.size() < kMaxTimed) d.timed.push_back({start, end});
  }
  return end;
}

void CudaRuntime::wait(int index, const DeviceEvent& event) {
  if (!event) return;
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event.get())), "cudaEventSynchronize", index);
  PerDevice& d = device(index);
  std::lock_guard lock(d.copies_mutex);
  const auto it = std::find_if(d.timed.begin(), d.timed.end(),
                               [&](const PerDevice::TimedCopy& c) { return c.end.get() == event.get(); });
  if (it == d.timed.end()) return;
  const Clock::time_point seen = Clock::now();
  float ms = 0.0f;
  // The trace's figure only: a copy that cannot be timed is left out of it, not an error.
  if (cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(it->start.get()), static_cast<cudaEvent_t>(it->end.get())) ==
      cudaSuccess)
    d.spans.push_back({seen - clock_seconds(static_cast<double>(ms) * 1e-3), seen});
  d.timed.erase(it);
}

void CudaRuntime::trace_copies(int index, bool on) {
  PerDevice& d = device(index);
  std::lock_guard lock(d.copies_mutex);
  d.timing_copies = on;
  if (on) return;
  d.timed.clear();
  d.spans.clear();
}

void CudaRuntime::take_copy_spans(int index, std::vector<CopySpan>& out) {
  PerDevice& d = device(index);
  std::lock_guard lock(d.copies_mutex);
  out.assign(d.spans.begin(), d.spans.end());
  d.spans.clear();
}

DeviceEvent CudaRuntime::record_timed(int index, const DeviceEvent& reuse) {
  const auto held = hold_off_capture(index, "a timed event recorded on the compute stream");
  if (!reuse) return record_on(stream(index), index, cudaEventDefault);
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(reuse.get()), stream(index)), "cudaEventRecord", index);
  return reuse;
}

double CudaRuntime::seconds_between(int index, const DeviceEvent& from, const DeviceEvent& to) {
  wait(index, to);
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from.get()), static_cast<cudaEvent_t>(to.get())),
             "cudaEventElapsedTime", index);
  return static_cast<double>(ms) * 1e-3;
}

CudaRuntime& cuda_runtime() {
  // Leaked on purpose: tensors in static objects may be freed after main returns.
  static CudaRuntime* runtime = new CudaRuntime();
  return *runtime;
}

}  // namespace dtrain::detail
