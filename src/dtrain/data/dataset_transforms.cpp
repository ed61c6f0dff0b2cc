// Synchronous transformations: map, filter, shuffle, batch, unbatch, repeat, take, skip,
// shard and cache. Each saves its own position plus its upstream's.
#include <algorithm>
#include <map>
#include <mutex>

#include "dtrain/core/rng.h"
#include "dtrain/data/dataset_internal.h"

namespace dtrain::data::detail {
namespace {

// A stage with one upstream iterator.
class UnaryIterator : public IteratorBase {
 public:
  explicit UnaryIterator(std::unique_ptr<IteratorBase> in) : in_(std::move(in)) {}
  void report(std::vector<std::string>& lines) const override { in_->report(lines); }

 protected:
  std::unique_ptr<IteratorBase> in_;
};

// A stage whose whole position is one counter plus its upstream's position.
class CounterIterator : public UnaryIterator {
 public:
  IteratorState save() const override { return {{count_}, {}, {in_->save()}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 1, 1, stage_);
    count_ = s.values[0];
    in_->restore(s.children[0]);
  }

 protected:
  CounterIterator(std::unique_ptr<IteratorBase> in, std::int64_t count, const char* stage)
      : UnaryIterator(std::move(in)), count_(count), stage_(stage) {}
  std::int64_t count_;

 private:
  const char* stage_;
};

// ---- map (sequential); the counter numbers elements for error messages
class MapIterator : public CounterIterator {
 public:
  MapIterator(std::unique_ptr<IteratorBase> in, MapFn fn) : CounterIterator(std::move(in), 0, "map"), fn_(std::move(fn)) {}
  std::optional<Element> next() override {
    std::optional<Element> e = in_->next();
    if (!e) return std::nullopt;
    const std::int64_t index = count_++;
    try {
      return fn_(*e);
    } catch (...) {
      rethrow_with_context(std::current_exception(), "map: element " + std::to_string(index));
    }
  }

 private:
  const MapFn fn_;  // a copy: iterators never refer into their node
};

class MapNode : public DatasetNode {
 public:
  MapNode(NodePtr in, MapFn fn) : in_(std::move(in)), fn_(std::move(fn)) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<MapIterator>(in_->make(ctx), fn_);
  }
  std::int64_t cardinality() const override { return in_->cardinality(); }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  MapFn fn_;
};

// ---- filter
class FilterIterator : public CounterIterator {
 public:
  FilterIterator(std::unique_ptr<IteratorBase> in, std::function<bool(const Element&)> p)
      : CounterIterator(std::move(in), 0, "filter"), predicate_(std::move(p)) {}
  std::optional<Element> next() override {
    while (std::optional<Element> e = in_->next()) {
      const std::int64_t index = count_++;
      bool keep;
      try {
        keep = predicate_(*e);
      } catch (...) {
        rethrow_with_context(std::current_exception(), "filter: element " + std::to_string(index));
      }
      if (keep) return e;
    }
    return std::nullopt;
  }

 private:
  const std::function<bool(const Element&)> predicate_;
};

class FilterNode : public DatasetNode {
 public:
  FilterNode(NodePtr in, std::function<bool(const Element&)> p) : in_(std::move(in)), predicate_(std::move(p)) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<FilterIterator>(in_->make(ctx), predicate_);
  }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::function<bool(const Element&)> predicate_;
};

// ---- interleave: `cycle` open datasets, each made by fn from an input element, read in
// turn `block` elements at a time. A finished one leaves its slot empty until the turn
// comes back to it, when the next input element fills it (TensorFlow's order).
class InterleaveIterator : public UnaryIterator {
 public:
  InterleaveIterator(std::unique_ptr<IteratorBase> in, std::function<Dataset(const Element&)> fn, std::int64_t cycle,
                     std::int64_t block, std::int64_t parallel, IteratorContext ctx)
      : UnaryIterator(std::move(in)),
        fn_(std::move(fn)),
        block_(block),
        parallel_(parallel),
        ctx_(std::move(ctx)),
        slots_(static_cast<std::size_t>(cycle)) {
    // What fn makes reads its whole input: sharding by file happened to the names above.
    ctx_.file_shard = {};
  }

