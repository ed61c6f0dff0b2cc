// What the examples share: reading an integer flag, and a main() that turns an error into
// one line on stderr and exit code 1.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dtrain/core/error.h"

namespace example {

// The value after `name` on the command line, or `fallback` when the flag is absent.
inline int int_flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) != 0) continue;
    char* end = nullptr;
    const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (i + 1 >= argc || *end != '\0' || v < 0 || v > 1'000'000)
      throw dtrain::InvalidArgument(std::string(name) + " needs a whole number from 0 to 1000000");
    return static_cast<int>(v);
  }
  return fallback;
}

inline bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

template <typename Body>
int run(Body&& body) {
  try {
    body();
    return 0;
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace example
