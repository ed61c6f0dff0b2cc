// Every wait of the comm layer's sockets has a deadline: a store or ring peer whose
// listen backlog is full (its host drops the SYNs), one that accepts and never answers,
// and a Redis server that accepts and never answers are each a Timeout naming the
// address and the operation, not a hang. Everything listens on 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/rendezvous/hash_store.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm/redis_store.h"
#include "dtrain/comm/tcp_ring.h"
#include "dtrain/comm/tcp_store.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

// A socket listening on 127.0.0.1 that never accepts; closed on destruction.
class Listener {
 public:
  explicit Listener(int backlog) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, backlog) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("cannot listen on 127.0.0.1");
    port_ = ntohs(a.sin_port);
  }
  ~Listener() {
    for (int fd : fillers_) ::close(fd);
    ::close(fd_);
  }
  int fd() const { return fd_; }
  int port() const { return port_; }

  // Connects until one connection is not completed within a second: the kernel then
  // drops this port's SYNs (its accept queue is full), as a host that does not answer
  // would. False if it never filled (the test is then skipped, saying why).
  bool fill() {
    for (int i = 0; i < 16; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      const sockaddr_in a = loopback(port_);
      fillers_.push_back(fd);
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) continue;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) == 0) return true;
    }
    return false;
  }

 private:
  int fd_ = -1, port_ = 0;
  std::vector<int> fillers_;
};

template <typename Fn>
std::string timeout_message(Fn&& fn) {
  try {
    fn();
  } catch (const Timeout& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a Timeout, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a Timeout, nothing was thrown";
  return "";
}

TEST(Deadlines, StoreWhoseHostDropsTheConnectionIsATimeoutNamingIt) {
  Listener full(0);
  if (!full.fill())
    GTEST_SKIP() << "the kernel completed every connection to a listener with a backlog of 0 (it did not drop the "
                    "SYNs), so the dropped connection this test is about could not be made";
  const std::string where = "127.0.0.1:" + std::to_string(full.port());
  const std::string message =
      timeout_message([&] { TcpStore store("127.0.0.1", full.port(), "tok", 1s, "worker:1"); });
  EXPECT_NE(message.find("worker:1: rendezvous store " + where), std::string::npos) << message;
  EXPECT_NE(message.find("could not be reached within 1 s (connect: no answer)"), std::string::npos) << message;
}

TEST(Deadlines, StoreThatAcceptsAndNeverAnswersIsATimeoutNamingIt) {
  Listener silent(16);  // the kernel completes the connection; nobody ever reads it
  const std::string message =
      timeout_message([&] { TcpStore store("127.0.0.1", silent.port(), "tok", 1s, "worker:1"); });
  EXPECT_NE(message.find("worker:1: rendezvous store 127.0.0.1:" + std::to_string(silent.port()) +
                         " (served by the chief) did not answer joining"),
            std::string::npos)
      << message;
}

// A loopback port that was just listened on and closed: connections to it are refused.
int closed_port() {
  Listener gone(1);
  return gone.port();
}

TEST(Deadlines, StoreNobodyServesIsATimeoutSayingSo) {
  const int port = closed_port();
  const std::string message = timeout_message([&] { TcpStore store("127.0.0.1", port, "tok", 300ms); });
  EXPECT_NE(message.find("could not be reached within 0.3 s"), std::string::npos) << message;
  EXPECT_NE(message.find("is the chief running?"), std::string::npos) << message;
}

TEST(Deadlines, RingPeerWhoseHostDropsTheConnectionIsATimeoutNamingIt) {
  // Rank 1 "published" an address whose accept queue is full.
  Listener full(0);
  if (!full.fill())
    GTEST_SKIP() << "the kernel completed every connection to a listener with a backlog of 0 (it did not drop the "
                    "SYNs), so the dropped connection this test is about could not be made";
  gloo::rendezvous::HashStore store;
  const std::string theirs = "127.0.0.1 " + std::to_string(full.port()) + " 7";
  store.set("dtrain/ring/1", std::vector<char>(theirs.begin(), theirs.end()));
  const std::string message = timeout_message(
      [&] { TcpRing ring(store, 0, 2, "127.0.0.1", 1s, {"worker:0", "worker:1"}); });
  EXPECT_NE(message.find("worker:0 could not connect to worker:1 at 127.0.0.1:" + std::to_string(full.port()) +
                         " within 1 s (joining the ring)"),
            std::string::npos)
      << message;
}

TEST(Deadlines, RedisServerThatAcceptsAndNeverAnswersIsATimeoutNamingIt) {
  // A fake Redis server: a thread that accepts one connection and reads what comes until
  // the client hangs up, never answering.
  Listener server(4);
  std::thread fake([&] {
    const int fd = ::accept(server.fd(), nullptr, nullptr);
    if (fd < 0) return;
    char buf[256];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(fd);
  });
  std::string message;
  {
    RedisStore store("127.0.0.1", server.port(), 2s, "worker:1");
    message = timeout_message([&] { store.set("key", {'v'}); });
  }  // the store hangs up: the fake server's thread ends
  fake.join();
  EXPECT_NE(message.find("worker:1: redis server 127.0.0.1:" + std::to_string(server.port()) +
                         " did not answer SET within 1 s"),
            std::string::npos)
      << message;
}

TEST(Deadlines, RedisServerNobodyServesIsAnIoErrorNamingIt) {
  const int port = closed_port();
  try {
    RedisStore store("127.0.0.1", port, 1s);
    ADD_FAILURE() << "connected to a closed port";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("redis server 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dtrain::comm
