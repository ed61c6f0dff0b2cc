// Variable reads and writes.
#include "dtrain/autograd/variable.h"

#include <mutex>
#include <unordered_map>

#include "dtrain/autograd/tape.h"
#include "dtrain/core/replica.h"

namespace dtrain {

namespace {
thread_local detail::RowReader* row_reader = nullptr;
std::mutex trackers_mutex;
std::unordered_map<std::uint64_t, detail::VariableTracker*>& trackers() {
  static std::unordered_map<std::uint64_t, detail::VariableTracker*> map;
  return map;
}
}  // namespace

void detail::track_variables(std::uint64_t strategy, VariableTracker* tracker) {
  std::lock_guard lock(trackers_mutex);
  if (tracker)
    trackers()[strategy] = tracker;
  else
    trackers().erase(strategy);
}

Variable::Variable(std::string name, Tensor initial_value, bool trainable)
    : name_(std::move(name)), value_(std::move(initial_value)), trainable_(trainable), strategy_(creation_scope()) {
  value_.check_defined("Variable");
  if (strategy_ == 0) return;
  std::lock_guard lock(trackers_mutex);
  const auto it = trackers().find(strategy_);
  if (it == trackers().end()) return;
  it->second->created(*this);
  tracked_.on = true;
}

Variable::~Variable() {
  if (!tracked_.on) return;
  std::lock_guard lock(trackers_mutex);
  const auto it = trackers().find(strategy_);
  if (it != trackers().end()) it->second->destroyed(*this);
}

detail::ScopedRowReader::ScopedRowReader(RowReader* reader) : ScopedAssign(row_reader, reader) {}

const Tensor& Variable::value_for_lookup(const Tensor& ids) const {
  detail::RowReader* reader = read_by_rows_ ? row_reader : nullptr;
  if (!reader) return value();
  const detail::ScopedRowReader none(nullptr);  // value() below is the lookup's read, not a whole one
  reader->read_rows(*this, ids);
  return value();
}

const Tensor& Variable::value() const {
  if (read_by_rows_ && row_reader) {
    detail::RowReader* reader = row_reader;
    const detail::ScopedRowReader none(nullptr);
    reader->read_whole(*this);
  }
  const ReplicaContext& replica = replica_context();
  if (replica.strategy != 0 && replica.strategy != strategy_)
    DTRAIN_THROW(InvalidArgument, "variable '", name_, "' was created outside the scope of the strategy whose replica ",
                 replica.replica_id, " (of ", replica.num_replicas, ") is using it; create the model and the optimizer ",
                 "inside strategy.scope()");
  const Tensor& read = replica.mirror >= 0 ? read_copy() : value_;
  if (trainable_) GradientTape::variable_read(read);
  return read;
}

const Tensor& Variable::read_copy() const {
  const int mirror = replica_context().mirror;
  if (mirror < 0 || mirrors_.empty()) return value_;
  if (static_cast<std::size_t>(mirror) >= mirrors_.size())
    DTRAIN_THROW(InternalError, "variable '", name_, "' has ", mirrors_.size(), " mirrors; replica ",
                 replica_context().replica_id, " reads mirror ", mirror);
  return mirrors_[static_cast<std::size_t>(mirror)];
}

void Variable::set_constraint(std::optional<Constraint> c) {
  if (c && c->kind != Constraint::Kind::non_neg)
    for (int a : c->axis)
      if (a >= value_.rank() || a < -value_.rank())
        DTRAIN_THROW(InvalidArgument, "variable '", name_, "': ", c->class_name(), "'s axis ", a,
                     " is outside its shape ", value_.shape().to_string());
  constraint_ = std::move(c);
}

void Variable::apply_constraint() {
  if (!constraint_) return;
  const Tensor next = constrained(*constraint_, value_);
  value_for_update().copy_from(next);
}

void Variable::assign(const Tensor& v) {
  if (!(v.shape() == value_.shape()) || v.dtype() != value_.dtype())
    DTRAIN_THROW(InvalidArgument, "Variable '", name_, "': cannot assign a ", dtype_name(v.dtype()), " ",
                 v.shape().to_string(), " value to a ", dtype_name(value_.dtype()), " ",
                 value_.shape().to_string(), " variable");
  value_for_update().copy_from(v);
}

}  // namespace dtrain
