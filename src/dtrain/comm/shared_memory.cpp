// The shared-memory all-reduce between processes of one host.
#include "dtrain/comm/shared_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "dtrain/comm/in_process.h"
#include "dtrain/comm/store_keys.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"
#include "dtrain/core/multiversion.h"

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

constexpr int kMaxRanks = 64;
constexpr std::size_t kPage = 4096;
// The counters each rank moves on through a piece of an all-reduce.
enum Counter { kArrived, kReduced, kDone, kCounters };
const char* const kWaitingFor[kCounters] = {"start the all-reduce", "sum its share",
                                             "finish reading the previous sum"};
enum State : std::int32_t { kPresent, kGaveUp, kLeft };

struct alignas(64) RankState {
  std::atomic<std::uint64_t> counter[kCounters];
  std::atomic<std::int32_t> state;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "counters in shared memory must be lock-free to work between processes");

std::string read_link(const char* path) {
  char buffer[256];
  const ssize_t n = ::readlink(path, buffer, sizeof buffer - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string("?");
}

using detail::bytes_of;
using detail::rank_name;
using detail::string_of;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Each rank's slot: 8 MiB up to 4 ranks, 32 MiB in all from 4 to 64 ranks.
std::size_t slot_bytes_for(int size) {
  return round_up(std::clamp<std::size_t>((32u << 20) / static_cast<std::size_t>(size), 256u << 10, 8u << 20), kPage);
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// The [begin, end) of `count` that `rank` sums: whole cache lines.
std::pair<std::size_t, std::size_t> share_of(std::size_t count, int rank, int size) {
  const auto n = static_cast<std::size_t>(size);
  const std::size_t share = round_up((count + n - 1) / n, kSharedAlignFloats);
  const std::size_t begin = std::min(count, share * static_cast<std::size_t>(rank));
  return {begin, std::min(count, begin + share)};
}

// Every out[k][0, count) = the sum over q of in[q][0, count), a block at a time, so that
// each input is read once and each output written once. Two values are added in float32
// (one rounding); more are accumulated in double and rounded once, so that the sum does
// not depend on the ranks' order.
DTRAIN_MULTIVERSION
void sum_copies(const std::vector<float*>& in, const std::vector<float*>& out, std::size_t count) {
  constexpr std::size_t kBlock = 512;
  alignas(64) float sum[kBlock];
  alignas(64) double wide[kBlock];
  for (std::size_t i = 0; i < count; i += kBlock) {
    const std::size_t n = std::min(kBlock, count - i);
    if (in.size() <= 2) {
      std::memcpy(sum, in[0] + i, n * sizeof(float));
      if (in.size() == 2) add_into(sum, in[1] + i, n);
    } else {
      const float* first = in[0] + i;
#pragma omp simd
      for (std::size_t j = 0; j < n; ++j) wide[j] = first[j];
      for (std::size_t q = 1; q < in.size(); ++q) {
        const float* x = in[q] + i;
#pragma omp simd
        for (std::size_t j = 0; j < n; ++j) wide[j] += x[j];
      }
#pragma omp simd
      for (std::size_t j = 0; j < n; ++j) sum[j] = static_cast<float>(wide[j]);
    }
    for (float* copy : out) std::memcpy(copy + i, sum, n * sizeof(float));
  }
}

struct Offered {
  SharedMapping mapping;
  std::vector<int> pids;  // [rank]
};

// The creator's pid in a segment name this file makes ("dtrain-PID-HEX"), else 0.
int creator_of(const std::string& file) {
  const std::string head = "dtrain-";
  if (file.rfind(head, 0) != 0) return 0;
  const std::size_t dash = file.find('-', head.size());
  if (dash == std::string::npos || dash == head.size() || dash - head.size() > 9 || dash + 1 == file.size()) return 0;
  for (std::size_t i = head.size(); i < dash; ++i)
    if (!std::isdigit(static_cast<unsigned char>(file[i]))) return 0;
  for (std::size_t i = dash + 1; i < file.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(file[i]))) return 0;
  return std::stoi(file.substr(head.size(), dash - head.size()));
}

// Names of segments left by a job killed while it was setting them up, removed by the
// next job that makes one. A creator holds a lock on its segment until it removes the
// name itself: a name is taken for orphaned only where no process by the creator's pid
// exists here and nobody holds that lock (a creator in another process namespace that
// shares /dev/shm still holds it).
void remove_orphaned_segments() {
  std::error_code error;
  std::filesystem::directory_iterator it("/dev/shm", error), end;
  for (; !error && it != end; it.increment(error)) {
    const std::string file = it->path().filename().string();
    const int pid = creator_of(file);
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    const int fd = ::shm_open(("/" + file).c_str(), O_RDWR, 0);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::shm_unlink(("/" + file).c_str());
    ::close(fd);
  }
}

// Rank 0 creates a segment of `bytes` (zeros) and offers it under `key`; every rank tries to attach and answers. Returns the mapping (and every rank's
// pid) where every rank attached, else none and the first reason in `why_not`, alike on
// every rank. A rank that gives a reason in `refuse` attaches to nothing and answers
// with it. The segment's name is removed once every rank has answered (or this function
// fails).
Offered share_segment(gloo::rendezvous::Store& store, const std::string& key, int rank, int size, std::size_t bytes,
                      const std::vector<std::string>& names,
                      std::chrono::milliseconds timeout, const std::string& refuse, std::string& why_not) {
  why_not.clear();
  const std::string& identity = host_identity();
  Offered out;
  NamedSegment made;  // rank 0's: its name goes when this function returns
  std::string problem = refuse;  // this rank's, if any
  if (problem.empty() && identity.find('?') != std::string::npos)
    problem = "cannot tell which host and namespaces this process is in (/proc: " + identity + ")";
  if (rank == 0) {
    if (problem.empty()) {
      made = NamedSegment::create(bytes, problem);
      out.mapping = std::move(made.mapping);
    }
    store.set(key + "/offer", bytes_of(problem.empty() ? "segment " + made.name() + " " + identity : "none " + problem));
  } else {
    try {
      store.wait({key + "/offer"}, timeout);
    } catch (const PeerFailure&) {
      throw;  // the chief's store is gone: reported as it is
    } catch (const std::exception& e) {
      DTRAIN_THROW(Timeout, rank_name(names, rank), ": waited ", timeout.count() / 1000.0, " s for ", rank_name(names, 0),
                   " to offer shared memory (", e.what(), ")");
    }
    const std::vector<char> raw = store.get(key + "/offer");
    auto attach = [&]() -> std::string {
      std::istringstream offer(string_of(raw));
      std::string kind, segment, theirs;
      offer >> kind >> segment >> std::ws;
      std::getline(offer, theirs);
      if (kind != "segment") return "no segment was offered";
      if (theirs != identity)
        return "not on " + rank_name(names, 0) + "'s host, or in another network or process namespace (" + identity +
               " against " + theirs + ")";
      std::string failed;
      out.mapping = open_segment(segment, bytes, failed);
      return failed;
    };
    if (problem.empty()) problem = attach();
  }
  store.set(key + "/answer/" + std::to_string(rank),
            bytes_of(problem.empty() ? "yes " + std::to_string(::getpid()) : "no " + problem));
  const std::string missing = detail::wait_for_ranks(store, key + "/answer/", size, names, timeout);
  if (!missing.empty())
    DTRAIN_THROW(Timeout, rank_name(names, rank), ": waited ", timeout.count() / 1000.0,
                 " s for every rank to say whether it can share memory with the others; never answered: ", missing);
  out.pids.assign(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    const std::vector<char> raw = store.get(key + "/answer/" + std::to_string(r));
    std::istringstream answer(string_of(raw));
    std::string yes, rest;
    answer >> yes;
    if (yes == "yes") {
      answer >> out.pids[static_cast<std::size_t>(r)];
    } else if (why_not.empty()) {
      std::getline(answer >> std::ws, rest);
      why_not = rank_name(names, r) + ": " + rest;
    }
  }
  if (!why_not.empty()) out.mapping = SharedMapping();
  return out;
}

}  // namespace

