// Collectives between processes (and hosts) over Gloo's TCP transport: sum all-reduce,
// broadcast, all-gather and barrier, each with a finite timeout. A failure is an error
// naming the operation, its sequence number and size; a dead or silent peer is named by
// its task once the others have checked who is still there.
//
// All-reduce picks its algorithm by size: up to 256 KiB between two ranks, Gloo's
// AllreduceRing objects, cached by a stable key the caller gives (a bucket id) and the
// element count, with their own buffers (never keyed by the caller's pointer); above that,
// or with more ranks, dtrain's TcpRing over direct sockets, which gives every rank the
// same bits; where every rank runs on this host, float32 all-reduces of any size go
// through shared memory instead (SharedMemoryGroup). (Measured on loopback: AllreduceRing 136 µs against gloo::allreduce's
// 385 µs at 4 KiB; at 1 MiB TcpRing 464 µs against AllreduceRing's 1174; for large
// buffers Gloo's TCP pairs move under 1 GB/s, TcpRing 1.3-2.2 GB/s; docs/benchmarks.md.)
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"

namespace gloo {
class Context;
class Algorithm;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace dtrain::comm {

class RendezvousStore;
class SharedBuffer;
class SharedMemoryGroup;
class TcpRing;

struct GlooGroupOptions {
  int rank = 0;
  int size = 1;
  std::vector<std::string> task_names;  // [rank] "worker:1"; default "rank N"
  std::string host = "127.0.0.1";       // the address peers reach this process at
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Debugging: before every collective, the ranks compare what they are about to run
  // (operation, sequence number, size); a mismatch is InvalidArgument naming both sides.
  bool check_collectives = false;
  // Ranks that all run on one host (one kernel, network and process namespace) sum
  // float32 through a shared memory segment instead of TCP; false: always TCP.
  bool shared_memory = true;
  // A second connection to the same store (the same keys): Gloo's mesh connects through
  // it on a thread of its own while the ring and the shared memory are set up through the
  // first (a connection serves one request at a time, so a wait on one would hold up the
  // other). Null: one after the other.
  std::shared_ptr<gloo::rendezvous::Store> mesh_store;
};

// What an all-reduce sends on the wire: float32 as it is, or each value rounded to 16
// bits (bfloat16 keeps float32's range with 8 bits of precision; float16 has 11 bits and
// a range up to 65504), halving the bytes. Sums are accumulated in float32 at each step
// and rounded again before they are passed on.
enum class Wire { f32, bf16, f16 };
const char* wire_name(Wire wire);
// Bytes that `count` floats take on the wire.
inline std::size_t wire_bytes(std::size_t count, Wire wire) {
  return count * (wire == Wire::f32 ? sizeof(float) : sizeof(std::uint16_t));
}

class GlooGroup {
 public:
  // Meets the other ranks through `store` (a TcpStore across processes; Gloo's HashStore
  // for ranks that are threads of one process), waiting at most the timeout; ranks that
  // never arrive are named in the error. With more than one rank, SIGPIPE is ignored from
  // then on (unless the program handles it), so that a dead peer is an error, not an exit.
  GlooGroup(std::shared_ptr<gloo::rendezvous::Store> store, GlooGroupOptions options);
  ~GlooGroup();
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  const std::string& task_name(int rank) const { return options_.task_names[static_cast<std::size_t>(rank)]; }

  // data[0, count) summed over ranks, in place. `key` names the buffer stably (a bucket id).
  // 16-bit wires always take the TCP ring: compression is asked for a link's sake.
  void allreduce(float* data, std::size_t count, std::uint64_t key, Wire wire = Wire::f32);
  // How float32 all-reduces travel: "shared memory", or "TCP" with the reason shared
  // memory is not used ("TCP (asked for)", "TCP (no shared memory: worker:1: not on
  // worker:0's host, ...)"); after a shared_buffer() that was refused or could not be
  // had, "shared memory (16-bit buckets over TCP)" or "shared memory (buffers copied in
  // and out: WHY)".
  const std::string& transport() const { return transport_; }
  // Whether everything summed goes through shared memory: the ranks share a segment and
  // no shared_buffer() was refused or failed.
  bool shares_memory() const { return shares_memory_; }
  // Where the ranks share memory: a buffer of `count` floats per rank in shared memory
  // (zeros) for allreduce(buffer, ...), which sums it without copying it in or out. Null
  // elsewhere, where no segment could be had, or where some rank's buckets travel on a
  // 16-bit `wire` (those take the TCP ring). Every rank calls it, in the same order as
  // its collectives.
  std::shared_ptr<SharedBuffer> shared_buffer(std::size_t count, Wire wire = Wire::f32);
  // buffer[offset, offset + count) summed over the ranks, into every rank's copy.
  void allreduce(SharedBuffer& buffer, std::size_t offset, std::size_t count);
  // Of the last float allreduce: the time spent waiting for the other ranks to start it
  // (TcpRing's or SharedMemoryGroup's last_peer_wait; 0 where Gloo's own ring ran it,
  // which does not tell).
  Clock::duration last_peer_wait() const { return last_peer_wait_; }
  // Small double-precision sums (counts, metric totals).
  void allreduce(double* data, std::size_t count);
  // data[0, count) from `root` to every rank.
  void broadcast(float* data, std::size_t count, int root);
  // out[r * count, (r+1) * count) = rank r's in[0, count).
  void allgather(const float* in, float* out, std::size_t count);
  void barrier();
  // Number of collectives run so far (the same on every rank).
  std::uint64_t sequence() const { return sequence_; }
  // This rank failed (inside a collective or out of one): peers waiting on it in the TCP
  // ring or in shared memory learn of it at once; in Gloo's own collectives, at their
  // timeout. The group is not used again.
  void abandon();

 private:
  struct CachedRing;
  template <typename Fn>
  void collective(const char* op, std::size_t bytes, Fn&& fn);
  void check_fingerprint(const char* op, std::size_t bytes);
  [[noreturn]] void fail(const char* op, std::size_t bytes, const std::string& what, bool timed_out);
  std::string absent_peers();

  GlooGroupOptions options_;
  std::shared_ptr<RendezvousStore> store_;  // the store given, or Gloo's wrapped as one
  bool announced_while_connected_ = false;  // this rank's arrival goes when its process ends
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<TcpRing> ring_;
  std::unique_ptr<SharedMemoryGroup> shared_;
  std::string transport_ = "TCP";
  bool shares_memory_ = false;
  std::map<std::pair<std::uint64_t, std::size_t>, std::unique_ptr<CachedRing>> rings_;
  std::map<std::uint64_t, std::vector<std::uint16_t>> wire_buffers_;  // [key] 16-bit copies
  std::uint64_t sequence_ = 0;
  Clock::time_point started_{};  // of the collective running, for the failure's message
  Clock::duration last_peer_wait_{};
};

}  // namespace dtrain::comm