  std::optional<Element> next() override {
    for (;;) {
      Slot& slot = slots_[current_];
      if (slot.it) {
        std::optional<Element> e;
        try {
          e = slot.it->next();
        } catch (...) {
          rethrow_with_context(std::current_exception(), "interleave: the dataset of input element " + std::to_string(slot.index));
        }
        if (e) {
          if (++taken_ == block_) advance();
          return e;
        }
        slot = Slot{};
        advance();
      } else if (!input_done_) {
        std::optional<Element> input = in_->next();
        if (!input) {
          input_done_ = true;
          continue;
        }
        open(slot, std::move(*input), inputs_++);
      } else if (std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.it; })) {
        return std::nullopt;
      } else {
        advance();
      }
    }
  }

  IteratorState save() const override {
    IteratorState s;
    s.values = {static_cast<std::int64_t>(current_), taken_, input_done_ ? 1 : 0, inputs_};
    s.children.push_back(in_->save());
    for (const Slot& slot : slots_) {
      s.values.push_back(slot.it ? slot.index : -1);
      if (!slot.it) continue;
      s.values.push_back(static_cast<std::int64_t>(slot.input.size()));
      s.tensors.insert(s.tensors.end(), slot.input.begin(), slot.input.end());
      s.children.push_back(slot.it->save());
    }
    return s;
  }
  void restore(const IteratorState& s) override {
    if (s.values.size() < 4 + slots_.size() || s.children.empty())
      DTRAIN_THROW(InvalidArgument, "interleave: the saved iterator state does not belong to this pipeline");
    current_ = static_cast<std::size_t>(s.values[0]);
    taken_ = s.values[1];
    input_done_ = s.values[2] != 0;
    inputs_ = s.values[3];
    if (current_ >= slots_.size() || taken_ < 0 || taken_ >= block_)
      DTRAIN_THROW(InvalidArgument, "interleave: the saved iterator state was made with another cycle_length or block_length");
    in_->restore(s.children[0]);
    std::size_t value = 4, tensor = 0, child = 1;
    for (Slot& slot : slots_) {
      slot = Slot{};
      if (value >= s.values.size()) DTRAIN_THROW(InvalidArgument, "interleave: the saved iterator state is cut short");
      const std::int64_t index = s.values[value++];
      if (index < 0) continue;
      if (value >= s.values.size() || child >= s.children.size())
        DTRAIN_THROW(InvalidArgument, "interleave: the saved iterator state is cut short");
      const auto arity = static_cast<std::size_t>(s.values[value++]);
      if (arity > s.tensors.size() - tensor) DTRAIN_THROW(InvalidArgument, "interleave: the saved iterator state is cut short");
      Element input(s.tensors.begin() + static_cast<std::ptrdiff_t>(tensor),
                    s.tensors.begin() + static_cast<std::ptrdiff_t>(tensor + arity));
      tensor += arity;
      open(slot, std::move(input), index);
      slot.it->restore(s.children[child++]);
    }
  }

 private:
  struct Slot {
    std::unique_ptr<IteratorBase> it;
    Element input;           // what made it, for a saved position
    std::int64_t index = 0;  // of the input element, for messages
  };
  void advance() {
    taken_ = 0;
    current_ = (current_ + 1) % slots_.size();
  }
  // Each open dataset reads ahead on a thread of its own only where the consumer's compute
  // threads leave a core idle (ctx_.idle_core). Without one, the reading would only take
  // its time from a compute thread, and records handed over between threads one by one
  // cost more than reading them in turn (one device on two cores: 1.0 s epochs against
  // 0.74 s, the seeds' MLP on Fashion-MNIST's TFRecord shards).
  void open(Slot& slot, Element input, std::int64_t index) {
    Dataset made = [&] {
      try {
        return fn_(input);
      } catch (...) {
        rethrow_with_context(std::current_exception(), "interleave: input element " + std::to_string(index));
      }
    }();
    if (parallel_ > 1 && ctx_.idle_core) made = made.prefetch(AUTOTUNE);
    slot.it = made.node()->make(ctx_);
    slot.input = std::move(input);
    slot.index = index;
  }

  const std::function<Dataset(const Element&)> fn_;
  const std::int64_t block_, parallel_;
  IteratorContext ctx_;
  std::vector<Slot> slots_;
  std::size_t current_ = 0;
  std::int64_t taken_ = 0;   // from the current slot in its block
  bool input_done_ = false;
  std::int64_t inputs_ = 0;  // input elements taken
};

