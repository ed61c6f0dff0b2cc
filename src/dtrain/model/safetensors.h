// The safetensors layout: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}), then the raw little-endian tensor bytes. PyTorch,
// JAX and others read it.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain {

struct NamedTensors {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;
};

// Writes `path` atomically: a temporary file beside it, flushed and renamed into place.
void save_safetensors(const std::string& path, const NamedTensors& data);
// Reads and validates every field; IoError names the file, the key and the offset.
NamedTensors load_safetensors(const std::string& path);

}  // namespace dtrain
