// Dataset sources: tensor slices, generators, ranges, CSV files, text lines and record files.
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <charconv>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif
#include <fstream>
#include <tuple>
#include <utility>

#include "dtrain/data/dataset_internal.h"

namespace dtrain::data::detail {
namespace {

// ---- from_tensor_slices: element i is row i of every tensor, as a view.
class SlicesIterator : public IteratorBase {
 public:
  explicit SlicesIterator(std::vector<Tensor> t) : rows_(std::move(t)) {}
  std::optional<Element> next() override {
    if (index_ >= rows_.count()) return std::nullopt;
    return rows_.at(index_++);
  }
  // A batch of consecutive rows is a view of each tensor: no copy.
  bool gathers() const override { return true; }
  std::optional<Element> next_batch(std::int64_t count) override {
    const std::int64_t end = std::min(index_ + count, rows_.count());
    if (index_ >= end) return std::nullopt;
    Element e;
    for (const Tensor& t : rows_.tensors) e.push_back(t.slice(index_, end));
    index_ = end;
    return e;
  }
  IteratorState save() const override { return {{index_}, {}, {}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 1, 0, "from_tensor_slices");
    if (s.values.size() != 1 || s.values[0] < 0 || s.values[0] > rows_.count())
      DTRAIN_THROW(InvalidArgument, "from_tensor_slices: the saved iterator state does not belong to this pipeline (",
                   s.values.size(), " values, position ", s.values[0], " of ", rows_.count(), " rows)");
    index_ = s.values[0];
  }

 private:
  const Rows rows_;  // tensor handles: copies share the data
  std::int64_t index_ = 0;
};

class SlicesNode : public DatasetNode {
 public:
  explicit SlicesNode(std::vector<Tensor> t) : tensors_(std::move(t)) {
    if (tensors_.empty()) DTRAIN_THROW(InvalidArgument, "from_tensor_slices: needs at least one tensor");
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      tensors_[i].check_defined("from_tensor_slices");
      if (tensors_[i].rank() == 0)
        DTRAIN_THROW(InvalidArgument, "from_tensor_slices: tensor ", i, " is a scalar; it needs an axis to slice");
      if (tensors_[i].dim(0) != tensors_[0].dim(0))
        DTRAIN_THROW(InvalidArgument, "from_tensor_slices: tensor ", i, " has ", tensors_[i].dim(0),
                     " rows but tensor 0 has ", tensors_[0].dim(0), " (shapes ", tensors_[i].shape().to_string(), " and ",
                     tensors_[0].shape().to_string(), ")");
    }
  }
  std::unique_ptr<IteratorBase> make(const IteratorContext&) const override {
    return std::make_unique<SlicesIterator>(tensors_);
  }
  std::int64_t cardinality() const override { return tensors_[0].dim(0); }
  const std::vector<Tensor>* row_source() const override { return &tensors_; }

 private:
  std::vector<Tensor> tensors_;
};

// ---- from_generator: fn(i) for i = 0, 1, ... until nullopt.
class GeneratorIterator : public IteratorBase {
 public:
  explicit GeneratorIterator(std::function<std::optional<Element>(std::int64_t)> fn) : fn_(std::move(fn)) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    std::optional<Element> e;
    try {
      e = fn_(index_);
    } catch (...) {
      rethrow_with_context(std::current_exception(), "from_generator: element " + std::to_string(index_));
    }
    if (!e) {
      done_ = true;
      return std::nullopt;
    }
    ++index_;
    return e;
  }
  IteratorState save() const override { return {{index_, done_ ? 1 : 0}, {}, {}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 2, 0, "from_generator");
    index_ = s.values[0];
    done_ = s.values[1] != 0;
  }

 private:
  const std::function<std::optional<Element>(std::int64_t)> fn_;
  std::int64_t index_ = 0;
  bool done_ = false;
};

class GeneratorNode : public DatasetNode {
 public:
  explicit GeneratorNode(std::function<std::optional<Element>(std::int64_t)> fn) : fn_(std::move(fn)) {
    if (!fn_) DTRAIN_THROW(InvalidArgument, "from_generator: the function is empty");
  }
  std::unique_ptr<IteratorBase> make(const IteratorContext&) const override {
    return std::make_unique<GeneratorIterator>(fn_);
  }

 private:
  std::function<std::optional<Element>(std::int64_t)> fn_;
};

