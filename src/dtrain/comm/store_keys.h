// What the comm layer's users of a rendezvous store share (internal to the comm layer).
#pragma once

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "dtrain/core/clock.h"
#include "dtrain/core/error.h"

namespace dtrain::comm::detail {

inline std::vector<char> bytes_of(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }
inline std::string string_of(const std::vector<char>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// names[rank], or "rank N" past the end of the list.
inline std::string rank_name(const std::vector<std::string>& names, int rank) {
  return rank < static_cast<int>(names.size()) ? names[static_cast<std::size_t>(rank)] : "rank " + std::to_string(rank);
}

// The slack beyond a wait: how long a store's reply may take beyond the wait it was
// asked for, and how long the roll call after a failed collective waits for the others.
// Half the timeout, at most 10 s, so that a frozen chief (whose process serves the store)
// is named within the timeout plus this (docs/errors.md, "Deadlines").
inline std::chrono::milliseconds patience(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 2, std::chrono::milliseconds(1), std::chrono::milliseconds(10000));
}

// Whether every one of `keys` came within `timeout` (false: it passed first). A store
// that is gone (PeerFailure) is reported as it is.
inline bool arrived(gloo::rendezvous::Store& store, const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) {
  try {
    store.wait(keys, timeout);
    return true;
  } catch (const PeerFailure&) {
    throw;
  } catch (const std::exception&) {
    return false;
  }
}

// Waits until the store holds prefix + r for every rank r < size, all within `timeout`.
// Returns the names of the ranks whose key never came ("worker:1, worker:2"); empty when
// every one did. A store that is gone (PeerFailure) is reported as it is.
inline std::string wait_for_ranks(gloo::rendezvous::Store& store, const std::string& prefix, int size,
                                  const std::vector<std::string>& names, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string missing;
  for (int r = 0; r < size; ++r)
    if (!arrived(store, {prefix + std::to_string(r)}, time_left(deadline)))
      missing += (missing.empty() ? "" : ", ") + rank_name(names, r);
  return missing;
}

}  // namespace dtrain::comm::detail
