// What the comm layer's users of a rendezvous store share (internal to the comm layer).
#pragma once

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace dtrain::comm::detail {

inline std::vector<char> bytes_of(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

// names[rank], or "rank N" past the end of the list.
inline std::string rank_name(const std::vector<std::string>& names, int rank) {
  return rank < static_cast<int>(names.size()) ? names[static_cast<std::size_t>(rank)] : "rank " + std::to_string(rank);
}

// Waits until the store holds prefix + r for every rank r < size, all within `timeout`.
// Returns the names of the ranks whose key never came ("worker:1, worker:2"); empty when
// every one did.
inline std::string wait_for_ranks(gloo::rendezvous::Store& store, const std::string& prefix, int size,
                                  const std::vector<std::string>& names, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string missing;
  for (int r = 0; r < size; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      store.wait({prefix + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      missing += (missing.empty() ? "" : ", ") + rank_name(names, r);
    }
  }
  return missing;
}

}  // namespace dtrain::comm::detail