// ---- range
class RangeIterator : public IteratorBase {
 public:
  RangeIterator(std::int64_t start, std::int64_t stop, std::int64_t step) : next_(start), stop_(stop), step_(step) {}
  std::optional<Element> next() override {
    if (step_ > 0 ? next_ >= stop_ : next_ <= stop_) return std::nullopt;
    Tensor t = Tensor::empty({}, DType::i32);
    t.data<std::int32_t>()[0] = static_cast<std::int32_t>(next_);
    next_ += step_;
    return Element{t};
  }
  IteratorState save() const override { return {{next_}, {}, {}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 1, 0, "range");
    next_ = s.values[0];
  }

 private:
  std::int64_t next_, stop_, step_;
};

class RangeNode : public DatasetNode {
 public:
  RangeNode(std::int64_t start, std::int64_t stop, std::int64_t step) : start_(start), stop_(stop), step_(step) {
    if (step == 0) DTRAIN_THROW(InvalidArgument, "range: step must not be 0");
    for (std::int64_t v : {start, stop})
      if (v < INT32_MIN || v > INT32_MAX) DTRAIN_THROW(InvalidArgument, "range: ", v, " does not fit the int32 elements");
  }
  std::unique_ptr<IteratorBase> make(const IteratorContext&) const override {
    return std::make_unique<RangeIterator>(start_, stop_, step_);
  }
  std::int64_t cardinality() const override {
    const std::int64_t span = step_ > 0 ? stop_ - start_ : start_ - stop_;
    const std::int64_t s = step_ > 0 ? step_ : -step_;
    return span <= 0 ? 0 : (span + s - 1) / s;
  }

 private:
  std::int64_t start_, stop_, step_;
};

// ---- CSV: one element per line; every field must be a number.
struct CsvLayout {
  std::vector<int> feature_columns;  // indices into a line's fields
  int label_column = -1;
  std::size_t fields = 0;            // fields every line must have (0: set by the first line)
};

