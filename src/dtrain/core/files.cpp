// Whole-file writes through a file beside the target.
#include "dtrain/core/files.h"

#include <cstdio>
#include <fstream>

#include "dtrain/core/error.h"

namespace dtrain {

namespace {

std::string partial_of(const std::string& path) { return path + ".partial"; }

}  // namespace

void check_replaceable(const std::string& path, std::string_view what) {
  const std::string partial = partial_of(path);
  if (!std::ofstream(partial)) DTRAIN_THROW(IoError, what, ": cannot write ", path);
  std::remove(partial.c_str());
}

void write_file_replacing(const std::string& path, std::string_view content, std::string_view what) {
  const std::string partial = partial_of(path);
  bool ok = false;
  {
    std::ofstream out(partial, std::ios::binary);
    if (out) {
      out.write(content.data(), static_cast<std::streamsize>(content.size()));
      out.flush();
      ok = static_cast<bool>(out);
    }
  }
  if (!ok || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    DTRAIN_THROW(IoError, what, ": cannot write ", path);
  }
}

}  // namespace dtrain