class InterleaveNode : public DatasetNode {
 public:
  InterleaveNode(NodePtr in, std::function<Dataset(const Element&)> fn, std::int64_t cycle, std::int64_t block,
                 std::int64_t parallel)
      : in_(std::move(in)), fn_(std::move(fn)), cycle_(cycle), block_(block), parallel_(parallel) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<InterleaveIterator>(in_->make(ctx), fn_, cycle_, block_, parallel_, ctx);
  }
  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::function<Dataset(const Element&)> fn_;
  std::int64_t cycle_, block_, parallel_;
};

// ---- shuffle: a buffer of `size` elements; each output is a random buffer slot, refilled
// from upstream. The generator is fixed by (seed, pass), so the order is reproducible.

// Takes slot i of the buffer, which the last slot then fills.
template <typename T>
T take_at(std::vector<T>& buffer, std::size_t i) {
  T out = std::move(buffer[i]);
  buffer[i] = std::move(buffer.back());
  buffer.pop_back();
  return out;
}

// One draw: a random slot of the buffer. Shared by the element and the row-number
// shuffles, which must give the same order.
template <typename T>
T draw_from(std::vector<T>& buffer, Generator& gen) {
  return take_at(buffer, static_cast<std::size_t>(gen.below(buffer.size())));
}

class ShuffleIterator : public UnaryIterator {
 public:
  ShuffleIterator(std::unique_ptr<IteratorBase> in, std::int64_t size, Generator gen)
      : UnaryIterator(std::move(in)), size_(size), gen_(gen) {}
  std::optional<Element> next() override {
    while (!upstream_done_ && static_cast<std::int64_t>(buffer_.size()) < size_) {
      std::optional<Element> e = in_->next();
      if (!e) upstream_done_ = true;
      else buffer_.push_back(std::move(*e));
    }
    if (buffer_.empty()) return std::nullopt;
    return draw_from(buffer_, gen_);
  }
  // values: generator counter, upstream done, buffer length, each buffered element's arity,
  // the generator's seed (that of the pass saved: an iterator of another pass resumes it).
  IteratorState save() const override {
    IteratorState s{{static_cast<std::int64_t>(gen_.counter()), upstream_done_ ? 1 : 0,
                     static_cast<std::int64_t>(buffer_.size())},
                    {},
                    {in_->save()}};
    save_elements(buffer_, s);
    s.values.push_back(static_cast<std::int64_t>(gen_.seed()));
    return s;
  }
  void restore(const IteratorState& s) override {
    check_state(s, 3, 1, "shuffle");
    const auto held = static_cast<std::size_t>(s.values[2]);
    buffer_ = load_elements(s, 3, held, "shuffle");
    // A state saved before the seed was kept has none: this iterator's own.
    const std::uint64_t seed = s.values.size() > 3 + held ? static_cast<std::uint64_t>(s.values[3 + held]) : gen_.seed();
    gen_ = Generator(seed, static_cast<std::uint64_t>(s.values[0]));
    upstream_done_ = s.values[1] != 0;
    in_->restore(s.children[0]);
  }

 private:
  std::int64_t size_;
  Generator gen_;
  std::vector<Element> buffer_;
  bool upstream_done_ = false;
};

