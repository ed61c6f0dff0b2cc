// IDX parsing over zlib's gzip reader (which also reads uncompressed files as they are).
#include "dtrain/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
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

// Reads exactly n bytes or throws, naming the offset where the data ran out.
void read_exact(gzFile f, const std::string& path, void* out, std::int64_t n, std::int64_t offset, const char* what) {
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
    if (got == 0)
      DTRAIN_THROW(IoError, path, ": truncated: expected ", n, " bytes of ", what, " at offset ", offset, ", found ",
                   done);
    done += got;
  }
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

std::vector<unsigned char> read_bytes(const std::string& path, int expected_rank, IdxHeader& header) {
  GzPtr f = open_gz(path);
  header = read_header(f.get(), path);
  if (header.type_code != 0x08)
    DTRAIN_THROW(IoError, path, ": IDX type code 0x", std::hex, header.type_code, std::dec,
                 " is not unsigned byte (0x08)");
  if (static_cast<int>(header.dims.size()) != expected_rank)
    DTRAIN_THROW(IoError, path, ": has ", header.dims.size(), " dimensions, expected ", expected_rank,
                 expected_rank == 1 ? " (labels)" : " (images)");
  std::int64_t n = 1;
  for (auto d : header.dims) n *= d;
  std::vector<unsigned char> bytes(static_cast<size_t>(n));
  read_exact(f.get(), path, bytes.data(), n, header.header_bytes, "values");
  unsigned char extra;
  if (gzread(f.get(), &extra, 1) > 0)
    DTRAIN_THROW(IoError, path, ": has data past the ", n, " values its header announces (offset ",
                 header.header_bytes + n, ")");
  return bytes;
}

}  // namespace

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

}  // namespace dtrain::data
