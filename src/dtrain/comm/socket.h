// What the comm layer's TCP code shares (internal to the comm layer).
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>

#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::comm::detail {

// host (a name or an IPv4 address) and port as an IPv4 socket address; an IoError
// starting with `who` when the name does not resolve.
inline sockaddr_in resolve(const std::string& host, int port, const std::string& who) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    DTRAIN_THROW(IoError, who, ": cannot resolve host '", host, "'");
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

// `t` as a socket's (or hiredis's) timeout, at least 1 ms: a zero timeval means "no timeout".
inline timeval timeval_of(std::chrono::milliseconds t) {
  t = std::max(t, std::chrono::milliseconds(1));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  return tv;
}

// A new TCP socket connected to `to` by `deadline`: a non-blocking connect, then poll
// for at most the time left, so that a peer whose host drops the SYNs (or whose listen
// backlog is full) costs the deadline, not the kernel's minutes of SYN retries. Returns
// the descriptor (blocking again, close-on-exec), or -1 with errno set: ETIMEDOUT once the
// deadline passed, else why the connection failed (ECONNREFUSED: nobody listens yet).
inline int connect_by(const sockaddr_in& to, Clock::time_point deadline) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  auto give_up = [fd](int why) {
    ::close(fd);
    errno = why;
    return -1;
  };
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
    if (errno != EINPROGRESS) return give_up(errno);
    for (;;) {
      pollfd p{fd, POLLOUT, 0};
      const int n = ::poll(&p, 1, milliseconds_left(deadline));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return give_up(errno);
      if (n == 0) return give_up(ETIMEDOUT);
      break;
    }
    int error = 0;
    socklen_t len = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return give_up(errno);
    if (error != 0) return give_up(error);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace dtrain::comm::detail