// Shuffle over tensor slices: the same draws as ShuffleIterator, made on row numbers, so
// the order is identical; elements are made (or a batch gathered) only when drawn.
class RowShuffleIterator : public IteratorBase {
 public:
  RowShuffleIterator(const std::vector<Tensor>& sources, std::int64_t size, Generator gen, const IteratorContext& ctx)
      : rows_(sources), size_(size), gen_(gen), ctx_(ctx) {}
  std::optional<Element> next() override {
    const std::int64_t r = draw();
    if (r < 0) return std::nullopt;
    return rows_.at(r);
  }
  bool gathers() const override { return true; }
  std::optional<Element> next_batch(std::int64_t count) override {
    draw_batch(count);
    if (drawn_.empty()) return std::nullopt;
    return gather_rows(rows_.tensors, drawn_, /*on_compute_pool=*/ctx_.on_consumer_thread());
  }
  // values: generator counter, next row to enter the buffer, buffer length, the buffer, the
  // generator's seed (as ShuffleIterator's).
  IteratorState save() const override {
    IteratorState s{{static_cast<std::int64_t>(gen_.counter()), next_row_, static_cast<std::int64_t>(buffer_.size())}, {}, {}};
    s.values.insert(s.values.end(), buffer_.begin(), buffer_.end());
    s.values.push_back(static_cast<std::int64_t>(gen_.seed()));
    return s;
  }
  void restore(const IteratorState& s) override {
    check_state(s, 3, 0, "shuffle");
    const std::int64_t next = s.values[1], held = s.values[2];
    const bool seeded = held >= 0 && s.values.size() == 4 + static_cast<std::size_t>(held);
    if (next < 0 || next > rows_.count() || held < 0 || held > size_ ||
        (!seeded && s.values.size() != 3 + static_cast<std::size_t>(held)))
      DTRAIN_THROW(InvalidArgument, "shuffle: the saved iterator state does not belong to this pipeline (next row ", next,
                   ", ", held, " buffered rows, for ", rows_.count(), " rows and a buffer of ", size_, ")");
    std::vector<std::int64_t> held_rows(s.values.begin() + 3, s.values.begin() + 3 + held);
    std::sort(held_rows.begin(), held_rows.end());
    for (std::size_t i = 0; i < held_rows.size(); ++i)
      if (held_rows[i] < 0 || held_rows[i] >= next || (i > 0 && held_rows[i] == held_rows[i - 1]))
        DTRAIN_THROW(InvalidArgument, "shuffle: the saved iterator state holds row ", held_rows[i],
                     " twice or outside [0, ", next, ")");
    gen_ = Generator(seeded ? static_cast<std::uint64_t>(s.values.back()) : gen_.seed(),
                     static_cast<std::uint64_t>(s.values[0]));
    next_row_ = next;
    buffer_.assign(s.values.begin() + 3, s.values.begin() + 3 + held);
  }

 private:
  // The next row in shuffled order, or -1 at the end.
  std::int64_t draw() {
    fill();
    if (buffer_.empty()) return -1;
    return draw_from(buffer_, gen_);
  }
  // Rows enter the buffer, in order, until it holds size_ or none are left.
  void fill() {
    while (next_row_ < rows_.count() && static_cast<std::int64_t>(buffer_.size()) < size_) buffer_.push_back(next_row_++);
  }
  // Up to `count` rows into drawn_, the same as that many calls of draw(). Which slot each
  // draw takes depends only on the generator and the buffer's length, so the slots are
  // worked out first and the buffer entries they read requested together: one cache miss
  // at a time, a batch's draws took as long as gathering its rows.
  void draw_batch(std::int64_t count) {
    drawn_.clear();
    slots_.clear();
    // The buffer's length at each draw, as fill() will leave it: topped up while rows are
    // left, then one shorter per draw.
    std::int64_t held = static_cast<std::int64_t>(buffer_.size()), left = rows_.count() - next_row_;
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int64_t added = std::min(size_ - held, left);
      held += added;
      left -= added;
      if (held == 0) break;
      const auto slot = static_cast<std::size_t>(gen_.bits_at(static_cast<std::uint64_t>(k)) %
                                                 static_cast<std::uint64_t>(held--));
      if (slot < buffer_.size()) __builtin_prefetch(buffer_.data() + slot);
      slots_.push_back(slot);
    }
    gen_.advance(slots_.size());  // what the draws' below() calls would have taken
    for (const std::size_t slot : slots_) {
      fill();
      drawn_.push_back(take_at(buffer_, slot));
    }
  }

  const Rows rows_;
  std::int64_t size_;
  Generator gen_;
  std::vector<std::int64_t> buffer_;
  std::vector<std::int64_t> drawn_;
  std::vector<std::size_t> slots_;  // draw_batch's slots, kept to reuse the allocation
  std::int64_t next_row_ = 0;
  const IteratorContext ctx_;
};

