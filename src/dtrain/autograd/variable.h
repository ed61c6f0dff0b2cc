// Variable: a named, mutable tensor that training updates (a layer's kernel, a bias).
// Reading value() inside a GradientTape makes the tape watch it when it is trainable.
// assign() and optimizers write in place, so the value keeps its identity and its storage;
// where a tensor read from the variable before still holds that storage (a tape's record
// of the read), the write goes to a copy first, and the read keeps the values it saw, as
// TensorFlow's variables copy on write.
// A variable belongs to the strategy whose scope() was open when it was created; a
// replica of another strategy reading it is an error naming it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtrain/autograd/constraint.h"
#include "dtrain/core/scoped.h"
#include "dtrain/core/tensor.h"

namespace dtrain {

class Variable {
 public:
  Variable(std::string name, Tensor initial_value, bool trainable = true);
  ~Variable();
  Variable(const Variable&) = default;
  Variable& operator=(const Variable&) = default;

  const std::string& name() const { return name_; }
  // Its layer was renamed (a functional model makes its layers' names unique).
  void set_name(std::string name) { name_ = std::move(name); }
  bool trainable() const { return trainable_; }
  void set_trainable(bool t) { trainable_ = t; }
  const Shape& shape() const { return value_.shape(); }
  DType dtype() const { return value_.dtype(); }
  std::int64_t numel() const { return value_.numel(); }
  // The identity of the value, as a tape knows it (does not watch); on a replica that reads
  // a mirror (below), the mirror's.
  std::uint64_t id() const { return read_copy().id(); }
  Device value_device() const { return read_copy().device(); }
  // The strategy (by number, see core/replica.h) whose scope created the variable.
  std::uint64_t strategy() const { return strategy_; }

  // The current value, watched by live tapes when trainable. Inside a strategy's run(),
  // a variable created outside that strategy's scope is an InvalidArgument naming it.
  const Tensor& value() const;
  // The same for a lookup of rows `ids` (an Embedding's gather; int32 on the host, each in
  // range: lookup_ids): a variable read by rows may have only those rows brought up to
  // date (see detail::RowReader).
  const Tensor& value_for_lookup(const Tensor& ids) const;
  // Whether its layer reads it only by rows (an Embedding's table) unless value() is read.
  bool read_by_rows() const { return read_by_rows_; }
  void set_read_by_rows(bool by_rows) { read_by_rows_ = by_rows; }
  // The value for in-place updates by optimizers and loaders; not watched.
  Tensor& mutable_value() { return value_; }
  // The same, for an update: first made a storage of its own where a tensor read from the
  // variable still holds its storage (Tensor::unshare).
  Tensor& value_for_update() {
    value_.unshare();
    return value_;
  }

  // Copies `v` into the variable; shapes and dtypes must match (an error names the variable).
  void assign(const Tensor& v);

  // MirroredStrategy over GPUs with memories of their own: a copy of the value on each GPU
  // but the first, which the replica on that GPU reads instead of the value (value(), id(),
  // value_device(); its replica context's `mirror`). The strategy makes them and copies the
  // value into them before its replicas run; updates go to the value. Empty elsewhere.
  std::vector<Tensor>& mirrors() { return mirrors_; }

  // Keras's constraint (kernel_constraint, ...), which optimizers apply after updating the
  // variable; an axis outside the variable's rank is an InvalidArgument naming both.
  const std::optional<Constraint>& constraint() const { return constraint_; }
  void set_constraint(std::optional<Constraint> c);
  // Replaces the value with its constrained value (nothing without a constraint).
  void apply_constraint();

 private:
  std::string name_;
  Tensor value_;
  bool trainable_;
  std::uint64_t strategy_;
  bool read_by_rows_ = false;
  std::optional<Constraint> constraint_;
  std::vector<Tensor> mirrors_;
  // What this thread reads: its replica's mirror where it has one, else the value.
  const Tensor& read_copy() const;
  // Whether a tracker (below) was told of this variable; copies are not tracked.
  struct Tracked {
    bool on = false;
    Tracked() = default;
    Tracked(const Tracked&) {}
    Tracked& operator=(const Tracked&) { return *this; }
  } tracked_;
};

namespace detail {
// A strategy that keeps its variables elsewhere (ParameterServerStrategy: on the
// parameter servers) is told of each variable made while its scope is open on any thread,
// and of that variable's destruction (not of copies).
class VariableTracker {
 public:
  virtual ~VariableTracker() = default;
  virtual void created(Variable& v) = 0;
  virtual void destroyed(Variable& v) = 0;
};
// Registers `tracker` for the strategy numbered `strategy` (see core/replica.h); null
// unregisters it.
void track_variables(std::uint64_t strategy, VariableTracker* tracker);

// A strategy whose variables live elsewhere and are brought up to date on demand
// (ParameterServerStrategy's worker, for embedding tables) is told, on the thread it set
// itself on, of every read of a variable read_by_rows(): whole (value()) or by a lookup.
class RowReader {
 public:
  virtual ~RowReader() = default;
  virtual void read_whole(const Variable& v) = 0;
  virtual void read_rows(const Variable& v, const Tensor& ids) = 0;
};
// Sets this thread's reader (null: none) for its lifetime. A reader is told of no read it
// makes itself: while it is told of one, the thread has none.
class ScopedRowReader : ScopedAssign<RowReader*> {
 public:
  explicit ScopedRowReader(RowReader* reader);
};
}  // namespace detail

}  // namespace dtrain
