// Gloo collectives with timeouts, named failures and cached small-buffer algorithms.
#include "dtrain/comm/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstring>
#include <future>
#include <thread>

#include "dtrain/comm/in_process.h"
#include "dtrain/comm/shared_memory.h"
#include "dtrain/comm/store_keys.h"
#include "dtrain/comm/tcp_ring.h"
#include "dtrain/comm/rendezvous_store.h"
#include "dtrain/core/error.h"
#include "dtrain/core/half.h"
#include "dtrain/core/multiversion.h"

namespace dtrain::comm {
namespace {

constexpr std::size_t kRingCacheBytes = 256u << 10;

using detail::bytes_of;

// Gloo's own stores (HashStore, where the ranks are threads of one process) as a
// RendezvousStore: a key is checked by waiting 1 ms for it, and none lasts only as long
// as its process.
class GlooStore final : public RendezvousStore {
 public:
  explicit GlooStore(std::shared_ptr<gloo::rendezvous::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_->set(key, data); }
  void set(const std::string& key, const std::vector<char>& data, std::chrono::milliseconds) override {
    store_->set(key, data);
  }
  std::vector<char> get(const std::string& key) override { return store_->get(key); }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }
  std::vector<bool> check(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    std::vector<bool> present;
    for (const std::string& k : keys) {
      try {
        store_->wait({k}, std::chrono::milliseconds(1));
        present.push_back(true);
      } catch (const std::exception&) {
        present.push_back(false);
      }
    }
    return present;
  }
  bool set_while_connected(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, data);
    return false;
  }
  // Gloo's HashStore writes a key once: it has no counter to add to.
  std::int64_t add(const std::string& key, std::int64_t) override {
    DTRAIN_THROW(InvalidArgument, "Gloo's in-process store writes a key once: it cannot add to '", key,
                 "' (use the TCP store)");
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
};

std::shared_ptr<RendezvousStore> rendezvous_store(std::shared_ptr<gloo::rendezvous::Store> store) {
  if (auto ours = std::dynamic_pointer_cast<RendezvousStore>(store)) return ours;
  return std::make_shared<GlooStore>(std::move(store));
}

bool timed_out(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
}

// ---- 16-bit wire formats. bfloat16 is float32's upper half, rounded to nearest even;
// float16 is core/half.h's (F16C instructions where the CPU has them).

inline std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

DTRAIN_MULTIVERSION
void encode_bf16(const float* in, std::uint16_t* out, std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

DTRAIN_MULTIVERSION
void decode_bf16(const std::uint16_t* in, float* out, std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) out[i] = from_bf16(in[i]);
}

// TcpRing's sums, acc += in, elementwise.
DTRAIN_MULTIVERSION
void sum_into_bf16(void* acc, const void* in, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(acc);
  const auto* y = static_cast<const std::uint16_t*>(in);
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) out[i] = to_bf16(from_bf16(out[i]) + from_bf16(y[i]));
}

void sum_into_f32(void* acc, const void* in, std::size_t n) {
  add_into(static_cast<float*>(acc), static_cast<const float*>(in), n);
}

void encode_f16(const float* in, std::uint16_t* out, std::size_t n) { to_f16(in, out, n); }
void decode_f16(const std::uint16_t* in, float* out, std::size_t n) { from_f16(in, out, n); }
void sum_into_f16(void* acc, const void* in, std::size_t n) {
  add_f16(static_cast<std::uint16_t*>(acc), static_cast<const std::uint16_t*>(in), n);
}

constexpr std::array<const char*, 4> kOps{"allreduce", "broadcast", "allgather", "barrier"};

}  // namespace

const char* wire_name(Wire wire) {
  switch (wire) {
    case Wire::f32:
      return "float32";
    case Wire::bf16:
      return "bfloat16";
    case Wire::f16:
      return "float16";
  }
  return "?";
}

struct GlooGroup::CachedRing {
  std::vector<float> buffer;
  std::unique_ptr<gloo::AllreduceRing<float>> ring;
};

