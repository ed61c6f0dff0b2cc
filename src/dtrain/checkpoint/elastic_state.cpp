// ElasticState: a Checkpoint's snapshot kept in memory, and passed between workers.
#include "dtrain/checkpoint/elastic_state.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/core/rng.h"

namespace dtrain::train {

void ElasticState::commit(std::int64_t step) {
  if (step < 0) DTRAIN_THROW(InvalidArgument, "ElasticState::commit: the step must be >= 0, got ", step);
  step_ = -1;  // a commit that fails part way is no commit
  checkpoint_.snapshot(snapshot_, /*copy=*/true);
  step_ = step;
}

std::int64_t ElasticState::restore() {
  if (!committed()) DTRAIN_THROW(InvalidArgument, "ElasticState::restore: nothing was committed");
  checkpoint_.restore(snapshot_, "the commit of step " + std::to_string(step_));
  return step_;
}

std::size_t ElasticState::bytes() const {
  std::size_t total = 0;
  for (const auto& [name, t] : snapshot_.data.tensors) total += t.nbytes();
  return total;
}

namespace {

// The tensors' names, dtypes and shapes: equal where a commit can go from one to the other.
std::uint64_t layout_of(const Snapshot& snapshot) {
  std::string text;
  for (const auto& [name, t] : snapshot.data.tensors)
    text += name + " " + std::string(dtype_name(t.dtype())) + " " + t.shape().to_string() + "\n";
  return fnv1a(text);
}

struct Offer {
  std::int64_t step = -1;
  std::uint64_t digest = 0, layout = 0;
  std::size_t metadata = 0;  // bytes of the JSON state
};

}  // namespace

ElasticState::Settled ElasticState::settle(ElasticMembership& workers, const std::string& key) {
  // A member whose last receipt failed part way holds no commit, but its block is laid
  // out: it offers nothing (step -1) and receives.
  if (!committed() && !snapshot_.block)
    DTRAIN_THROW(InvalidArgument, "ElasticState::settle: ", workers.id(), " has nothing committed");
  const std::string metadata = nlohmann::json(snapshot_.data.metadata).dump();
  std::ostringstream mine;
  mine << step_ << " " << digest() << " " << layout_of(snapshot_) << " " << metadata.size();
  const std::vector<std::string> all = workers.exchange(key, mine.str());
  std::vector<Offer> offers(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    in >> offers[r].step >> offers[r].digest >> offers[r].layout >> offers[r].metadata;
    if (!in) DTRAIN_THROW(InternalError, "ElasticState::settle: ", workers.members()[r], " sent '", all[r], "'");
  }
  Settled out;
  const auto latest = std::max_element(offers.begin(), offers.end(),
                                       [](const Offer& a, const Offer& b) { return a.step < b.step; });
  out.source = static_cast<int>(latest - offers.begin());
  out.step = latest->step;
  if (out.step < 0)
    DTRAIN_THROW(InvalidArgument, "elastic: no member holds a commit (each one's last receipt of it failed part way)");
  const Offer& source = *latest;
  const std::string& source_id = workers.members()[static_cast<std::size_t>(out.source)];
  std::vector<bool> receives(offers.size(), false);
  for (std::size_t r = 0; r < offers.size(); ++r) {
    const std::string& who = workers.members()[r];
    if (offers[r].layout != source.layout)
      DTRAIN_THROW(InvalidArgument, "elastic: ", who, "'s model and optimizer hold other variables (names or shapes) ",
                   "than ", source_id, "'s; every worker must build the same model");
    receives[r] = offers[r].step != source.step || offers[r].digest != source.digest;
    if (receives[r]) out.receivers.push_back(who);
  }
  if (out.receivers.empty()) return out;
  // Every member takes part in each broadcast; those that hold the commit already get
  // their own bytes again.
  const auto me = static_cast<std::size_t>(std::find(workers.members().begin(), workers.members().end(), workers.id()) -
                                            workers.members().begin());
  out.received = receives[me];
  if (out.received) step_ = -1;  // until the whole commit came
  std::size_t used = 0;
  for (const auto& [name, t] : snapshot_.data.tensors) used += t.nbytes();
  out.bytes = used + source.metadata + snapshot_.checksums.size() * sizeof(std::uint64_t);
  // The block's capacity is whole pages: its bytes go as whole floats, in place.
  if (used > 0) workers.broadcast(snapshot_.block.get(), (used + 3) / 4 * 4, out.source);
  std::string text = out.source == static_cast<int>(me) ? metadata : std::string(source.metadata, '\0');
  workers.broadcast(text.data(), text.size(), out.source);
  std::vector<std::uint64_t> checksums = snapshot_.checksums;
  workers.broadcast(checksums.data(), checksums.size() * sizeof(std::uint64_t), out.source);
  if (out.received) {
    snapshot_.data.metadata = nlohmann::json::parse(text).get<std::map<std::string, std::string>>();
    snapshot_.checksums = std::move(checksums);
    step_ = out.step;
  }
  return out;
}

}  // namespace dtrain::train
