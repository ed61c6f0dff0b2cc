// Dataset's public methods, the Iterator wrapper, state serialization and shared helpers.
#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/core/device_staging.h"
#include "dtrain/core/rng.h"
#include "dtrain/core/threads.h"
#include "dtrain/data/dataset_internal.h"
#include "dtrain/data/idx.h"

namespace dtrain::data {
namespace detail {

void rethrow_with_context(std::exception_ptr error, const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const Cancelled&) {
    throw;  // a stopped pipeline is not an input error
  } catch (...) {
    dtrain::rethrow_with_context(std::current_exception(), context);
  }
}

namespace {

// Copies `count` rows of `bytes` each to consecutive places in dst; row i comes from
// source(i). The rows of a shuffled batch lie at random places in memory, each too short
// for the hardware prefetcher to ramp up, so the next rows' lines are requested while
// this one is copied.
template <typename Source>
void copy_rows(char* dst, std::size_t bytes, std::size_t count, Source source) {
  if (bytes == 0) return;
  constexpr std::size_t kAhead = 4;
  auto prefetch = [&](std::size_t i) {
    if (i >= count) return;
    const char* p = source(i);
    for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
  };
  for (std::size_t i = 0; i < kAhead; ++i) prefetch(i);
  for (std::size_t i = 0; i < count; ++i) {
    prefetch(i + kAhead);
    std::memcpy(dst + i * bytes, source(i), bytes);
  }
}

// copy_rows for strings: `count` rows of `width` strings each into `dst`.
template <typename Source>
void copy_string_rows(Tensor& dst, std::size_t width, std::size_t count, Source source) {
  std::string* to = dst.data<std::string>();
  for (std::size_t i = 0; i < count; ++i) std::copy_n(source(i), width, to + i * width);
}

// A tensor of `count` rows of shape row_dims.
Tensor stacked(std::span<const std::int64_t> row_dims, DType dtype, std::size_t count) {
  std::vector<std::int64_t> dims{static_cast<std::int64_t>(count)};
  dims.insert(dims.end(), row_dims.begin(), row_dims.end());
  return Tensor::empty(Shape(dims), dtype);
}

}  // namespace

Element stack(const std::vector<Element>& elements, const char* op) {
  DTRAIN_CHECK(!elements.empty());
  const Element& first = elements.front();
  for (std::size_t i = 0; i < elements.size(); ++i) {
    const Element& e = elements[i];
    if (e.size() != first.size())
      DTRAIN_THROW(InvalidArgument, op, ": element ", i, " has ", e.size(), " components, the first has ", first.size());
    for (std::size_t c = 0; c < first.size(); ++c)
      if (!(e[c].shape() == first[c].shape()) || e[c].dtype() != first[c].dtype())
        DTRAIN_THROW(InvalidArgument, op, ": component ", c, " of element ", i, " is ", dtype_name(e[c].dtype()), " ",
                     e[c].shape().to_string(), " but element 0's is ", dtype_name(first[c].dtype()), " ",
                     first[c].shape().to_string(), " (use padded batching or map to a common shape)");
  }
  Element out;
  for (std::size_t c = 0; c < first.size(); ++c) {
    Tensor t = stacked(first[c].shape().dims(), first[c].dtype(), elements.size());
    if (t.dtype() == DType::string) {
      copy_string_rows(t, static_cast<std::size_t>(first[c].numel()), elements.size(),
                       [&](std::size_t i) { return elements[i][c].data<std::string>(); });
      out.push_back(std::move(t));
      continue;
    }
    copy_rows(static_cast<char*>(t.raw_data()), first[c].nbytes(), elements.size(),
              [&](std::size_t i) { return static_cast<const char*>(elements[i][c].raw_data()); });
    out.push_back(std::move(t));
  }
  return out;
}


Rows::Rows(std::vector<Tensor> t) : tensors(std::move(t)) {
  for (const Tensor& x : tensors) row_shapes.emplace_back(x.shape().dims().subspan(1));
}

Element Rows::at(std::int64_t r) const {
  Element e;
  e.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) e.push_back(tensors[i].row(r, row_shapes[i]));
  return e;
}

