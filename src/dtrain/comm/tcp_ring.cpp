// The TCP ring all-reduce.
#include "dtrain/comm/tcp_ring.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "dtrain/comm/socket.h"
#include "dtrain/comm/store_keys.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

sockaddr_in resolve(const std::string& host, int port) { return detail::resolve(host, port, "all-reduce ring"); }

void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Blocking-with-deadline helpers for the handshake (the sockets are non-blocking).
bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, milliseconds_left(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// All n bytes sent (sending) or received, waiting for the socket up to the deadline.
bool transfer(int fd, void* data, std::size_t n, bool sending, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t done = sending ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (done > 0) {
      p += done;
      n -= static_cast<std::size_t>(done);
    } else if (done < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, sending ? POLLOUT : POLLIN, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

TcpRing::TcpRing(gloo::rendezvous::Store& store, int rank, int size, const std::string& host,
                 std::chrono::milliseconds timeout, std::vector<std::string> names)
    : rank_(rank), size_(size), timeout_(timeout), names_(std::move(names)) {
  if (size_ < 2) return;
  const auto deadline = Clock::now() + timeout_;
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  // Listen, and publish where, with a nonce only the previous rank learns from the store.
  sockaddr_in a = resolve(host, 0);
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 4) != 0) {
    const std::string why = std::strerror(errno);
    if (listener >= 0) ::close(listener);
    DTRAIN_THROW(IoError, "all-reduce ring: ", names_[static_cast<std::size_t>(rank_)], " cannot listen on ", host, ": ",
                 why);
  }
  socklen_t len = sizeof a;
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  std::random_device random;
  const std::uint64_t nonce = (static_cast<std::uint64_t>(random()) << 32) | random();
  const std::string mine = host + " " + std::to_string(ntohs(a.sin_port)) + " " + std::to_string(nonce);
  store.set("dtrain/ring/" + std::to_string(rank_), detail::bytes_of(mine));
  try {
    // Connect to the next rank, presenting its nonce and this rank's number.
    const std::string key = "dtrain/ring/" + std::to_string(next);
    store.wait({key}, time_left(deadline));
    const std::vector<char> theirs_bytes = store.get(key);
    const std::string theirs(theirs_bytes.begin(), theirs_bytes.end());
    const std::size_t s1 = theirs.find(' '), s2 = theirs.rfind(' ');
    const sockaddr_in to = resolve(theirs.substr(0, s1), std::stoi(theirs.substr(s1 + 1, s2 - s1 - 1)));
    const std::uint64_t their_nonce = std::stoull(theirs.substr(s2 + 1));
    const std::string at = theirs.substr(0, s1) + ":" + theirs.substr(s1 + 1, s2 - s1 - 1);
    // Bounded by the ring's deadline, not the kernel's SYN retries.
    next_fd_ = detail::connect_by(to, deadline);
    if (next_fd_ < 0 && errno == ETIMEDOUT)
      DTRAIN_THROW(Timeout, "all-reduce ring: ", names_[static_cast<std::size_t>(rank_)], " could not connect to ",
                   names_[static_cast<std::size_t>(next)], " at ", at, " within ",
                   timeout_.count() / 1000.0, " s (joining the ring)");
    if (next_fd_ < 0)
      DTRAIN_THROW(PeerFailure, "all-reduce ring: ", names_[static_cast<std::size_t>(rank_)], " cannot connect to ",
                   names_[static_cast<std::size_t>(next)], " at ", at, " (joining the ring): ",
                   std::strerror(errno));
    tune(next_fd_);
    std::uint64_t hello[2] = {their_nonce, static_cast<std::uint64_t>(rank_)};
    if (!transfer(next_fd_, hello, sizeof hello, /*sending=*/true, deadline))
      DTRAIN_THROW(PeerFailure, "all-reduce ring: ", names_[static_cast<std::size_t>(next)], " hung up while joining");
    // Accept the previous rank: the first connection that presents this rank's nonce.
    fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
    while (prev_fd_ < 0) {
      if (!wait_for(listener, POLLIN, deadline))
        DTRAIN_THROW(Timeout, "all-reduce ring: ", names_[static_cast<std::size_t>(prev)], " did not connect to ",
                     names_[static_cast<std::size_t>(rank_)], " within ", timeout_.count() / 1000.0, " s");
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      tune(fd);
      std::uint64_t got[2] = {0, 0};
      if (transfer(fd, got, sizeof got, /*sending=*/false, deadline) && got[0] == nonce && got[1] == static_cast<std::uint64_t>(prev))
        prev_fd_ = fd;
      else
        ::close(fd);  // a stray connection: not the ring's
    }
  } catch (...) {
    ::close(listener);
    if (next_fd_ >= 0) ::close(next_fd_);
    throw;
  }
  ::close(listener);
}

TcpRing::~TcpRing() {
  if (next_fd_ >= 0) ::close(next_fd_);
  if (prev_fd_ >= 0) ::close(prev_fd_);
}

void TcpRing::shutdown() {
  if (next_fd_ >= 0) ::shutdown(next_fd_, SHUT_RDWR);
  if (prev_fd_ >= 0) ::shutdown(prev_fd_, SHUT_RDWR);
}

void TcpRing::exchange(const char* send, std::size_t send_bytes, char* recv, std::size_t recv_bytes) {
  const std::string& me = names_[static_cast<std::size_t>(rank_)];
  const std::string& next = names_[static_cast<std::size_t>((rank_ + 1) % size_)];
  const std::string& prev = names_[static_cast<std::size_t>((rank_ + size_ - 1) % size_)];
  // The timeout is for a lack of progress: each byte moved starts it again.
  auto deadline = Clock::now() + timeout_;
  while (send_bytes > 0 || recv_bytes > 0) {
    pollfd fds[2] = {{next_fd_, static_cast<short>(send_bytes > 0 ? POLLOUT : 0), 0},
                     {prev_fd_, static_cast<short>(recv_bytes > 0 ? POLLIN : 0), 0}};
    const int n = ::poll(fds, 2, milliseconds_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0)
      DTRAIN_THROW(Timeout, me, ": no progress for ", timeout_.count() / 1000.0, " s ",
                   send_bytes > 0 ? "sending to " + next : "", send_bytes > 0 && recv_bytes > 0 ? " and " : "",
                   recv_bytes > 0 ? "receiving from " + prev : "");
    if (send_bytes > 0 && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = ::send(next_fd_, send, send_bytes, MSG_NOSIGNAL);
      if (w > 0) {
        send += w;
        send_bytes -= static_cast<std::size_t>(w);
        deadline = Clock::now() + timeout_;
      } else if (!(w < 0 && (errno == EAGAIN || errno == EINTR))) {
        DTRAIN_THROW(PeerFailure, me, ": sending to ", next, " failed: ", w == 0 ? "closed" : std::strerror(errno));
      }
    }
    if (recv_bytes > 0 && (fds[1].revents & (POLLIN | POLLERR | POLLHUP))) {
      const ssize_t r = ::recv(prev_fd_, recv, recv_bytes, 0);
      if (r > 0) {
        if (awaiting_first_bytes_) {
          last_peer_wait_ = Clock::now() - started_;
          awaiting_first_bytes_ = false;
        }
        recv += r;
        recv_bytes -= static_cast<std::size_t>(r);
        deadline = Clock::now() + timeout_;
      } else if (r == 0) {
        DTRAIN_THROW(PeerFailure, me, ": ", prev, " closed its connection");
      } else if (errno != EAGAIN && errno != EINTR) {
        DTRAIN_THROW(PeerFailure, me, ": receiving from ", prev, " failed: ", std::strerror(errno));
      }
    }
  }
}

void TcpRing::allreduce(void* data, std::size_t count, std::size_t element, SumInto sum) {
  last_peer_wait_ = {};
  if (size_ < 2 || count == 0) return;
  started_ = Clock::now();
  awaiting_first_bytes_ = true;
  char* bytes = static_cast<char*>(data);
  const auto n = static_cast<std::size_t>(size_);
  // Segment k: elements [begin(k), begin(k + 1)), sizes differing by at most one.
  auto begin = [&](std::size_t k) { return (count / n) * k + std::min(k, count % n); };
  auto segment = [&](std::size_t k, char*& at, std::size_t& len) {
    k %= n;
    at = bytes + begin(k) * element;
    len = (begin(k + 1) - begin(k)) * element;
  };
  scratch_.resize((count / n + 1) * element);
  const auto r = static_cast<std::size_t>(rank_);
  // Reduce-scatter: at step s, send segment r - s (holding s + 1 ranks' values) and add
  // the previous rank's segment r - s - 1 into ours. Rank r ends owning segment r + 1.
  for (std::size_t s = 0; s + 1 < n; ++s) {
    char *out, *in;
    std::size_t out_len, in_len;
    segment(r + n - s, out, out_len);
    segment(r + n - s - 1, in, in_len);
    exchange(out, out_len, scratch_.data(), in_len);
    sum(in, scratch_.data(), in_len / element);
  }
  // All-gather: pass the finished segments on, receiving each straight into place.
  for (std::size_t s = 0; s + 1 < n; ++s) {
    char *out, *in;
    std::size_t out_len, in_len;
    segment(r + 1 + n - s, out, out_len);
    segment(r + n - s, in, in_len);
    exchange(out, out_len, in, in_len);
  }
}

}  // namespace dtrain::comm
