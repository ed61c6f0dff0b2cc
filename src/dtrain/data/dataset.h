// Dataset: a tf.data for C++. A Dataset is an immutable description of a pipeline
// (sources and transformations); make_iterator() runs it. Elements are tuples of tensors.
// Background work (prefetch, parallel map) runs on threads the iterator owns and stops
// when the iterator is destroyed. Every iterator records how long its consumer waited for
// each element, and its position can be saved and restored exactly.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

using Element = std::vector<Tensor>;

// Pass as a parallelism or buffer size to let the pipeline choose from measured rates.
inline constexpr std::int64_t AUTOTUNE = -1;
// cardinality() values that are not counts.
inline constexpr std::int64_t kUnknownCardinality = -1;
inline constexpr std::int64_t kInfiniteCardinality = -2;

// How a multi-worker strategy shares a dataset among its workers
// (tf.data.experimental.AutoShardPolicy):
// - FILE: each worker's file source (csv, records) reads every num_workers-th file,
//   starting at its index, and the batch() nearest the consumer makes that worker's share
//   of each global batch (Dataset::shard_by_file). A step's global batch is every worker's
//   batch together; an epoch ends when the last worker's data does (as with OFF). It needs
//   at least as many files as workers and a batch() above the file source.
// - DATA: every worker runs the whole pipeline, whose elements are global batches, and
//   keeps its replicas' rows of each; together the workers train on exactly the batches
//   one process would.
// - AUTO: FILE where the pipeline reads at least as many files as there are workers below
//   a batch() of at least as many rows, else DATA (custom loops through
//   experimental_distribute_dataset, which cannot end uneven shards together, take DATA).
// - OFF: each worker's dataset is its own (sharded by the program, say with
//   shard(num_workers, worker_index)); a step's global batch is every worker's batch
//   together, and an epoch ends when the last worker's data does (workers whose data ran
//   out take part with empty batches until then).
enum class AutoShardPolicy { AUTO, FILE, DATA, OFF };

struct DatasetOptions {
  int max_threads = 0;  // background threads a pipeline may use (0: the process's cores)
  std::int64_t autotune_max_buffer = 64;  // the largest prefetch buffer AUTOTUNE picks
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::AUTO;
  // How long save() (and autotune_report()) waits for a background stage to finish the
  // element it is making, so that its position can be taken, before it fails with Timeout
  // naming the stage; 0: 60 s (kDefaultTimeout). A map function or source that never
  // returns would otherwise hold save() forever.
  double timeout_seconds = 0;
  // How long next() waits for a background stage's next element before it fails with
  // Timeout naming the stage; 0: no limit, since a slow source or map function is not an
  // error unless the program says so (see docs/data.md).
  double element_timeout_seconds = 0;
};

// A position in a pipeline: what save() returns and restore() takes. It holds integers,
// tensors (buffered elements of shuffle and cache) and the states of upstream stages.
struct IteratorState {
  std::vector<std::int64_t> values;
  std::vector<Tensor> tensors;
  std::vector<IteratorState> children;

  std::string to_bytes() const;
  // Throws IoError when the bytes are not a state this version wrote.
  static IteratorState from_bytes(std::string_view bytes);
};

// What the consumer of an iterator waited (the input wait the profiler reports).
struct InputStats {
  std::int64_t elements = 0;
  double wait_seconds = 0.0;       // total time blocked in next()
  double last_wait_seconds = 0.0;  // for the element next() returned last
  double max_wait_seconds = 0.0;
};

// Where a prefetch's producer reads the time it took for an element and the CPU time its
// thread spent on it (seconds, from any origin), which decide AUTOTUNE's inline rule.
// Tests give clocks of their own, so that the rule's outcome does not depend on how the
// scheduler treats the test's threads.
struct StageClocks {
  std::function<double()> wall;
  std::function<double()> thread_cpu;
};