class ShuffleNode : public DatasetNode {
 public:
  ShuffleNode(NodePtr in, std::int64_t size, std::uint64_t seed, bool reshuffle)
      : in_(std::move(in)), size_(size), seed_(seed), reshuffle_(reshuffle) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    const std::uint64_t seed = reshuffle_ ? mix64(seed_ ^ mix64(ctx.iteration + 0x51)) : seed_;
    if (const std::vector<Tensor>* rows = in_->row_source()) return std::make_unique<RowShuffleIterator>(*rows, size_, Generator(seed), ctx);
    return std::make_unique<ShuffleIterator>(in_->make(ctx), size_, Generator(seed));
  }
  std::int64_t cardinality() const override { return in_->cardinality(); }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::int64_t size_;
  std::uint64_t seed_;
  bool reshuffle_;
};

// ---- batch
class BatchIterator : public UnaryIterator {
 public:
  BatchIterator(std::unique_ptr<IteratorBase> in, std::int64_t size, bool drop) : UnaryIterator(std::move(in)), size_(size), drop_(drop) {}
  std::optional<Element> next() override {
    if (in_->gathers()) {
      std::optional<Element> b = in_->next_batch(size_);
      if (!b || (drop_ && b->front().dim(0) < size_)) return std::nullopt;
      return b;
    }
    std::vector<Element> items;
    items.reserve(static_cast<std::size_t>(std::min<std::int64_t>(size_, 4096)));  // a batch of 2^62 gathers what comes
    while (static_cast<std::int64_t>(items.size()) < size_) {
      std::optional<Element> e = in_->next();
      if (!e) break;
      items.push_back(std::move(*e));
    }
    if (items.empty() || (drop_ && static_cast<std::int64_t>(items.size()) < size_)) return std::nullopt;
    return stack(items, "batch");
  }
  IteratorState save() const override { return {{}, {}, {in_->save()}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 0, 1, "batch");
    in_->restore(s.children[0]);
  }

 private:
  std::int64_t size_;
  bool drop_;
};

class BatchNode : public DatasetNode {
 public:
  BatchNode(NodePtr in, std::int64_t size, bool drop) : in_(std::move(in)), size_(size), drop_(drop) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    if (!ctx.file_shard.rebatch) return std::make_unique<BatchIterator>(in_->make(ctx), size_, drop_);
    // Sharded by file: this worker's part of each global batch of size_ rows (at least
    // one: shard_by_file checked the size against the workers).
    IteratorContext below = ctx;
    below.file_shard.rebatch = false;
    return std::make_unique<BatchIterator>(in_->make(below), ctx.file_shard.share(size_), drop_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t n = in_->cardinality();
    if (n < 0) return n;
    return drop_ ? n / size_ : (n + size_ - 1) / size_;
  }
  const DatasetNode* input() const override { return in_.get(); }
  std::int64_t batch_size() const override { return size_; }

 private:
  NodePtr in_;
  std::int64_t size_;
  bool drop_;
};

// ---- unbatch
class UnbatchIterator : public UnaryIterator {
 public:
  using UnaryIterator::UnaryIterator;
  std::optional<Element> next() override {
    while (!current_ || row_ >= current_->count()) {
      std::optional<Element> e = in_->next();
      if (!e) return std::nullopt;
      for (std::size_t c = 0; c < e->size(); ++c)
        if ((*e)[c].rank() == 0 || (*e)[c].dim(0) != (*e)[0].dim(0))
          DTRAIN_THROW(InvalidArgument, "unbatch: component ", c, " has shape ", (*e)[c].shape().to_string(),
                       ", which does not share the batch axis of component 0 (", (*e)[0].shape().to_string(), ")");
      current_.emplace(std::move(*e));
      row_ = 0;
    }
    return current_->at(row_++);
  }
  IteratorState save() const override {
    IteratorState s{{row_, current_ ? 1 : 0}, {}, {in_->save()}};
    if (current_) save_elements(std::span(&current_->tensors, 1), s);
    return s;
  }
  void restore(const IteratorState& s) override {
    check_state(s, 2, 1, "unbatch");
    row_ = s.values[0];
    current_.reset();
    if (s.values[1]) current_.emplace(load_elements(s, 2, 1, "unbatch")[0]);
    in_->restore(s.children[0]);
  }