GlooGroup::GlooGroup(std::shared_ptr<gloo::rendezvous::Store> store, GlooGroupOptions options)
    : options_(std::move(options)), store_(rendezvous_store(std::move(store))) {
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size)
    DTRAIN_THROW(InvalidArgument, "GlooGroup: rank ", options_.rank, " is not in [0, ", options_.size, ")");
  if (options_.task_names.empty())
    for (int r = 0; r < options_.size; ++r) options_.task_names.push_back("rank " + std::to_string(r));
  if (static_cast<int>(options_.task_names.size()) != options_.size)
    DTRAIN_THROW(InvalidArgument, "GlooGroup: ", options_.task_names.size(), " task names for ", options_.size, " ranks");
  if (options_.timeout.count() <= 0) DTRAIN_THROW(InvalidArgument, "GlooGroup: the timeout must be positive");
  // Everybody announces itself, then waits for the others, naming whoever is missing.
  // Over a TcpStore the announcement lasts as long as this process's connection.
  announced_while_connected_ = store_->set_while_connected("dtrain/arrived/" + std::to_string(options_.rank),
                                                           bytes_of(task_name(options_.rank)));
  const std::string missing =
      detail::wait_for_ranks(*store_, "dtrain/arrived/", options_.size, options_.task_names, options_.timeout);
  if (!missing.empty())
    DTRAIN_THROW(Timeout, "rendezvous: ", task_name(options_.rank), " waited ", options_.timeout.count() / 1000.0,
                 " s; these tasks never arrived: ", missing);
  if (options_.size == 1) {
    transport_ = "none (one rank)";
    return;
  }
  // Gloo writes to its peers' sockets without MSG_NOSIGNAL: a write to a peer that has
  // just died would end this process with SIGPIPE, silently, instead of an error naming
  // the peer. A program that set its own SIGPIPE handler keeps it.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  const auto connect_mesh = [this](gloo::rendezvous::Store& through) {
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options_.host;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(options_.rank, options_.size);
      context->setTimeout(options_.timeout);
      gloo::rendezvous::PrefixStore prefixed("dtrain/gloo", through);
      context->connectFullMesh(prefixed, device);
      context_ = context;
    } catch (const std::exception& e) {
      DTRAIN_THROW(PeerFailure, "rendezvous: ", task_name(options_.rank), " could not connect to every peer: ", e.what());
    }
  };
  std::future<void> mesh;
  if (options_.mesh_store) mesh = std::async(std::launch::async, [&] { connect_mesh(*options_.mesh_store); });
  else connect_mesh(*store_);
  // Every rank takes part in the shared memory, also one asked to keep to TCP, so that
  // all decide alike. (Leaving with an error waits for the mesh's thread: the future's
  // destructor does.)
  std::string why_not;
  ring_ = std::make_unique<TcpRing>(*store_, options_.rank, options_.size, options_.host, options_.timeout,
                                    options_.task_names);
  shared_ = SharedMemoryGroup::join(*store_, options_.rank, options_.size, options_.timeout, options_.task_names,
                                    options_.shared_memory ? "" : "TCP asked for", why_not);
  if (mesh.valid()) mesh.get();
  shares_memory_ = shared_ != nullptr;
  if (shared_) transport_ = "shared memory";
  else if (!options_.shared_memory) transport_ = "TCP (asked for)";
  else transport_ = "TCP (no shared memory: " + why_not + ")";
}

void GlooGroup::abandon() {
  if (ring_) ring_->shutdown();
  if (shared_) shared_->shutdown();
}

GlooGroup::~GlooGroup() = default;

std::string GlooGroup::absent_peers() {
  // Each rank that is still alive answers a roll call for this failed operation. The
  // roll call asks the store which ranks have answered, every 20 ms, until all have or
  // the patience (half the timeout, at most 10 s) has passed: one deadline for all ranks,
  // however many are missing. Over a TcpStore, a rank whose process has ended loses its
  // announcement (it went with its connection), so the roll call stops waiting for it at
  // once. Those that never answer are named. The chief, whose process may serve the
  // store, then waits as long again for the ranks that answered to finish their own roll
  // calls. Every request to the store is bounded by the same patience: a frozen chief
  // (stopped, its store with it) is named as such once it has passed, not after another
  // timeout.
  const std::string call = "dtrain/rollcall/" + std::to_string(sequence_) + "/";
  const auto key = [](const std::string& prefix, int r) { return prefix + std::to_string(r); };
  std::vector<int> pending, answered;
  for (int r = 0; r < options_.size; ++r)
    if (r != options_.rank) pending.push_back(r);
  std::string absent;
  auto name = [&](int r, const char* why) { absent += (absent.empty() ? "" : ", ") + task_name(r) + why; };
  const auto patience = detail::patience(options_.timeout);
  try {
    store_->set(key(call, options_.rank), bytes_of("here"), patience);
  } catch (const Timeout&) {
    return dtrain::detail::concat(task_name(0), " (it serves the rendezvous store, which did not answer within ",
                                  patience.count() / 1000.0, " s)");
  } catch (const std::exception&) {
    return task_name(0) + " (which serves the rendezvous store)";
  }
  const auto poll = std::chrono::milliseconds(20);
  try {
    for (const auto deadline = Clock::now() + patience; !pending.empty();) {
      std::vector<std::string> keys;
      for (int r : pending) keys.insert(keys.end(), {key(call, r), key("dtrain/arrived/", r)});
      const std::vector<bool> present = store_->check(keys, time_left(deadline));
      std::vector<int> still;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (present[2 * i]) answered.push_back(pending[i]);
        else if (!present[2 * i + 1]) name(pending[i], " (its process ended)");
        else still.push_back(pending[i]);
      }
      pending = std::move(still);
      if (pending.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::min(poll, time_left(deadline)));
    }
    store_->set(key(call + "done/", options_.rank), bytes_of("done"), patience);
    if (options_.rank == 0) {
      for (const auto deadline = Clock::now() + patience; !answered.empty();) {
        std::vector<std::string> keys;
        for (int r : answered) keys.push_back(key(call + "done/", r));
        const std::vector<bool> done = store_->check(keys, time_left(deadline));
        std::vector<int> still;
        for (std::size_t i = 0; i < answered.size(); ++i)
          if (!done[i]) still.push_back(answered[i]);
        answered = std::move(still);
        if (answered.empty() || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::min(poll, time_left(deadline)));
      }
    }
  } catch (const std::exception&) {
    // The store went away meanwhile (the chief ended): what was learnt so far stands.
    for (int r : pending) name(r, " (unknown: the rendezvous store was lost)");
    return absent;
  }
  // Only a store that removes a dead process's announcement tells alive from ended.
  for (int r : pending) name(r, announced_while_connected_ ? " (alive, but not answering)" : "");
  return absent;
}

