// Thread-local replica context and creation scope.
#include "dtrain/core/replica.h"

namespace dtrain {
namespace {

ReplicaContext& context_slot() {
  thread_local ReplicaContext context;
  return context;
}

std::uint64_t& scope_slot() {
  thread_local std::uint64_t scope = 0;
  return scope;
}

}  // namespace

const ReplicaContext& replica_context() { return context_slot(); }

std::vector<TimedCrossReplicaCall>& timed_cross_replica_calls() {
  thread_local std::vector<TimedCrossReplicaCall> calls;
  return calls;
}
std::uint64_t creation_scope() { return scope_slot(); }

namespace detail {

ScopedReplicaContext::ScopedReplicaContext(const ReplicaContext& context) : saved_(context_slot()) {
  context_slot() = context;
}
ScopedReplicaContext::~ScopedReplicaContext() { context_slot() = saved_; }

void set_creation_scope(std::uint64_t strategy) { scope_slot() = strategy; }

}  // namespace detail
}  // namespace dtrain
