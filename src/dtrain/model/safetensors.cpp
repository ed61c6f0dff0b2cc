// safetensors reading and writing with nlohmann::json for the header.
#include "dtrain/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
// libxxhash's _dispatch functions pick AVX2 or AVX-512 at run time (the build itself targets
// baseline x86-64), hashing at about twice the rate of its SSE2 code.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include <xxh_x86dispatch.h>

#include "dtrain/core/files.h"
#include "dtrain/core/threads.h"
#include "dtrain/model/json_reader.h"

namespace dtrain {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the limit other readers apply too
// Direct I/O wants buffers, lengths and file offsets in multiples of the disk's block size;
// 4096 covers every block size in use.
constexpr std::size_t kDirectAlignment = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// A block of `bytes` (a multiple of kDirectAlignment) aligned for direct I/O. One of 2 MB
// or more is asked to live in huge pages: a direct write then pins a few large pages
// instead of thousands of small ones (0.2 ms of system time for 25 MB here, against 0.7 ms),
// and the snapshot's copy into it misses the TLB less.
std::shared_ptr<void> aligned_block(std::size_t bytes) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const bool huge = bytes >= kHugePage;
  const std::size_t size = huge ? round_up(bytes, kHugePage) : bytes;
  void* p = std::aligned_alloc(huge ? kHugePage : kDirectAlignment, size);
  if (!p) throw std::bad_alloc();
  if (huge) ::madvise(p, size, MADV_HUGEPAGE);  // a hint: refused, it changes nothing
  return {p, std::free};
}

// Copies `n` bytes and returns the XXH3 checksum of the copy. Each 64 KB chunk is hashed
// right after its copy, while it is still in the cache, so the checksum costs a fraction of
// what a second pass over memory would.
std::uint64_t copy_with_checksum(void* to, const void* from, std::size_t n) {
  constexpr std::size_t kChunk = std::size_t{64} << 10;
  auto* dst = static_cast<unsigned char*>(to);
  const auto* src = static_cast<const unsigned char*>(from);
  if (n <= kChunk) {
    if (n > 0) std::memcpy(dst, src, n);
    return XXH3_64bits_dispatch(dst, n);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (std::size_t at = 0; at < n; at += kChunk) {
    const std::size_t len = std::min(kChunk, n - at);
    std::memcpy(dst + at, src + at, len);
    XXH3_64bits_update_dispatch(&state, dst + at, len);
  }
  return XXH3_64bits_digest(&state);
}

const char* dtype_code(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::string: break;  // not a weight's dtype
  }
  return "?";
}

bool dtype_from_code(const std::string& s, DType& t) {
  if (s == "F32") t = DType::f32;
  else if (s == "BF16") t = DType::bf16;
  else if (s == "F16") t = DType::f16;
  else if (s == "I32") t = DType::i32;
  else if (s == "U8") t = DType::u8;
  else return false;
  return true;
}

// pwrite(2) of all `n` bytes at `offset`; false on error (errno says which).
bool pwrite_all(int fd, const void* data, std::size_t n, off_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    offset += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// The header JSON of `data` (tensors at consecutive offsets, in order).
nlohmann::json header_of(const std::string& path, const NamedTensors& data) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : data.tensors) {
    t.check_defined(("save_safetensors: tensor '" + name + "'").c_str());
    if (name == "__metadata__" || header.contains(name))
      DTRAIN_THROW(InvalidArgument, path, ": tensor name '", name, "' is reserved or used twice");
    header[name] = {{"dtype", dtype_code(t.dtype())}, {"shape", t.shape().to_vector()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!data.metadata.empty()) header["__metadata__"] = data.metadata;
  return header;
}

// The 8-byte length and the header's text, padded with spaces so that the data begins at a
// multiple of `align`.
std::string prefix_of(const nlohmann::json& header, std::size_t align) {
  std::string text = header.dump();
  text.append(round_up(8 + text.size(), align) - 8 - text.size(), ' ');
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<std::size_t>(i)] = static_cast<char>(text.size() >> (8 * i));
  return prefix + text;
}

