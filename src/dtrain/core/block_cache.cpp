// Size-class free lists per stream over an injected allocator.
#include "dtrain/core/block_cache.h"

#include <algorithm>
#include <cstdio>

#include "dtrain/core/error.h"

namespace dtrain {

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) std::snprintf(text, sizeof text, "%zu B", bytes);
  else std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  return text;
}

namespace {

const std::string*& tag_slot() {
  thread_local const std::string* tag = nullptr;
  return tag;
}

constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kLargeAbove = std::size_t{1} << 20;
constexpr std::size_t kLargeStep = std::size_t{2} << 20;

}  // namespace

AllocationTag::AllocationTag(const std::string* who) : saved_(tag_slot()) { tag_slot() = who; }
AllocationTag::~AllocationTag() { tag_slot() = saved_; }
const std::string* AllocationTag::current() { return tag_slot(); }

std::size_t BlockCache::size_class(std::size_t bytes) {
  if (bytes == 0) return kSmallStep;
  const std::size_t step = bytes < kLargeAbove ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

BlockCache::BlockCache(std::string where, Source source) : where_(std::move(where)), source_(std::move(source)) {}

BlockCache::~BlockCache() {
  // Blocks still in use belong to tensors that outlive the cache (static objects at exit):
  // they are left to the process's end.
  try {
    release_cached();
  } catch (...) {
    // A device that failed cannot free: nothing to do at teardown.
  }
}

void* BlockCache::allocate(std::size_t bytes, int stream) {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  ++stats_.allocations;
  return allocate_locked(bytes, size, stream);
}

void* BlockCache::allocate_locked(std::size_t bytes, std::size_t size, int stream) {
  if (auto it = free_.find({stream, size}); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.bytes_in_use += size;
    stats_.bytes_cached -= size;
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    return p;
  }
  void* p = fresh_locked(size);
  std::size_t cached_before = 0;
  if (p == nullptr) {
    // Blocks of other classes or streams may be what stands in the way.
    cached_before = stats_.bytes_cached;
    release_locked();
    p = fresh_locked(size);
  }
  if (p == nullptr) {
    const auto [free, total] = source_.free_and_total();
    const std::string* who = AllocationTag::current();
    const std::string limit =
        limit_ ? detail::concat(", within the limit of ", format_bytes(limit_), " (", limit_why_, ")") : "";
    DTRAIN_THROW(ResourceExhausted, "out of memory on ", where_, ": ", who ? *who + " asked for " : "asked for ",
                 format_bytes(bytes), " (", bytes, " bytes); ", format_bytes(stats_.bytes_in_use),
                 " in use by tensors, ", format_bytes(cached_before), " cached (freed and tried again), ",
                 format_bytes(free), " free of ", format_bytes(total), limit,
                 ". A smaller batch, bfloat16 mixed precision or fewer live tensors need less.");
  }
  ++stats_.device_allocations;
  bytes_reserved_ += size;
  stats_.bytes_in_use += size;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return p;
}

void* BlockCache::fresh_locked(std::size_t size) {
  if (limit_ && bytes_reserved_ + size > limit_) return nullptr;
  return source_.allocate(size);
}

void BlockCache::set_limit(std::size_t bytes, std::string why) {
  std::lock_guard lock(mutex_);
  if (bytes && bytes_reserved_ > bytes) release_locked();
  if (bytes && bytes_reserved_ > bytes)
    DTRAIN_THROW(InvalidArgument, where_, ": a limit of ", format_bytes(bytes), " (", why, ") is less than the ",
                 format_bytes(bytes_reserved_), " its tensors hold already");
  limit_ = bytes;
  limit_why_ = std::move(why);
}

void BlockCache::deallocate(void* data, std::size_t bytes, int stream) {
  if (data == nullptr) return;
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  if (!pooled_.empty())
    if (const auto it = pooled_.find(data); it != pooled_.end()) {
      if (const auto pool = pools_.find(it->second); pool != pools_.end()) {
        pool->second[size].push_back(data);  // still the graph's
        return;
      }
      pooled_.erase(it);  // its pool was closed while it was in use
    }
  stats_.bytes_in_use -= size;
  stats_.bytes_cached += size;
  free_[{stream, size}].push_back(data);
}

int BlockCache::open_pool() {
  std::lock_guard lock(mutex_);
  const int id = next_pool_++;
  pools_[id];
  return id;
}

void* BlockCache::allocate_in(int pool, std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  const auto it = pools_.find(pool);
  if (it == pools_.end()) DTRAIN_THROW(InternalError, "allocate_in: pool ", pool, " of ", where_, " is not open");
  ++stats_.allocations;
  if (std::vector<void*>& blocks = it->second[size]; !blocks.empty()) {
    void* p = blocks.back();
    blocks.pop_back();
    return p;
  }
  void* p = allocate_locked(bytes, size, 0);
  pooled_[p] = pool;
  return p;
}

void BlockCache::close_pool(int pool) {
  std::lock_guard lock(mutex_);
  const auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  for (auto& [size, blocks] : it->second)
    for (void* p : blocks) {
      pooled_.erase(p);
      stats_.bytes_in_use -= size;
      stats_.bytes_cached += size;
      free_[{0, size}].push_back(p);
    }
  pools_.erase(it);
}

void BlockCache::release_cached() {
  std::lock_guard lock(mutex_);
  release_locked();
}

void BlockCache::release_locked() {
  if (stats_.bytes_cached == 0) return;
  source_.synchronize();
  for (auto& [key, blocks] : free_) {
    for (void* p : blocks) source_.free(p);
    bytes_reserved_ -= key.second * blocks.size();
  }
  free_.clear();
  stats_.bytes_cached = 0;
}

DeviceMemoryStats BlockCache::stats() const {
  DeviceMemoryStats s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  const auto [free, total] = source_.free_and_total();
  s.device_free = free;
  s.device_total = total;
  return s;
}

}  // namespace dtrain