struct IteratorContext {
  std::stop_token stop;          // set when the iterator is being destroyed
  // Null: the steady clock and the thread's CPU clock.
  std::shared_ptr<const StageClocks> clocks;
  std::uint64_t iteration = 0;   // which pass over the data (an epoch); shuffle seeds by it
  DatasetOptions options;
  // Set by a prefetch or parallel map for the stages below it: true while they run on its
  // background threads. Null, or false, means the consumer's thread, where a batch
  // gathered from rows may use the compute threads (they wait for it anyway).
  std::shared_ptr<const std::atomic<bool>> background;
  // Whether the consumer's compute threads (the kernels' thread count of the thread that
  // made the iterator) leave a core idle for background stages; decided once, so that a
  // stage made again later on a background thread decides as the consumer would.
  bool idle_core = true;
  bool on_consumer_thread() const { return !background || !background->load(std::memory_order_relaxed); }
  // Set by Dataset::shard_by_file for the stages below it: file sources read files index,
  // index + count, ...; and while `rebatch` is set, the first batch() met (the one nearest
  // the consumer) makes this worker's share of its batch size, clearing it below.
  struct FileShard {
    int count = 1, index = 0;
    bool rebatch = false;
    // Rows of a global batch of `size` that are this worker's: size / count, and one more
    // for the first size % count workers.
    std::int64_t share(std::int64_t size) const { return size / count + (index < size % count ? 1 : 0); }
  } file_shard;
};

// One stage of a running pipeline. Internal interface, public so that tests and new
// sources can implement it.
class IteratorBase {
 public:
  virtual ~IteratorBase() = default;
  virtual std::optional<Element> next() = 0;  // nullopt at the end
  // The position after the last element returned.
  virtual IteratorState save() const = 0;
  // Moves a freshly made iterator to a saved position.
  virtual void restore(const IteratorState& state) = 0;
  // One line per stage that tunes itself: what it chose and what it measured.
  virtual void report(std::vector<std::string>& /*lines*/) const {}
  // Batching fast path. A stage that returns true from gathers() implements next_batch:
  // its next `count` elements (fewer at the end) stacked along a new first axis, built
  // without making the elements one by one; nullopt at the end.
  virtual bool gathers() const { return false; }
  virtual std::optional<Element> next_batch(std::int64_t /*count*/) { return std::nullopt; }
};

class DatasetNode {
 public:
  virtual ~DatasetNode() = default;
  virtual std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const = 0;
  virtual std::int64_t cardinality() const { return kUnknownCardinality; }
  // Non-null when the elements are exactly the rows of these tensors, in order (as from
  // from_tensor_slices): shuffle then draws row numbers instead of holding elements.
  virtual const std::vector<Tensor>* row_source() const { return nullptr; }
  // For walking a pipeline from the consumer to its source (auto-sharding): the stage this
  // one reads from (null for a source), the files a source reads, and a batch's size (0
  // for stages that do not batch).
  virtual const DatasetNode* input() const { return nullptr; }
  virtual std::int64_t files() const { return 0; }
  virtual std::int64_t batch_size() const { return 0; }
};

class Iterator;

// A file's compression, named as tf.data and tf.io name it: "" (or "NONE"), "ZLIB" (zlib's
// stream: header, deflate data, Adler-32) or "GZIP". A file is one stream; gzip members
// one after another read as one.
enum class Compression { none, zlib, gzip };
// InvalidArgument naming `what` (the call or key) for any other name.
Compression compression_named(std::string_view name, std::string_view what);
std::string_view compression_name(Compression c);

struct CsvOptions {
  bool header = true;
  char delimiter = ',';
  // Columns to keep, by header name or by 0-based index as text ("3"); empty keeps all.
  std::vector<std::string> select_columns;
  // A column to yield as a second, scalar component (the label); empty for none.
  std::string label_column;
  // Whether a cell may hold a value that is not finite ("nan", "inf", "-infinity", ...).
  // Off: such a cell is an IoError naming the file, line and column, since one NaN in the
  // data turns every weight NaN a step later.
  bool allow_non_finite = false;
};