// What ranks must have in common to share a segment: the kernel (its boot), the network
// namespace (namespaces that emulate hosts keep their links) and the process namespace
// (peers' pids are watched). Read once per process.
const std::string& host_identity() {
  static const std::string identity = [] {
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    return (boot.empty() ? "?" : boot) + " " + read_link("/proc/self/ns/net") + " " + read_link("/proc/self/ns/pid");
  }();
  return identity;
}

SharedMapping::~SharedMapping() {
  if (base_) ::munmap(base_, bytes_);
}

SharedMapping::SharedMapping(SharedMapping&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, bytes_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

namespace {

// `bytes` of the segment open as `fd` (named `name` in errors), mapped and populated; the
// descriptor is closed either way.
SharedMapping map_and_close(int fd, std::size_t bytes, const std::string& name, std::string& why_not) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    why_not = "cannot map " + name + ": " + std::strerror(errno);
    return {};
  }
  return SharedMapping(p, bytes);
}

}  // namespace

NamedSegment NamedSegment::create(std::size_t bytes, std::string& why_not) {
  why_not.clear();
  remove_orphaned_segments();
  std::random_device random;
  std::ostringstream n;
  n << "/dtrain-" << ::getpid() << "-" << std::hex << random() << random();
  NamedSegment made;
  const int fd = ::shm_open(n.str().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    why_not = "cannot create " + n.str() + " in /dev/shm: " + std::strerror(errno);
    return made;
  }
  made.name_ = n.str();
  if (::flock(fd, LOCK_EX) == 0) made.lock_ = ::dup(fd);
  // Reserved up front: a /dev/shm too small is this message, not a SIGBUS mid-step.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0) {
    ::close(fd);
    why_not = "cannot reserve " + std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB in /dev/shm: " + std::strerror(e);
    return made;
  }
  made.mapping = map_and_close(fd, bytes, made.name_, why_not);
  return made;
}

