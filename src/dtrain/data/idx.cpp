// IDX parsing over zlib's gzip reader (which also reads uncompressed files as they are).
#include "dtrain/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::data {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

GzPtr open_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) DTRAIN_THROW(IoError, path, ": cannot open (", std::strerror(errno), ")");
  gzbuffer(f, 1 << 20);
  return GzPtr(f);
}

// Reads up to n bytes, fewer only where the data ends; throws naming the offset of
// corrupt compressed data.
std::int64_t read_up_to(gzFile f, const std::string& path, void* out, std::int64_t n, std::int64_t offset,
                        const char* what) {
  char* p = static_cast<char*>(out);
  std::int64_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::int64_t>(n - done, 1 << 30));
    const int got = gzread(f, p + done, chunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      DTRAIN_THROW(IoError, path, ": corrupt compressed data while reading ", what, " at offset ", offset + done, " (",
                   msg, ")");
    }
    if (got == 0) break;
    done += got;
  }
  return done;
}

// Reads exactly n bytes or throws, naming the offset where the data ran out.
void read_exact(gzFile f, const std::string& path, void* out, std::int64_t n, std::int64_t offset, const char* what) {
  const std::int64_t done = read_up_to(f, path, out, n, offset, what);
  if (done < n)
    DTRAIN_THROW(IoError, path, ": truncated: expected ", n, " bytes of ", what, " at offset ", offset, ", found ",
                 done);
}

IdxHeader read_header(gzFile f, const std::string& path) {
  unsigned char magic[4];
  read_exact(f, path, magic, 4, 0, "the header");
  if (magic[0] != 0 || magic[1] != 0)
    DTRAIN_THROW(IoError, path, ": not an IDX file (magic bytes ", int(magic[0]), " ", int(magic[1]),
                 ", expected 0 0)");
  IdxHeader h;
  h.type_code = magic[2];
  const int rank = magic[3];
  if (rank < 1 || rank > 4) DTRAIN_THROW(IoError, path, ": IDX header gives ", rank, " dimensions (expected 1 to 4)");
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    read_exact(f, path, b, 4, 4 + 4 * i, "the header");
    h.dims.push_back((std::int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3]);
  }
  h.header_bytes = 4 + 4 * rank;
  return h;
}

// The header's extents as "60000 x 28 x 28", for messages.
std::string dims_text(const IdxHeader& h) {
  std::string out;
  for (std::int64_t d : h.dims) out += (out.empty() ? "" : " x ") + std::to_string(d);
  return out;
}

// The bytes of an uncompressed file after its header; -1 for gzip (its length is known
// only once it is read) or a file that is not a regular one.
std::int64_t plain_bytes_after_header(gzFile f, const std::string& path, const IdxHeader& h) {
  if (!gzdirect(f)) return -1;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return std::max<std::int64_t>(0, static_cast<std::int64_t>(st.st_size) - h.header_bytes);
}

// The header's type, rank and extents against what a reader takes: unsigned bytes,
// `expected_rank` dimensions, extents whose product (and that of the non-zero ones: [0,
// 2^32, 2^32] holds no values but could not be shaped) can be addressed.
void check_header(const std::string& path, int expected_rank, const IdxHeader& header) {
  if (header.type_code != 0x08)
    DTRAIN_THROW(IoError, path, ": IDX type code 0x", std::hex, header.type_code, std::dec,
                 " is not unsigned byte (0x08)");
  if (static_cast<int>(header.dims.size()) != expected_rank)
    DTRAIN_THROW(IoError, path, ": has ", header.dims.size(), " dimensions, expected ", expected_rank,
                 expected_rank == 1 ? " (labels)" : " (images)");
  std::int64_t nonzero = 1;
  for (auto d : header.dims)
    if (__builtin_mul_overflow(nonzero, std::max<std::int64_t>(d, 1), &nonzero))
      DTRAIN_THROW(IoError, path, ": the IDX header's extents ", dims_text(header),
                   " multiply past what can be addressed");
}