// Writes `head` (the prefix, copied into a page-aligned buffer) and then `block`'s first
// `data_bytes` with direct I/O. `refused` where the file system takes no direct I/O (a
// tmpfs, say) or not these sizes, before anything was written; `failed` with errno set.
enum class Direct { written, refused, failed };
Direct write_direct(int fd, const void* head, std::size_t head_bytes, const void* block, std::size_t data_bytes) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) return Direct::refused;
  if (!pwrite_all(fd, head, head_bytes, 0)) {
    if (errno != EINVAL) return Direct::failed;
    ::fcntl(fd, F_SETFL, flags);
    return Direct::refused;
  }
  // The block's capacity is a whole number of 4096-byte pages, so its last page is written
  // whole and the file then cut to its length.
  const bool ok = pwrite_all(fd, block, round_up(data_bytes, kDirectAlignment), static_cast<off_t>(head_bytes)) &&
                  ::ftruncate(fd, static_cast<off_t>(head_bytes + data_bytes)) == 0;
  return ok ? Direct::written : Direct::failed;
}

// Writes the file through a temporary beside it, fsync'd; `durable` also fsyncs the folder
// after the rename, so that the new name survives a power loss. `block`, when given, holds
// the tensors' bytes as the data section lays them out (pack), and is written with direct
// I/O where the file system allows it.
void write_file(const std::string& path, const NamedTensors& data, const nlohmann::json& header, bool durable,
                const void* block = nullptr) {
  // Other writers pad to 8 bytes; a packed block's data begins at a page, for direct I/O.
  const std::string prefix = prefix_of(header, block ? kDirectAlignment : 8);
  std::shared_ptr<void> head;
  if (block) {
    head = aligned_block(prefix.size());
    std::memcpy(head.get(), prefix.data(), prefix.size());
  }
  if (is_special_file(path)) {  // /dev/null stays a device: renaming over it would replace it
    std::vector<std::string_view> parts{prefix};
    for (const auto& [name, t] : data.tensors) parts.emplace_back(static_cast<const char*>(t.raw_data()), t.nbytes());
    write_through(path, parts, "safetensors");
    return;
  }
  std::string tmp = path + ".tmp-XXXXXX";  // unique per call: concurrent saves never share it
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) DTRAIN_THROW(IoError, path, ": cannot create a temporary file beside it (", std::strerror(errno), ")");
  ::fchmod(fd, 0644);
  std::size_t data_bytes = 0;
  for (const auto& [name, t] : data.tensors) data_bytes += static_cast<std::size_t>(t.nbytes());
  const Direct direct = block ? write_direct(fd, head.get(), prefix.size(), block, data_bytes) : Direct::refused;
  bool ok = direct == Direct::written;
  if (direct == Direct::refused) {
    ok = pwrite_all(fd, prefix.data(), prefix.size(), 0);
    off_t offset = static_cast<off_t>(prefix.size());
    for (const auto& [name, t] : data.tensors) {
      if (ok) ok = pwrite_all(fd, t.raw_data(), t.nbytes(), offset);
      offset += static_cast<off_t>(t.nbytes());
    }
  }
  ok = ok && ::fsync(fd) == 0;
  int saved_errno = errno;
  if (::close(fd) != 0 && ok) {  // some file systems report write errors only here
    ok = false;
    saved_errno = errno;
  }
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved_errno;
    std::remove(tmp.c_str());
    DTRAIN_THROW(IoError, path, ": writing failed (", std::strerror(err), "); the previous file, if any, is untouched");
  }
  if (durable) sync_folder_of(path);
}

