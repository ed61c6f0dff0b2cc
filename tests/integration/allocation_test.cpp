// A steady-state training step allocates nothing: the caching allocator's bytes and
// system calls stop growing after the first steps, and the process heap's live bytes too.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "dtrain/dtrain.h"

// The replacement below stores its size header in front of the block; GCC cannot see that
// operator new and delete here agree, so it warns about a mismatch that is not one.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#pragma GCC diagnostic ignored "-Warray-bounds"

// Live heap bytes, tracked by replacing the global operator new/delete in this binary.
namespace {
std::atomic<std::int64_t> g_live_bytes{0};
constexpr std::size_t kHeader = 16;  // keeps the returned pointer 16-byte aligned
}  // namespace

void* operator new(std::size_t n) {
  auto* p = static_cast<char*>(std::malloc(n + kHeader));
  if (!p) throw std::bad_alloc();
  *reinterpret_cast<std::size_t*>(p) = n;
  g_live_bytes.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
  return p + kHeader;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
  g_live_bytes.fetch_sub(static_cast<std::int64_t>(*reinterpret_cast<std::size_t*>(base)), std::memory_order_relaxed);
  std::free(base);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace dtrain {
namespace {

TEST(Allocation, TrainingStepStopsAllocatingAfterWarmup) {
  nn::Dense d1(128, "relu", {.seed = 1}), d2(128, "relu", {.seed = 2}), d3(10, "", {.seed = 3});
  nn::Dropout drop(0.1f, 4);
  losses::SparseCategoricalCrossentropy loss_fn(true);
  optim::Adam optimizer(1e-3f);
  Generator g(5);
  Tensor x = Tensor::empty({32, 256});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = g.normal();
  Tensor y = Tensor::empty({32}, DType::i32);
  for (std::int64_t i = 0; i < 32; ++i) y.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 10);
  std::vector<Variable*> vars;

  AllocatorStats at_step3{};
  std::int64_t heap_at_step3 = 0;
  for (int step = 1; step <= 200; ++step) {
    {
      GradientTape tape;
      Tensor logits = d3(drop(d2(d1(x, true), true), true), true);
      Tensor loss = loss_fn(y, logits);
      if (vars.empty())
        for (auto* layer : std::initializer_list<nn::Layer*>{&d1, &d2, &d3})
          for (Variable* v : layer->trainable_variables()) vars.push_back(v);
      optimizer.apply_gradients(tape.gradient(loss, vars), vars);
    }
    if (step == 3) {
      at_step3 = cpu_allocator().stats();
      heap_at_step3 = g_live_bytes.load();
    }
  }
  const AllocatorStats at_end = cpu_allocator().stats();
  EXPECT_EQ(at_end.bytes_reserved, at_step3.bytes_reserved) << "tensor memory grew after step 3";
  EXPECT_EQ(at_end.system_allocations, at_step3.system_allocations) << "new system allocations after step 3";
  EXPECT_GT(at_end.allocations, at_step3.allocations);  // tensors were made, from the cache
  EXPECT_LE(g_live_bytes.load(), heap_at_step3) << "live heap bytes grew after step 3";
}

}  // namespace
}  // namespace dtrain