std::vector<std::string_view> split(std::string_view line, char delimiter) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t p = line.find(delimiter, start);
    out.push_back(line.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A CSV field as a float32, as the number it writes: a leading '+' is allowed, and a
// value beyond float32's range becomes what float32 holds for it (1e-50 is 0, 1e50 is
// inf, which the caller refuses unless non-finite values are allowed; `beyond` says so).
// False when the field is not a number.
bool parse_field(std::string_view f, float& v, bool& beyond) {
  beyond = false;
  if (f.size() > 1 && f.front() == '+' && f[1] != '-' && f[1] != '+') f.remove_prefix(1);
  if (f.empty()) return false;
  const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
  if (p != f.data() + f.size()) return false;
  if (ec == std::errc()) return true;
  if (ec != std::errc::result_out_of_range) return false;
  // A number all the same (from_chars read all of it), as a double (from_chars does not
  // follow the locale); strtod only past double's range too, for its +-HUGE_VAL or +-0.
  double d = 0;
  if (std::from_chars(f.data(), f.data() + f.size(), d).ec != std::errc()) d = std::strtod(std::string(f).c_str(), nullptr);
  v = static_cast<float>(d);
  beyond = std::isinf(v);
  return true;
}

// A source that reads files line by line: its position is the file and the line of it last
// read; restoring opens that file and skips the lines read before.
class LineFilesIterator : public IteratorBase {
 public:
  LineFilesIterator(std::vector<std::string> files, const char* stage) : files_(std::move(files)), stage_(stage) {}
  IteratorState save() const override { return {{static_cast<std::int64_t>(file_), line_}, {}, {}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 2, 0, stage_);
    file_ = static_cast<std::size_t>(s.values[0]);
    skip_to_ = s.values[1];
    if (file_ < files_.size()) open_current();
  }

 protected:
  virtual void open_current() = 0;
  const std::string& path() const { return files_[file_]; }

  const std::vector<std::string> files_;
  std::size_t file_ = 0;
  std::int64_t line_ = 0, skip_to_ = 0;

 private:
  const char* stage_;
};

class CsvIterator : public LineFilesIterator {
 public:
  CsvIterator(std::vector<std::string> files, CsvOptions o) : LineFilesIterator(std::move(files), "csv"), options_(std::move(o)) {}

  std::optional<Element> next() override {
    for (;;) {
      if (!in_.is_open()) {
        if (file_ >= files_.size()) return std::nullopt;
        open_current();
      }
      std::string line;
      if (!std::getline(in_, line)) {
        in_.close();
        ++file_;
        line_ = 0;
        skip_to_ = 0;
        continue;
      }
      ++line_;
      if (line_ == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);  // a UTF-8 byte order mark
      if (trim(line).empty()) continue;
      if (line_ == 1 && options_.header) {
        read_header(line);
        continue;
      }
      if (line_ <= skip_to_) continue;  // restoring: lines already consumed
      return parse(line);
    }
  }

 private:
  void open_current() override {
    in_.open(path());
    if (!in_) DTRAIN_THROW(IoError, path(), ": cannot open (", std::strerror(errno), ")");
    line_ = 0;
    layout_ = CsvLayout{};
    if (!options_.header) resolve({});
  }

  void read_header(const std::string& line) {
    std::vector<std::string> names;
    for (auto f : split(line, options_.delimiter)) names.emplace_back(trim(f));
    resolve(names);
  }

  // Column names or indices -> positions.
  int column_index(const std::string& name, const std::vector<std::string>& names) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return static_cast<int>(i);
    int idx = -1;
    auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), idx);
    if (ec == std::errc() && p == name.data() + name.size() && idx >= 0) return idx;
    DTRAIN_THROW(InvalidArgument, path(), ": no column '", name, "'", names.empty() ? " (the file has no header)" : "");
  }

  void resolve(const std::vector<std::string>& names) {
    layout_.fields = names.size();
    for (const auto& c : options_.select_columns) layout_.feature_columns.push_back(column_index(c, names));
    if (!options_.label_column.empty()) layout_.label_column = column_index(options_.label_column, names);
  }

  Element parse(const std::string& line) {
    const auto fields = split(line, options_.delimiter);
    if (layout_.fields == 0) layout_.fields = fields.size();
    if (fields.size() != layout_.fields)
      DTRAIN_THROW(IoError, path(), ":", line_, ": ", fields.size(), " fields, expected ", layout_.fields);
    if (layout_.feature_columns.empty()) {
      for (std::size_t i = 0; i < fields.size(); ++i)
        if (static_cast<int>(i) != layout_.label_column) layout_.feature_columns.push_back(static_cast<int>(i));
    }
    auto value = [&](int col) {
      if (col >= static_cast<int>(fields.size()))
        DTRAIN_THROW(IoError, path(), ":", line_, ": column ", col, " is past the ", fields.size(), " fields of the line");
      const std::string_view f = trim(fields[col]);
      float v = 0;
      bool beyond = false;
      if (!parse_field(f, v, beyond))
        DTRAIN_THROW(IoError, path(), ":", line_, ": column ", col + 1, ": '", std::string(f), "' is not a number");
      if (beyond && !options_.allow_non_finite)
        DTRAIN_THROW(IoError, path(), ":", line_, ": column ", col + 1, ": '", std::string(f),
                     "' is beyond float32's range (CsvOptions::allow_non_finite accepts it as inf)");
      if (!std::isfinite(v) && !options_.allow_non_finite)
        DTRAIN_THROW(IoError, path(), ":", line_, ": column ", col + 1, ": '", std::string(f),
                     "' is not a finite number (CsvOptions::allow_non_finite accepts it)");
      return v;
    };
    Tensor x = Tensor::empty({static_cast<std::int64_t>(layout_.feature_columns.size())});
    for (std::size_t i = 0; i < layout_.feature_columns.size(); ++i) x.data<float>()[i] = value(layout_.feature_columns[i]);
    if (layout_.label_column < 0) return {x};
    return {x, Tensor::scalar(value(layout_.label_column))};
  }

  const CsvOptions options_;
  std::ifstream in_;
  CsvLayout layout_;
};

// The files of a file source that a worker reads when the pipeline is sharded by file.
std::vector<std::string> files_of_shard(const std::vector<std::string>& files, const IteratorContext& ctx) {
  const IteratorContext::FileShard& shard = ctx.file_shard;
  if (shard.count == 1) return files;
  std::vector<std::string> mine;
  for (std::size_t i = static_cast<std::size_t>(shard.index); i < files.size(); i += static_cast<std::size_t>(shard.count))
    mine.push_back(files[i]);
  return mine;
}