std::vector<Element> load_elements(const IteratorState& s, std::size_t first_value, std::size_t count, const char* stage) {
  std::vector<Element> out;
  std::size_t t = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (first_value + i >= s.values.size()) DTRAIN_THROW(InvalidArgument, stage, ": saved state is incomplete");
    const auto arity = static_cast<std::size_t>(s.values[first_value + i]);
    if (t + arity > s.tensors.size()) DTRAIN_THROW(InvalidArgument, stage, ": saved state is incomplete");
    out.emplace_back(s.tensors.begin() + static_cast<std::ptrdiff_t>(t), s.tensors.begin() + static_cast<std::ptrdiff_t>(t + arity));
    t += arity;
  }
  return out;
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void put_tensor(std::string& out, const Tensor& t) {
  put_u64(out, static_cast<std::uint64_t>(t.dtype()));
  put_u64(out, static_cast<std::uint64_t>(t.rank()));
  for (auto d : t.shape().dims()) put_u64(out, static_cast<std::uint64_t>(d));
  if (t.dtype() == DType::string) {  // each string's length, then its bytes
    const std::string* v = t.data<std::string>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      put_u64(out, v[i].size());
      out.append(v[i]);
    }
    return;
  }
  out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
}

std::uint64_t ByteReader::u64() {
  if (pos + 8 > in.size()) DTRAIN_THROW(IoError, what, ": truncated at byte ", pos, " of ", in.size());
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  pos += 8;
  return v;
}

Tensor ByteReader::tensor() {
  const std::size_t at = pos;
  const std::uint64_t dtype = u64(), rank = u64();
  if (dtype > static_cast<std::uint64_t>(kLastDType) || rank > static_cast<std::uint64_t>(Shape::kMaxRank))
    DTRAIN_THROW(IoError, what, ": corrupt tensor header at byte ", at);
  // The extents come from the bytes: their product (of the non-zero ones too, which a
  // Shape must hold) is checked for overflow and against the bytes left before the tensor
  // is allocated.
  std::vector<std::int64_t> dims;
  // A string is at least its 8-byte length.
  const bool strings = static_cast<DType>(dtype) == DType::string;
  std::uint64_t bytes = strings ? 8 : dtype_size(static_cast<DType>(dtype)), nonzero = 1;
  for (std::uint64_t d = 0; d < rank; ++d) {
    const std::uint64_t extent = u64();
    if (extent > static_cast<std::uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, extent, &bytes) ||
        __builtin_mul_overflow(nonzero, std::max<std::uint64_t>(extent, 1), &nonzero) || nonzero > INT64_MAX)
      DTRAIN_THROW(IoError, what, ": the tensor at byte ", at, " claims extents that overflow a 64-bit size");
    dims.push_back(static_cast<std::int64_t>(extent));
  }
  if (bytes > in.size() - pos) {
    std::string shape;
    for (std::int64_t e : dims) shape += (shape.empty() ? "" : ", ") + std::to_string(e);
    DTRAIN_THROW(IoError, what, ": the tensor at byte ", at, " claims [", shape, "] = ", bytes, " bytes, but only ",
                 in.size() - pos, " of the ", in.size(), " remain");
  }
  Tensor t = Tensor::empty(Shape(dims), static_cast<DType>(dtype));
  if (strings) {
    std::string* v = t.data<std::string>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const std::uint64_t length = u64();
      if (length > in.size() - pos)
        DTRAIN_THROW(IoError, what, ": string ", i, " of the tensor at byte ", at, " claims ", length,
                     " bytes, but only ", in.size() - pos, " remain");
      v[i].assign(in.data() + pos, length);
      pos += length;
    }
    return t;
  }
  if (t.nbytes()) std::memcpy(t.raw_data(), in.data() + pos, t.nbytes());
  pos += t.nbytes();
  return t;
}

