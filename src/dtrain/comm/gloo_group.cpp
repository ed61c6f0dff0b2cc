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

#include <cstring>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

constexpr std::size_t kRingCacheBytes = 1u << 20;

std::vector<char> bytes_of(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

bool timed_out(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
}

}  // namespace

struct GlooGroup::CachedRing {
  std::vector<float> buffer;
  std::unique_ptr<gloo::AllreduceRing<float>> ring;
};

GlooGroup::GlooGroup(std::shared_ptr<gloo::rendezvous::Store> store, GlooGroupOptions options)
    : options_(std::move(options)), store_(std::move(store)) {
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size)
    DTRAIN_THROW(InvalidArgument, "GlooGroup: rank ", options_.rank, " is not in [0, ", options_.size, ")");
  if (options_.task_names.empty())
    for (int r = 0; r < options_.size; ++r) options_.task_names.push_back("rank " + std::to_string(r));
  if (static_cast<int>(options_.task_names.size()) != options_.size)
    DTRAIN_THROW(InvalidArgument, "GlooGroup: ", options_.task_names.size(), " task names for ", options_.size, " ranks");
  if (options_.timeout.count() <= 0) DTRAIN_THROW(InvalidArgument, "GlooGroup: the timeout must be positive");
  // Everybody announces itself, then waits for the others, naming whoever is missing.
  const std::string me = "dtrain/arrived/" + std::to_string(options_.rank);
  store_->set(me, bytes_of(task_name(options_.rank)));
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  std::string missing;
  for (int r = 0; r < options_.size; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      store_->wait({"dtrain/arrived/" + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      missing += (missing.empty() ? "" : ", ") + task_name(r);
    }
  }
  if (!missing.empty())
    DTRAIN_THROW(Timeout, "rendezvous: ", task_name(options_.rank), " waited ", options_.timeout.count() / 1000.0,
                 " s; these tasks never arrived: ", missing);
  if (options_.size == 1) return;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options_.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options_.rank, options_.size);
    context->setTimeout(options_.timeout);
    gloo::rendezvous::PrefixStore prefixed("dtrain/gloo", *store_);
    context->connectFullMesh(prefixed, device);
    context_ = context;
  } catch (const std::exception& e) {
    DTRAIN_THROW(PeerFailure, "rendezvous: ", task_name(options_.rank), " could not connect to every peer: ", e.what());
  }
}

GlooGroup::~GlooGroup() = default;

std::string GlooGroup::absent_peers() {
  // Each rank that is still alive answers a roll call for this failed operation; those
  // that do not within a few seconds are named.
  const std::string call = "dtrain/rollcall/" + std::to_string(sequence_) + "/";
  std::string absent;
  try {
    store_->set(call + std::to_string(options_.rank), bytes_of("here"));
    const auto wait = std::min(options_.timeout, std::chrono::milliseconds(3000));
    for (int r = 0; r < options_.size; ++r) {
      if (r == options_.rank) continue;
      try {
        store_->wait({call + std::to_string(r)}, wait);
      } catch (const std::exception&) {
        absent += (absent.empty() ? "" : ", ") + task_name(r);
      }
    }
  } catch (const std::exception&) {
    return task_name(0) + " (which serves the rendezvous store)";
  }
  return absent;
}

void GlooGroup::fail(const char* op, std::size_t bytes, const std::string& what, bool timeout) {
  const std::string absent = absent_peers();
  const std::string head = dtrain::detail::concat(task_name(options_.rank), ": ", op, " #", sequence_, " (", bytes,
                                                  " bytes) failed");
  const std::string peers = absent.empty() ? "" : "; not answering: " + absent;
  if (timeout)
    DTRAIN_THROW(Timeout, head, " after ", options_.timeout.count() / 1000.0, " s", peers, " (", what, ")");
  DTRAIN_THROW(PeerFailure, head, peers, " (", what, ")");
}

template <typename Fn>
void GlooGroup::collective(const char* op, std::size_t bytes, Fn&& fn) {
  ++sequence_;
  if (options_.size == 1) return;
  try {
    fn();
  } catch (const gloo::IoException& e) {
    fail(op, bytes, e.what(), timed_out(e.what()));
  } catch (const gloo::Exception& e) {
    fail(op, bytes, e.what(), timed_out(e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    fail(op, bytes, e.what(), timed_out(e.what()));
  }
}

void GlooGroup::allreduce(float* data, std::size_t count, std::uint64_t key) {
  const std::size_t bytes = count * sizeof(float);
  collective("allreduce", bytes, [&] {
    if (count == 0) return;
    if (bytes <= kRingCacheBytes) {
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
    gloo::AllreduceOptions opts(context_);
    opts.setInput(data, count);
    opts.setOutput(data, count);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
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
