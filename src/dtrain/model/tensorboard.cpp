// TensorBoard's event files (TFRecord framing, Event protocol buffers encoded field by
// field) and Keras's TensorBoard callback.
#include "dtrain/model/tensorboard.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "dtrain/data/dataset.h"
#include "dtrain/model/compile_config.h"
#include "dtrain/model/model.h"

namespace dtrain {
namespace tensorboard {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

// Protocol-buffer encoding: just the wire types the Event messages use.
class Proto {
 public:
  Proto& varint_field(int field, std::uint64_t v) {
    key(field, 0);
    varint(v);
    return *this;
  }
  Proto& double_field(int field, double v) {
    key(field, 1);
    fixed(v);
    return *this;
  }
  Proto& float_field(int field, float v) {
    key(field, 5);
    fixed(v);
    return *this;
  }
  Proto& bytes_field(int field, const std::string& bytes) {
    key(field, 2);
    varint(bytes.size());
    out_ += bytes;
    return *this;
  }
  Proto& message_field(int field, const Proto& m) { return bytes_field(field, m.out_); }
  Proto& packed_doubles(int field, std::span<const double> values) {
    Proto packed;
    for (double v : values) packed.fixed(v);
    return bytes_field(field, packed.out_);
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
  void key(int field, int wire_type) { varint((static_cast<std::uint64_t>(field) << 3) | static_cast<unsigned>(wire_type)); }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  template <typename T>
  void fixed(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // little-endian, as the wire format is (x86-64, aarch64)
    out_.append(b, sizeof(T));
  }
};

// Event{wall_time, step, summary{value[0] = value}}.
std::string summary_event(const Proto& value, std::int64_t step) {
  Proto summary;
  summary.message_field(1, value);
  Proto event;
  event.double_field(1, now_seconds()).varint_field(2, static_cast<std::uint64_t>(step)).message_field(5, summary);
  return event.bytes();
}

}  // namespace

EventWriter::EventWriter(const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec || !std::filesystem::is_directory(run_dir))
    DTRAIN_THROW(IoError, run_dir, ": cannot make the TensorBoard run folder (", ec ? ec.message() : "not a folder", ")");
  // Two writers in one second and process (train and validation share a folder never,
  // but a second fit may reuse one) differ by the counter.
  static std::atomic<int> counter{0};
  path_ = (std::filesystem::path(run_dir) /
           ("events.out.tfevents." + std::to_string(static_cast<long long>(now_seconds())) + "." + host_name() + "." +
            std::to_string(getpid()) + "." + std::to_string(counter++) + ".v2"))
              .string();
  out_ = std::make_unique<data::RecordWriter>(path_, data::RecordFraming::tfrecord);
  Proto first;
  first.double_field(1, now_seconds()).bytes_field(3, "brain.Event:2");
  write_event(first.bytes());
}

EventWriter::~EventWriter() = default;

void EventWriter::write_event(const std::string& event) {
  out_->write(event);
  out_->flush();
}

void EventWriter::scalar(const std::string& tag, double value, std::int64_t step) {
  Proto v;
  v.bytes_field(1, tag).float_field(2, static_cast<float>(value));
  write_event(summary_event(v, step));
}

void EventWriter::histogram(const std::string& tag, std::span<const float> values, std::int64_t step, int buckets) {
  if (buckets < 1) DTRAIN_THROW(InvalidArgument, "histogram '", tag, "': buckets must be at least 1, got ", buckets);
  const auto n = static_cast<std::size_t>(buckets);
  Proto h;
  double lo = 0, hi = 0, sum = 0, squares = 0;
  std::vector<double> limits, counts;
  if (!values.empty()) {
    lo = hi = values[0];
    for (float v : values) {
      lo = std::min<double>(lo, v);
      hi = std::max<double>(hi, v);
      sum += v;
      squares += static_cast<double>(v) * v;
    }
    if (lo == hi) {
      limits = {hi};
      counts = {static_cast<double>(values.size())};
    } else {
      const double width = (hi - lo) / buckets;
      counts.assign(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) limits.push_back(i + 1 == n ? hi : lo + width * static_cast<double>(i + 1));
      for (float v : values) counts[std::min(n - 1, static_cast<std::size_t>((v - lo) / width))] += 1;
    }
  }
  h.double_field(1, lo).double_field(2, hi).double_field(3, static_cast<double>(values.size()));
  h.double_field(4, sum).double_field(5, squares).packed_doubles(6, limits).packed_doubles(7, counts);
  Proto v;
  v.bytes_field(1, tag).message_field(5, h);
  write_event(summary_event(v, step));
}

void EventWriter::text(const std::string& tag, const std::string& markdown, std::int64_t step) {
  Proto plugin;
  plugin.bytes_field(1, "text");
  Proto metadata;
  metadata.message_field(1, plugin);
  Proto tensor;
  tensor.varint_field(1, 7).message_field(2, Proto()).bytes_field(8, markdown);  // DT_STRING, a scalar
  Proto v;
  v.bytes_field(1, tag).message_field(8, tensor).message_field(9, metadata);
  write_event(summary_event(v, step));
}

std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DTRAIN_THROW(IoError, path, ": cannot open");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  auto u32 = [&](std::size_t offset) {
    std::uint32_t v;
    std::memcpy(&v, bytes.data() + offset, 4);
    return v;
  };
  auto masked_crc32c = [&](std::size_t offset, std::size_t size) {
    return data::masked_crc32c(data::crc32c(std::string_view(bytes).substr(offset, size)));
  };
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) DTRAIN_THROW(IoError, path, ": a record's header is cut short at offset ", at);
    std::uint64_t length;
    std::memcpy(&length, bytes.data() + at, 8);
    if (u32(at + 8) != masked_crc32c(at, 8))
      DTRAIN_THROW(IoError, path, ": the length's CRC does not match at offset ", at);
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4)
      DTRAIN_THROW(IoError, path, ": the record at offset ", at, " says ", length, " bytes, more than the file holds");
    const std::size_t data = at + 12;
    if (u32(data + length) != masked_crc32c(data, length))
      DTRAIN_THROW(IoError, path, ": the data's CRC does not match in the record at offset ", at);
    records.emplace_back(bytes.substr(data, length));
    at = data + length + 4;
  }
  return records;
}

}  // namespace tensorboard