void check_state(const IteratorState& s, std::size_t values, std::size_t children, const char* stage) {
  if (s.values.size() < values || s.children.size() != children)
    DTRAIN_THROW(InvalidArgument, stage, ": the saved iterator state does not belong to this pipeline (",
                 s.values.size(), " values and ", s.children.size(), " children, expected ", values, " and ", children, ")");
}

int thread_budget(const DatasetOptions& options) {
  return options.max_threads > 0 ? options.max_threads : available_cores();
}

}  // namespace detail

Element gather_rows(const std::vector<Tensor>& sources, std::span<const std::int64_t> rows, bool on_compute_pool) {
  Element out;
  for (std::size_t c = 0; c < sources.size(); ++c) {
    const Tensor& src = sources[c];
    src.check_defined("gather_rows");
    if (src.rank() == 0) DTRAIN_THROW(InvalidArgument, "gather_rows: tensor ", c, " is a scalar; it has no rows");
    for (std::int64_t r : rows)
      if (r < 0 || r >= src.dim(0))
        DTRAIN_THROW(InvalidArgument, "gather_rows: row ", r, " is out of range for tensor ", c, " of shape ",
                     src.shape().to_string());
    Tensor t = detail::stacked(src.shape().dims().subspan(1), src.dtype(), rows.size());
    if (src.dtype() == DType::string) {
      const auto width = static_cast<std::size_t>(t.numel()) / std::max<std::size_t>(rows.size(), 1);
      detail::copy_string_rows(t, width, rows.size(), [&](std::size_t i) {
        return src.data<std::string>() + static_cast<std::size_t>(rows[i]) * width;
      });
      out.push_back(std::move(t));
      continue;
    }
    const std::size_t bytes = src.dim(0) ? src.nbytes() / static_cast<std::size_t>(src.dim(0)) : 0;
    const char* base = static_cast<const char*>(src.raw_data());
    char* dst = static_cast<char*>(t.raw_data());
    auto copy = [&](std::int64_t begin, std::int64_t end) {
      detail::copy_rows(dst + static_cast<std::size_t>(begin) * bytes, bytes, static_cast<std::size_t>(end - begin),
                        [&](std::size_t i) { return base + static_cast<std::size_t>(rows[static_cast<std::size_t>(begin) + i]) * bytes; });
    };
    const auto n = static_cast<std::int64_t>(rows.size());
    // Parallel when each thread gets at least 16 KiB to copy: the rows lie at random places,
    // so the copy waits on memory more than it uses bandwidth, and two threads wait at once.
    if (on_compute_pool && bytes) parallel_for(n, std::max<std::int64_t>(1, 16384 / static_cast<std::int64_t>(bytes)), copy);
    else copy(0, n);
    out.push_back(std::move(t));
  }
  return out;
}

// ---- IteratorState serialization: a little-endian tree of counts, integers and tensors.
namespace {

using detail::ByteReader;
using detail::put_tensor;
using detail::put_u64;

constexpr std::uint32_t kStateMagic = 0x44544953;  // "DTIS"

void write_state(std::string& out, const IteratorState& s) {
  put_u64(out, s.values.size());
  for (auto v : s.values) put_u64(out, static_cast<std::uint64_t>(v));
  put_u64(out, s.tensors.size());
  for (const Tensor& t : s.tensors) put_tensor(out, t);
  put_u64(out, s.children.size());
  for (const auto& c : s.children) write_state(out, c);
}

IteratorState read_state(ByteReader& r, int depth) {
  if (depth > 64) DTRAIN_THROW(IoError, "iterator state: nested too deeply");
  IteratorState s;
  const std::uint64_t nv = r.u64();
  if (nv > r.in.size()) DTRAIN_THROW(IoError, "iterator state: corrupt value count ", nv);
  for (std::uint64_t i = 0; i < nv; ++i) s.values.push_back(static_cast<std::int64_t>(r.u64()));
  const std::uint64_t nt = r.u64();
  if (nt > r.in.size()) DTRAIN_THROW(IoError, "iterator state: corrupt tensor count ", nt);
  for (std::uint64_t i = 0; i < nt; ++i) s.tensors.push_back(r.tensor());
  const std::uint64_t nc = r.u64();
  if (nc > r.in.size()) DTRAIN_THROW(IoError, "iterator state: corrupt child count ", nc);
  for (std::uint64_t i = 0; i < nc; ++i) s.children.push_back(read_state(r, depth + 1));
  return s;
}

}  // namespace

