// The rendezvous store over TCP. A request is an op byte, a wait in milliseconds and
// length-prefixed fields; a reply is a status byte and one length-prefixed value.
#include "dtrain/comm/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "dtrain/comm/socket.h"
#include "dtrain/comm/store_keys.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

enum Status : char { kOk = 0, kMissing = 1, kRefused = 2 };

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

bool get_u32(int fd, std::uint32_t& v) {
  unsigned char b[4];
  if (!read_all(fd, b, 4)) return false;
  v = static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 | static_cast<std::uint32_t>(b[2]) << 16 |
      static_cast<std::uint32_t>(b[3]) << 24;
  return true;
}

constexpr std::uint32_t kMaxField = 64u << 20;

bool reply(int fd, Status status, const std::string& value = {}) {
  std::string out(1, static_cast<char>(status));
  put_u32(out, static_cast<std::uint32_t>(value.size()));
  out += value;
  return write_all(fd, out.data(), out.size());
}

sockaddr_in resolve(const std::string& host, int port, const std::string& where) {
  return detail::resolve(host, port, "rendezvous store " + where);
}

}  // namespace

// ---- server

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string token) : token_(std::move(token)) {
  const std::string where = host + ":" + std::to_string(port);
  sockaddr_in a = resolve(host, port, where);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    DTRAIN_THROW(IoError, "rendezvous store: cannot serve on ", where, ": ", why);
  }
  socklen_t len = sizeof a;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  {
    std::lock_guard lock(mutex_);
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
  }
  changed_.notify_all();
  acceptor_.join();
  for (auto& t : threads_) t.join();
  ::close(listen_fd_);
}

void TcpStoreServer::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // shut down
    }
    std::lock_guard lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    clients_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  bool greeted = false;
  std::vector<std::string> ephemeral;  // keys removed when this connection closes
  for (;;) {
    char op = 0;
    std::uint32_t wait_ms = 0, count = 0;
    if (!read_all(fd, &op, 1) || !get_u32(fd, wait_ms) || !get_u32(fd, count) || count > 1u << 20) break;
    std::vector<std::string> fields(count);
    bool ok = true;
    for (auto& f : fields) {
      std::uint32_t n = 0;
      if (!get_u32(fd, n) || n > kMaxField) {
        ok = false;
        break;
      }
      f.resize(n);
      if (n && !read_all(fd, f.data(), n)) ok = false;
    }
    if (!ok) break;
    if (!greeted) {
      // The first request must be the hello with the cluster's token.
      if (op != 'H' || fields.size() != 1 || fields[0] != token_) {
        reply(fd, kRefused);
        break;
      }
      greeted = true;
      if (!reply(fd, kOk)) break;
      continue;
    }
    requests_.fetch_add(1);
    std::unique_lock lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    auto all_present = [&](std::size_t from) {
      for (std::size_t i = from; i < fields.size(); ++i)
        if (!values_.count(fields[i])) return false;
      return true;
    };
    if ((op == 'S' || op == 'E') && fields.size() == 2) {
      values_[fields[0]].assign(fields[1].begin(), fields[1].end());
      if (op == 'E') ephemeral.push_back(fields[0]);
      changed_.notify_all();
      lock.unlock();
      if (!reply(fd, kOk)) break;
    } else if ((op == 'G' && fields.size() == 1) || op == 'W') {
      changed_.wait_until(lock, deadline, [&] { return stopping_ || all_present(0); });
      const bool present = all_present(0);
      std::string value;
      if (present && op == 'G') value.assign(values_[fields[0]].begin(), values_[fields[0]].end());
      lock.unlock();
      if (!reply(fd, present ? kOk : kMissing, value)) break;
    } else if (op == 'A' && fields.size() == 2) {
      // Whole decimal numbers only, and a sum that fits; else the request is malformed,
      // which ends the connection and leaves the key as it was.
      auto number = [](const char* from, const char* to, std::int64_t& out) {
        const auto [end, error] = std::from_chars(from, to, out);
        return error == std::errc() && end == to;
      };
      const auto found = values_.find(fields[0]);
      std::int64_t stored = 0, delta = 0, sum = 0;
      if (found != values_.end() && !number(found->second.data(), found->second.data() + found->second.size(), stored))
        break;
      if (!number(fields[1].data(), fields[1].data() + fields[1].size(), delta) ||
          __builtin_add_overflow(stored, delta, &sum))
        break;
      const std::string text = std::to_string(sum);
      values_[fields[0]].assign(text.begin(), text.end());
      changed_.notify_all();
      lock.unlock();
      if (!reply(fd, kOk, text)) break;
    } else if (op == 'C') {
      std::string bits;
      for (const auto& k : fields) bits.push_back(values_.count(k) ? '1' : '0');
      lock.unlock();
      if (!reply(fd, kOk, bits)) break;
    } else {
      break;  // a malformed request ends the connection
    }
  }
  ::shutdown(fd, SHUT_RDWR);
  std::lock_guard lock(mutex_);
  for (const std::string& key : ephemeral) values_.erase(key);
  if (!ephemeral.empty()) changed_.notify_all();
  // The descriptor is closed here, once; the destructor only shuts down open ones.
  for (auto it = clients_.begin(); it != clients_.end(); ++it)
    if (*it == fd) {
      clients_.erase(it);
      break;
    }
  ::close(fd);
}