constexpr const char* kChecksumsKey = "dtrain.xxh3";
constexpr const char* kHeaderChecksumKey = "dtrain.header_xxh3";

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::uint64_t header_checksum(nlohmann::json header) {
  header["__metadata__"].erase(kHeaderChecksumKey);
  const std::string text = header.dump();
  return XXH3_64bits_dispatch(text.data(), text.size());
}

}  // namespace

const Tensor* NamedTensors::find(const std::string& name) const {
  for (const auto& [k, t] : tensors)
    if (k == name) return &t;
  return nullptr;
}

std::uint64_t tensor_checksum(const Tensor& t) {
  return XXH3_64bits_dispatch(t.raw_data(), static_cast<std::size_t>(t.nbytes()));
}

void add_checksums(CheckedTensors& tensors) {
  for (std::size_t i = tensors.checksums.size(); i < tensors.data.tensors.size(); ++i)
    tensors.checksums.push_back(tensor_checksum(tensors.data.tensors[i].second));
}

void pack(const NamedTensors& from, CheckedTensors& into) {
  std::size_t bytes = 0;
  for (const auto& [name, t] : from.tensors) {
    t.check_defined(("pack: tensor '" + name + "'").c_str());
    bytes += static_cast<std::size_t>(t.nbytes());
  }
  const std::size_t capacity = round_up(std::max<std::size_t>(bytes, 1), kDirectAlignment);
  if (!into.block || into.block_bytes < capacity) {
    into.block = aligned_block(capacity);
    into.block_bytes = capacity;
  }
  into.data.tensors.clear();
  into.data.metadata = from.metadata;
  const std::size_t count = from.tensors.size();
  into.checksums.assign(count, 0);
  auto* base = static_cast<unsigned char*>(into.block.get());
  std::vector<std::size_t> offsets(count);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const Tensor& t = from.tensors[i].second;
    offsets[i] = offset;
    into.data.tensors.emplace_back(from.tensors[i].first, Tensor::over(base + offset, t.shape(), t.dtype(), into.block));
    offset += static_cast<std::size_t>(t.nbytes());
  }
  // A checksum runs through its tensor in order, so the threads share the tensors, not their
  // bytes: each takes the largest one left to whichever has the least so far. The copy is a
  // moment between steps, when the compute threads wait, so it takes every core the process
  // may use, even where training uses fewer.
  const int cores = std::max(num_threads(), available_cores());
  const auto threads = static_cast<std::size_t>(
      std::clamp<std::size_t>(bytes / (std::size_t{1} << 20), 1, static_cast<std::size_t>(cores)));
  std::vector<std::size_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return from.tensors[a].second.nbytes() > from.tensors[b].second.nbytes();
  });
  std::vector<std::vector<std::size_t>> shares(threads);
  std::vector<std::size_t> load(threads, 0);
  for (std::size_t i : order) {
    const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shares[least].push_back(i);
    load[least] += static_cast<std::size_t>(from.tensors[i].second.nbytes());
  }
  ScopedThreads wide(static_cast<int>(threads));
  parallel_for(static_cast<std::int64_t>(threads), 1, [&](std::int64_t begin, std::int64_t end) {
    for (auto s = static_cast<std::size_t>(begin); s < static_cast<std::size_t>(end); ++s)
      for (std::size_t i : shares[s]) {
        const Tensor& t = from.tensors[i].second;
        into.checksums[i] = copy_with_checksum(base + offsets[i], t.raw_data(), static_cast<std::size_t>(t.nbytes()));
      }
  });
}

void sync_folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0 || ::fsync(dir) != 0) {
    const int err = errno;
    if (dir >= 0) ::close(dir);
    DTRAIN_THROW(IoError, path, ": written, but its folder could not be synced (", std::strerror(err), ")");
  }
  ::close(dir);
}

void save_safetensors(const std::string& path, const NamedTensors& data) {
  write_file(path, data, header_of(path, data), /*durable=*/false);
}

