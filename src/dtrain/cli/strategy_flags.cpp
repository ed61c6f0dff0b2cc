// Reading --consistency and --partitioner.
#include "dtrain/cli/strategy_flags.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "dtrain/core/error.h"

namespace dtrain::cli {
namespace {

// `digits` as a whole number in [least, most], or nothing: no sign, no space, nothing after.
std::optional<std::int64_t> whole_number(const std::string& digits, std::int64_t least, std::int64_t most) {
  if (digits.empty() || !std::isdigit(static_cast<unsigned char>(digits[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || v < least || v > most) return std::nullopt;
  return v;
}

}  // namespace

distribute::Consistency parse_consistency(const std::string& text) {
  if (text.empty() || text == "async") return distribute::Consistency::async();
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  int n = 0;
  if (colon != std::string::npos) {
    const auto v = whole_number(text.substr(colon + 1), 0, 1'000'000);
    if (!v) DTRAIN_THROW(InvalidArgument, "--consistency '", text, "': expected a number of 0 or more after the colon");
    n = static_cast<int>(*v);
  }
  if (kind == "ssp" && colon != std::string::npos) return distribute::Consistency::ssp(n);
  if (kind == "sync") return distribute::Consistency::sync(n);
  DTRAIN_THROW(InvalidArgument, "--consistency '", text, "': expected async, ssp:K (K closures of staleness) or ",
               "sync[:B] (B backup workers)");
}

distribute::Partitioner parse_partitioner(const std::string& text) {
  if (text.empty()) return {};
  auto fail = [&](const std::string& why) -> distribute::Partitioner {
    DTRAIN_THROW(InvalidArgument, "--partitioner '", text, "': ", why, " (expected fixed:N, min_size:BYTES[:MAX_SHARDS] ",
                 "or max_size:BYTES[:MAX_SHARDS], BYTES with an optional k or m)");
  };
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const std::size_t colon = text.find(':', at);
    parts.push_back(text.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  // A count of 1 or more, with `k`/`m` multiplying by 1024 / 1024^2 where `sized`.
  auto number = [&](const std::string& part, const char* what, bool sized) {
    std::int64_t scale = 1;
    std::string digits = part;
    if (sized && !digits.empty() && (digits.back() == 'k' || digits.back() == 'm')) {
      scale = digits.back() == 'k' ? 1024 : 1024 * 1024;
      digits.pop_back();
    }
    const auto v = whole_number(digits, 1, (std::int64_t{1} << 40) / scale);
    if (!v) fail(std::string(what) + " '" + part + "' is not a number of 1 or more");
    return *v * scale;
  };
  const std::string& kind = parts[0];
  if (kind == "fixed" && parts.size() == 2) return distribute::FixedShardsPartitioner(number(parts[1], "N", false));
  if ((kind == "min_size" || kind == "max_size") && (parts.size() == 2 || parts.size() == 3)) {
    const std::int64_t bytes = number(parts[1], "BYTES", true);
    if (kind == "min_size")
      return distribute::MinSizePartitioner(bytes, parts.size() == 3 ? number(parts[2], "MAX_SHARDS", false) : 1);
    return distribute::MaxSizePartitioner(bytes, parts.size() == 3 ? number(parts[2], "MAX_SHARDS", false) : 0);
  }
  return fail("unknown form");
}

}  // namespace dtrain::cli