std::string IteratorState::to_bytes() const {
  std::string out;
  put_u64(out, kStateMagic);
  write_state(out, *this);
  return out;
}

IteratorState IteratorState::from_bytes(std::string_view bytes) {
  ByteReader r{bytes, "iterator state"};
  if (bytes.size() < 8 || r.u64() != kStateMagic) DTRAIN_THROW(IoError, "iterator state: not a dtrain iterator state");
  IteratorState s = read_state(r, 0);
  if (r.pos != bytes.size()) DTRAIN_THROW(IoError, "iterator state: ", bytes.size() - r.pos, " trailing bytes");
  return s;
}

// ---- Dataset

Dataset Dataset::from_tensor_slices(std::vector<Tensor> tensors) {
  return Dataset(detail::tensor_slices_node(std::move(tensors)));
}
Dataset Dataset::from_generator(std::function<std::optional<Element>(std::int64_t)> fn) {
  return Dataset(detail::generator_node(std::move(fn)));
}
Dataset Dataset::range(std::int64_t start, std::int64_t stop, std::int64_t step) {
  return Dataset(detail::range_node(start, stop, step));
}
Dataset Dataset::from_idx(const std::string& images_path, const std::string& labels_path) {
  Tensor x = read_idx_images(images_path), y = read_idx_labels(labels_path);
  if (x.dim(0) != y.dim(0))
    DTRAIN_THROW(IoError, images_path, " holds ", x.dim(0), " images but ", labels_path, " holds ", y.dim(0), " labels");
  return from_tensor_slices({x, y});
}
Dataset Dataset::csv(std::vector<std::string> files, CsvOptions options) {
  return Dataset(detail::csv_node(std::move(files), std::move(options)));
}
Dataset Dataset::records(std::vector<std::string> files) { return Dataset(detail::records_node(std::move(files))); }
Dataset Dataset::tfrecord(std::vector<std::string> files, Compression compression, std::int64_t num_parallel_reads) {
  if (num_parallel_reads < AUTOTUNE)
    DTRAIN_THROW(InvalidArgument, "TFRecordDataset: num_parallel_reads must be AUTOTUNE (-1) or >= 0, got ", num_parallel_reads);
  if ((num_parallel_reads >= 0 && num_parallel_reads <= 1) || files.size() <= 1)
    return Dataset(detail::tfrecord_node(std::move(files), compression));
  // interleave reads AUTOTUNE as the machine's cores, for both.
  return file_names(std::move(files))
      .interleave([compression](const Element& e) { return tfrecord({*e[0].data<std::string>()}, compression); },
                  num_parallel_reads, 1, num_parallel_reads);
}

Dataset Dataset::file_names(std::vector<std::string> files) { return Dataset(detail::file_names_node(std::move(files))); }

std::vector<std::string> Dataset::glob(const std::vector<std::string>& patterns) {
  std::set<std::string> found;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    const std::size_t matches = rc == 0 ? g.gl_pathc : 0;
    for (std::size_t i = 0; i < matches; ++i) found.insert(g.gl_pathv[i]);
    globfree(&g);
    if (rc == GLOB_NOSPACE || rc == GLOB_ABORTED)
      DTRAIN_THROW(IoError, "list_files: the pattern '", pattern, "' could not be read (", rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read", ")");
    if (matches == 0) DTRAIN_THROW(InvalidArgument, "list_files: no files match the pattern '", pattern, "'");
  }
  return {found.begin(), found.end()};
}