namespace {

std::string profile_dir(const std::string& log_dir) {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y_%m_%d_%H_%M_%S", &tm);
  return (std::filesystem::path(log_dir) / "train" / "plugins" / "profile" / stamp).string();
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoard::TensorBoard(TensorBoardOptions options) : options_(std::move(options)) {
  if (options_.log_dir.empty()) DTRAIN_THROW(InvalidArgument, "TensorBoard: log_dir is empty");
  if (options_.histogram_freq < 0)
    DTRAIN_THROW(InvalidArgument, "TensorBoard: histogram_freq must be >= 0, got ", options_.histogram_freq);
  if (options_.update_freq < 0)
    DTRAIN_THROW(InvalidArgument, "TensorBoard: update_freq must be 'epoch', 'batch' or a number >= 1, got ",
                 options_.update_freq);
  if (options_.profile_last > 0) {
    if (options_.profile_first < 1 || options_.profile_first > options_.profile_last)
      DTRAIN_THROW(InvalidArgument, "TensorBoard: profile_batch must be a batch >= 1 or a range (first, last) with ",
                   "1 <= first <= last, got (", options_.profile_first, ", ", options_.profile_last, ")");
    // fit checks that the trace can be written before training: its folder is made now.
    const std::string dir = profile_dir(options_.log_dir);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) DTRAIN_THROW(IoError, dir, ": cannot make the profile folder (", ec.message(), ")");
    tracer_ = std::make_shared<ProfilerCallback>((std::filesystem::path(dir) / "dtrain.json").string(),
                                                 options_.profile_last);
  }
}

std::string TensorBoard::train_dir() const { return (std::filesystem::path(task_dir_) / "train").string(); }
std::string TensorBoard::validation_dir() const { return (std::filesystem::path(task_dir_) / "validation").string(); }

void TensorBoard::on_train_begin(const Logs&) {
  const StrategyBackend* strategy = model_ ? model_->distribute_strategy().get() : nullptr;
  const int worker = strategy && strategy->num_workers() > 1 ? std::max(0, strategy->worker_index()) : 0;
  task_dir_ = worker == 0 ? options_.log_dir
                          : (std::filesystem::path(options_.log_dir) / ("worker_" + std::to_string(worker))).string();
  train_ = std::make_unique<tensorboard::EventWriter>(train_dir());
  validation_.reset();
  global_batch_ = 0;
  seen_.restart();
  if (!model_) return;
  std::string config = "### model\n\n```\n";
  try {
    config += model_->to_json(2);
  } catch (const Error&) {  // a model with layers written in Python has no JSON
    config += model_->summary();
  }
  config += "\n```\n";
  if (model_->compiled()) {
    std::string optimizer;
    try {
      optimizer = optimizer_to_json(model_->optimizer()).dump();
    } catch (const Error&) {
      optimizer = model_->optimizer().name();
    }
    config += "\n### compile\n\noptimizer `" + optimizer + "`, loss `" + model_->loss().name() + "`\n";
  }
  train_->text("run_config", config, 0);
}

void TensorBoard::on_epoch_begin(int, const Logs&) {
  epoch_batches_ = 0;
  epoch_start_ = seconds_now();
  seen_.restart();
}

void TensorBoard::on_train_batch_end(std::int64_t batch, const Logs& logs) {
  const std::int64_t n = seen_.after(batch);
  const std::int64_t before = global_batch_;
  global_batch_ += n;
  epoch_batches_ += n;
  if (options_.update_freq <= 0 || !train_) return;
  // Written once per update_freq batches: when this call's batches crossed a multiple.
  if (global_batch_ / options_.update_freq == before / options_.update_freq) return;
  for (const auto& [name, value] : logs.items()) train_->scalar("batch_" + name, value, global_batch_);
}

void TensorBoard::on_epoch_end(int epoch, const Logs& logs) {
  if (!train_) return;
  for (const auto& [name, value] : logs.items()) {
    if (name.rfind("val_", 0) == 0) {
      if (!validation_) validation_ = std::make_unique<tensorboard::EventWriter>(validation_dir());
      validation_->scalar("epoch_" + name.substr(4), value, epoch);
    } else {
      train_->scalar("epoch_" + name, value, epoch);
    }
  }
  if (options_.write_steps_per_second) {
    const double seconds = seconds_now() - epoch_start_;
    if (seconds > 0) train_->scalar("epoch_steps_per_second", static_cast<double>(epoch_batches_) / seconds, epoch);
  }
  if (options_.histogram_freq > 0 && epoch % options_.histogram_freq == 0) write_histograms(epoch);
}

void TensorBoard::write_histograms(int epoch) {
  if (!model_) return;
  for (Variable* v : model_->variables()) {
    const std::vector<float> values = v->value().to_vector();
    train_->histogram(v->name() + "/histogram", values, epoch);
  }
}

void TensorBoard::on_train_end(const Logs&) {
  train_.reset();
  validation_.reset();
  if (!tracer_) return;
  // fit wrote the trace before calling on_train_end: gzipped where TensorBoard looks.
  const StrategyBackend* strategy = model_ ? model_->distribute_strategy().get() : nullptr;
  const int worker = strategy && strategy->num_workers() > 1 ? std::max(0, strategy->worker_index()) : 0;
  const std::filesystem::path plain = tracer_->path_for_worker(worker);
  std::ifstream in(plain, std::ios::binary);
  if (!in) return;  // no step was traced
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::filesystem::path gz = plain.parent_path() / (plain.stem().string() + ".trace.json.gz");
  gzFile out = gzopen(gz.c_str(), "wb");
  if (out == nullptr) DTRAIN_THROW(IoError, gz.string(), ": cannot create the profile trace");
  const int written = gzwrite(out, json.data(), static_cast<unsigned>(json.size()));
  if (gzclose(out) != Z_OK || written != static_cast<int>(json.size()))
    DTRAIN_THROW(IoError, gz.string(), ": write failed");
  std::error_code ec;
  std::filesystem::remove(plain, ec);
}

}  // namespace dtrain
