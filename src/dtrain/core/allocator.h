// The caching allocator behind every Tensor buffer: blocks are returned to per-size free
// lists and reused, so a training step that repeats the same shapes stops asking the
// system for memory after its first steps. It is not a general-purpose malloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace dtrain {

struct AllocatorStats {
  std::size_t bytes_reserved = 0;       // obtained from the system and not yet released
  std::size_t bytes_in_use = 0;         // handed out to live tensors
  std::size_t peak_bytes_in_use = 0;
  std::uint64_t system_allocations = 0; // calls that reached the system allocator
  std::uint64_t allocations = 0;        // all calls to allocate()
};

// This process's resident memory in MiB (from /proc/self/statm; 0 where unreadable).
double resident_mb();

class CachingAllocator {
 public:
  static constexpr std::size_t kAlignment = 64;  // a cache line; AVX-512 loads stay aligned

  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a 64-byte-aligned block of at least `bytes` (0 is allowed and gives a valid,
  // unique pointer). Throws std::bad_alloc when the system has no memory left.
  void* allocate(std::size_t bytes);
  // `bytes` must be what was passed to allocate().
  void deallocate(void* ptr, std::size_t bytes);

  // Gives every cached (unused) block back to the system.
  void release_cached();
  AllocatorStats stats() const;
  // Starts peak_bytes_in_use again from what is in use now (to measure one computation's peak).
  void reset_peak();

  // Blocks of at least this size start on a 2 MiB boundary and are marked for transparent
  // huge pages: a batch gathered from rows scattered over hundreds of MiB, or a 4 MiB
  // weight streamed by a matmul, then costs one TLB entry per 2 MiB instead of one per
  // 4 KiB (a shuffled Fashion-MNIST batch gathers about 20% faster here).
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;

  static std::size_t round_size(std::size_t bytes) {
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // rounded size -> free blocks
  AllocatorStats stats_;
};

// The process's CPU allocator. Tensors use it unless given another.
CachingAllocator& cpu_allocator();

}  // namespace dtrain
