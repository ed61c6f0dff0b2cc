// The current strategy of a thread, and strategy numbering.
#include "dtrain/model/strategy_backend.h"

#include <atomic>

#include "dtrain/core/replica.h"

namespace dtrain {
namespace {

std::shared_ptr<StrategyBackend>& current_slot() {
  thread_local std::shared_ptr<StrategyBackend> current;
  return current;
}

}  // namespace

StrategyBackend::StrategyBackend() {
  static std::atomic<std::uint64_t> next{1};
  id_ = next.fetch_add(1);
}

std::shared_ptr<StrategyBackend> current_strategy() { return current_slot(); }

namespace detail {

ScopedStrategy::ScopedStrategy(std::shared_ptr<StrategyBackend> strategy)
    : saved_(current_slot()), saved_scope_(creation_scope()) {
  if (strategy && strategy->placement()) {
    saved_placement_ = detail::exchange_placement(strategy->placement());
    placed_ = true;
  }
  detail::set_creation_scope(strategy ? strategy->id() : 0);
  current_slot() = std::move(strategy);
}

ScopedStrategy::ScopedStrategy(ScopedStrategy&& other) noexcept
    : active_(other.active_), saved_(std::move(other.saved_)), saved_scope_(other.saved_scope_),
      placed_(other.placed_), saved_placement_(other.saved_placement_) {
  other.active_ = false;
}

ScopedStrategy::~ScopedStrategy() {
  if (!active_) return;
  current_slot() = std::move(saved_);
  detail::set_creation_scope(saved_scope_);
  if (placed_) detail::exchange_placement(saved_placement_);
}

}  // namespace detail
}  // namespace dtrain