 private:
  std::optional<Rows> current_;  // the batch being split
  std::int64_t row_ = 0;
};

class UnbatchNode : public DatasetNode {
 public:
  explicit UnbatchNode(NodePtr in) : in_(std::move(in)) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<UnbatchIterator>(in_->make(ctx));
  }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
};

// ---- repeat: pass k of the upstream runs with iteration mix(parent, k), so a shuffle
// below reshuffles on every repetition, reproducibly.
class RepeatIterator : public IteratorBase {
 public:
  RepeatIterator(NodePtr node, IteratorContext ctx, std::int64_t count) : node_(std::move(node)), ctx_(std::move(ctx)), count_(count) {}
  std::optional<Element> next() override {
    while (count_ < 0 || pass_ < count_) {
      if (!in_) in_ = node_->make(pass_context());
      std::optional<Element> e = in_->next();
      if (e) {
        produced_in_pass_ = true;
        return e;
      }
      in_.reset();
      ++pass_;
      // An empty dataset repeated forever would spin: stop instead.
      if (!produced_in_pass_) return std::nullopt;
      produced_in_pass_ = false;
    }
    return std::nullopt;
  }
  IteratorState save() const override {
    IteratorState s{{pass_, produced_in_pass_ ? 1 : 0, in_ ? 1 : 0}, {}, {}};
    if (in_) s.children.push_back(in_->save());
    return s;
  }
  void restore(const IteratorState& s) override {
    if (s.values.size() < 3) check_state(s, 3, 0, "repeat");
    pass_ = s.values[0];
    produced_in_pass_ = s.values[1] != 0;
    in_.reset();
    if (s.values[2]) {
      check_state(s, 3, 1, "repeat");
      in_ = node_->make(pass_context());
      in_->restore(s.children[0]);
    }
  }
  void report(std::vector<std::string>& lines) const override {
    if (in_) in_->report(lines);
  }

 private:
  IteratorContext pass_context() const {
    IteratorContext c = ctx_;
    c.iteration = mix64(ctx_.iteration ^ mix64(static_cast<std::uint64_t>(pass_) + 0x7e));
    return c;
  }
  const NodePtr node_;
  IteratorContext ctx_;
  std::int64_t count_;
  std::int64_t pass_ = 0;
  bool produced_in_pass_ = false;
  std::unique_ptr<IteratorBase> in_;
};

class RepeatNode : public DatasetNode {
 public:
  RepeatNode(NodePtr in, std::int64_t count) : in_(std::move(in)), count_(count) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<RepeatIterator>(in_, ctx, count_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t n = in_->cardinality();
    if (count_ < 0) return n == 0 ? 0 : kInfiniteCardinality;
    if (n < 0) return n;
    return n * count_;
  }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::int64_t count_;
};

// ---- take / skip / shard: counters over the upstream.
// take and skip count the elements left to take or skip (-1: all); shard counts positions.
class TakeIterator : public CounterIterator {
 public:
  TakeIterator(std::unique_ptr<IteratorBase> in, std::int64_t count) : CounterIterator(std::move(in), count, "take") {}
  std::optional<Element> next() override {
    if (count_ == 0) return std::nullopt;
    std::optional<Element> e = in_->next();
    if (e && count_ > 0) --count_;
    return e;
  }
};

class SkipIterator : public CounterIterator {
 public:
  SkipIterator(std::unique_ptr<IteratorBase> in, std::int64_t count) : CounterIterator(std::move(in), count, "skip") {}
  std::optional<Element> next() override {
    while (count_ != 0) {
      if (!in_->next()) return std::nullopt;
      if (count_ > 0) --count_;
    }
    return in_->next();
  }
};

class ShardIterator : public CounterIterator {
 public:
  ShardIterator(std::unique_ptr<IteratorBase> in, std::int64_t n, std::int64_t index)
      : CounterIterator(std::move(in), 0, "shard"), n_(n), index_(index) {}
  std::optional<Element> next() override {
    while (std::optional<Element> e = in_->next()) {
      const std::int64_t position = count_++;
      if (position % n_ == index_) return e;
    }
    return std::nullopt;
  }