NamedSegment::~NamedSegment() { remove_name(); }

NamedSegment::NamedSegment(NamedSegment&& other) noexcept
    : mapping(std::move(other.mapping)), name_(std::exchange(other.name_, {})), lock_(std::exchange(other.lock_, -1)) {}

NamedSegment& NamedSegment::operator=(NamedSegment&& other) noexcept {
  if (this != &other) {
    remove_name();
    mapping = std::move(other.mapping);
    name_ = std::exchange(other.name_, {});
    lock_ = std::exchange(other.lock_, -1);
  }
  return *this;
}

void NamedSegment::remove_name() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  name_.clear();
  if (lock_ >= 0) ::close(lock_);
  lock_ = -1;
}

SharedMapping open_segment(const std::string& name, std::size_t bytes, std::string& why_not) {
  why_not.clear();
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    why_not = "cannot open " + name + ": " + std::strerror(errno);
    return {};
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    ::close(fd);
    why_not = name + " is not the size this process expects";
    return {};
  }
  return map_and_close(fd, bytes, name, why_not);
}

SharedBuffer::SharedBuffer(SharedMapping mapping, int rank, int size, std::size_t count, std::size_t stride)
    : mapping_(std::move(mapping)), rank_(rank), size_(size), count_(count), stride_(stride) {}

struct SharedMemoryGroup::Header {
  alignas(64) std::atomic<std::uint32_t> futex;  // bumped at every change a waiter may want
  std::atomic<std::uint32_t> sleepers;           // waiters asleep on it, or about to be
  RankState ranks[kMaxRanks];
};

SharedMemoryGroup::SharedMemoryGroup(int rank, int size, std::chrono::milliseconds timeout,
                                     std::vector<std::string> names)
    : rank_(rank), size_(size), timeout_(timeout), names_(std::move(names)) {}

std::size_t SharedMemoryGroup::header_bytes() { return round_up(sizeof(Header), kPage); }

