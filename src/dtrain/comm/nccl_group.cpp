// The NCCL group's bounded joining, collectives and error translation, over NcclApi.
#include "dtrain/comm/nccl_group.h"

#include <thread>
#include <utility>

#include "dtrain/comm/rendezvous_store.h"
#include "dtrain/comm/store_keys.h"
#include "dtrain/core/error.h"

namespace dtrain::comm {
namespace {

// Between two polls of the communicator: its collectives take microseconds to
// milliseconds, and the caller waits for nothing else meanwhile.
void pause() { std::this_thread::sleep_for(std::chrono::microseconds(20)); }

double seconds(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

}  // namespace

NcclGroup::NcclGroup(const NcclApi& api, std::shared_ptr<RendezvousStore> store, NcclGroupOptions options)
    : api_(api), store_(std::move(store)), options_(std::move(options)) {
  if (options_.size < 1 || options_.rank < 0 || options_.rank >= options_.size)
    DTRAIN_THROW(InvalidArgument, "NCCL group: rank ", options_.rank, " of ", options_.size);
  const auto deadline = Clock::now() + options_.timeout;
  const std::string gpu = "cuda:" + std::to_string(options_.device);
  // Rank 0's unique id, through the store.
  const std::string id_key = options_.prefix + "id";
  NcclApi::Id id{};
  if (options_.rank == 0) {
    if (const int r = api_.get_unique_id(id); r != kNcclSuccess) fail("ncclGetUniqueId on " + gpu, r);
    store_->set(id_key, std::vector<char>(id.begin(), id.end()));
  } else {
    if (!detail::arrived(*store_, {id_key}, options_.timeout))
      DTRAIN_THROW(Timeout, "NCCL communicator: ", task_name(options_.rank), " waited ", seconds(options_.timeout),
                   " s for ", task_name(0), " to publish the communicator's unique id");
    const std::vector<char> v = store_->get(id_key);
    if (v.size() != id.size())
      DTRAIN_THROW(InternalError, "NCCL communicator: the unique id in the store has ", v.size(), " bytes, not ",
                   id.size());
    std::copy(v.begin(), v.end(), id.begin());
  }
  const std::string me = std::to_string(options_.rank);
  store_->set_while_connected(options_.prefix + "alive/" + me, detail::bytes_of("here"));
  store_->set(options_.prefix + "joined/" + me, detail::bytes_of("here"));
  const std::string op = "joining the NCCL communicator on " + gpu + " (" + std::to_string(options_.size) + " ranks)";
  if (const int r = api_.init(comm_, options_.size, id, options_.rank, options_.device);
      r != kNcclSuccess && r != kNcclInProgress)
    fail(op, r);
  for (;;) {
    int state = kNcclSuccess;
    if (const int r = api_.async_error(comm_, state); r != kNcclSuccess) fail(op, r);
    if (state == kNcclSuccess) return;
    if (state != kNcclInProgress) fail(op, state);
    if (Clock::now() >= deadline) {
      abort_communicator();
      std::vector<std::string> keys;
      for (int r = 0; r < options_.size; ++r) keys.push_back(options_.prefix + "joined/" + std::to_string(r));
      const std::vector<bool> joined = store_->check(keys, detail::patience(options_.timeout));
      std::string missing;
      for (int r = 0; r < options_.size; ++r)
        if (!joined[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + task_name(r);
      DTRAIN_THROW(Timeout, op, ": ", task_name(options_.rank), " waited ", seconds(options_.timeout), " s; ",
                   missing.empty() ? "every rank came to the store, but NCCL did not connect them (an interface or "
                                     "network NCCL cannot use? NCCL_DEBUG=INFO says more)"
                                   : "never came: " + missing);
    }
    pause();
  }
}

NcclGroup::~NcclGroup() {
  if (comm_ == nullptr) return;
  if (failed_ || cancelled_.load(std::memory_order_acquire)) api_.abort(comm_);
  else api_.destroy(comm_);
}

void NcclGroup::abort_communicator() {
  failed_ = true;
  started_.clear();  // nothing started is waited for any more
  if (comm_ == nullptr) return;
  api_.abort(comm_);
  comm_ = nullptr;
}

std::string NcclGroup::task_name(int rank) const { return detail::rank_name(options_.task_names, rank); }

std::string NcclGroup::describe() const {
  return dtrain::detail::concat("NCCL (cuda:", options_.device, ", ", options_.size, " ranks)");
}

std::string NcclGroup::next_op(std::size_t count) {
  std::string tasks;
  for (int r = 0; r < options_.size; ++r) tasks += (r ? ", " : "") + task_name(r);
  const std::string op = dtrain::detail::concat("NCCL all-reduce #", ++sequence_, " of ", count, " floats on cuda:",
                                                options_.device, " among ", tasks);
  check_cancelled(op);
  if (failed_ || comm_ == nullptr) DTRAIN_THROW(InvalidArgument, "NCCL group: used again after it failed");
  return op;
}

void NcclGroup::cancel(const std::string& why) {
  {
    std::lock_guard lock(cancel_mutex_);
    cancel_why_ = why;
  }
  cancelled_.store(true, std::memory_order_release);
}

void NcclGroup::check_cancelled(const std::string& op) {
  if (!cancelled_.load(std::memory_order_acquire)) return;
  abort_communicator();
  std::lock_guard lock(cancel_mutex_);
  DTRAIN_THROW(PeerFailure, op, ": cancelled, so the communicator was aborted: ", cancel_why_);
}

void NcclGroup::queued(const std::string& op, int result, bool beside) {
  if (result != kNcclSuccess && result != kNcclInProgress) fail(op, result);
  // A nonblocking communicator may still be queueing the collective: nothing may follow it
  // (its end's mark included) until it says success.
  const auto deadline = Clock::now() + options_.timeout;
  for (int state = result; state == kNcclInProgress;) {
    check_cancelled(op);
    if (const int r = api_.async_error(comm_, state); r != kNcclSuccess) fail(op, r);
    if (state != kNcclSuccess && state != kNcclInProgress) fail(op, state);
    if (state == kNcclInProgress && Clock::now() >= deadline) {
      abort_communicator();
      DTRAIN_THROW(Timeout, op, ": not queued within ", seconds(options_.timeout),
                   " s, so the communicator was aborted; ", absent_peers(op));
    }
    if (state == kNcclInProgress) pause();
  }
  if (const int r = api_.record(comm_, options_.device, beside); r != kNcclSuccess) fail(op, r);
}

void NcclGroup::all_reduce(float* data, std::size_t count) {
  const std::string op = next_op(count);
  queued(op, api_.all_reduce(comm_, data, count, options_.device), false);
  wait_done(op);
}

void NcclGroup::start_all_reduce(float* data, std::size_t count) {
  const std::string op = next_op(count);
  queued(op, api_.all_reduce_beside(comm_, data, count, options_.device), true);
  started_ = op;
}

void NcclGroup::finish_all_reduces() {
  if (started_.empty()) return;
  if (failed_ || comm_ == nullptr) DTRAIN_THROW(InvalidArgument, "NCCL group: used again after it failed");
  const std::string op = std::exchange(started_, std::string());
  wait_done(op);
  if (const int r = api_.join(comm_, options_.device); r != kNcclSuccess) fail(op, r);
}

void NcclGroup::wait_done(const std::string& op) {
  const auto deadline = Clock::now() + options_.timeout;
  for (;;) {
    check_cancelled(op);
    std::string why;
    const int finished = api_.done(comm_, why);
    if (finished == 0) return;
    if (finished < 0) {
      failed_ = true;
      DTRAIN_THROW(DeviceError, op, ": the device failed: ", why);
    }
    int state = kNcclSuccess;
    if (const int r = api_.async_error(comm_, state); r != kNcclSuccess) fail(op, r);
    if (state != kNcclSuccess && state != kNcclInProgress) fail(op, state);
    if (Clock::now() >= deadline) {
      // Aborted first, so that the device's queue is released; then the roll call.
      abort_communicator();
      DTRAIN_THROW(Timeout, op, ": not done within ", seconds(options_.timeout), " s, so the communicator was aborted; ",
                   absent_peers(op));
    }
    pause();
  }
}

void NcclGroup::fail(const std::string& op, int result) {
  std::string words = api_.error_string ? api_.error_string(result) : std::string();
  if (comm_ != nullptr && api_.last_error)
    if (const std::string last = api_.last_error(comm_); !last.empty()) words += (words.empty() ? "" : ": ") + last;
  abort_communicator();
  const std::string what = dtrain::detail::concat(op, ": NCCL says '", words, "' (ncclResult_t ", result, ")");
  switch (result) {
    case kNcclRemoteError:
      DTRAIN_THROW(PeerFailure, what, "; a peer failed or closed its connection; ", absent_peers(op));
    case kNcclSystemError:
      DTRAIN_THROW(Unavailable, what, "; a system call or the network failed; ", absent_peers(op));
    case kNcclUnhandledCudaError:
      DTRAIN_THROW(DeviceError, what);
    case kNcclInvalidArgument:
    case kNcclInvalidUsage:
      DTRAIN_THROW(InvalidArgument, what);
    default:
      DTRAIN_THROW(InternalError, what);
  }
}

std::string NcclGroup::absent_peers(const std::string& op) {
  if (options_.size < 2) return "no other rank to wait for";
  // Every live rank answers a roll call for the failed collective; the store forgets a
  // rank's alive key when its process ends. Those that never answer within the patience
  // are named, with what the store knows of them.
  const std::string call = options_.prefix + "rollcall/" + std::to_string(sequence_) + "/";
  const auto patience = detail::patience(options_.timeout);
  std::vector<int> pending;
  for (int r = 0; r < options_.size; ++r)
    if (r != options_.rank) pending.push_back(r);
  std::string absent;
  auto name = [&](int r, const char* why) { absent += (absent.empty() ? "" : ", ") + task_name(r) + why; };
  try {
    store_->set(call + std::to_string(options_.rank), detail::bytes_of("here"), patience);
    for (const auto deadline = Clock::now() + patience; !pending.empty();) {
      std::vector<std::string> keys;
      for (int r : pending)
        keys.insert(keys.end(), {call + std::to_string(r), options_.prefix + "alive/" + std::to_string(r)});
      const std::vector<bool> present = store_->check(keys, time_left(deadline));
      std::vector<int> still;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        if (present[2 * i]) continue;  // answered
        if (!present[2 * i + 1]) name(pending[i], " (its process ended)");
        else still.push_back(pending[i]);
      }
      pending = std::move(still);
      if (pending.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception& e) {
    return dtrain::detail::concat("the roll call after ", op, " failed too: ", e.what());
  }
  for (int r : pending) name(r, " (alive, but not answering)");
  return absent.empty() ? "every other rank answered the roll call" : "not there: " + absent;
}

}  // namespace dtrain::comm