 private:
  std::int64_t n_, index_;
};

template <typename It>
class CountNode : public DatasetNode {
 public:
  CountNode(NodePtr in, std::int64_t count, std::int64_t (*card)(std::int64_t, std::int64_t))
      : in_(std::move(in)), count_(count), card_(card) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<It>(in_->make(ctx), count_);
  }
  std::int64_t cardinality() const override { return card_(in_->cardinality(), count_); }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::int64_t count_;
  std::int64_t (*card_)(std::int64_t, std::int64_t);
};

class ShardNode : public DatasetNode {
 public:
  ShardNode(NodePtr in, std::int64_t n, std::int64_t index) : in_(std::move(in)), n_(n), index_(index) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<ShardIterator>(in_->make(ctx), n_, index_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t c = in_->cardinality();
    if (c < 0) return c;
    return c / n_ + (index_ < c % n_ ? 1 : 0);
  }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::int64_t n_, index_;
};

// ---- cache: the first iterator to run a complete pass fills a store shared by every
// iterator of this dataset; once complete, later passes read from it.
struct CacheStore {
  std::mutex mutex;
  std::vector<Element> elements;
  bool complete = false;
  bool filling = false;  // an iterator is filling it now
};

class CacheIterator : public IteratorBase {
 public:
  CacheIterator(NodePtr in, const IteratorContext& ctx, std::shared_ptr<CacheStore> store)
      : in_node_(std::move(in)), ctx_(ctx), store_(std::move(store)) {
    std::lock_guard lock(store_->mutex);
    if (store_->complete) {
      reading_ = true;
    } else {
      in_ = in_node_->make(ctx_);
      if (!store_->filling) {
        store_->filling = true;
        store_->elements.clear();
        filling_ = true;
      }
    }
  }
  ~CacheIterator() override {
    if (filling_) {
      std::lock_guard lock(store_->mutex);
      store_->filling = false;
    }
  }
  std::optional<Element> next() override {
    if (reading_) {
      std::lock_guard lock(store_->mutex);
      if (position_ >= static_cast<std::int64_t>(store_->elements.size())) return std::nullopt;
      return store_->elements[static_cast<std::size_t>(position_++)];
    }
    std::optional<Element> e = in_->next();
    std::lock_guard lock(store_->mutex);
    if (!e) {
      if (filling_) {
        store_->complete = true;
        store_->filling = false;
        filling_ = false;
      }
      return std::nullopt;
    }
    ++position_;
    if (filling_) store_->elements.push_back(*e);
    return e;
  }
  IteratorState save() const override {
    // Reading from a complete cache: the position is enough. Otherwise the upstream's
    // position, and the elements cached so far, so that a restored pass can finish filling.
    IteratorState s{{reading_ ? 1 : 0, position_, filling_ ? 1 : 0}, {}, {}};
    if (!reading_) {
      s.children.push_back(in_->save());
      if (filling_) {
        std::lock_guard lock(store_->mutex);
        s.values.push_back(static_cast<std::int64_t>(store_->elements.size()));
        save_elements(store_->elements, s);
      }
    }
    return s;
  }
  void restore(const IteratorState& s) override {
    if (s.values.size() < 3) check_state(s, 3, 0, "cache");
    position_ = s.values[1];
    if (s.values[0]) {
      // Saved while reading a complete cache. In a new process the cache is empty: this
      // iterator, the one filling it, reads a whole pass into it first.
      if (!reading_ && !filling_)
        DTRAIN_THROW(InvalidArgument, "cache: cannot restore while another iterator of this dataset is filling the cache");
      if (filling_) {
        std::vector<Element> all;
        while (std::optional<Element> e = in_->next()) all.push_back(std::move(*e));
        std::lock_guard lock(store_->mutex);
        store_->elements = std::move(all);
        store_->complete = true;
        store_->filling = false;
        filling_ = false;
      }
      reading_ = true;
      in_.reset();
      return;
    }
    check_state(s, 3, 1, "cache");
    if (!in_) in_ = in_node_->make(ctx_);
    in_->restore(s.children[0]);
    if (s.values[2] && filling_) {
      std::lock_guard lock(store_->mutex);
      store_->elements = load_elements(s, 4, static_cast<std::size_t>(s.values[3]), "cache");
    } else if (filling_) {
      // The saved pass was not filling; this one cannot fill from the middle.
      std::lock_guard lock(store_->mutex);
      store_->filling = false;
      filling_ = false;
    }
  }
  void report(std::vector<std::string>& lines) const override {
    if (in_) in_->report(lines);
  }

