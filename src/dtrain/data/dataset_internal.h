// Pieces shared by the dataset implementation files (private to the data layer).
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "dtrain/core/clock.h"
#include "dtrain/data/dataset.h"

namespace dtrain::data::detail {

// Thrown by a background stage whose iterator is being destroyed, so that no stage above it
// can mistake the shutdown for the end of the data (a cache would otherwise keep a prefix
// of a pass as if it were complete). It never reaches a user: the stages that see it are
// being destroyed too.
class Cancelled : public Error {
 public:
  Cancelled() : Error("the input pipeline was stopped") {}
};

// Rethrows `error` with `context` in front of its message, keeping dtrain's error kind.
[[noreturn]] void rethrow_with_context(std::exception_ptr error, const std::string& context);

// Stacks elements (each a tuple of same-shaped tensors) along a new first axis.
Element stack(const std::vector<Element>& elements, const char* op);

// Row r of every tensor, as views; row_shapes[i] is tensor i's shape without its first axis.
struct Rows {
  std::vector<Tensor> tensors;
  std::vector<Shape> row_shapes;
  explicit Rows(std::vector<Tensor> t);
  std::int64_t count() const { return tensors.empty() ? 0 : tensors[0].dim(0); }
  Element at(std::int64_t r) const;
};

// Buffered elements in a saved state: each element's arity appended to the values, its
// tensors to the tensors. `get` picks the element out of a container's item.
template <typename Items, typename Get = std::identity>
void save_elements(const Items& items, IteratorState& s, Get get = {}) {
  for (const auto& item : items) {
    const Element& e = get(item);
    s.values.push_back(static_cast<std::int64_t>(e.size()));
    // Kept on the host: a state is written to files (a prefetch_to_device's elements are on a GPU).
    for (const Tensor& t : e) s.tensors.push_back(t.defined() ? t.to(Device::cpu()) : t);
  }
}
// `count` elements whose arities start at values[first_value]; an error names the stage.
std::vector<Element> load_elements(const IteratorState& s, std::size_t first_value, std::size_t count, const char* stage);

// The byte layout shared by saved iterator states and encoded elements: little-endian
// u64s, and tensors as [u64 dtype][u64 rank][u64 dims...][raw bytes].
void put_u64(std::string& out, std::uint64_t v);
void put_tensor(std::string& out, const Tensor& t);
// Reads that layout; running short or a corrupt header is an IoError starting with `what`.
struct ByteReader {
  std::string_view in;
  const char* what;
  std::size_t pos = 0;
  std::uint64_t u64();
  Tensor tensor();
};

// Checks a saved state has the expected number of values and children.
void check_state(const IteratorState& s, std::size_t values, std::size_t children, const char* stage);

// The number of threads a pipeline may use for background work.
int thread_budget(const DatasetOptions& options);

// Exponential moving average used by AUTOTUNE's rate estimates.
struct Ema {
  double value = 0.0;
  bool primed = false;
  void add(double x, double weight = 0.2) {
    value = primed ? (1 - weight) * value + weight * x : x;
    primed = true;
  }
};

using NodePtr = std::shared_ptr<const DatasetNode>;
using MapFn = std::function<Element(const Element&)>;

// Node factories, one per source or transformation (defined in dataset_sources.cpp,
// dataset_transforms.cpp and dataset_async.cpp).
NodePtr tensor_slices_node(std::vector<Tensor> tensors);
NodePtr generator_node(std::function<std::optional<Element>(std::int64_t)> fn);
NodePtr range_node(std::int64_t start, std::int64_t stop, std::int64_t step);
NodePtr csv_node(std::vector<std::string> files, CsvOptions options);
NodePtr records_node(std::vector<std::string> files);
NodePtr tfrecord_node(std::vector<std::string> files, Compression compression);
NodePtr text_lines_node(std::vector<std::string> files, bool gzip);
NodePtr file_names_node(std::vector<std::string> files);
NodePtr interleave_node(NodePtr in, std::function<Dataset(const Element&)> fn, std::int64_t cycle_length,
                        std::int64_t block_length, std::int64_t num_parallel_calls);
NodePtr map_node(NodePtr in, MapFn fn);
NodePtr parallel_map_node(NodePtr in, MapFn fn, std::int64_t parallelism, bool deterministic);
NodePtr filter_node(NodePtr in, std::function<bool(const Element&)> predicate);
NodePtr shuffle_node(NodePtr in, std::int64_t buffer, std::uint64_t seed, bool reshuffle);
NodePtr batch_node(NodePtr in, std::int64_t size, bool drop_remainder);
NodePtr unbatch_node(NodePtr in);
NodePtr repeat_node(NodePtr in, std::int64_t count);
NodePtr take_node(NodePtr in, std::int64_t count);
NodePtr skip_node(NodePtr in, std::int64_t count);
NodePtr shard_node(NodePtr in, std::int64_t num_shards, std::int64_t index);
NodePtr cache_node(NodePtr in);
// may_go_inline false: an AUTOTUNE buffer keeps its thread even where the consumer's
// compute threads take every core (prefetch_to_device: the copy must overlap the step).
NodePtr prefetch_node(NodePtr in, std::int64_t buffer, bool may_go_inline = true);

}  // namespace dtrain::data::detail