// A source over files: the iterator of each worker reads its shard of them
// (files_of_shard), taking `Args` after its files.
template <typename It, typename... Args>
class FilesNode : public DatasetNode {
 public:
  FilesNode(const char* source, std::vector<std::string> files, Args... args)
      : files_(std::move(files)), args_(std::move(args)...) {
    if (files_.empty()) DTRAIN_THROW(InvalidArgument, source, ": no files given");
  }
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::apply([&](const Args&... a) { return std::make_unique<It>(files_of_shard(files_, ctx), a...); }, args_);
  }
  std::int64_t files() const override { return static_cast<std::int64_t>(files_.size()); }

 private:
  std::vector<std::string> files_;
  std::tuple<Args...> args_;
};

// ---- file names: one string scalar per name (Dataset.list_files), a file source of its own.
class FileNamesIterator : public IteratorBase {
 public:
  explicit FileNamesIterator(std::vector<std::string> files) : files_(std::move(files)) {}
  std::optional<Element> next() override {
    if (index_ >= files_.size()) return std::nullopt;
    Tensor t = Tensor::empty(Shape{}, DType::string);
    *t.data<std::string>() = files_[index_++];
    return Element{std::move(t)};
  }
  IteratorState save() const override { return {{static_cast<std::int64_t>(index_)}, {}, {}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 1, 0, "list_files");
    if (s.values[0] < 0 || s.values[0] > static_cast<std::int64_t>(files_.size()))
      DTRAIN_THROW(InvalidArgument, "list_files: the saved position ", s.values[0], " is past its ", files_.size(), " names");
    index_ = static_cast<std::size_t>(s.values[0]);
  }

 private:
  const std::vector<std::string> files_;
  std::size_t index_ = 0;
};

// ---- text lines: one string scalar per line, read through zlib (which reads a file that is
// not compressed as it is, so "GZIP" only checks that it is).
class TextLinesIterator : public LineFilesIterator {
 public:
  TextLinesIterator(std::vector<std::string> files, bool gzip) : LineFilesIterator(std::move(files), "text_lines"), gzip_(gzip) {}
  ~TextLinesIterator() override { close(); }

  std::optional<Element> next() override {
    for (;;) {
      if (!in_) {
        if (file_ >= files_.size()) return std::nullopt;
        open_current();
      }
      std::string line;
      if (!read_line(line)) {
        close();
        ++file_;
        skip_to_ = 0;
        continue;
      }
      if (++line_ <= skip_to_) continue;  // restoring: lines already consumed
      Tensor t = Tensor::empty(Shape{}, DType::string);
      *t.data<std::string>() = std::move(line);
      return Element{std::move(t)};
    }
  }

