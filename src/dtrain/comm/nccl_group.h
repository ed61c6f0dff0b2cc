// Sums of float32 buffers in GPU memory between processes, one GPU each, with NCCL: the
// communicator's unique id travels through the job's rendezvous store, every wait is
// bounded, and a communicator that does not finish a collective in time is aborted (NCCL's
// own calls never hang the caller). NCCL's errors become dtrain's, naming the collective,
// its size and the tasks; a peer that died or stopped is named by a roll call through the
// store, as the Gloo group names it. The library is reached through NcclApi, a table of
// plain functions: the machine's NCCL (nccl_library) or, in tests, a fake.
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): processes that share a
// GPU sum through host memory instead (distribute/device_reducer.h).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"

namespace dtrain::comm {

class RendezvousStore;

// NCCL's calls as dtrain makes them, in plain types (no CUDA or NCCL header needed). The
// int results are NCCL's ncclResult_t values (kNcclSuccess ...).
struct NcclApi {
  using Id = std::array<char, 128>;  // ncclUniqueId
  std::function<int(Id& id)> get_unique_id;
  // Starts joining without waiting (a nonblocking communicator on `device`): its state is
  // then polled with async_error until success or an error.
  std::function<int(void*& comm, int ranks, const Id& id, int rank, int device)> init;
  std::function<int(void* comm, int& state)> async_error;
  // Queues the sum of `count` floats at `data` (in place) on `device`'s compute stream.
  // ncclInProgress: still being queued; async_error says when it is (success).
  std::function<int(void* comm, float* data, std::size_t count, int device)> all_reduce;
  // The same beside the compute stream: on the communicator's own stream, after the work
  // queued on the compute stream so far (the gradients it sums), which goes on meanwhile.
  std::function<int(void* comm, float* data, std::size_t count, int device)> all_reduce_beside;
  // Marks the end of the collectives queued so far (on the compute stream, or beside it),
  // which done() then tells of; called once each is queued.
  std::function<int(void* comm, int device, bool beside)> record;
  // The compute stream's later work waits for the sums queued beside it.
  std::function<int(void* comm, int device)> join;
  // Whether the last all_reduce queued through `comm` has run: 0 yes, 1 not yet, -1 the
  // device failed (`why` says how).
  std::function<int(void* comm, std::string& why)> done;
  std::function<int(void* comm)> abort;
  std::function<int(void* comm)> destroy;
  std::function<std::string(int result)> error_string;
  std::function<std::string(void* comm)> last_error;
};

// ncclResult_t's values.
inline constexpr int kNcclSuccess = 0, kNcclUnhandledCudaError = 1, kNcclSystemError = 2, kNcclInternalError = 3,
                     kNcclInvalidArgument = 4, kNcclInvalidUsage = 5, kNcclRemoteError = 6, kNcclInProgress = 7;

// The machine's NCCL (libnccl.so.2, opened at the first call; its collectives queued on
// the device's compute stream), or null with why not in `absence` (this build has no
// CUDA backend, or the library is not there).
const NcclApi* nccl_library(std::string* absence = nullptr);
// Replaces the machine's NCCL in nccl_library() until called with null: the tests' fake,
// which sums GPU buffers of any runtime (the stand-in GPU's host memory included).
void set_nccl_library(const NcclApi* api);
bool nccl_library_replaced();

struct NcclGroupOptions {
  int rank = 0;
  int size = 1;
  std::vector<std::string> task_names;  // [rank] "worker:1"; default "rank N"
  int device = 0;                       // this rank's GPU (cuda:N)
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string prefix = "dtrain/nccl/";  // its keys in the store
};

class NcclGroup {
 public:
  // Rank 0 makes the unique id and publishes it; every rank joins, all within the timeout:
  // a rank that never came is named (Timeout), and so is NCCL's error where it failed.
  NcclGroup(const NcclApi& api, std::shared_ptr<RendezvousStore> store, NcclGroupOptions options);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // data[0, count) in GPU memory summed over the ranks, in place; returns once the sum has
  // run. Not done within the timeout: the communicator is aborted and a Timeout names the
  // collective and the ranks that did not answer the roll call. An NCCL error: its kind
  // (PeerFailure for a peer's, DeviceError for CUDA's, InvalidArgument for a misuse,
  // Unavailable for the system's) with NCCL's words. The group is not used after a failure.
  void all_reduce(float* data, std::size_t count);
  // The same queued beside the compute stream, after its work so far, without waiting:
  // gradient buckets summed while backward still runs. finish_all_reduces() then waits
  // for every sum started (bounded, and failing, as all_reduce) and makes the compute
  // stream's later work wait for them too.
  void start_all_reduce(float* data, std::size_t count);
  void finish_all_reduces();
  // From another thread: a rank of this process failed. This group's wait under way (or
  // its next collective) aborts the communicator and throws PeerFailure with `why`.
  void cancel(const std::string& why);
  // On the group's own thread: aborts the communicator now (its queued work released);
  // the group is not used again.
  void abort() { abort_communicator(); }
  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  // "NCCL (cuda:0, 2 ranks)".
  std::string describe() const;

 private:
  // Aborts the communicator (its queued work is released); the group is not used again.
  void abort_communicator();
  // Throws for `result` (not success) of `op`, after aborting the communicator.
  [[noreturn]] void fail(const std::string& op, int result);
  // Which other ranks did not answer a roll call for `op` (their process ended, or they
  // are alive and silent), within the patience.
  std::string absent_peers(const std::string& op);
  std::string task_name(int rank) const;
  // "NCCL all-reduce #N of COUNT floats on cuda:D among ...", numbering a new collective.
  std::string next_op(std::size_t count);
  // Until the last collective queued has run: bounded by the timeout, as all_reduce says.
  void wait_done(const std::string& op);
  // After a collective's call returned `result`: until it is queued (a nonblocking
  // communicator's ncclInProgress), then its end marked; bounded as wait_done.
  void queued(const std::string& op, int result, bool beside);
  // Throws (after aborting) where cancel() was called.
  void check_cancelled(const std::string& op);

  const NcclApi& api_;
  std::shared_ptr<RendezvousStore> store_;
  NcclGroupOptions options_;
  void* comm_ = nullptr;
  bool failed_ = false;
  std::uint64_t sequence_ = 0;
  std::string started_;  // the last collective start_all_reduce queued, until finished
  std::atomic<bool> cancelled_{false};
  std::mutex cancel_mutex_;
  std::string cancel_why_;
};

}  // namespace dtrain::comm