SharedMemoryGroup::~SharedMemoryGroup() {
  mark(kLeft);
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

void SharedMemoryGroup::mark(int state) {
  if (!header_) return;
  // A rank that gave up stays so; one that leaves after giving up is still one that gave up.
  std::int32_t present = kPresent;
  header_->ranks[rank_].state.compare_exchange_strong(present, state);
  header_->futex.fetch_add(1);
  futex(&header_->futex, FUTEX_WAKE, INT_MAX, nullptr);
}

void SharedMemoryGroup::shutdown() { mark(kGaveUp); }

std::unique_ptr<SharedMemoryGroup> SharedMemoryGroup::join(gloo::rendezvous::Store& store, int rank, int size,
                                                           std::chrono::milliseconds timeout,
                                                           std::vector<std::string> names, const std::string& refuse,
                                                           std::string& why_not) {
  if (size > kMaxRanks) {
    why_not = "more than " + std::to_string(kMaxRanks) + " ranks";
    return nullptr;
  }
  std::unique_ptr<SharedMemoryGroup> group(new SharedMemoryGroup(rank, size, timeout, std::move(names)));
  group->slot_bytes_ = slot_bytes_for(size);
  const std::size_t bytes = header_bytes() + group->slot_bytes_ * static_cast<std::size_t>(size);
  // The header's atomics start as the segment's zeros.
  Offered offered = share_segment(store, "dtrain/shm/group", rank, size, bytes, group->names_, timeout, refuse, why_not);
  if (!offered.mapping) return nullptr;
  group->mapping_ = std::move(offered.mapping);
  group->header_ = reinterpret_cast<Header*>(group->mapping_.base());
  group->watch(offered.pids);
  return group;
}

std::shared_ptr<SharedBuffer> SharedMemoryGroup::buffer(gloo::rendezvous::Store& store, std::size_t count,
                                                        const std::string& refuse, std::string& why_not) {
  const std::size_t stride = round_up(std::max<std::size_t>(count, 1) * sizeof(float), kPage);
  Offered offered = share_segment(store, "dtrain/shm/buffer/" + std::to_string(++buffers_), rank_, size_,
                                  stride * static_cast<std::size_t>(size_), names_, timeout_, refuse, why_not);
  if (!offered.mapping) return nullptr;
  return std::make_shared<SharedBuffer>(std::move(offered.mapping), rank_, size_, count, stride);
}

void SharedMemoryGroup::watch(const std::vector<int>& pids) {
  // A peer's pidfd becomes readable when its process ends, whoever reaps it.
  pids_ = pids;
  pidfds_.assign(static_cast<std::size_t>(size_), -1);
  for (int r = 0; r < size_; ++r) {
    const int pid = pids[static_cast<std::size_t>(r)];
    if (pid == ::getpid()) continue;
    const long fd = ::syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) pidfds_[static_cast<std::size_t>(r)] = static_cast<int>(fd);
    else if (errno == ESRCH)
      DTRAIN_THROW(PeerFailure, rank_name(names_, r), "'s process (pid ", pid, ") ended before the first all-reduce");
    // Elsewhere (no pidfd_open in this kernel) a dead peer is found by the timeout.
  }
}

float* SharedMemoryGroup::slot(int rank) const {
  return reinterpret_cast<float*>(mapping_.base() + header_bytes() +
                                  slot_bytes_ * static_cast<std::size_t>(rank));
}