Compression compression_named(std::string_view name, std::string_view what) {
  if (name.empty() || name == "NONE") return Compression::none;
  if (name == "ZLIB") return Compression::zlib;
  if (name == "GZIP") return Compression::gzip;
  DTRAIN_THROW(InvalidArgument, what, ": compression_type '", name, "' is not one TensorFlow names ('', 'ZLIB' or 'GZIP')");
}

std::string_view compression_name(Compression c) {
  switch (c) {
    case Compression::none: return "";
    case Compression::zlib: return "ZLIB";
    case Compression::gzip: return "GZIP";
  }
  return "?";
}

Dataset Dataset::text_lines(std::vector<std::string> files, const std::string& compression) {
  if (compression != "" && compression != "GZIP")
    DTRAIN_THROW(InvalidArgument, "TextLineDataset: compression_type '", compression, "' is not one dtrain reads ('' or 'GZIP')");
  return Dataset(detail::text_lines_node(std::move(files), compression == "GZIP"));
}

Dataset Dataset::map(std::function<Element(const Element&)> fn, std::int64_t num_parallel_calls,
                     bool deterministic) const {
  if (!fn) DTRAIN_THROW(InvalidArgument, "map: the function is empty");
  if (num_parallel_calls < AUTOTUNE || num_parallel_calls > 1024)
    DTRAIN_THROW(InvalidArgument, "map: num_parallel_calls must be AUTOTUNE (-1) or in [0, 1024], got ", num_parallel_calls);
  if (num_parallel_calls == 0 || num_parallel_calls == 1)
    return Dataset(detail::map_node(node_, std::move(fn)), options_);
  return Dataset(detail::parallel_map_node(node_, std::move(fn), num_parallel_calls, deterministic), options_);
}
Dataset Dataset::filter(std::function<bool(const Element&)> predicate) const {
  if (!predicate) DTRAIN_THROW(InvalidArgument, "filter: the predicate is empty");
  return Dataset(detail::filter_node(node_, std::move(predicate)), options_);
}
Dataset Dataset::interleave(std::function<Dataset(const Element&)> fn, std::int64_t cycle_length,
                            std::int64_t block_length, std::int64_t num_parallel_calls) const {
  if (!fn) DTRAIN_THROW(InvalidArgument, "interleave: the function is empty");
  if (cycle_length == AUTOTUNE) cycle_length = std::max(1u, std::thread::hardware_concurrency());
  if (cycle_length <= 0) DTRAIN_THROW(InvalidArgument, "interleave: cycle_length must be AUTOTUNE (-1) or positive, got ", cycle_length);
  if (block_length <= 0) DTRAIN_THROW(InvalidArgument, "interleave: block_length must be positive, got ", block_length);
  if (num_parallel_calls < AUTOTUNE || num_parallel_calls > 1024)
    DTRAIN_THROW(InvalidArgument, "interleave: num_parallel_calls must be AUTOTUNE (-1) or in [0, 1024], got ",
                 num_parallel_calls);
  if (num_parallel_calls == AUTOTUNE) num_parallel_calls = cycle_length;
  return Dataset(detail::interleave_node(node_, std::move(fn), cycle_length, block_length, num_parallel_calls), options_);
}
Dataset Dataset::shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed, bool reshuffle) const {
  if (buffer_size <= 0) DTRAIN_THROW(InvalidArgument, "shuffle: buffer_size must be positive, got ", buffer_size);
  return Dataset(detail::shuffle_node(node_, buffer_size, seed ? *seed : next_seed(), reshuffle), options_);
}
Dataset Dataset::batch(std::int64_t batch_size, bool drop_remainder) const {
  if (batch_size <= 0) DTRAIN_THROW(InvalidArgument, "batch: batch_size must be positive, got ", batch_size);
  return Dataset(detail::batch_node(node_, batch_size, drop_remainder), options_);
}
Dataset Dataset::unbatch() const { return Dataset(detail::unbatch_node(node_), options_); }
Dataset Dataset::repeat(std::int64_t count) const {
  if (count < -1) DTRAIN_THROW(InvalidArgument, "repeat: count must be -1 (forever) or >= 0, got ", count);
  return Dataset(detail::repeat_node(node_, count), options_);
}
Dataset Dataset::take(std::int64_t count) const {
  if (count < -1) DTRAIN_THROW(InvalidArgument, "take: count must be -1 (all) or >= 0, got ", count);
  return Dataset(detail::take_node(node_, count), options_);
}
Dataset Dataset::skip(std::int64_t count) const {
  if (count < -1) DTRAIN_THROW(InvalidArgument, "skip: count must be -1 (all) or >= 0, got ", count);
  return Dataset(detail::skip_node(node_, count), options_);
}
Dataset Dataset::shard(std::int64_t num_shards, std::int64_t index) const {
  if (num_shards <= 0) DTRAIN_THROW(InvalidArgument, "shard: num_shards must be positive, got ", num_shards);
  if (index < 0 || index >= num_shards)
    DTRAIN_THROW(InvalidArgument, "shard: index ", index, " is out of range for ", num_shards, " shards");
  return Dataset(detail::shard_node(node_, num_shards, index), options_);
}
Dataset Dataset::cache() const { return Dataset(detail::cache_node(node_), options_); }
Dataset Dataset::prefetch(std::int64_t buffer_size) const {
  if (buffer_size < AUTOTUNE || buffer_size == 0)
    DTRAIN_THROW(InvalidArgument, "prefetch: buffer_size must be AUTOTUNE (-1) or positive, got ", buffer_size);
  return Dataset(detail::prefetch_node(node_, buffer_size), options_);
}
Dataset Dataset::prefetch_to_device(Device device, std::int64_t buffer_size) const {
  if (buffer_size < AUTOTUNE || buffer_size == 0)
    DTRAIN_THROW(InvalidArgument, "prefetch_to_device: buffer_size must be AUTOTUNE (-1) or positive, got ", buffer_size);
  auto staging = std::make_shared<DeviceStaging>(device);
  detail::MapFn copy = [staging](const Element& e) {
    Element out;
    out.reserve(e.size());
    for (const Tensor& t : e) out.push_back(staging->stage(t));
    return out;
  };
  // Its thread stays: run inline, the copy and its wait would be the training thread's.
  return Dataset(detail::prefetch_node(detail::map_node(node_, std::move(copy)), buffer_size, /*may_go_inline=*/false),
                 options_);
}