 private:
  const NodePtr in_node_;
  IteratorContext ctx_;
  std::shared_ptr<CacheStore> store_;
  std::unique_ptr<IteratorBase> in_;
  bool reading_ = false, filling_ = false;
  std::int64_t position_ = 0;
};

class CacheNode : public DatasetNode {
 public:
  explicit CacheNode(NodePtr in) : in_(std::move(in)) {}
  // Caching rows of tensors already in memory would only copy views: read them directly.
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    if (in_->row_source()) return in_->make(ctx);
    return std::make_unique<CacheIterator>(in_, ctx, store_for(ctx.file_shard));
  }
  std::int64_t cardinality() const override { return in_->cardinality(); }
  const std::vector<Tensor>* row_source() const override { return in_->row_source(); }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  // The elements below depend on the file shard a worker reads: one store for each.
  std::shared_ptr<CacheStore> store_for(const IteratorContext::FileShard& shard) const {
    std::lock_guard lock(mutex_);
    std::shared_ptr<CacheStore>& store = stores_[{shard.count, shard.index}];
    if (!store) store = std::make_shared<CacheStore>();
    return store;
  }

  NodePtr in_;
  mutable std::mutex mutex_;
  mutable std::map<std::pair<int, int>, std::shared_ptr<CacheStore>> stores_;
};

std::int64_t take_cardinality(std::int64_t n, std::int64_t count) {
  if (count < 0) return n;
  if (n == kInfiniteCardinality) return count;
  if (n < 0) return n;
  return std::min(n, count);
}

std::int64_t skip_cardinality(std::int64_t n, std::int64_t count) {
  if (n < 0) return n;
  if (count < 0) return 0;
  return std::max<std::int64_t>(0, n - count);
}

}  // namespace

NodePtr map_node(NodePtr in, MapFn fn) { return std::make_shared<MapNode>(std::move(in), std::move(fn)); }
NodePtr interleave_node(NodePtr in, std::function<Dataset(const Element&)> fn, std::int64_t cycle_length,
                        std::int64_t block_length, std::int64_t num_parallel_calls) {
  return std::make_shared<InterleaveNode>(std::move(in), std::move(fn), cycle_length, block_length, num_parallel_calls);
}
NodePtr filter_node(NodePtr in, std::function<bool(const Element&)> p) {
  return std::make_shared<FilterNode>(std::move(in), std::move(p));
}
NodePtr shuffle_node(NodePtr in, std::int64_t buffer, std::uint64_t seed, bool reshuffle) {
  return std::make_shared<ShuffleNode>(std::move(in), buffer, seed, reshuffle);
}
NodePtr batch_node(NodePtr in, std::int64_t size, bool drop) { return std::make_shared<BatchNode>(std::move(in), size, drop); }
NodePtr unbatch_node(NodePtr in) { return std::make_shared<UnbatchNode>(std::move(in)); }
NodePtr repeat_node(NodePtr in, std::int64_t count) { return std::make_shared<RepeatNode>(std::move(in), count); }
NodePtr take_node(NodePtr in, std::int64_t count) {
  return std::make_shared<CountNode<TakeIterator>>(std::move(in), count, take_cardinality);
}
NodePtr skip_node(NodePtr in, std::int64_t count) {
  return std::make_shared<CountNode<SkipIterator>>(std::move(in), count, skip_cardinality);
}
NodePtr shard_node(NodePtr in, std::int64_t n, std::int64_t index) { return std::make_shared<ShardNode>(std::move(in), n, index); }
NodePtr cache_node(NodePtr in) { return std::make_shared<CacheNode>(std::move(in)); }

}  // namespace dtrain::data::detail
