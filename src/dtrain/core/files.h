// Writing a whole file so that nobody sees half of it.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace dtrain {

// Whether `path` names something other than a regular file or a folder: a device such as
// /dev/null, a FIFO, a socket. Such a path is written to in place, never replaced.
bool is_special_file(const std::string& path);

// Writes `parts`, one after another, into the special file `path` (is_special_file) as it
// is; IoError "<what>: cannot write PATH" when it cannot.
void write_through(const std::string& path, std::span<const std::string_view> parts, std::string_view what);

// Writes `content` to `path` through PATH.partial, renamed into place once complete: a
// reader sees the old file or the new one, and a failed write leaves the old one (a
// special file is written in place). Throws IoError "<what>: cannot write PATH" when it
// cannot.
void write_file_replacing(const std::string& path, std::string_view content, std::string_view what);

// Whether write_file_replacing(path, ...) could start: the same IoError now if not, so that
// a file due at the end of a long job fails before the job.
void check_replaceable(const std::string& path, std::string_view what);

}  // namespace dtrain