Dataset Dataset::with_options(DatasetOptions options) const {
  if (options.max_threads < 0) DTRAIN_THROW(InvalidArgument, "options: max_threads must be >= 0, got ", options.max_threads);
  if (options.autotune_max_buffer < 1)
    DTRAIN_THROW(InvalidArgument, "options: autotune_max_buffer must be >= 1, got ", options.autotune_max_buffer);
  if (!(options.timeout_seconds >= 0.0))
    DTRAIN_THROW(InvalidArgument, "options: timeout_seconds must be >= 0, got ", options.timeout_seconds);
  if (!(options.element_timeout_seconds >= 0.0))
    DTRAIN_THROW(InvalidArgument, "options: element_timeout_seconds must be >= 0, got ", options.element_timeout_seconds);
  return Dataset(node_, options);
}

std::int64_t Dataset::cardinality() const { return node_->cardinality(); }

namespace {

// What auto-sharding by file needs to know of a pipeline: the files its source reads, and
// the size of the batch() nearest the consumer above that source (0: none).
struct FileSource {
  std::int64_t files = 0;
  std::int64_t batch = 0;
};

FileSource file_source(const DatasetNode& root) {
  FileSource found;
  for (const DatasetNode* n = &root; n; n = n->input()) {
    if (found.batch == 0) found.batch = n->batch_size();
    if (n->files() > 0) {
      found.files = n->files();
      break;
    }
  }
  return found;
}

// Runs the pipeline below as one worker's shard; its saved positions name the shard, so
// that one cannot be restored into another worker's pipeline.
class ShardByFileIterator : public IteratorBase {
 public:
  ShardByFileIterator(std::unique_ptr<IteratorBase> in, int count, int index)
      : in_(std::move(in)), count_(count), index_(index) {}
  std::optional<Element> next() override { return in_->next(); }
  IteratorState save() const override { return {{count_, index_}, {}, {in_->save()}}; }
  void restore(const IteratorState& s) override {
    detail::check_state(s, 2, 1, "shard_by_file");
    if (s.values[0] != count_ || s.values[1] != index_)
      DTRAIN_THROW(InvalidArgument, "shard_by_file: the saved position belongs to worker ", s.values[1], " of ",
                   s.values[0], ", not to worker ", index_, " of ", count_);
    in_->restore(s.children[0]);
  }
  void report(std::vector<std::string>& lines) const override { in_->report(lines); }

