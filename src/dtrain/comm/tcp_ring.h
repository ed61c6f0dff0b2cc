// A ring of direct TCP connections between the ranks of a group, for all-reducing large
// buffers at the speed of the sockets. Each rank sends to the next rank and receives
// from the previous one at the same time (non-blocking sockets, one poll loop), first a
// reduce-scatter, then an all-gather: every piece of the buffer is summed along the ring
// on its way to one rank and then passed on as it is, so every rank ends with the same
// bits. Measured on loopback here, Gloo's TCP pairs move 0.6-0.9 GB/s where one plain
// socket (iperf3) moves 1.9 GB/s and this ring 1.3-2.2 GB/s; see docs/benchmarks.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"

namespace gloo::rendezvous {
class Store;
}

namespace dtrain::comm {

class TcpRing {
 public:
  // acc[0, n) += in[0, n) for the element type being reduced.
  using SumInto = void (*)(void* acc, const void* in, std::size_t n);

  // Joins the ring through `store` (keys under "dtrain/ring/"): listens on host:0,
  // publishes its address with a nonce, connects to the next rank and accepts the
  // previous one (which must present this rank's nonce). Waits at most `timeout`;
  // names[r] names rank r in errors.
  TcpRing(gloo::rendezvous::Store& store, int rank, int size, const std::string& host,
          std::chrono::milliseconds timeout, std::vector<std::string> names);
  ~TcpRing();
  TcpRing(const TcpRing&) = delete;
  TcpRing& operator=(const TcpRing&) = delete;

  // data[0, count) of `element`-byte values summed over the ranks, in place. A peer that
  // closes its connection is PeerFailure naming it; no progress for the timeout, Timeout.
  void allreduce(void* data, std::size_t count, std::size_t element, SumInto sum);
  // Of the last allreduce: the time until the previous rank's first bytes arrived. While
  // that rank has not started the collective, this rank can only wait: the time is that
  // rank's lateness plus one message's latency. (A late rank further round the ring
  // delays later steps instead, which this does not separate from the transfer.)
  Clock::duration last_peer_wait() const { return last_peer_wait_; }
  // Shuts the ring's connections down: after a failure, so that the neighbours, which may
  // be waiting on this rank rather than on the one that failed, learn of it at once.
  void shutdown();

 private:
  // Sends send[0, send_bytes) to the next rank while receiving recv_bytes from the
  // previous one into recv.
  void exchange(const char* send, std::size_t send_bytes, char* recv, std::size_t recv_bytes);

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> names_;
  int next_fd_ = -1;  // to rank + 1
  int prev_fd_ = -1;  // from rank - 1
  std::vector<char> scratch_;
  Clock::duration last_peer_wait_{};
  bool awaiting_first_bytes_ = false;
  Clock::time_point started_{};
};

}  // namespace dtrain::comm
