// Whole-file writes through a file beside the target.
#include "dtrain/core/files.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dtrain/core/error.h"

namespace dtrain {

namespace {

std::string partial_of(const std::string& path) { return path + ".partial"; }

}  // namespace

bool is_special_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  return !ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
         !std::filesystem::is_directory(status);
}

void write_through(const std::string& path, std::span<const std::string_view> parts, std::string_view what) {
  std::ofstream out(path, std::ios::binary);
  for (const std::string_view part : parts) out.write(part.data(), static_cast<std::streamsize>(part.size()));
  out.flush();
  if (!out) DTRAIN_THROW(IoError, what, ": cannot write ", path);
}

void check_replaceable(const std::string& path, std::string_view what) {
  if (is_special_file(path)) return;  // opened only to be written: a FIFO would wait for a reader
  const std::string partial = partial_of(path);
  if (!std::ofstream(partial)) DTRAIN_THROW(IoError, what, ": cannot write ", path);
  std::remove(partial.c_str());
}

void write_file_replacing(const std::string& path, std::string_view content, std::string_view what) {
  if (is_special_file(path)) {  // /dev/null stays a device: renaming over it would replace it
    write_through(path, {&content, 1}, what);
    return;
  }
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
