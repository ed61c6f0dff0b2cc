// The caching allocator of a device's memory (and of pinned host memory): blocks from a
// slow allocator (cudaMalloc takes microseconds to milliseconds and synchronizes) go back
// to free lists keyed by size class and stream, and are handed out again to work on the
// same stream, so a training step that repeats its shapes stops reaching the device's
// allocator after its first steps. The allocator itself is given as functions, so that
// the cache is tested on the CPU. It does not split or merge blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtrain/core/device.h"

namespace dtrain {

// "1.50 GiB", "512.0 KiB", "37 B".
std::string format_bytes(std::size_t bytes);

// Who is asking for memory on this thread (a layer), for out-of-memory messages. Ambient
// because the allocation happens deep inside kernels' callers that know no layer; set
// around each layer's call (nn::Layer). The text must outlive the guard.
class AllocationTag {
 public:
  explicit AllocationTag(const std::string* who);
  ~AllocationTag();
  AllocationTag(const AllocationTag&) = delete;
  AllocationTag& operator=(const AllocationTag&) = delete;
  // The innermost tag's text, or null.
  static const std::string* current();

 private:
  const std::string* saved_;
};

class BlockCache {
 public:
  struct Source {
    std::function<void*(std::size_t)> allocate;  // null when the memory is not there
    std::function<void(void*)> free;
    // The memory's own count of free and total bytes.
    std::function<std::pair<std::size_t, std::size_t>()> free_and_total;
    // Waits for queued work, before cached blocks it may still use are freed.
    std::function<void()> synchronize;
  };

  // `where` names the memory in messages ("cuda:0", "pinned host memory").
  BlockCache(std::string where, Source source);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A block of at least `bytes` for work on `stream`. When the source has no memory left,
  // the cache frees its unused blocks and asks again; then a ResourceExhausted names the
  // bytes asked, in use, cached and free, and the AllocationTag.
  void* allocate(std::size_t bytes, int stream = 0);
  // `bytes` and `stream` as given to allocate().
  void deallocate(void* data, std::size_t bytes, int stream = 0);
  // Frees every unused block (after the source's synchronize); not a pool's.
  void release_cached();

  // Private pools: the memory of a captured CUDA graph, whose replays write to the blocks
  // its capture was given, so nothing else may have them while it lives. A block
  // allocated into a pool goes back to that pool when deallocated (whatever the stream),
  // and only allocate_in hands it out again, until close_pool: then the pool's unused
  // blocks join the shared lists, and its blocks deallocated later go there too. A pool
  // takes the shared lists' blocks before asking the source: their earlier work was queued
  // before the graph's. A pool's blocks count as in use (by the graph) until closed.
  int open_pool();
  void* allocate_in(int pool, std::size_t bytes);
  void close_pool(int pool);
  DeviceMemoryStats stats() const;

  // At most `bytes` taken from the source at once (0: as much as it has), as the sum of a
  // GPU's logical devices' memory_limit asks: an allocation beyond it frees the unused
  // blocks and tries again, then fails as a full device does, naming the limit and `why`
  // ("the memory_limit of its 2 logical GPUs"). InvalidArgument where the tensors alive
  // already hold more (the unused blocks are freed first).
  void set_limit(std::size_t bytes, std::string why);

  // Sizes are rounded up to a class: 512-byte steps below 1 MiB, 2 MiB steps above (the
  // device's page), so a tensor of a few bytes more reuses the same block.
  static std::size_t size_class(std::size_t bytes);

 private:
  void release_locked();
  void* allocate_locked(std::size_t bytes, std::size_t size, int stream);
  // A block of `size` bytes from the source, within the limit; null when not there.
  void* fresh_locked(std::size_t size);

  std::string where_;
  Source source_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_;  // (stream, class) -> blocks
  DeviceMemoryStats stats_;
  std::size_t bytes_reserved_ = 0;  // taken from the source
  std::size_t limit_ = 0;           // on bytes_reserved_; 0: none
  std::string limit_why_;
  std::map<int, std::map<std::size_t, std::vector<void*>>> pools_;  // open pools' unused blocks, by class
  std::unordered_map<void*, int> pooled_;  // every block a pool handed out, to its pool
  int next_pool_ = 1;
};

}  // namespace dtrain
