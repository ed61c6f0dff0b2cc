// The safetensors layout: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}), then the raw little-endian tensor bytes. PyTorch,
// JAX and others read it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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

// Checkpoint files: the same layout, plus a 64-bit XXH3 checksum of every tensor's bytes
// (__metadata__["dtrain.xxh3"], a JSON object of name -> 16 hex digits) and of the header
// itself (__metadata__["dtrain.header_xxh3"], over the header as written without that
// key), written durably: to a temporary file, fsync'd, renamed into place, and the folder
// fsync'd, so a crash at any point leaves the old file or the complete new one.
// `sync_folder` false leaves the folder's fsync to the caller, which writes more files
// there and syncs the folder once (CheckpointManager and its index).
void save_checked(const std::string& path, const NamedTensors& data, bool sync_folder = true);
// Tensors as a checkpoint file will hold them, each with its checksum (tensor_checksum).
struct CheckedTensors {
  NamedTensors data;
  std::vector<std::uint64_t> checksums;  // one per tensor of data, in order
  // When packed (pack): one block holding the tensors' bytes as the file's data
  // section lays them out, aligned for direct I/O; data's tensors are views into it.
  std::shared_ptr<void> block;
  std::size_t block_bytes = 0;  // its capacity, a multiple of 4096
};
// Copies `from` into `into`'s block (kept from the last call when large enough) and
// computes every tensor's checksum as it copies, sharing the tensors among the compute
// threads (core/threads.h): all that is left to a writer thread is the write itself.
void pack(const NamedTensors& from, CheckedTensors& into);
// Computes the checksums `tensors` lacks.
void add_checksums(CheckedTensors& tensors);
// save_checked of tensors whose checksums are known. A packed block is written as it is,
// with direct I/O where the file system has it (the kernel neither copies nor caches it),
// after a header padded with spaces so that the data begins at a multiple of 4096 bytes.
void save_checked(const std::string& path, const CheckedTensors& tensors, bool sync_folder = true);
// fsync of a folder, so that the names renamed into it survive a power loss.
void sync_folder_of(const std::string& path);
// load_safetensors, then every checksum verified. A file that is truncated anywhere, has
// any bit flipped, or lacks the checksums is an IoError naming the file and, where the
// fault is in a tensor's bytes, the tensor.
NamedTensors load_checked(const std::string& path);
// XXH3-64 of a tensor's bytes (xxhash's XXH3_64bits, seed 0): other tools can check it.
std::uint64_t tensor_checksum(const Tensor& t);

}  // namespace dtrain