 private:
  void open_current() override {
    close();
    in_ = gzopen(path().c_str(), "rb");
    if (!in_) DTRAIN_THROW(IoError, path(), ": cannot open (", std::strerror(errno), ")");
    gzbuffer(in_, 1 << 16);
    if (gzip_ && gzdirect(in_) && !at_end()) {
      close();
      DTRAIN_THROW(IoError, files_[file_], ": compression_type is 'GZIP' but the file is not gzip-compressed");
    }
    line_ = 0;
  }
  bool at_end() {
    const int c = gzgetc(in_);
    if (c < 0) return true;
    gzungetc(c, in_);
    return false;
  }
  void close() {
    if (in_) gzclose(in_);
    in_ = nullptr;
    begin_ = end_ = 0;
  }
  // The next line without its end (bytes, NULs included); false at the end of the file.
  bool read_line(std::string& line) {
    bool any = false;
    for (;;) {
      if (begin_ == end_) {
        const int n = gzread(in_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
        if (n < 0) {
          int err = 0;
          const char* what = gzerror(in_, &err);
          DTRAIN_THROW(IoError, path(), ": line ", line_ + 1, ": ", err == Z_ERRNO ? std::strerror(errno) : what);
        }
        if (n == 0) {
          int err = 0;
          gzerror(in_, &err);
          if (err == Z_BUF_ERROR) DTRAIN_THROW(IoError, path(), ": the compressed data ends early, in line ", line_ + 1);
          return any;
        }
        begin_ = 0;
        end_ = static_cast<std::size_t>(n);
      }
      any = true;
      const char* from = buffer_.data() + begin_;
      const auto* newline = static_cast<const char*>(std::memchr(from, '\n', end_ - begin_));
      if (!newline) {
        line.append(from, end_ - begin_);
        begin_ = end_;
        continue;
      }
      line.append(from, static_cast<std::size_t>(newline - from));
      begin_ += static_cast<std::size_t>(newline - from) + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
  }

  const bool gzip_;
  gzFile in_ = nullptr;
  std::vector<char> buffer_ = std::vector<char>(1 << 16);
  std::size_t begin_ = 0, end_ = 0;  // the bytes of buffer_ not yet read
};

// ---- record files
std::uint32_t crc(const void* data, std::size_t n) {
  return static_cast<std::uint32_t>(crc32(0L, static_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

// The checksum a record's framing puts after its length and after its bytes.
std::uint32_t record_checksum(RecordFraming framing, const void* data, std::size_t n) {
  if (framing == RecordFraming::dtrain) return crc(data, n);
  return masked_crc32c(data::crc32c(std::string_view(static_cast<const char*>(data), n)));
}

void put_le(char* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>(v >> (8 * i));
}

std::uint64_t get_le(const unsigned char* in, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

// A compressed file's bytes, inflated as they are read: zlib's stream or gzip's (members
// one after another read as one stream). Its read errors say what went wrong; the reader
// adds the file, record and offset.
class InflatingFile {
 public:
  InflatingFile(const std::string& path, Compression compression) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) DTRAIN_THROW(IoError, path, ": cannot open (", std::strerror(errno), ")");
    if (inflateInit2(&z_, compression == Compression::gzip ? 15 + 16 : 15) != Z_OK) {
      std::fclose(file_);
      DTRAIN_THROW(IoError, path, ": zlib cannot start inflating (out of memory)");
    }
  }
  ~InflatingFile() {
    inflateEnd(&z_);
    std::fclose(file_);
  }
  InflatingFile(const InflatingFile&) = delete;
  InflatingFile& operator=(const InflatingFile&) = delete;

  // Up to n bytes into `out`; fewer only at the end of the data. zlib counts in uInt: a
  // larger request is read in pieces.
  std::size_t read(char* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const std::size_t piece = std::min<std::size_t>(n - got, std::size_t{1} << 30);
      const std::size_t read_now = read_piece(out + got, piece);
      got += read_now;
      if (read_now < piece) break;
    }
    return got;
  }

 private:
  std::size_t read_piece(char* out, std::size_t n) {
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out > 0) {
      if (z_.avail_in == 0 && !refill()) {
        if (ended_ || !started_) break;  // the end of the last stream, or an empty file
        DTRAIN_THROW(IoError, "the compressed data ends early");
      }
      if (ended_) {  // another gzip member (or zlib stream) follows
        inflateReset(&z_);
        ended_ = false;
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        DTRAIN_THROW(IoError, "the compressed data is corrupt (zlib: ", z_.msg ? z_.msg : "error " + std::to_string(rc),
                     ")");
      }
    }
    const std::size_t got = n - z_.avail_out;
    inflated_ += static_cast<std::int64_t>(got);
    return got;
  }

  bool refill() {
    const std::size_t got = std::fread(input_.data(), 1, input_.size(), file_);
    if (got == 0 && std::ferror(file_)) DTRAIN_THROW(IoError, "read failed (", std::strerror(errno), ")");
    z_.next_in = input_.data();
    z_.avail_in = static_cast<uInt>(got);
    started_ |= got > 0;
    return got > 0;
  }

  std::FILE* file_ = nullptr;
  z_stream z_{};
  std::vector<unsigned char> input_ = std::vector<unsigned char>(1 << 16);
  bool started_ = false, ended_ = false;
  std::int64_t inflated_ = 0;
};

// Record files, uncompressed (a record's length is checked against the bytes the file has
// left before anything is allocated for it) or inflated as they are read (a record is read
// in pieces that grow with what has arrived, so a lying length costs no more memory than
// the data there is).
class RecordsIterator : public IteratorBase {
 public:
  explicit RecordsIterator(std::vector<std::string> files, RecordFraming framing = RecordFraming::dtrain,
                           Compression compression = Compression::none)
      : files_(std::move(files)), framing_(framing), compression_(compression) {}
  std::optional<Element> next() override {
    for (;;) {
      if (!is_open()) {
        if (file_ >= files_.size()) return std::nullopt;
        open_current(0);
        record_ = 0;
      }
      unsigned char head[12];
      const std::size_t got = read(reinterpret_cast<char*>(head), 12);
      if (got == 0) {
        close_current();
        ++file_;
        continue;
      }
      const std::string& path = files_[file_];
      if (got != 12)
        DTRAIN_THROW(IoError, path, ": truncated record header at offset ", where(), " (record ", record_, ")");
      const std::uint64_t length = get_le(head, 8);
      if (record_checksum(framing_, head, 8) != get_le(head + 8, 4))
        DTRAIN_THROW(IoError, path, ": corrupt record at offset ", where(), " (record ", record_,
                     "): the length's checksum does not match");
      if (!inflating_) {
        const std::uint64_t left = static_cast<std::uint64_t>(size_ - offset_ - 12);
        if (length > left || left - length < 4)
          DTRAIN_THROW(IoError, path, ": truncated record at offset ", where(), " (record ", record_, "): its header claims ",
                       length, " bytes (and a 4-byte checksum), but the file holds ", left, " after the header");
      }
      // A TFRecord's record is a string scalar, as TensorFlow gives it; dtrain's, uint8
      // [length] (read straight into the tensor when the file is not compressed).
      Tensor bytes;
      std::string* text = nullptr;
      if (framing_ == RecordFraming::tfrecord || inflating_) {
        bytes = Tensor::empty(Shape{}, DType::string);
        text = bytes.data<std::string>();
      } else {
        bytes = Tensor::empty({static_cast<std::int64_t>(length)}, DType::u8);
      }
      const bool whole = text ? read_growing(*text, length) : read(static_cast<char*>(bytes.raw_data()), length) == length;
      unsigned char tail[4];
      if (!whole || read(reinterpret_cast<char*>(tail), 4) != 4)
        DTRAIN_THROW(IoError, path, ": truncated record at offset ", where(), " (record ", record_, ", ", length,
                     " bytes announced)");
      const void* data = text ? static_cast<const void*>(text->data()) : bytes.raw_data();
      if (record_checksum(framing_, data, length) != get_le(tail, 4))
        DTRAIN_THROW(IoError, path, ": corrupt record at offset ", where(), " (record ", record_,
                     "): the data's checksum does not match");
      offset_ += 16 + static_cast<std::int64_t>(length);
      ++record_;
      if (text && framing_ == RecordFraming::dtrain) {  // a compressed file of dtrain's records
        Tensor u8 = Tensor::empty({static_cast<std::int64_t>(length)}, DType::u8);
        if (length > 0) std::memcpy(u8.raw_data(), text->data(), length);
        return Element{std::move(u8)};
      }
      return Element{std::move(bytes)};
    }
  }
  IteratorState save() const override { return {{static_cast<std::int64_t>(file_), offset_}, {}, {}}; }
  void restore(const IteratorState& s) override {
    check_state(s, 2, 0, "records");
    close_current();
    file_ = static_cast<std::size_t>(s.values[0]);
    if (file_ < files_.size()) open_current(s.values[1]);
    record_ = 0;  // counted from the position restored (the messages' record numbers)
  }

 private:
  bool is_open() const { return inflating_ != nullptr || plain_.is_open(); }
  void close_current() {
    plain_.close();
    inflating_.reset();
  }
  std::string where() const {
    return std::to_string(offset_) + (inflating_ ? " of the inflated data" : "");
  }
  std::size_t read(char* out, std::size_t n) {
    if (inflating_) {
      try {
        return inflating_->read(out, n);
      } catch (const IoError& e) {
        DTRAIN_THROW(IoError, files_[file_], ": record ", record_, " (at offset ", where(), "): ", e.what());
      }
    }
    plain_.read(out, static_cast<std::streamsize>(n));
    return static_cast<std::size_t>(plain_.gcount());
  }
  // `length` bytes into `out`, in pieces that grow with what has arrived where the file is
  // inflated; false if the data ends first.
  bool read_growing(std::string& out, std::uint64_t length) {
    if (!inflating_) {
      out.resize(static_cast<std::size_t>(length));
      return read(out.data(), out.size()) == out.size();
    }
    std::size_t have = 0;
    while (have < length) {
      const std::uint64_t step = std::max<std::uint64_t>(std::uint64_t{1} << 20, have);
      const auto upto = static_cast<std::size_t>(std::min<std::uint64_t>(length, have + step));
      out.resize(upto);
      have += read(out.data() + have, upto - have);
      if (have < upto) return false;
    }
    return true;
  }
  void open_current(std::int64_t offset) {
    const std::string& path = files_[file_];
    if (offset < 0) DTRAIN_THROW(InvalidArgument, path, ": the saved position ", offset, " is outside the file");
    offset_ = 0;
    if (compression_ != Compression::none) {
      inflating_ = std::make_unique<InflatingFile>(path, compression_);
      std::vector<char> skip(1 << 16);
      for (std::int64_t left = offset; left > 0;) {
        const auto n = static_cast<std::size_t>(std::min<std::int64_t>(left, static_cast<std::int64_t>(skip.size())));
        if (read(skip.data(), n) != n) {
          close_current();  // the next pass opens the file afresh
          DTRAIN_THROW(InvalidArgument, path, ": the saved position ", offset, " is past the end of its inflated data");
        }
        left -= static_cast<std::int64_t>(n);
      }
      offset_ = offset;
      return;
    }
    plain_.open(path, std::ios::binary | std::ios::ate);
    if (!plain_) DTRAIN_THROW(IoError, path, ": cannot open (", std::strerror(errno), ")");
    size_ = plain_.tellg();
    if (size_ < 0) DTRAIN_THROW(IoError, path, ": cannot tell its length; record files must be regular files");
    if (offset > size_) {
      close_current();
      DTRAIN_THROW(InvalidArgument, path, ": the saved position ", offset, " is outside the file (", size_, " bytes)");
    }
    plain_.seekg(offset);
    offset_ = offset;
  }
  const std::vector<std::string> files_;
  const RecordFraming framing_;
  const Compression compression_;
  std::size_t file_ = 0;
  std::int64_t offset_ = 0;
  std::int64_t record_ = 0;  // of the current file, from 0
  std::int64_t size_ = 0;  // the current file's length in bytes (uncompressed files)
  std::ifstream plain_;
  std::unique_ptr<InflatingFile> inflating_;
};

}  // namespace

NodePtr tensor_slices_node(std::vector<Tensor> tensors) { return std::make_shared<SlicesNode>(std::move(tensors)); }
NodePtr generator_node(std::function<std::optional<Element>(std::int64_t)> fn) {
  return std::make_shared<GeneratorNode>(std::move(fn));
}
NodePtr range_node(std::int64_t start, std::int64_t stop, std::int64_t step) {
  return std::make_shared<RangeNode>(start, stop, step);
}
NodePtr csv_node(std::vector<std::string> files, CsvOptions options) {
  return std::make_shared<FilesNode<CsvIterator, CsvOptions>>("csv", std::move(files), std::move(options));
}
NodePtr records_node(std::vector<std::string> files) {
  return std::make_shared<FilesNode<RecordsIterator>>("records", std::move(files));
}
NodePtr tfrecord_node(std::vector<std::string> files, Compression compression) {
  return std::make_shared<FilesNode<RecordsIterator, RecordFraming, Compression>>("tfrecord", std::move(files),
                                                                                  RecordFraming::tfrecord, compression);
}
NodePtr file_names_node(std::vector<std::string> files) {
  return std::make_shared<FilesNode<FileNamesIterator>>("list_files", std::move(files));
}
NodePtr text_lines_node(std::vector<std::string> files, bool gzip) {
  return std::make_shared<FilesNode<TextLinesIterator, bool>>("text_lines", std::move(files), gzip);
}

}  // namespace dtrain::data::detail