void save_checked(const std::string& path, const NamedTensors& data, bool sync_folder) {
  CheckedTensors checked{data};
  add_checksums(checked);
  save_checked(path, checked, sync_folder);
}

void save_checked(const std::string& path, const CheckedTensors& tensors, bool sync_folder) {
  const NamedTensors& data = tensors.data;
  DTRAIN_CHECK(tensors.checksums.size() == data.tensors.size(), "save_checked: one checksum per tensor");
  NamedTensors with = {data.tensors, data.metadata};
  nlohmann::json sums = nlohmann::json::object();
  for (std::size_t i = 0; i < data.tensors.size(); ++i) sums[data.tensors[i].first] = hex64(tensors.checksums[i]);
  with.metadata[kChecksumsKey] = sums.dump();
  with.metadata.erase(kHeaderChecksumKey);
  nlohmann::json header = header_of(path, with);
  header["__metadata__"][kHeaderChecksumKey] = hex64(header_checksum(header));
  write_file(path, with, header, /*durable=*/sync_folder, tensors.block.get());
}

NamedTensors load_safetensors(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) DTRAIN_THROW(IoError, path, ": is a folder, not a safetensors file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) DTRAIN_THROW(IoError, path, ": cannot open (", std::strerror(errno), ")");
  const std::int64_t size = in.tellg();
  in.seekg(0);
  if (size < 8) DTRAIN_THROW(IoError, path, ": truncated: ", size, " bytes, too short for a safetensors header");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  if (!in) DTRAIN_THROW(IoError, path, ": cannot read its first 8 bytes (", std::strerror(errno), ")");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  if (n > static_cast<std::uint64_t>(size - 8))
    DTRAIN_THROW(IoError, path, ": header length ", n, " at offset 0 exceeds the file's ", size - 8, " remaining bytes");
  if (n > kMaxHeaderBytes) DTRAIN_THROW(IoError, path, ": header length ", n, " exceeds the format's 100 MB limit");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  // The JSON parser stops at a NUL, so a header padded with one would parse; the format
  // pads with spaces only.
  if (const auto nul = text.find('\0'); nul != std::string::npos)
    DTRAIN_THROW(IoError, path, ": header holds a NUL byte at offset ", 8 + nul, " (its padding must be spaces)");
  nlohmann::json header;
  // A name given twice would otherwise leave one of the two, silently.
  const auto depth_limit = json_depth_limit(path + ": header");
  std::set<std::string> names;
  auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second)
      DTRAIN_THROW(InvalidArgument, path, ": header names ", parsed == "__metadata__" ? "the key '" : "tensor '",
                   parsed.get<std::string>(), "' twice");
    return depth_limit(depth, event, parsed);
  };
  try {
    header = nlohmann::json::parse(text, check);
  } catch (const InvalidArgument& e) {  // nested too deep, or a name twice
    DTRAIN_THROW(IoError, e.what());
  } catch (const nlohmann::json::parse_error& e) {
    DTRAIN_THROW(IoError, path, ": header is not valid JSON at byte ", 8 + e.byte, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {  // a number too large for a double (1e999)
    DTRAIN_THROW(IoError, path, ": header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) DTRAIN_THROW(IoError, path, ": header is not a JSON object");
  const std::uint64_t data_start = 8 + n;
  const std::uint64_t data_size = static_cast<std::uint64_t>(size) - data_start;

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  NamedTensors out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) DTRAIN_THROW(IoError, path, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) DTRAIN_THROW(IoError, path, ": __metadata__ key '", m.key(), "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { DTRAIN_THROW(IoError, path, ": tensor '", name, "': ", what); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    Entry e{name, DType::f32, {}, 0, 0};
    if (!v["dtype"].is_string() || !dtype_from_code(v["dtype"].get<std::string>(), e.dtype))
      bad("dtype " + v["dtype"].dump() + " is not one of F32, BF16, I32, U8");
    std::vector<std::int64_t> dims;
    if (!v["shape"].is_array()) bad("shape is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) bad("shape " + v["shape"].dump() + " is not a list of sizes");
      dims.push_back(d.get<std::int64_t>());
    }
    if (dims.size() > static_cast<size_t>(Shape::kMaxRank)) bad("rank " + std::to_string(dims.size()) + " is too large");
    try {
      e.shape = Shape(dims);
    } catch (const InvalidArgument&) {
      bad("shape " + v["shape"].dump() + " holds more elements than can be addressed");
    }
    std::uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(static_cast<std::uint64_t>(e.shape.numel()), dtype_size(e.dtype), &expected_bytes))
      bad("shape " + v["shape"].dump() + " holds more bytes than can be addressed");
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets " + off.dump() + " is not [begin, end]");
    e.begin = off[0].get<std::uint64_t>();
    e.end = off[1].get<std::uint64_t>();
    const std::uint64_t expected = expected_bytes;
    if (e.end < e.begin || e.end - e.begin != expected)
      bad("data_offsets " + off.dump() + " span " + std::to_string(e.end - e.begin) + " bytes, but " +
          std::string(dtype_name(e.dtype)) + " " + e.shape.to_string() + " needs " + std::to_string(expected));
    if (e.end > data_size)
      bad("data ends at file offset " + std::to_string(data_start + e.end) + ", past the end of the file (" +
          std::to_string(size) + " bytes): truncated?");
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      DTRAIN_THROW(IoError, path, ": tensors '", entries[i - 1].name, "' and '", entries[i].name, "' overlap");
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.seekg(static_cast<std::streamoff>(data_start + e.begin));
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
    if (!in) DTRAIN_THROW(IoError, path, ": tensor '", e.name, "': read failed at offset ", data_start + e.begin);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

NamedTensors load_checked(const std::string& path) {
  NamedTensors data = load_safetensors(path);
  const auto sums_text = data.metadata.find(kChecksumsKey);
  const auto header_text = data.metadata.find(kHeaderChecksumKey);
  if (sums_text == data.metadata.end() || header_text == data.metadata.end())
    DTRAIN_THROW(IoError, path, ": has no checksums (__metadata__ lacks ", kChecksumsKey, " or ", kHeaderChecksumKey,
                 "): not a dtrain checkpoint, or its header was damaged");
  // The header as the writer made it: the tensors at consecutive offsets in file order.
  NamedTensors without = data;
  without.metadata.erase(kHeaderChecksumKey);
  nlohmann::json header = header_of(path, without);
  if (hex64(header_checksum(header)) != header_text->second)
    DTRAIN_THROW(IoError, path, ": the header's checksum does not match (", header_text->second, " recorded, ",
                 hex64(header_checksum(header)), " computed): the header was changed after it was written");
  nlohmann::json sums;
  try {
    sums = nlohmann::json::parse(sums_text->second);
  } catch (const nlohmann::json::exception& e) {
    DTRAIN_THROW(IoError, path, ": ", kChecksumsKey, " is not a JSON object: ", e.what());
  }
  if (!sums.is_object() || sums.size() != data.tensors.size())
    DTRAIN_THROW(IoError, path, ": ", kChecksumsKey, " does not list one checksum per tensor");
  for (const auto& [name, t] : data.tensors) {
    if (!sums.contains(name) || !sums[name].is_string())
      DTRAIN_THROW(IoError, path, ": tensor '", name, "' has no checksum");
    const std::string computed = hex64(tensor_checksum(t));
    if (sums[name].get<std::string>() != computed)
      DTRAIN_THROW(IoError, path, ": tensor '", name, "' (", dtype_name(t.dtype()), " ", t.shape().to_string(),
                   "): its bytes do not match their checksum (", sums[name].get<std::string>(), " recorded, ", computed,
                   " computed): the data was damaged after it was written");
  }
  return data;
}

}  // namespace dtrain