void SharedMemoryGroup::publish(int field, std::uint64_t value) {
  header_->ranks[rank_].counter[field].store(value);
  // A waiter counts itself a sleeper before it reads the futex word and looks at the
  // counters again (all sequentially consistent), so a publisher that sees no sleeper
  // needs neither to move the word nor to wake anyone.
  if (header_->sleepers.load() != 0) {
    header_->futex.fetch_add(1);
    futex(&header_->futex, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void SharedMemoryGroup::check_peers(int field, std::uint64_t target) {
  std::vector<pollfd> watched;
  std::vector<int> whose;
  auto waited_for = [&] {
    return dtrain::detail::concat(" while ", rank_name(names_, rank_), " waited for it to ", kWaitingFor[field],
                                  " (shared-memory all-reduce)");
  };
  for (int r = 0; r < size_; ++r) {
    const RankState& peer = header_->ranks[r];
    if (r == rank_ || peer.counter[field].load() >= target) continue;
    // A rank marks itself only after its last publication: behind now means behind for good.
    if (const std::int32_t state = peer.state.load(); state != kPresent && peer.counter[field].load() < target)
      DTRAIN_THROW(PeerFailure, rank_name(names_, r),
                   state == kGaveUp ? " gave up (its communication failed or its step was abandoned)"
                                    : " left the group",
                   waited_for());
    if (const int fd = pidfds_[static_cast<std::size_t>(r)]; fd >= 0) {
      watched.push_back({fd, POLLIN, 0});
      whose.push_back(r);
    }
  }
  if (watched.empty() || ::poll(watched.data(), watched.size(), 0) <= 0) return;
  for (std::size_t i = 0; i < watched.size(); ++i)
    if ((watched[i].revents & (POLLIN | POLLHUP)) && header_->ranks[whose[i]].counter[field].load() < target)
      DTRAIN_THROW(PeerFailure, rank_name(names_, whose[i]), "'s process (pid ", pids_[static_cast<std::size_t>(whose[i])],
                   ") ended", waited_for());
}

void SharedMemoryGroup::wait_all(int field, std::uint64_t target) {
  auto all_there = [&] {
    for (int r = 0; r < size_; ++r)
      if (header_->ranks[r].counter[field].load() < target) return false;
    return true;
  };
  if (all_there()) return;
  // A short spin first: a peer a few microseconds behind costs no sleep and wake-up.
  for (const auto spin_until = Clock::now() + 20us; Clock::now() < spin_until;) {
    for (int i = 0; i < 64; ++i) cpu_relax();
    if (all_there()) return;
  }
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    header_->sleepers.fetch_add(1);
    const std::uint32_t seen = header_->futex.load();
    if (all_there()) {
      header_->sleepers.fetch_sub(1);
      return;
    }
    const timespec slice{0, 5'000'000};  // 5 ms: how often dead processes are looked for
    futex(&header_->futex, FUTEX_WAIT, seen, &slice);
    header_->sleepers.fetch_sub(1);
    if (all_there()) return;
    check_peers(field, target);
    if (Clock::now() >= deadline) {
      std::string behind;
      for (int r = 0; r < size_; ++r)
        if (header_->ranks[r].counter[field].load() < target)
          behind += (behind.empty() ? "" : ", ") + rank_name(names_, r);
      DTRAIN_THROW(Timeout, rank_name(names_, rank_), " waited ", timeout_.count() / 1000.0, " s for ", behind, " to ",
                   kWaitingFor[field], " (shared-memory all-reduce)");
    }
  }
}

void SharedMemoryGroup::allreduce(float* data, std::size_t count) {
  last_peer_wait_ = {};
  const std::size_t piece = slot_bytes_ / sizeof(float);
  for (std::size_t offset = 0; offset < count; offset += piece) {
    const std::size_t n = std::min(piece, count - offset);
    ++sequence_;
    // Slots are reused piece after piece: nobody writes before everyone has read.
    wait_all(kDone, sequence_ - 1);
    std::memcpy(slot(rank_), data + offset, n * sizeof(float));
    publish(kArrived, sequence_);
    const Clock::time_point arrived = Clock::now();
    wait_all(kArrived, sequence_);
    if (offset == 0) last_peer_wait_ = Clock::now() - arrived;
    // Each rank sums its share of every slot into slot 0.
    const auto [begin, end] = share_of(n, rank_, size_);
    inputs_.clear();
    for (int r = 0; r < size_; ++r) inputs_.push_back(slot(r) + begin);
    outputs_.assign(1, inputs_[0]);
    if (begin < end) sum_copies(inputs_, outputs_, end - begin);
    publish(kReduced, sequence_);
    wait_all(kReduced, sequence_);
    std::memcpy(data + offset, slot(0), n * sizeof(float));
    publish(kDone, sequence_);
  }
}

void SharedMemoryGroup::allreduce(SharedBuffer& buffer, std::size_t offset, std::size_t count) {
  if (buffer.size() != size_ || offset + count > buffer.count())
    DTRAIN_THROW(InvalidArgument, "shared-memory all-reduce: [", offset, ", ", offset + count,
                 ") is not within a buffer of ", buffer.count(), " floats for ", buffer.size(), " ranks");
  ++sequence_;
  // Every rank has written its copy; each sums its share of all copies into all of them;
  // once everyone has, every copy holds the sum and may be written again.
  publish(kArrived, sequence_);
  const Clock::time_point arrived = Clock::now();
  wait_all(kArrived, sequence_);
  last_peer_wait_ = Clock::now() - arrived;
  const auto [begin, end] = share_of(count, rank_, size_);
  inputs_.clear();
  for (int r = 0; r < size_; ++r) inputs_.push_back(buffer.of(r) + offset + begin);
  if (begin < end) sum_copies(inputs_, inputs_, end - begin);
  publish(kReduced, sequence_);
  wait_all(kReduced, sequence_);
  publish(kDone, sequence_);
}

}  // namespace dtrain::comm