namespace dtrain::data {
namespace {

// CRC-32C: the reflected Castagnoli polynomial, 8 bytes a step (slicing by 8) where the
// processor has no CRC32 instruction.
constexpr std::uint32_t kCastagnoli = 0x82f63b78u;

struct Crc32cTables {
  std::uint32_t t[8][256];
  Crc32cTables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? kCastagnoli : 0);
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

std::uint32_t crc32c_tables(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  static const Crc32cTables tables;
  const auto& t = tables.t;
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = crc ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                                    std::uint32_t{p[3]} << 24);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// SSE 4.2's CRC32 instruction computes CRC-32C, 8 bytes at a time.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  std::uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return ~crc32c_sse42(~0u, p, bytes.size());
#endif
  return ~crc32c_tables(~0u, p, bytes.size());
}

struct RecordWriter::Deflater {
  z_stream z{};
  std::vector<unsigned char> out = std::vector<unsigned char>(1 << 16);
  ~Deflater() { deflateEnd(&z); }
};

RecordWriter::RecordWriter(const std::string& path, RecordFraming framing, Compression compression, int level)
    : path_(path), framing_(framing), file_(nullptr) {
  if (level < -1 || level > 9) DTRAIN_THROW(InvalidArgument, path, ": compression level ", level, " is not in -1..9");
  if (compression != Compression::none) deflater_ = std::make_unique<Deflater>();  // before the file, which it would leak
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) DTRAIN_THROW(IoError, path, ": cannot create (", std::strerror(errno), ")");
  if (compression == Compression::none) return;
  if (deflateInit2(&deflater_->z, level, Z_DEFLATED, compression == Compression::gzip ? 15 + 16 : 15, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    deflater_.reset();
    std::fclose(file_);
    file_ = nullptr;
    DTRAIN_THROW(IoError, path, ": zlib cannot start compressing (out of memory)");
  }
}

RecordWriter::~RecordWriter() {
  if (!file_) return;
  try {
    close();  // a compressed stream is ended, so what was written can be read
  } catch (const std::exception&) {
    // A destructor cannot report it; close() does.
  }
}

void RecordWriter::deflate_out(int flush) {
  z_stream& z = deflater_->z;
  do {
    z.next_out = deflater_->out.data();
    z.avail_out = static_cast<uInt>(deflater_->out.size());
    const int rc = deflate(&z, flush);
    if (rc == Z_STREAM_ERROR) DTRAIN_THROW(IoError, path_, ": zlib could not compress");
    const std::size_t n = deflater_->out.size() - z.avail_out;
    if (n > 0 && std::fwrite(deflater_->out.data(), 1, n, file_) != n)
      DTRAIN_THROW(IoError, path_, ": write failed (", std::strerror(errno), ")");
  } while (z.avail_out == 0 || (flush == Z_FINISH && z.avail_in > 0));
}

void RecordWriter::put(const char* bytes, std::size_t n) {
  if (!deflater_) {
    if (std::fwrite(bytes, 1, n, file_) != n) DTRAIN_THROW(IoError, path_, ": write failed (", std::strerror(errno), ")");
    return;
  }
  z_stream& z = deflater_->z;
  while (n > 0) {  // zlib counts in uInt
    const auto piece = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes));
    z.avail_in = piece;
    deflate_out(Z_NO_FLUSH);
    bytes += piece;
    n -= piece;
  }
}