// ---- client

namespace {

const char* op_name(char op) {
  switch (op) {
    case 'H': return "joining";
    case 'S': case 'E': return "set";
    case 'G': return "get";
    case 'W': return "wait";
    case 'C': return "check";
    case 'A': return "add";
    default: return "request";
  }
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout,
                   std::string who)
    : where_(host + ":" + std::to_string(port)), who_(who.empty() ? "" : who + ": "), timeout_(timeout) {
  const sockaddr_in a = resolve(host, port, where_);
  const auto deadline = Clock::now() + timeout;
  int last_error = 0;
  for (;;) {
    // Nobody listening yet (refused) is retried; a connect that gets no answer at all
    // takes at most the time left.
    fd_ = detail::connect_by(a, deadline);
    if (fd_ >= 0) break;
    last_error = errno;
    if (Clock::now() >= deadline || last_error == ETIMEDOUT)
      DTRAIN_THROW(Timeout, who_, "rendezvous store ", where_, " (served by the chief) could not be reached within ",
                   timeout.count() / 1000.0, " s (connect: ",
                   last_error == ETIMEDOUT ? "no answer" : std::strerror(last_error), "): is the chief running?");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, milliseconds_left(deadline))));
  }
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  try {
    // The hello's reply comes by the same deadline as the connection.
    request('H', {token}, std::chrono::milliseconds(0), time_left(deadline));
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::pair<bool, std::vector<char>> TcpStore::request(char op, const std::vector<std::string>& fields,
                                                    std::chrono::milliseconds wait, std::chrono::milliseconds limit) {
  std::lock_guard lock(mutex_);
  std::string out(1, op);
  put_u32(out, static_cast<std::uint32_t>(std::max<std::int64_t>(0, wait.count())));
  put_u32(out, static_cast<std::uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(out, static_cast<std::uint32_t>(f.size()));
    out += f;
  }
  // A chief that stops answering (frozen, or its host gone without closing the
  // connection) must not hold this process forever: the reply may take the request's own
  // wait plus the patience (half the timeout, at most 10 s), or the limit the caller
  // gives. The limit applies to each send and receive: it bounds a reply that does not move.
  if (limit.count() < 0)
    limit = std::chrono::milliseconds(std::max<std::int64_t>(0, wait.count())) + detail::patience(timeout_);
  limit = std::max(limit, std::chrono::milliseconds(1));  // as the socket's timeout below, for the message
  const timeval tv = detail::timeval_of(limit);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  auto broken = [&] {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      DTRAIN_THROW(Timeout, who_, "rendezvous store ", where_, " (served by the chief) did not answer ", op_name(op),
                   " within ", limit.count() / 1000.0, " s");
    DTRAIN_THROW(PeerFailure, who_, "rendezvous store ", where_, " (served by the chief) closed the connection (",
                 op_name(op), ")");
  };
  char status = 0;
  std::uint32_t n = 0;
  errno = 0;
  if (!write_all(fd_, out.data(), out.size()) || !read_all(fd_, &status, 1) || !get_u32(fd_, n) || n > kMaxField)
    broken();
  std::vector<char> value(n);
  if (n && !read_all(fd_, value.data(), n)) broken();
  if (status == kRefused)
    DTRAIN_THROW(InvalidArgument, who_, "rendezvous store ", where_,
                 " refused this process: its cluster token (DTRAIN_CLUSTER_TOKEN) is not this job's");
  return {status == kOk, std::move(value)};
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  request('S', {key, std::string(data.begin(), data.end())}, std::chrono::milliseconds(0));
}

bool TcpStore::set_while_connected(const std::string& key, const std::vector<char>& data) {
  request('E', {key, std::string(data.begin(), data.end())}, std::chrono::milliseconds(0));
  return true;
}

std::vector<char> TcpStore::get(const std::string& key) {
  auto [found, value] = request('G', {key}, timeout_);
  if (!found)
    DTRAIN_THROW(Timeout, who_, "rendezvous store ", where_, ": key '", key, "' did not appear within ",
                 timeout_.count() / 1000.0, " s");
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  if (!request('W', keys, timeout).first) {
    std::string missing;
    const std::vector<bool> present = check(keys);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!present[i]) missing += (missing.empty() ? "" : ", ") + keys[i];
    DTRAIN_THROW(Timeout, who_, "rendezvous store ", where_, ": still missing after ", timeout.count() / 1000.0, " s: ", missing);
  }
}

void TcpStore::set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds limit) {
  request('S', {key, std::string(data.begin(), data.end())}, std::chrono::milliseconds(0), limit);
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  return std::stoll(detail::string_of(request('A', {key, std::to_string(delta)}, std::chrono::milliseconds(0)).second));
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  return check(keys, std::chrono::milliseconds(-1));
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys, std::chrono::milliseconds limit) {
  const std::vector<char> bits = request('C', keys, std::chrono::milliseconds(0), limit).second;
  std::vector<bool> out(keys.size(), false);
  for (std::size_t i = 0; i < keys.size() && i < bits.size(); ++i) out[i] = bits[i] == '1';
  return out;
}

}  // namespace dtrain::comm
