// What the fuzz targets share: the input as a file for readers that take a path, and the
// rule that a reader may fail only with a dtrain::Error. Not a test framework: libFuzzer
// reports anything else (another exception, a crash, a leak, a hang, a large allocation).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::fuzz {

// The input written to one file per process (rewritten for each input), in /dev/shm where
// there is one so that the file never touches a disk; removed when the process exits.
inline const std::string& write_input(const std::uint8_t* data, std::size_t size) {
  struct InputFile {
    std::string path;
    ~InputFile() { std::remove(path.c_str()); }
  };
  static const InputFile file{[] {
    const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/dtrain_fuzz_" + std::to_string(::getpid());
  }()};
  std::FILE* f = std::fopen(file.path.c_str(), "wb");
  if (!f) std::abort();  // the harness itself failed, not the reader
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return file.path;
}

// Runs a reader on one input: a dtrain::Error is a correct answer to malformed bytes;
// any other exception escapes and libFuzzer reports it as a crash.
template <typename Fn>
void expect_only_dtrain_errors(Fn&& fn) {
  try {
    fn();
  } catch (const dtrain::Error&) {
  }
}

}  // namespace dtrain::fuzz