 private:
  std::unique_ptr<IteratorBase> in_;
  int count_, index_;
};

// The pipeline below it, run as worker `index` of `count` under FILE sharding.
class ShardByFileNode : public DatasetNode {
 public:
  ShardByFileNode(detail::NodePtr in, int count, int index) : in_(std::move(in)), count_(count), index_(index) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    IteratorContext below = ctx;
    below.file_shard = {count_, index_, /*rebatch=*/true};
    return std::make_unique<ShardByFileIterator>(in_->make(below), count_, index_);
  }
  // A count known below would be the whole pipeline's, not this worker's share of it
  // (file sources do not know their length; a take() below the batch would count whole
  // batches): only an endless pipeline stays so.
  std::int64_t cardinality() const override {
    return in_->cardinality() == kInfiniteCardinality ? kInfiniteCardinality : kUnknownCardinality;
  }
  const DatasetNode* input() const override { return in_.get(); }

 private:
  detail::NodePtr in_;
  int count_, index_;
};

}  // namespace

std::int64_t Dataset::input_files() const { return file_source(*node_).files; }

Dataset Dataset::shard_by_file(int num_workers, int index) const {
  if (num_workers <= 0 || index < 0 || index >= num_workers)
    DTRAIN_THROW(InvalidArgument, "shard_by_file: worker index ", index, " is out of range for ", num_workers, " workers");
  const FileSource source = file_source(*node_);
  if (source.files < num_workers)
    DTRAIN_THROW(InvalidArgument, "auto-shard FILE: the pipeline reads ", source.files, " file(s) but there are ",
                 num_workers, " workers; each worker needs a file of its own (write the data as at least ", num_workers,
                 " files, or shard by DATA)");
  if (source.batch == 0)
    DTRAIN_THROW(InvalidArgument, "auto-shard FILE: the pipeline has no batch() above its file source, so there is no "
                 "global batch to share out among the ", num_workers, " workers");
  if (source.batch < num_workers)
    DTRAIN_THROW(InvalidArgument, "auto-shard FILE: a global batch of ", source.batch,
                 " rows cannot be shared out among ", num_workers,
                 " workers; make the batch at least as large as the number of workers");
  return Dataset(std::make_shared<ShardByFileNode>(node_, num_workers, index), options_);
}

