#include <gtest/gtest.h>

#include "dtrain/core/allocator.h"
#include "dtrain/core/tensor.h"

namespace dtrain {

TEST(CachingAllocator, ReusesFreedBlocksOfTheSameSize) {
  CachingAllocator a;
  void* p = a.allocate(1000);
  a.deallocate(p, 1000);
  void* q = a.allocate(1000);
  EXPECT_EQ(p, q);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.system_allocations, 1u);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.bytes_in_use, CachingAllocator::round_size(1000));
  a.deallocate(q, 1000);
  EXPECT_EQ(a.stats().bytes_in_use, 0u);
  a.release_cached();
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
}

TEST(CachingAllocator, LargeBlocksStartOnAHugePageAndAreReused) {
  CachingAllocator a;
  // Not a multiple of the huge page: the sanitizers' aligned_alloc would refuse it.
  const std::size_t bytes = CachingAllocator::kHugePage + 64 * 3;
  void* p = a.allocate(bytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % CachingAllocator::kHugePage, 0u);
  static_cast<char*>(p)[bytes - 1] = 1;  // the whole block is usable
  a.deallocate(p, bytes);
  EXPECT_EQ(a.allocate(bytes), p);
  a.deallocate(p, bytes);
  EXPECT_EQ(a.stats().system_allocations, 1u);
  // Smaller blocks keep the cache-line alignment only.
  void* small = a.allocate(1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small) % CachingAllocator::kAlignment, 0u);
  a.deallocate(small, 1000);
}

TEST(CachingAllocator, ZeroBytesGivesDistinctValidPointers) {
  CachingAllocator a;
  void* p = a.allocate(0);
  void* q = a.allocate(0);
  EXPECT_NE(p, nullptr);
  EXPECT_NE(p, q);
  a.deallocate(p, 0);
  a.deallocate(q, 0);
}

TEST(CachingAllocator, TensorsReturnTheirStorage) {
  const auto before = cpu_allocator().stats();
  { Tensor t = Tensor::zeros({123, 7}); }
  { Tensor t = Tensor::zeros({123, 7}); }
  const auto after = cpu_allocator().stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_LE(after.system_allocations, before.system_allocations + 1);
}

}  // namespace dtrain
