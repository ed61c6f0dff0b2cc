// Reader for the IDX format of the MNIST family (optionally gzip-compressed): a big-endian
// header (two zero bytes, a type code, the number of dimensions, then each extent as a
// uint32) followed by the values. Every check names the file and what was wrong.
#pragma once

#include <string>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

// Reads an IDX file of unsigned bytes (type 0x08). Images come back as float32 with
// shape [count, rows * cols] (scaled by `scale`), labels as int32 [count].
// Throws IoError naming the file for a missing, truncated or malformed file. The sizes in
// the header are checked (for overflow, and against the bytes there are) before anything
// is allocated for them.
Tensor read_idx_images(const std::string& path, float scale = 1.0f / 255.0f);
// The same images as they are stored: uint8 [count, rows * cols] (as Keras's load_data
// gives them), for a model that scales them itself (nn::Rescaling).
Tensor read_idx_image_bytes(const std::string& path);
Tensor read_idx_labels(const std::string& path);
// The same, each label checked to be a class number below `classes`: one that is not is an
// IoError naming the file, the label's index and the class count.
Tensor read_idx_labels(const std::string& path, std::int64_t classes);

struct IdxHeader {
  int type_code = 0;                    // 0x08 = unsigned byte
  std::vector<std::int64_t> dims;       // extents, outermost first
  std::int64_t header_bytes = 0;
};

// The header alone (nothing after it is read or decompressed), checked as the readers above
// check it: unsigned bytes, `expected_rank` dimensions (3 for images, 1 for labels), extents
// that multiply without overflow. Throws IoError naming the file.
IdxHeader read_idx_header(const std::string& path, int expected_rank);

// The first `limit` bytes of a file (all of it with a negative limit), gunzipped where it is
// gzip (a dictzip .dz dictionary is): zlib reads plain files as they are. IoError names the
// file, and the offset of corrupt compressed data.
std::vector<std::uint8_t> read_file_bytes(const std::string& path, std::int64_t limit = -1);

}  // namespace dtrain::data