WorkerShard auto_shard(const Dataset& dataset, int num_workers, int index) {
  if (num_workers <= 1) return {AutoShardPolicy::DATA, dataset, false, ""};  // nothing to share
  AutoShardPolicy policy = dataset.options().auto_shard_policy;
  const FileSource source = file_source(*dataset.node());
  if (policy == AutoShardPolicy::AUTO)
    policy = source.files >= num_workers && source.batch >= num_workers ? AutoShardPolicy::FILE : AutoShardPolicy::DATA;
  std::ostringstream plan;
  switch (policy) {
    case AutoShardPolicy::FILE: {
      Dataset mine = dataset.shard_by_file(num_workers, index);
      plan << "auto-shard FILE: this worker reads input files";
      const std::int64_t mine_count = (source.files - index + num_workers - 1) / num_workers;
      for (std::int64_t i = 0; i < std::min<std::int64_t>(mine_count, 6); ++i)
        plan << (i ? ", " : " ") << index + i * num_workers;
      plan << (mine_count > 6 ? ", ..." : "") << " (" << mine_count << " of " << source.files
           << ") and makes its part of each global batch; an epoch ends when every worker's data has";
      return {policy, std::move(mine), true, plan.str()};
    }
    case AutoShardPolicy::OFF:
      return {policy, dataset, true,
              "auto-shard OFF: each worker trains on its own dataset; an epoch ends when every worker's data has"};
    default:
      return {policy, dataset, false,
              "auto-shard DATA: every worker reads the whole input and keeps its replicas' rows of each global batch"};
  }
}

Iterator Dataset::make_iterator(std::uint64_t iteration) const {
  IteratorContext ctx;
  ctx.iteration = iteration;
  ctx.options = options_;
  ctx.idle_core = num_threads() < available_cores();
  return Iterator(node_, ctx);
}

// ---- Iterator

Iterator::Iterator(std::shared_ptr<const DatasetNode> node, IteratorContext ctx)
    : node_(std::move(node)), stop_(std::make_unique<std::stop_source>()), ctx_(std::move(ctx)) {
  ctx_.stop = stop_->get_token();
  root_ = node_->make(ctx_);
}

Iterator::Iterator(Iterator&&) noexcept = default;

Iterator& Iterator::operator=(Iterator&& other) noexcept {
  if (this != &other) {
    stop();
    node_ = std::move(other.node_);
    stop_ = std::move(other.stop_);
    ctx_ = std::move(other.ctx_);
    root_ = std::move(other.root_);
    stats_ = other.stats_;
  }
  return *this;
}

Iterator::~Iterator() { stop(); }

void Iterator::stop() {
  if (stop_) stop_->request_stop();
  root_.reset();  // joins background threads, which see the stop request
}

std::optional<Element> Iterator::next() {
  if (!root_) DTRAIN_THROW(InvalidArgument, "Iterator::next: the iterator was moved from");
  const auto start = Clock::now();
  std::optional<Element> e = root_->next();
  const double waited = seconds_since(start);
  if (e) {
    ++stats_.elements;
    stats_.wait_seconds += waited;
    stats_.last_wait_seconds = waited;
    stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, waited);
  }
  return e;
}

IteratorState Iterator::save() const {
  if (!root_) DTRAIN_THROW(InvalidArgument, "Iterator::save: the iterator was moved from");
  return root_->save();
}

void Iterator::restore(const IteratorState& state) {
  if (!node_) DTRAIN_THROW(InvalidArgument, "Iterator::restore: the iterator was moved from");
  // A fresh pipeline (the old one first releases what it holds, such as a cache it was
  // filling), moved to the saved position before any element is produced. If the state
  // does not fit, the iterator is left at the start of a clean pipeline.
  stats_ = InputStats{};
  restart();
  try {
    root_->restore(state);
  } catch (...) {
    restart();
    throw;
  }
}

void Iterator::restart() {
  stop();
  stop_ = std::make_unique<std::stop_source>();
  ctx_.stop = stop_->get_token();
  root_ = node_->make(ctx_);
}

std::vector<std::string> Iterator::autotune_report() const {
  std::vector<std::string> lines;
  if (root_) root_->report(lines);
  return lines;
}

}  // namespace dtrain::data