void RecordWriter::write(std::string_view record) {
  if (!file_) DTRAIN_THROW(IoError, path_, ": write after close");
  char head[12], tail[4];
  detail::put_le(head, record.size(), 8);
  detail::put_le(head + 8, detail::record_checksum(framing_, head, 8), 4);
  detail::put_le(tail, detail::record_checksum(framing_, record.data(), record.size()), 4);
  put(head, 12);
  put(record.data(), record.size());
  put(tail, 4);
}

void RecordWriter::flush() {
  if (!file_) DTRAIN_THROW(IoError, path_, ": flush after close");
  if (deflater_) deflate_out(Z_SYNC_FLUSH);
  if (std::fflush(file_) != 0) DTRAIN_THROW(IoError, path_, ": flush failed (", std::strerror(errno), ")");
}

void RecordWriter::close() {
  if (!file_) return;
  std::string error;
  if (deflater_) {
    try {
      deflate_out(Z_FINISH);
    } catch (const IoError& e) {
      error = e.what();
    }
    deflater_.reset();
  }
  if (std::fflush(file_) != 0 && error.empty()) error = path_ + ": flush failed (" + std::strerror(errno) + ")";
  if (std::fclose(file_) != 0 && error.empty()) error = path_ + ": close failed (" + std::strerror(errno) + ")";
  file_ = nullptr;
  if (!error.empty()) DTRAIN_THROW(IoError, error);
}

// Element <-> bytes: [u64 count] then per tensor [u64 dtype][u64 rank][u64 dims...][bytes].
std::string encode_element(const Element& element) {
  std::string out;
  detail::put_u64(out, element.size());
  for (const Tensor& t : element) {
    t.check_defined("encode_element");
    detail::put_tensor(out, t);
  }
  return out;
}

Element decode_element(const Tensor& record) {
  record.check_dtype(DType::u8, "decode_element");
  detail::ByteReader r{{static_cast<const char*>(record.raw_data()), static_cast<std::size_t>(record.numel())},
                       "decode_element"};
  const std::uint64_t count = r.u64();
  if (count > r.in.size()) DTRAIN_THROW(IoError, "decode_element: corrupt component count ", count);
  Element e;
  for (std::uint64_t i = 0; i < count; ++i) e.push_back(r.tensor());
  if (r.pos != r.in.size())
    DTRAIN_THROW(IoError, "decode_element: ", r.in.size() - r.pos, " bytes left after ", count, " components");
  return e;
}

}  // namespace dtrain::data
