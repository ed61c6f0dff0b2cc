// Size-bucketed block cache over aligned_alloc.
#include "dtrain/core/allocator.h"

#include "dtrain/core/error.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <new>

namespace dtrain {

double resident_mb() {
  std::ifstream in("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  in >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

CachingAllocator::~CachingAllocator() { release_cached(); }

namespace {

void* system_allocate(std::size_t size) {
  if (size < CachingAllocator::kHugePage) return std::aligned_alloc(CachingAllocator::kAlignment, size);
  // posix_memalign, unlike aligned_alloc, takes sizes that are not a multiple of the
  // alignment (the sanitizers' aligned_alloc rejects them).
  void* p = nullptr;
  if (posix_memalign(&p, CachingAllocator::kHugePage, size) != 0) return nullptr;
  // Advice only: where transparent huge pages are off, the block keeps 4 KiB pages.
  madvise(p, size, MADV_HUGEPAGE);
  return p;
}

}  // namespace

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = round_size(bytes);
  {
    std::lock_guard lock(mutex_);
    ++stats_.allocations;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.bytes_in_use += size;
      if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
      return p;
    }
  }
  void* p = system_allocate(size);
  if (p == nullptr) {
    // Cached blocks of other sizes may be what stands between us and success.
    release_cached();
    p = system_allocate(size);
    if (p == nullptr)
      DTRAIN_THROW(ResourceExhausted, "out of memory: ", bytes, " bytes (", static_cast<double>(bytes) / 1e9,
                   " GB) could not be allocated");
  }
  std::lock_guard lock(mutex_);
  ++stats_.system_allocations;
  stats_.bytes_reserved += size;
  stats_.bytes_in_use += size;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  return p;
}

void CachingAllocator::deallocate(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  const std::size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  stats_.bytes_in_use -= size;
  free_[size].push_back(ptr);
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) std::free(p);
    stats_.bytes_reserved -= size * blocks.size();
    blocks.clear();
  }
  free_.clear();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

CachingAllocator& cpu_allocator() {
  // Intentionally leaked: tensors held in static objects may be freed after main returns.
  static CachingAllocator* allocator = new CachingAllocator();
  return *allocator;
}

}  // namespace dtrain
