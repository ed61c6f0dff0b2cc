// A fake NCCL among threads of one process, for tests: its "GPU memory" is host memory
// (the stand-in GPU's is too), and a collective sums every rank's buffer once all have
// queued it. Faults can be planted: a peer's error at a collective, a refused collective.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "dtrain/comm/nccl_group.h"

namespace dtrain::testing {

using comm::kNcclInProgress;
using comm::kNcclInvalidArgument;
using comm::kNcclInvalidUsage;
using comm::kNcclRemoteError;
using comm::kNcclSuccess;
using comm::NcclApi;

class FakeNccl {
 public:
  explicit FakeNccl(int size) : size_(size) {
    api.get_unique_id = [](NcclApi::Id& id) {
      id.fill('u');
      return kNcclSuccess;
    };
    api.init = [this](void*& comm, int ranks, const NcclApi::Id& id, int rank, int) {
      if (ranks != size_ || id[0] != 'u') return kNcclInvalidArgument;
      comm = new Comm{rank};
      std::lock_guard lock(mutex_);
      ++joined_;
      return kNcclInProgress;
    };
    api.async_error = [this](void* comm, int& state) {
      std::lock_guard lock(mutex_);
      state = joined_ < size_ ? kNcclInProgress : kNcclSuccess;
      if (remote_error_at && static_cast<Comm*>(comm)->sequence == remote_error_at) state = kNcclRemoteError;
      return kNcclSuccess;
    };
    api.all_reduce = [this](void* comm, float* data, std::size_t count, int) {
      auto* c = static_cast<Comm*>(comm);
      if (usage_error_at && c->sequence + 1 == usage_error_at) return kNcclInvalidUsage;
      const int queued = still_queueing ? kNcclInProgress : kNcclSuccess;
      std::lock_guard lock(mutex_);
      auto& round = rounds_[++c->sequence];
      round[c->rank] = data;
      if (static_cast<int>(round.size()) == size_)  // the last rank's queueing completes it
        for (std::size_t i = 0; i < count; ++i) {
          float sum = 0;
          for (const auto& [rank, buffer] : round) sum += buffer[i];
          for (const auto& [rank, buffer] : round) buffer[i] = sum;
        }
      return queued;
    };
    // Its "streams" run at once: beside the compute stream is the same.
    api.all_reduce_beside = [this](void* comm, float* data, std::size_t count, int device) {
      ++beside_;
      return api.all_reduce(comm, data, count, device);
    };
    api.join = [](void*, int) { return kNcclSuccess; };
    api.record = [this](void*, int, bool) {
      ++records_;
      return kNcclSuccess;
    };
    api.done = [this](void* comm, std::string&) {
      std::lock_guard lock(mutex_);
      const std::uint64_t sequence = static_cast<Comm*>(comm)->sequence;
      if (remote_error_at == sequence) return 1;  // the failed collective never ends
      return static_cast<int>(rounds_[sequence].size()) == size_ ? 0 : 1;
    };
    api.abort = [this](void* comm) {
      delete static_cast<Comm*>(comm);
      std::lock_guard lock(mutex_);
      ++aborts_;
      return kNcclSuccess;
    };
    api.destroy = [](void* comm) {
      delete static_cast<Comm*>(comm);
      return kNcclSuccess;
    };
    api.error_string = [](int result) { return "fake error " + std::to_string(result); };
    api.last_error = [](void*) { return std::string(); };
  }
  // Collectives queued beside the compute stream (gradient buckets during backward), and
  // the ends marked (each once its collective is queued).
  int beside() const { return beside_.load(); }
  int records() const { return records_.load(); }
  int aborts() {
    std::lock_guard lock(mutex_);
    return aborts_;
  }

  NcclApi api;
  std::uint64_t remote_error_at = 0;  // the collective whose async state is a peer's error
  std::uint64_t usage_error_at = 0;   // the collective NCCL refuses to queue
  bool still_queueing = false;        // each collective answers ncclInProgress (a nonblocking communicator's)

 private:
  struct Comm {
    int rank;
    std::uint64_t sequence = 0;
  };
  int size_;
  std::mutex mutex_;
  int joined_ = 0, aborts_ = 0;
  std::atomic<int> beside_{0}, records_{0};
  std::map<std::uint64_t, std::map<int, float*>> rounds_;  // [collective][rank] its buffer
};

}  // namespace dtrain::testing