void GlooGroup::fail(const char* op, std::size_t bytes, const std::string& what, bool timeout) {
  // The group is broken: pass the failure on to the neighbours before the roll call.
  abandon();
  const std::string absent = absent_peers();
  const std::string head = dtrain::detail::concat(task_name(options_.rank), ": ", op, " #", sequence_, " (", bytes,
                                                  " bytes) failed");
  const std::string peers = absent.empty() ? "" : "; not answering: " + absent;
  // The time it really took (the collective's wait, then the roll call), beside the timeout.
  const double elapsed = std::round(seconds_since(started_) * 10) / 10;
  if (timeout)
    DTRAIN_THROW(Timeout, head, " after ", elapsed, " s (no answer within the ", options_.timeout.count() / 1000.0,
                 " s timeout, then the roll call)", peers, " (", what, ")");
  DTRAIN_THROW(PeerFailure, head, peers, " (", what, ")");
}

template <typename Fn>
void GlooGroup::collective(const char* op, std::size_t bytes, Fn&& fn) {
  ++sequence_;
  if (options_.size == 1) return;
  started_ = Clock::now();
  try {
    if (options_.check_collectives) check_fingerprint(op, bytes);
    fn();
  } catch (const Timeout& e) {  // from the TCP ring or shared memory
    fail(op, bytes, e.what(), true);
  } catch (const PeerFailure& e) {
    fail(op, bytes, e.what(), false);
  } catch (const gloo::IoException& e) {
    fail(op, bytes, e.what(), timed_out(e.what()));
  } catch (const gloo::Exception& e) {
    fail(op, bytes, e.what(), timed_out(e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    fail(op, bytes, e.what(), timed_out(e.what()));
  }
}

void GlooGroup::check_fingerprint(const char* op, std::size_t bytes) {
  const auto id = static_cast<std::uint32_t>(std::find_if(kOps.begin(), kOps.end(), [&](const char* o) {
                                               return std::strcmp(o, op) == 0;
                                             }) - kOps.begin());
  std::array<std::uint32_t, 4> mine{id, static_cast<std::uint32_t>(sequence_), static_cast<std::uint32_t>(bytes),
                                    static_cast<std::uint32_t>(static_cast<std::uint64_t>(bytes) >> 32)};
  std::vector<std::uint32_t> all(mine.size() * static_cast<std::size_t>(options_.size));
  gloo::AllgatherOptions opts(context_);
  opts.setInput(mine.data(), mine.size());
  opts.setOutput(all.data(), all.size());
  opts.setTag(0x80000000u | static_cast<std::uint32_t>(sequence_));
  opts.setTimeout(options_.timeout);
  gloo::allgather(opts);
  auto describe = [](const std::uint32_t* f) {
    const std::uint64_t size = f[2] | (static_cast<std::uint64_t>(f[3]) << 32);
    return dtrain::detail::concat(f[0] < kOps.size() ? kOps[f[0]] : "?", " #", f[1], " (", size, " bytes)");
  };
  for (int r = 0; r < options_.size; ++r) {
    const std::uint32_t* theirs = all.data() + static_cast<std::size_t>(r) * mine.size();
    if (!std::equal(mine.begin(), mine.end(), theirs))
      DTRAIN_THROW(InvalidArgument, "collective mismatch: ", task_name(options_.rank), " runs ", describe(mine.data()),
                   " but ", task_name(r), " runs ", describe(theirs),
                   "; every worker must make the same collective calls in the same order");
  }
}

void GlooGroup::allreduce(float* data, std::size_t count, std::uint64_t key, Wire wire) {
  const std::size_t bytes = wire_bytes(count, wire);
  last_peer_wait_ = {};
  collective("allreduce", bytes, [&] {
    if (count == 0) return;
    if (wire != Wire::f32) {
      // Every 16-bit all-reduce takes the TCP ring, summing in its own format.
      std::vector<std::uint16_t>& half = wire_buffers_[key];
      half.resize(count);
      (wire == Wire::bf16 ? encode_bf16 : encode_f16)(data, half.data(), count);
      ring_->allreduce(half.data(), count, sizeof(std::uint16_t), wire == Wire::bf16 ? &sum_into_bf16 : &sum_into_f16);
      last_peer_wait_ = ring_->last_peer_wait();
      (wire == Wire::bf16 ? decode_bf16 : decode_f16)(half.data(), data, count);
      return;
    }
    if (shared_) {
      shared_->allreduce(data, count);
      last_peer_wait_ = shared_->last_peer_wait();
      return;
    }
    // AllreduceRing adds the contributions in a different order on each rank, which for
    // three or more ranks can leave the ranks' sums a rounding apart (and the workers'
    // weights drifting); with two, a + b == b + a exactly. The newer ring reduces each
    // piece on one rank and passes the result on, so every rank gets the same bits.
    if (bytes <= kRingCacheBytes && options_.size == 2) {
      auto& slot = rings_[{key, count}];
      if (!slot) {
        slot = std::make_unique<CachedRing>();
        slot->buffer.resize(count);
        slot->ring = std::make_unique<gloo::AllreduceRing<float>>(context_, std::vector<float*>{slot->buffer.data()},
                                                                  static_cast<int>(count));
      }
      std::memcpy(slot->buffer.data(), data, bytes);
      slot->ring->run();
      std::memcpy(data, slot->buffer.data(), bytes);
      return;
    }
    ring_->allreduce(data, count, sizeof(float), &sum_into_f32);
    last_peer_wait_ = ring_->last_peer_wait();
  });
}

std::shared_ptr<SharedBuffer> GlooGroup::shared_buffer(std::size_t count, Wire wire) {
  if (!shared_) return nullptr;
  const std::string refuse = wire == Wire::f32 ? "" : "16-bit buckets over TCP";
  std::string why_not;
  std::shared_ptr<SharedBuffer> buffer = shared_->buffer(*store_, count, refuse, why_not);
  if (!buffer && shares_memory_) {
    shares_memory_ = false;
    transport_ += refuse.empty() ? " (buffers copied in and out: " + why_not + ")" : " (" + refuse + ")";
  }
  return buffer;
}

void GlooGroup::allreduce(SharedBuffer& buffer, std::size_t offset, std::size_t count) {
  last_peer_wait_ = {};
  collective("allreduce", count * sizeof(float), [&] {
    if (count == 0) return;
    shared_->allreduce(buffer, offset, count);
    last_peer_wait_ = shared_->last_peer_wait();
  });
}

void GlooGroup::allreduce(double* data, std::size_t count) {
  collective("allreduce", count * sizeof(double), [&] {
    if (count == 0) return;
    gloo::AllreduceOptions opts(context_);
    opts.setInput(data, count);
    opts.setOutput(data, count);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    opts.setTag(static_cast<std::uint32_t>(sequence_));
    opts.setTimeout(options_.timeout);
    gloo::allreduce(opts);
  });
}

void GlooGroup::broadcast(float* data, std::size_t count, int root) {
  if (root < 0 || root >= options_.size)
    DTRAIN_THROW(InvalidArgument, "broadcast: root ", root, " is not in [0, ", options_.size, ")");
  collective("broadcast", count * sizeof(float), [&] {
    if (count == 0) return;
    gloo::BroadcastOptions opts(context_);
    if (options_.rank == root) opts.setInput(data, count);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTag(static_cast<std::uint32_t>(sequence_));
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  });
}

void GlooGroup::allgather(const float* in, float* out, std::size_t count) {
  collective("allgather", count * sizeof(float), [&] {
    if (count == 0) return;
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<float*>(in), count);
    opts.setOutput(out, count * static_cast<std::size_t>(options_.size));
    opts.setTag(static_cast<std::uint32_t>(sequence_));
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  });
  if (options_.size == 1 && count && in != out) std::memcpy(out, in, count * sizeof(float));
}

void GlooGroup::barrier() {
  collective("barrier", 0, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(static_cast<std::uint32_t>(sequence_));
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace dtrain::comm
