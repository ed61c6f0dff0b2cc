// The machine's NCCL behind NcclApi: libnccl.so.2 opened at the first call (a binary runs
// where it is missing), nonblocking communicators, collectives on the device's compute
// stream with an event after each, which done() queries.
#include "dtrain/comm/nccl_group.h"

#include <atomic>

#if DTRAIN_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <iterator>
#include <mutex>

#include "dtrain/core/cuda_runtime.h"
#endif

#include "dtrain/core/error.h"

namespace dtrain::comm {

#if DTRAIN_CUDA
namespace {

// The library's functions dtrain calls.
struct Functions {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
};

// What NcclApi's `void* comm` points at: the communicator, its device, and the event after
// its last collective.
struct Comm {
  ncclComm_t comm = nullptr;
  int device = 0;
  cudaEvent_t done = nullptr;
  // The collectives queued beside the compute stream: their stream (made at the first),
  // and the compute stream's point they start after.
  cudaStream_t side = nullptr;
  cudaEvent_t ready = nullptr;
};

template <typename F>
void bind(void* handle, const char* symbol, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, symbol));
  if (out == nullptr) DTRAIN_THROW(Unsupported, "libnccl.so.2 has no ", symbol, " (older than NCCL 2.14?)");
}

int check_cuda(cudaError_t e) { return e == cudaSuccess ? kNcclSuccess : kNcclUnhandledCudaError; }

}  // namespace

static const NcclApi* machine_nccl(std::string* absence) {
  static Functions f;
  static NcclApi api;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    try {
      dlerror();
      void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* why = dlerror();
        DTRAIN_THROW(Unsupported, "libnccl.so.2 could not be loaded: ", why ? why : "no reason given");
      }
      bind(h, "ncclGetUniqueId", f.get_unique_id);
      bind(h, "ncclCommInitRankConfig", f.init_rank_config);
      bind(h, "ncclCommGetAsyncError", f.get_async_error);
      bind(h, "ncclAllReduce", f.all_reduce);
      bind(h, "ncclCommAbort", f.abort);
      bind(h, "ncclCommDestroy", f.destroy);
      bind(h, "ncclGetErrorString", f.error_string);
      bind(h, "ncclGetLastError", f.last_error);
    } catch (const Error& e) {
      failure = e.what();
      return;
    }
    api.get_unique_id = [](NcclApi::Id& id) {
      ncclUniqueId u;
      const ncclResult_t r = f.get_unique_id(&u);
      static_assert(sizeof u.internal == std::tuple_size_v<NcclApi::Id>);
      std::copy(std::begin(u.internal), std::end(u.internal), id.begin());
      return static_cast<int>(r);
    };
    api.init = [](void*& comm, int ranks, const NcclApi::Id& id, int rank, int device) {
      auto* c = new Comm;
      c->device = device;
      comm = c;
      (void)dtrain::detail::cuda_runtime().stream(device);  // makes the device current
      if (const int r = check_cuda(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming)); r != kNcclSuccess)
        return r;
      ncclUniqueId u;
      std::copy(id.begin(), id.end(), std::begin(u.internal));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // every wait is the caller's, bounded
      return static_cast<int>(f.init_rank_config(&c->comm, ranks, u, rank, &config));
    };
    api.async_error = [](void* comm, int& state) {
      ncclResult_t s = ncclSuccess;
      const ncclResult_t r = f.get_async_error(static_cast<Comm*>(comm)->comm, &s);
      state = static_cast<int>(s);
      return static_cast<int>(r);
    };
    api.all_reduce = [](void* comm, float* data, std::size_t count, int device) {
      auto* c = static_cast<Comm*>(comm);
      cudaStream_t stream = dtrain::detail::cuda_runtime().stream(device);
      return static_cast<int>(f.all_reduce(data, data, count, ncclFloat32, ncclSum, c->comm, stream));
    };
    api.all_reduce_beside = [](void* comm, float* data, std::size_t count, int device) {
      auto* c = static_cast<Comm*>(comm);
      cudaStream_t compute = dtrain::detail::cuda_runtime().stream(device);
      if (c->side == nullptr) {
        if (const int r = check_cuda(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking)); r != kNcclSuccess)
          return r;
        if (const int r = check_cuda(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming)); r != kNcclSuccess)
          return r;
      }
      if (const int r = check_cuda(cudaEventRecord(c->ready, compute)); r != kNcclSuccess) return r;
      if (const int r = check_cuda(cudaStreamWaitEvent(c->side, c->ready, 0)); r != kNcclSuccess) return r;
      return static_cast<int>(f.all_reduce(data, data, count, ncclFloat32, ncclSum, c->comm, c->side));
    };
    api.record = [](void* comm, int device, bool beside) {
      auto* c = static_cast<Comm*>(comm);
      return check_cuda(cudaEventRecord(c->done, beside ? c->side : dtrain::detail::cuda_runtime().stream(device)));
    };
    api.join = [](void* comm, int device) {
      cudaStream_t compute = dtrain::detail::cuda_runtime().stream(device);
      return check_cuda(cudaStreamWaitEvent(compute, static_cast<Comm*>(comm)->done, 0));
    };
    api.done = [](void* comm, std::string& why) {
      const cudaError_t e = cudaEventQuery(static_cast<Comm*>(comm)->done);
      if (e == cudaSuccess) return 0;
      if (e == cudaErrorNotReady) return 1;
      why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      return -1;
    };
    auto end = [](void* comm, bool abort) {
      auto* c = static_cast<Comm*>(comm);
      const ncclResult_t r = c->comm == nullptr ? ncclSuccess : abort ? f.abort(c->comm) : f.destroy(c->comm);
      if (c->done != nullptr) (void)cudaEventDestroy(c->done);
      if (c->ready != nullptr) (void)cudaEventDestroy(c->ready);
      if (c->side != nullptr) (void)cudaStreamDestroy(c->side);
      delete c;
      return static_cast<int>(r);
    };
    api.abort = [end](void* comm) { return end(comm, true); };
    api.destroy = [end](void* comm) { return end(comm, false); };
    api.error_string = [](int result) { return std::string(f.error_string(static_cast<ncclResult_t>(result))); };
    api.last_error = [](void* comm) {
      const char* text = f.last_error(static_cast<Comm*>(comm)->comm);
      return std::string(text ? text : "");
    };
  });
  if (!failure.empty()) {
    if (absence) *absence = failure;
    return nullptr;
  }
  return &api;
}

#else

static const NcclApi* machine_nccl(std::string* absence) {
  if (absence) *absence = "this build of dtrain has no CUDA backend";
  return nullptr;
}

#endif

namespace {
std::atomic<const NcclApi*> replacement{nullptr};
}  // namespace

void set_nccl_library(const NcclApi* api) { replacement.store(api, std::memory_order_release); }
bool nccl_library_replaced() { return replacement.load(std::memory_order_acquire) != nullptr; }

const NcclApi* nccl_library(std::string* absence) {
  if (const NcclApi* api = replacement.load(std::memory_order_acquire)) return api;
  return machine_nccl(absence);
}

}  // namespace dtrain::comm