class Dataset {
 public:
  // --- sources
  // Rows of each tensor along axis 0, as views (no copy). All must have the same length.
  static Dataset from_tensor_slices(std::vector<Tensor> tensors);
  // fn(i) returns element i, or nullopt after the last. An exception inside it reaches the
  // consumer as an Error naming the element index. Called from one thread at a time.
  static Dataset from_generator(std::function<std::optional<Element>(std::int64_t index)> fn);
  // int32 scalars start, start + step, ... below stop (above it for a negative step).
  static Dataset range(std::int64_t start, std::int64_t stop, std::int64_t step = 1);
  static Dataset range(std::int64_t stop) { return range(0, stop); }
  // IDX image and label files (gzip or not): elements (float32 [rows*cols] / 255, int32 label).
  static Dataset from_idx(const std::string& images_path, const std::string& labels_path);
  // Numeric CSV files, line by line: elements (float32 [columns]) or (features, label).
  static Dataset csv(std::vector<std::string> files, CsvOptions options = {});
  // Record files written by RecordWriter: elements (uint8 [record bytes]).
  static Dataset records(std::vector<std::string> files);
  // TFRecord files as TensorFlow writes them (tf.data.TFRecordDataset): elements (a string
  // scalar: the record's bytes), each record's length and bytes checked against their
  // masked CRC-32C. A compressed file is inflated as it is read; a record's offset in
  // messages is then its offset in the inflated bytes.
  // num_parallel_reads > 1 reads that many files at once, a record from each in turn
  // (interleave(..., num_parallel_reads, 1, num_parallel_reads), as TensorFlow does).
  static Dataset tfrecord(std::vector<std::string> files, Compression compression = Compression::none,
                          std::int64_t num_parallel_reads = 0);
  // File names as elements (string scalars; Dataset.list_files'). A file source: sharding
  // by file gives each worker its names, and the readers interleave makes of them read
  // their whole files.
  static Dataset file_names(std::vector<std::string> files);
  // The files each pattern matches (glob(7)), sorted, without repeats; a pattern that
  // matches nothing is InvalidArgument naming it (tf.io.gfile.glob, list_files).
  static std::vector<std::string> glob(const std::vector<std::string>& patterns);
  // The lines of text files, in order (tf.data.TextLineDataset): elements are string
  // scalars without their "\n" (or "\r\n"); empty lines are elements too. compression:
  // "" or "GZIP".
  static Dataset text_lines(std::vector<std::string> files, const std::string& compression = "");

  // --- transformations
  Dataset map(std::function<Element(const Element&)> fn, std::int64_t num_parallel_calls = 0,
              bool deterministic = true) const;
  Dataset filter(std::function<bool(const Element&)> predicate) const;
  // fn makes a dataset of each element; cycle_length of them are open at once and read in
  // turn, block_length elements at a time, a finished one replaced by the next element's
  // (TensorFlow's order; cycle_length AUTOTUNE: the machine's cores). num_parallel_calls
  // above 1 reads each open dataset ahead on a thread of its own (an AUTOTUNE prefetch),
  // the order unchanged. A saved position holds each open dataset's element and position.
  Dataset interleave(std::function<Dataset(const Element&)> fn, std::int64_t cycle_length = AUTOTUNE,
                     std::int64_t block_length = 1, std::int64_t num_parallel_calls = 0) const;
  // buffer_size elements are held and drawn from at random. Without a seed, the next of
  // set_random_seed's sequence is used. reshuffle_each_iteration gives each pass (epoch)
  // its own order, a pure function of (seed, pass).
  Dataset shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const;
  Dataset batch(std::int64_t batch_size, bool drop_remainder = false) const;
  Dataset unbatch() const;
  Dataset repeat(std::int64_t count = -1) const;  // -1: forever
  Dataset take(std::int64_t count) const;         // -1: all
  Dataset skip(std::int64_t count) const;         // -1: all
  // Every num_shards-th element, starting at index.
  Dataset shard(std::int64_t num_shards, std::int64_t index) const;
  // Keeps the elements of the first complete pass in memory; later passes read them.
  Dataset cache() const;
  Dataset prefetch(std::int64_t buffer_size = AUTOTUNE) const;
  // tf.data.experimental.prefetch_to_device: the last stage of a pipeline that feeds a GPU.
  // A background thread copies each element's tensors to `device` (through page-locked
  // memory, on the device's transfer stream, beside the compute stream: DeviceStaging) and
  // keeps up to buffer_size elements there, so the training step finds its batch on the
  // device, copied while the step before computed. String tensors stay on the CPU, where
  // strings live; `device` must be a GPU that is here.
  Dataset prefetch_to_device(Device device, std::int64_t buffer_size = AUTOTUNE) const;
  Dataset with_options(DatasetOptions options) const;
  const DatasetOptions& options() const { return options_; }

  std::int64_t cardinality() const;
  // The files the pipeline's source reads (csv, records); 0 for sources that read none.
  std::int64_t input_files() const;
  // The pipeline worker `index` of `num_workers` runs under AutoShardPolicy::FILE: its file
  // source reads files index, index + num_workers, ..., and the batch() nearest the
  // consumer makes batch_size / num_workers rows (one more for the first
  // batch_size % num_workers workers). A take() or skip() below that batch then counts
  // this worker's elements. InvalidArgument, with the counts, when the source has fewer
  // files than workers, there is no batch() above it, or that batch is smaller than the
  // number of workers. A saved position belongs to its worker's shard.
  Dataset shard_by_file(int num_workers, int index) const;
  // Runs the pipeline; `iteration` numbers the pass (fit passes the epoch).
  Iterator make_iterator(std::uint64_t iteration = 0) const;

