// Sums between the processes of one host through shared memory, for the workers of a
// job that all run on the same machine: no sockets, no copies through the kernel.
//
// Two ways to sum. allreduce(data, count) takes any buffer: each rank copies it into its
// own slot of the group's segment, sums its share of every slot and copies the whole sum
// back, so every rank gets the same bits; a buffer larger than a slot goes
// through in pieces. A SharedBuffer (buffer()) lives in shared memory from the start:
// each rank writes its values there, and allreduce(buffer, ...) sums each share of the
// ranks' copies and writes the sum into every copy, without copying anything in or out.
// Sums of more than two ranks are accumulated in double and rounded once, so that they
// do not depend on the order of the ranks.
//
// Waits spin for a few microseconds, then sleep on a futex in the segment. A peer whose
// process ends, that gives up after a failure of its own (shutdown) or that leaves the
// group fails the others' waits at once, naming it; no progress for the timeout is a
// Timeout naming the ranks waited for.
//
// Ranks share memory only where they are on one kernel, in one network namespace (so
// that namespaces emulating hosts keep their links) and one process namespace, and can
// all open the segment; otherwise join() says why and the caller keeps to TCP.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"

namespace gloo::rendezvous {
class Store;
}

namespace dtrain::comm {

// Shares of a sum, and whatever else may be summed while its neighbour is being written
// (gradient buckets side by side in one buffer), start on whole cache lines of floats.
inline constexpr std::size_t kSharedAlignFloats = 16;

// A mapping of a shared memory segment, unmapped when destroyed.
class SharedMapping {
 public:
  SharedMapping() = default;
  SharedMapping(void* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
  ~SharedMapping();
  SharedMapping(SharedMapping&& other) noexcept;
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  char* base() const { return static_cast<char*>(base_); }
  explicit operator bool() const { return base_ != nullptr; }

 private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// What processes must have in common to share a segment: the kernel (its boot), the
// network namespace (namespaces that emulate hosts keep their links) and the process
// namespace. Read once per process; a part it cannot read is "?".
const std::string& host_identity();

// A segment this process made: mapped here, and named in /dev/shm ("/dtrain-PID-HEX") until
// remove_name() or destruction, so that others can open it meanwhile. The segments of
// processes that died before removing their names are removed by the next create().
class NamedSegment {
 public:
  NamedSegment() = default;
  // `bytes` zeros, reserved up front (a /dev/shm too small is `why_not`, not a SIGBUS
  // later); an unmapped segment and `why_not` where it cannot be had.
  static NamedSegment create(std::size_t bytes, std::string& why_not);
  ~NamedSegment();
  NamedSegment(NamedSegment&& other) noexcept;
  NamedSegment& operator=(NamedSegment&& other) noexcept;
  const std::string& name() const { return name_; }
  void remove_name();  // the mapping stays

  SharedMapping mapping;

 private:
  std::string name_;
  int lock_ = -1;  // held while named: a live creator in another process namespace keeps its segment
};

// Maps the segment `name` made by another process, which must hold exactly `bytes`; an
// unmapped one and `why_not` otherwise.
SharedMapping open_segment(const std::string& name, std::size_t bytes, std::string& why_not);

// `count` floats per rank, every rank's copy mapped into every rank.
class SharedBuffer {
 public:
  SharedBuffer(SharedMapping mapping, int rank, int size, std::size_t count, std::size_t stride);
  float* local() const { return of(rank_); }
  float* of(int rank) const {
    return reinterpret_cast<float*>(mapping_.base() + stride_ * static_cast<std::size_t>(rank));
  }
  std::size_t count() const { return count_; }
  int size() const { return size_; }

 private:
  SharedMapping mapping_;
  int rank_, size_;
  std::size_t count_, stride_;  // stride: bytes between the ranks' copies
};

class SharedMemoryGroup {
 public:
  // Rank 0 creates a segment and offers it through `store` (keys under "dtrain/shm/"),
  // every rank tries to attach and says whether it could. Returns the group where every
  // rank attached, else null with the first reason in `why_not`; all ranks decide alike.
  // The segment's name is removed as soon as every rank has answered, so nothing is left
  // behind in /dev/shm. names[r] names rank r in errors.
  // A rank that gives a reason in `refuse` (it was asked to keep to TCP) takes part, so
  // that all ranks learn it, and attaches to nothing.
  static std::unique_ptr<SharedMemoryGroup> join(gloo::rendezvous::Store& store, int rank, int size,
                                                 std::chrono::milliseconds timeout, std::vector<std::string> names,
                                                 const std::string& refuse, std::string& why_not);
  ~SharedMemoryGroup();  // the others' later waits on this rank fail: it left
  SharedMemoryGroup(const SharedMemoryGroup&) = delete;
  SharedMemoryGroup& operator=(const SharedMemoryGroup&) = delete;

  // data[0, count) summed over the ranks, in place.
  void allreduce(float* data, std::size_t count);
  // Every rank calls it, in the same order as its other calls: a new buffer of `count`
  // floats per rank (zeros), or null (with why in `why_not`, the same on every rank) where
  // a segment could not be had or some rank refused one. Each buffer lives as long as its
  // last holder.
  std::shared_ptr<SharedBuffer> buffer(gloo::rendezvous::Store& store, std::size_t count, const std::string& refuse,
                                       std::string& why_not);
  // Every rank's buffer.of(r)[offset, offset + count) becomes the sum over the ranks.
  void allreduce(SharedBuffer& buffer, std::size_t offset, std::size_t count);
  // This rank failed: every other rank's wait on it fails now, naming it.
  void shutdown();
  // Of the last all-reduce: how long this rank waited for the others to start it.
  Clock::duration last_peer_wait() const { return last_peer_wait_; }

  // Bytes each rank's slot holds (the largest piece allreduce(data, count) moves at once).
  std::size_t slot_bytes() const { return slot_bytes_; }

 private:
  struct Header;
  static std::size_t header_bytes();
  SharedMemoryGroup(int rank, int size, std::chrono::milliseconds timeout, std::vector<std::string> names);
  float* slot(int rank) const;
  // Waits until every rank's counter `field` has reached `target`.
  void wait_all(int field, std::uint64_t target);
  void publish(int field, std::uint64_t value);
  // Throws for a rank that has not reached `target` in `field` and never will.
  void check_peers(int field, std::uint64_t target);
  void watch(const std::vector<int>& pids);
  // Sets this rank's state (once: gave up, or left) and wakes every waiter.
  void mark(int state);

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> names_;
  SharedMapping mapping_;
  std::size_t slot_bytes_ = 0;
  Header* header_ = nullptr;
  std::vector<int> pids_;     // [rank]
  std::vector<int> pidfds_;   // [rank]: -1 for this process (or one that shares it)
  std::uint64_t sequence_ = 0;
  std::uint64_t buffers_ = 0;  // made so far: each one's keys in the store
  Clock::duration last_peer_wait_{};
  std::vector<float*> inputs_, outputs_;  // the current sum's, kept to allocate nothing per call
};

}  // namespace dtrain::comm