// Sizes come from the file, so nothing is allocated for them until the bytes are there:
// the extents' product is checked for overflow, an uncompressed file's length is checked
// before reading, and gzip data is read in chunks that grow with what has been read (at
// most twice the bytes actually found), so a 100-byte file claiming 2^40 values fails
// after reading 100 bytes.
std::vector<unsigned char> read_bytes(const std::string& path, int expected_rank, IdxHeader& header) {
  GzPtr f = open_gz(path);
  header = read_header(f.get(), path);
  check_header(path, expected_rank, header);
  std::int64_t n = 1;
  for (auto d : header.dims) n *= d;
  auto truncated = [&](std::int64_t found) {
    DTRAIN_THROW(IoError, path, ": truncated: the IDX header claims ", n, " bytes of values (", dims_text(header),
                 ") but the file holds ", found, " after the header (values start at offset ", header.header_bytes, ")");
  };
  const std::int64_t available = plain_bytes_after_header(f.get(), path, header);
  if (available >= 0 && n > available) truncated(available);
  std::vector<unsigned char> bytes;
  constexpr std::int64_t kFirstChunk = 1 << 16;
  while (static_cast<std::int64_t>(bytes.size()) < n) {
    const auto done = static_cast<std::int64_t>(bytes.size());
    const std::int64_t chunk = std::min(n - done, std::max(kFirstChunk, done));
    bytes.resize(static_cast<std::size_t>(done + chunk));
    const std::int64_t got = read_up_to(f.get(), path, bytes.data() + done, chunk, header.header_bytes + done, "values");
    if (got < chunk) truncated(done + got);
  }
  unsigned char extra;
  if (gzread(f.get(), &extra, 1) > 0)
    DTRAIN_THROW(IoError, path, ": has data past the ", n, " values its header announces (offset ",
                 header.header_bytes + n, ")");
  return bytes;
}

}  // namespace

IdxHeader read_idx_header(const std::string& path, int expected_rank) {
  GzPtr f = open_gz(path);
  IdxHeader h = read_header(f.get(), path);
  check_header(path, expected_rank, h);
  return h;
}

Tensor read_idx_images(const std::string& path, float scale) {
  IdxHeader h;
  const std::vector<unsigned char> bytes = read_bytes(path, 3, h);
  const std::int64_t count = h.dims[0], features = h.dims[1] * h.dims[2];
  Tensor t = Tensor::empty({count, features});
  float* p = t.data<float>();
  for (size_t i = 0; i < bytes.size(); ++i) p[i] = static_cast<float>(bytes[i]) * scale;
  return t;
}

Tensor read_idx_image_bytes(const std::string& path) {
  IdxHeader h;
  const std::vector<unsigned char> bytes = read_bytes(path, 3, h);
  Tensor t = Tensor::empty({h.dims[0], h.dims[1] * h.dims[2]}, DType::u8);
  std::copy(bytes.begin(), bytes.end(), t.data<std::uint8_t>());
  return t;
}

Tensor read_idx_labels(const std::string& path) {
  IdxHeader h;
  const std::vector<unsigned char> bytes = read_bytes(path, 1, h);
  Tensor t = Tensor::empty({h.dims[0]}, DType::i32);
  std::int32_t* p = t.data<std::int32_t>();
  for (size_t i = 0; i < bytes.size(); ++i) p[i] = bytes[i];
  return t;
}

Tensor read_idx_labels(const std::string& path, std::int64_t classes) {
  Tensor t = read_idx_labels(path);
  const std::int32_t* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (p[i] >= classes)
      DTRAIN_THROW(IoError, path, ": label ", p[i], " at index ", i, " is not a class number below ", classes);
  return t;
}

std::vector<std::uint8_t> read_file_bytes(const std::string& path, std::int64_t limit) {
  GzPtr f = open_gz(path);
  std::vector<std::uint8_t> out;
  constexpr std::int64_t kChunk = 1 << 20;
  while (limit < 0 || static_cast<std::int64_t>(out.size()) < limit) {
    const std::int64_t want = limit < 0 ? kChunk : std::min(kChunk, limit - static_cast<std::int64_t>(out.size()));
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(want));
    const std::int64_t got = read_up_to(f.get(), path, out.data() + at, want, static_cast<std::int64_t>(at), "text");
    out.resize(at + static_cast<std::size_t>(got));
    if (got < want) break;
  }
  return out;
}

}  // namespace dtrain::data
