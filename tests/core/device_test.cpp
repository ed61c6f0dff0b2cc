#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "common/error_message.h"
#include "dtrain/core/block_cache.h"
#include "dtrain/core/device.h"
#include "dtrain/core/tensor.h"

namespace dtrain {
namespace {

TEST(Device, ParsesTensorFlowAndPyTorchNames) {
  EXPECT_EQ(parse_device("/GPU:0"), Device::cuda(0));
  EXPECT_EQ(parse_device("/gpu:1"), Device::cuda(1));
  EXPECT_EQ(parse_device("GPU:2"), Device::cuda(2));
  EXPECT_EQ(parse_device("gpu"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(parse_device("/device:GPU:1"), Device::cuda(1));
  EXPECT_EQ(parse_device("/physical_device:GPU:0"), Device::cuda(0));
  EXPECT_EQ(parse_device("/job:localhost/replica:0/task:0/device:GPU:4"), Device::cuda(4));
  // Every CPU name is the CPU's one memory.
  EXPECT_EQ(parse_device("/cpu:0"), Device::cpu());
  EXPECT_EQ(parse_device("/CPU:3"), Device::cpu());
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("/job:worker/replica:0/task:1/device:CPU:0"), Device::cpu());
  EXPECT_EQ(Device::cuda(1).to_string(), "cuda:1");
  EXPECT_EQ(Device::cuda(1).tf_name(), "/device:GPU:1");
  for (const char* bad : {"", "tpu:0", "/gpu:", "gpu:x", "/gpu:-1", "/job:localhost", "gpu:1234567"})
    EXPECT_THROW(parse_device(bad), InvalidArgument) << bad;
  EXPECT_TRUE(testing::message_of([] { parse_device("tpu:0"); }).find("'tpu:0'") != std::string::npos);
}

TEST(Device, TheCpuAlwaysExistsAndAutoFallsBackToIt) {
  EXPECT_EQ(device_count(DeviceType::cpu), 1);
  EXPECT_NO_THROW(check_device(Device::cpu()));
  EXPECT_EQ(resolve_device("cpu"), Device::cpu());
  if (device_count(DeviceType::cuda) == 0) {
    EXPECT_EQ(resolve_device("auto"), Device::cpu());
    // Asking for a GPU where there is none names what was found, in one line.
    const std::string m = testing::message_of([] { resolve_device("/GPU:0"); });
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("no GPU"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_THROW(Tensor::empty({2}, DType::f32, Device::cuda(0)), InvalidArgument);
  }
}

TEST(Device, PlacementNestsAndRestores) {
  EXPECT_EQ(placement(), Device::cpu());
  {
    DevicePlacement cpu(Device::cpu());
    EXPECT_EQ(placement(), Device::cpu());
  }
  if (device_count(DeviceType::cuda) == 0) {
    EXPECT_THROW(DevicePlacement gpu(Device::cuda(0)), InvalidArgument);
  }
  EXPECT_THROW(set_default_placement("tpu"), InvalidArgument);
  set_default_placement("auto");
  EXPECT_EQ(placement(), device_count(DeviceType::cuda) > 0 ? Device::cuda(0) : Device::cpu());
  set_default_placement("cpu");
  EXPECT_EQ(placement(), Device::cpu());
}

// A source of at most `limit` bytes, counting what it was asked for.
struct FakeMemory {
  std::size_t limit = 1 << 20, used = 0;
  int allocations = 0, frees = 0, synchronizations = 0;
  std::map<void*, std::size_t> sizes;
  BlockCache::Source source() {
    return {[this](std::size_t n) -> void* {
              if (used + n > limit) return nullptr;
              used += n;
              ++allocations;
              void* p = std::malloc(n);
              sizes[p] = n;
              return p;
            },
            [this](void* p) {
              ++frees;
              used -= sizes.at(p);
              sizes.erase(p);
              std::free(p);
            },
            [this]() -> std::pair<std::size_t, std::size_t> { return {limit - used, limit}; },
            [this] { ++synchronizations; }};
  }
};

TEST(BlockCache, SizesRoundUpToClassesSmallAndLarge) {
  EXPECT_EQ(BlockCache::size_class(0), 512u);
  EXPECT_EQ(BlockCache::size_class(1), 512u);
  EXPECT_EQ(BlockCache::size_class(513), 1024u);
  EXPECT_EQ(BlockCache::size_class((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(BlockCache::size_class((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(BlockCache::size_class((2u << 20) + 1), 4u << 20);
}

TEST(BlockCache, ReusesABlockOnlyForItsClassAndStream) {
  FakeMemory memory;
  BlockCache cache("cuda:9", memory.source());
  void* a = cache.allocate(1000, /*stream=*/0);
  cache.deallocate(a, 1000, 0);
  EXPECT_EQ(cache.allocate(1020, 0), a);  // the same class
  cache.deallocate(a, 1020, 0);
  void* b = cache.allocate(1000, /*stream=*/1);  // another stream may still be using a
  EXPECT_NE(b, a);
  void* c = cache.allocate(3000, 0);  // another class
  EXPECT_NE(c, a);
  EXPECT_EQ(memory.allocations, 3);
  const DeviceMemoryStats s = cache.stats();
  EXPECT_EQ(s.bytes_in_use, 1024u + 3072u);
  EXPECT_EQ(s.bytes_cached, 1024u);
  EXPECT_EQ(s.device_allocations, 3u);
  EXPECT_EQ(s.allocations, 4u);
  cache.deallocate(b, 1000, 1);
  cache.deallocate(c, 3000, 0);
  cache.release_cached();
  EXPECT_EQ(memory.frees, 3);
  EXPECT_EQ(memory.synchronizations, 1);  // queued work may still read what is freed
  EXPECT_EQ(cache.stats().bytes_cached, 0u);
}

TEST(BlockCache, APoolKeepsItsBlocksFromOthersUntilClosed) {
  FakeMemory memory;
  BlockCache cache("cuda:0", memory.source());
  void* shared = cache.allocate(1000);
  cache.deallocate(shared, 1000);
  const int pool = cache.open_pool();
  void* a = cache.allocate_in(pool, 1000);
  EXPECT_EQ(a, shared);  // the shared lists' block first: its work was queued before
  cache.deallocate(a, 1000);
  void* b = cache.allocate(1000);  // the pool's block is the graph's: not handed out
  EXPECT_NE(b, a);
  EXPECT_EQ(cache.allocate_in(pool, 900), a);  // but the pool reuses it
  void* c = cache.allocate_in(pool, 5000);
  cache.deallocate(c, 5000);
  EXPECT_EQ(cache.stats().bytes_in_use, 1024u + 1024u + 5120u);  // a pool's blocks are the graph's
  EXPECT_EQ(cache.stats().bytes_cached, 0u);
  cache.release_cached();
  EXPECT_EQ(memory.frees, 0);  // a pool's unused blocks are not freed under the graph
  cache.close_pool(pool);
  EXPECT_EQ(cache.stats().bytes_cached, 5120u);  // c joined the shared lists
  EXPECT_EQ(cache.allocate(5000), c);
  cache.deallocate(a, 1000);  // in use when its pool closed: to the shared lists
  EXPECT_EQ(cache.allocate(1000), a);
  EXPECT_THROW(cache.allocate_in(pool, 10), InternalError);
  for (void* p : {a, b}) cache.deallocate(p, 1000);
  cache.deallocate(c, 5000);
  EXPECT_EQ(cache.stats().bytes_in_use, 0u);
}

TEST(BlockCache, ARepeatedStepStopsReachingTheDeviceAfterItsFirst) {
  FakeMemory memory;
  BlockCache cache("cuda:0", memory.source());
  for (int step = 0; step < 5; ++step) {
    std::vector<std::pair<void*, std::size_t>> live;
    for (std::size_t bytes : {64 * 1024, 4096, 4096, 300000, 12})
      live.emplace_back(cache.allocate(bytes), bytes);
    for (auto [p, n] : live) cache.deallocate(p, n);
    if (step == 0) {
      EXPECT_EQ(memory.allocations, 5);
    }
  }
  EXPECT_EQ(memory.allocations, 5);
}

TEST(BlockCache, OutOfMemoryFreesTheCacheRetriesThenNamesEverything) {
  FakeMemory memory;
  memory.limit = 8192;
  BlockCache cache("cuda:0", memory.source());
  void* small = cache.allocate(2048);
  cache.deallocate(small, 2048);  // cached, in the way of a larger block
  void* big = cache.allocate(7000);  // fits once the cached block is freed
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(memory.frees, 1);
  const std::string who = "layer 'dense_7'";
  const AllocationTag tag(&who);
  const std::string m = testing::message_of([&] { cache.allocate(100000); });
  for (const char* part : {"out of memory on cuda:0", "layer 'dense_7' asked for 97.66 KiB (100000 bytes)",
                           "7.00 KiB in use", "free of 8.00 KiB"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  EXPECT_THROW(cache.allocate(100000), ResourceExhausted);
  cache.deallocate(big, 7000);
}

TEST(BlockCache, FormatsBytesAsPeopleReadThem) {
  EXPECT_EQ(format_bytes(37), "37 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(std::size_t{3} << 30), "3.00 GiB");
}

TEST(AllocationTag, NestsAndRestores) {
  EXPECT_EQ(AllocationTag::current(), nullptr);
  const std::string a = "a", b = "b";
  {
    const AllocationTag outer(&a);
    {
      const AllocationTag inner(&b);
      EXPECT_EQ(AllocationTag::current(), &b);
    }
    EXPECT_EQ(AllocationTag::current(), &a);
  }
  EXPECT_EQ(AllocationTag::current(), nullptr);
}

}  // namespace
}  // namespace dtrain