  // Wraps a custom node (a new source or transformation).
  explicit Dataset(std::shared_ptr<const DatasetNode> node, DatasetOptions options = {})
      : node_(std::move(node)), options_(options) {}
  const std::shared_ptr<const DatasetNode>& node() const { return node_; }

 private:
  std::shared_ptr<const DatasetNode> node_;
  DatasetOptions options_;
};

class Iterator {
 public:
  Iterator(Iterator&&) noexcept;
  Iterator& operator=(Iterator&&) noexcept;
  ~Iterator();  // stops the pipeline's threads and waits for them

  std::optional<Element> next();
  IteratorState save() const;
  // Continues from a saved position of an iterator of the same pipeline. If the state does
  // not belong to this pipeline, throws and leaves the iterator at the start of its pass.
  void restore(const IteratorState& state);
  const InputStats& stats() const { return stats_; }
  // What AUTOTUNE chose, stage by stage, with the rates it measured.
  std::vector<std::string> autotune_report() const;

 private:
  friend class Dataset;
  Iterator(std::shared_ptr<const DatasetNode> node, IteratorContext ctx);
  void stop();
  void restart();  // stops the pipeline and makes a fresh one, at the start of its pass

  std::shared_ptr<const DatasetNode> node_;
  std::unique_ptr<std::stop_source> stop_;
  IteratorContext ctx_;
  std::unique_ptr<IteratorBase> root_;
  InputStats stats_;
};

// What one worker of a multi-worker strategy runs: `dataset`'s options name the policy
// (AUTO resolved to FILE or DATA for the given number of workers), and `own_batches` says
// whether its batches are its own part of each global batch (FILE, OFF) rather than whole
// global batches it takes its rows of (DATA). `plan` says so in a line, for the log. One
// worker runs the whole dataset, whatever its policy.
struct WorkerShard {
  AutoShardPolicy policy;
  Dataset dataset;
  bool own_batches;
  std::string plan;
};
WorkerShard auto_shard(const Dataset& dataset, int num_workers, int index);

// --- record files: [u64 length][u32 checksum of the length][bytes][u32 checksum of the
// bytes], little-endian. dtrain's own record files checksum with CRC-32 (zlib's);
// TFRecord files, TensorFlow's, with a masked CRC-32C. A corrupt record is an IoError
// naming the file, the record and its offset.
enum class RecordFraming { dtrain, tfrecord };

// CRC-32C (Castagnoli) of `bytes`, and TFRecord's mask of a CRC: rotated right by 15
// bits, plus 0xa282ead8.
std::uint32_t crc32c(std::string_view bytes);
inline std::uint32_t masked_crc32c(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

class RecordWriter {
 public:
  // Truncates `path`. tf.io.TFRecordWriter is RecordWriter(path, RecordFraming::tfrecord),
  // with its options' compression and level (zlib's 0-9; -1 its default, 6).
  explicit RecordWriter(const std::string& path, RecordFraming framing = RecordFraming::dtrain,
                        Compression compression = Compression::none, int level = -1);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  void write(std::string_view record);
  void flush();  // what was written reaches the file (a compressed stream is sync-flushed)
  void close();  // ends the compressed stream and flushes; errors name the file

 private:
  void put(const char* bytes, std::size_t n);
  void deflate_out(int flush);
  std::string path_;
  RecordFraming framing_;
  std::FILE* file_;
  struct Deflater;
  std::unique_ptr<Deflater> deflater_;  // null when uncompressed
};

// Row rows[i] of every tensor, stacked along a new first axis: a shuffled batch of tensors
// held in memory, in one pass that prefetches the rows ahead of the copy. With
// on_compute_pool the copy is split over the compute threads; only for calls from the
// training thread (a pipeline thread would start an OpenMP pool of its own).
Element gather_rows(const std::vector<Tensor>& sources, std::span<const std::int64_t> rows,
                    bool on_compute_pool = false);

// Tensors <-> one record (dtype, shape and bytes of each), to store elements in record files.
std::string encode_element(const Element& element);
Element decode_element(const Tensor& record_bytes);

}  // namespace dtrain::data
