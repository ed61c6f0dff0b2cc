// Config parsing: strict keys, typed values, paths in every message; and the data a config
// names, read into memory (the file sources are not streamed).
#include "dtrain/cli/config.h"

#include <algorithm>
#include <cstdlib>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>

#include "dtrain/core/rng.h"
#include "dtrain/data/idx.h"
#include "dtrain/model/compile_config.h"
#include "dtrain/model/json_reader.h"
#include "dtrain/model/serialization.h"
#include "dtrain/nn/policy.h"

namespace dtrain::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The one place a config error's message is composed: "FILE: KEY.PATH: message". An error
// that names its key path already (JsonReader's) gets the file; one from a piece built or a
// file read at `key` (a layer's or an optimizer's check, a data file's fault) gets the file
// and `key`; one that names the file already passes unchanged, so nesting never repeats the
// file and never drops the key. The error keeps its kind (InvalidArgument, IoError, ...).
[[noreturn]] void rethrow_in_file(const std::exception_ptr& error, const std::string& file, const std::string& key) {
  const std::string message = message_of(error);
  if (message.rfind(file + ": ", 0) == 0) std::rethrow_exception(error);
  rethrow_with_context(error, key.empty() || names_json_path(message, key) ? file : file + ": " + key);
}

// A new error of `Kind` about `key`, composed as above.
template <typename Kind>
[[noreturn]] void throw_in_file(const std::string& file, const std::string& key, const std::string& message) {
  rethrow_in_file(std::make_exception_ptr(Kind(message)), file, key);
}

// Runs fn; an error from it is composed as above.
template <typename Fn>
auto in_file(const std::string& file, const std::string& key, Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    rethrow_in_file(std::current_exception(), file, key);
  }
}

// Runs fn and puts the seed sequence (set_random_seed) back where it stood, so that what
// is made only to check the config (a Dropout layer draws its seed when made) leaves the
// training model's initial weights to the seed alone.
template <typename Fn>
auto drawing_no_seeds(Fn&& fn) {
  struct Restore {
    SeedSequence at = seed_sequence();
    ~Restore() { set_seed_sequence(at); }
  } restore;
  return fn();
}

// "model": the JSON Sequential::to_json writes, or the short form {"input_shape", "layers"}.
json normalized_model(const JsonReader& r) {
  r.expect_object();
  if (r.has("class_name")) return r.raw();
  r.expect_keys({"name", "input_shape", "layers"});
  json config = {{"name", r.get_string("name", "sequential")}, {"layers", r.child("layers").raw()}};
  if (r.has("input_shape")) config["input_shape"] = r.child("input_shape").raw();
  return {{"class_name", "Sequential"}, {"config", config}};
}


// ---- data sources

// A file the config names must exist when the config is read, so that a typo fails before
// any training.
void check_file(const JsonReader& at, const std::string& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) at.fail("", "no file '" + file + "'");
  if (!fs::is_regular_file(file, ec)) at.fail("", "'" + file + "' is not a regular file");
}

// A name with glob(7)'s wildcards that is not itself a file: the files it matches, sorted
// (data::Dataset::glob, as list_files finds them).
bool add_matches(const JsonReader& at, const std::string& pattern, std::vector<std::string>& files) {
  std::error_code ec;
  if (pattern.find_first_of("*?[") == std::string::npos || fs::exists(pattern, ec)) return false;
  std::vector<std::string> found;
  try {
    found = data::Dataset::glob({pattern});
  } catch (const Error&) {
    at.fail("", "'" + pattern + "' matches no file");
  }
  for (const std::string& file : found) check_file(at, file);
  files.insert(files.end(), found.begin(), found.end());
  return true;
}

// `key`: one file name, or a non-empty array of them; a name may be a glob pattern
// ("train-*.tfrecord"), which gives the files it matches in sorted order.
std::vector<std::string> files_at(const JsonReader& d, const std::string& key) {
  const JsonReader f = d.child(key);
  std::vector<std::string> files;
  if (f.raw().is_string()) {
    if (add_matches(f, f.raw().get<std::string>(), files)) return files;
    files.push_back(f.raw().get<std::string>());
    check_file(f, files.back());
    return files;
  }
  if (!f.raw().is_array() || f.raw().empty())
    f.fail("", "expected a file name or a non-empty array of file names, got " + f.raw().dump());
  for (std::size_t i = 0; i < f.size(); ++i) {
    const JsonReader e = f.element(i);
    if (!e.raw().is_string()) e.fail("", "expected a file name, got " + e.raw().dump());
    if (add_matches(e, e.raw().get<std::string>(), files)) continue;
    files.push_back(e.raw().get<std::string>());
    check_file(e, files.back());
  }
  return files;
}

std::string one_file_at(const JsonReader& d, const std::string& key) {
  const std::string file = d.get_string(key);
  check_file(d.child(key), file);
  return file;
}

// The fields of a CSV line, trimmed as data::Dataset::csv trims them.
std::vector<std::string> csv_fields(const std::string& line, char delimiter) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = line.find(delimiter, start);
    const std::string f = line.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::size_t first = f.find_first_not_of(" \t"), last = f.find_last_not_of(" \t\r");
    fields.push_back(first == std::string::npos ? "" : f.substr(first, last - first + 1));
    if (end == std::string::npos) return fields;
    start = end + 1;
  }
}

// The columns the config names must be in every file: by header name, or by 0-based
// index as text (as CsvOptions reads them). Checked on each file's first line, so that a
// misspelt column fails when the config is read.
void check_csv_columns(const JsonReader& d, const std::string& key, const std::vector<std::string>& files,
                       const data::CsvOptions& o) {
  for (const std::string& file : files) {
    std::ifstream in(file);
    std::string line;
    bool found = false;
    for (bool first = true; !found && std::getline(in, line); first = false) {
      if (first && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);  // a UTF-8 byte order mark
      found = line.find_first_not_of(" \t\r") != std::string::npos;
    }
    if (!found) d.fail(key, "'" + file + "' has no lines");
    if (const auto cr = line.find('\r'); cr != std::string::npos && cr + 1 < line.size())
      d.fail(key, "'" + file + "' ends its lines in a carriage return alone; dtrain reads LF or CRLF line endings");
    const std::vector<std::string> names = csv_fields(line, o.delimiter);
    auto check = [&](const std::string& column_key, const std::string& column) {
      if (o.header && std::find(names.begin(), names.end(), column) != names.end()) return;
      std::size_t index = 0;
      const auto [end, ec] = std::from_chars(column.data(), column.data() + column.size(), index);
      if (!column.empty() && ec == std::errc() && end == column.data() + column.size() && index < names.size()) return;
      std::string known;
      if (o.header) {
        // A wide file's header is cut short: the first names are enough to spot a typo.
        for (std::size_t i = 0; i < names.size() && i < 12; ++i) known += (i ? ", " : "") + names[i];
        if (names.size() > 12) known += ", ... (" + std::to_string(names.size()) + " columns)";
        known = "its columns: " + known;
      } else {
        known = "it has no header; its " + std::to_string(names.size()) + " columns are named by 0-based index";
      }
      d.fail(column_key, "no column '" + column + "' in " + file + " (" + known + ")");
    };
    check("label_column", o.label_column);
    for (const std::string& column : o.select_columns) check("select_columns", column);
  }
}

// "checkpoint": {"dir": "...", "every": N or "epoch", "keep": false}.
CheckpointConfig checkpoint_from(const JsonReader& k) {
  k.expect_object();
  k.expect_keys({"dir", "every", "keep"});
  CheckpointConfig cc;
  cc.dir = k.get_string("dir");
  if (cc.dir.empty()) k.fail("dir", "must name a folder to save the checkpoints in");
  if (k.has("every")) {
    const json& v = k.raw()["every"];
    if (v.is_string() && v.get<std::string>() == "epoch") cc.every = 0;
    else if (v.is_number_integer() && k.get_int("every") >= 1) cc.every = k.get_int("every");
    else k.fail("every", "expected a number of training batches (1 or more) or \"epoch\", got " + v.dump());
  }
  cc.keep = k.get_bool("keep", false);
  return cc;
}

PipelineConfig pipeline_from(const JsonReader& p) {
  p.expect_keys({"cache", "shuffle", "prefetch", "drop_remainder"});
  PipelineConfig pc;
  pc.cache = p.get_bool("cache", false);
  pc.shuffle = p.get_int("shuffle", 0);
  pc.drop_remainder = p.get_bool("drop_remainder", false);
  if (p.has("prefetch")) {
    const auto& v = p.raw()["prefetch"];
    if (v.is_string() && v.get<std::string>() == "autotune") pc.prefetch = data::AUTOTUNE;
    else if (v.is_number_integer() && v.get<std::int64_t>() >= 0) pc.prefetch = v.get<std::int64_t>();
    else p.fail("prefetch", "expected \"autotune\" or a buffer size >= 0, got " + v.dump());
  }
  if (pc.shuffle < 0) p.fail("shuffle", "must be a buffer size >= 0 (0 = no shuffling)");
  return pc;
}

// "data": each source takes its own keys; a key of another source is an error.
DataConfig data_from(const JsonReader& d) {
  DataConfig c;
  c.source = d.get_string("source", "synthetic");
  if (c.source == "synthetic")
    d.expect_keys({"source", "samples", "test_samples", "features", "classes", "labels", "pipeline"});
  else if (c.source == "fashion_mnist")
    d.expect_keys({"source", "path", "pipeline"});
  else if (c.source == "csv")
    d.expect_keys({"source", "train", "test", "label_column", "header", "delimiter", "select_columns", "allow_non_finite",
                   "pipeline"});
  else if (c.source == "idx")
    d.expect_keys({"source", "train_images", "train_labels", "test_images", "test_labels", "pipeline"});
  else if (c.source == "records")
    d.expect_keys({"source", "train", "test", "pipeline"});
  else if (c.source == "tfrecord")
    d.expect_keys({"source", "train", "test", "compression", "features", "x", "y", "pipeline"});
  else if (c.source == "text")
    d.expect_keys({"source", "files", "length", "bytes", "held_out", "tokenizer", "pipeline"});
  else
    d.fail("source", "expected \"synthetic\", \"fashion_mnist\", \"csv\", \"idx\", \"records\", \"tfrecord\" or \"text\", got \"" +
                         c.source + "\"");
  if (d.has("pipeline")) c.pipeline = pipeline_from(d.child("pipeline"));

  if (c.source == "fashion_mnist") c.path = d.get_string("path", "");
  if (c.source == "synthetic") {
    c.samples = d.get_int("samples", c.samples);
    c.test_samples = d.get_int("test_samples", 0);
    c.features = d.get_int("features", c.features);
    c.classes = d.get_int("classes", c.classes);
    const std::string labels = d.get_string("labels", "random");
    if (labels == "teacher") c.labels = data::SyntheticLabels::teacher;
    else if (labels != "random") d.fail("labels", "expected \"random\" or \"teacher\", got \"" + labels + "\"");
    if (c.samples <= 0 || c.features <= 0 || c.classes <= 0 || c.test_samples < 0)
      d.fail("", "samples, features and classes must be positive and test_samples >= 0");
  }
  if (c.source == "csv") {
    c.csv.label_column = d.get_string("label_column");
    c.csv.header = d.get_bool("header", true);
    c.csv.allow_non_finite = d.get_bool("allow_non_finite", false);
    const std::string delimiter = d.get_string("delimiter", ",");
    if (delimiter.size() != 1) d.fail("delimiter", "expected one character, got \"" + delimiter + "\"");
    c.csv.delimiter = delimiter[0];
    if (d.has("select_columns")) {
      const JsonReader s = d.child("select_columns");
      s.expect_array();
      if (s.size() == 0) s.fail("", "expected at least one column (leave the key out to keep every column)");
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (!s.raw()[i].is_string()) s.element(i).fail("", "expected a column name or a 0-based index as text");
        c.csv.select_columns.push_back(s.raw()[i].get<std::string>());
      }
      for (const std::string& column : c.csv.select_columns)
        if (column == c.csv.label_column) s.fail("", "holds the label column '" + column + "'");
    }
    c.train_files = files_at(d, "train");
    check_csv_columns(d, "train", c.train_files, c.csv);
    if (d.has("test")) {
      c.test_files = files_at(d, "test");
      check_csv_columns(d, "test", c.test_files, c.csv);
    }
  }
  if (c.source == "idx") {
    c.train_files = {one_file_at(d, "train_images"), one_file_at(d, "train_labels")};
    if (d.has("test_images") || d.has("test_labels")) {
      for (const char* key : {"test_images", "test_labels"})
        if (!d.has(key)) d.fail(key, "is required with the other test file (give test_images and test_labels, or neither)");
      c.test_files = {one_file_at(d, "test_images"), one_file_at(d, "test_labels")};
    }
  }
  if (c.source == "records" || c.source == "tfrecord") {
    c.train_files = files_at(d, "train");
    if (d.has("test")) c.test_files = files_at(d, "test");
  }
  if (c.source == "tfrecord") {
    const std::string compression = d.get_string("compression", "");
    try {
      c.compression = data::compression_named(compression, "compression");
    } catch (const InvalidArgument&) {
      d.fail("compression", "expected \"\", \"ZLIB\" or \"GZIP\", got \"" + compression + "\"");
    }
    const JsonReader features = d.child("features");
    if (!features.raw().is_object()) features.fail("", "expected an object of feature specs, got " + features.raw().dump());
    const auto spec_of = [&](const char* role) {
      const std::string name = d.get_string(role);
      if (!features.has(name)) d.fail(role, "names the feature \"" + name + "\", which data.features does not give");
      const JsonReader f = features.child(name);
      f.expect_keys({"type", "shape", "dtype", "default", "decode_raw"});
      data::FeatureSpec spec;
      spec.key = name;
      const std::string type = f.get_string("type", "fixed_len");
      if (type != "fixed_len") f.fail("type", "must be \"fixed_len\" (a row and a label have one shape), got \"" + type + "\"");
      std::vector<std::int64_t> dims;
      if (f.has("shape")) {
        const JsonReader shape = f.child("shape");
        if (!shape.raw().is_array()) shape.fail("", "expected an array of sizes, got " + shape.raw().dump());
        for (std::size_t i = 0; i < shape.size(); ++i) {
          const JsonReader e = shape.element(i);
          if (!e.raw().is_number_integer() || e.raw().get<std::int64_t>() < 0) e.fail("", "expected a size, got " + e.raw().dump());
          dims.push_back(e.raw().get<std::int64_t>());
        }
      }
      spec.shape = Shape(dims);
      const std::string dtype = f.get_string("dtype", "float32");
      if (dtype == "float32") spec.dtype = DType::f32;
      else if (dtype == "int64") spec.dtype = DType::i32;
      else if (dtype == "string") spec.dtype = DType::string;
      else f.fail("dtype", "must be \"float32\", \"int64\" or \"string\", got \"" + dtype + "\"");
      if (f.has("default")) {
        if (spec.dtype == DType::string) f.fail("default", "is for number features");
        const double v = f.get_number("default");
        spec.default_value = spec.dtype == DType::f32
                                 ? Tensor::full(spec.shape, static_cast<float>(v))
                                 : Tensor::full(spec.shape, static_cast<float>(v)).astype(DType::i32);
      }
      if (f.has("decode_raw")) {
        const std::string raw = f.get_string("decode_raw");
        if (spec.dtype != DType::string) f.fail("decode_raw", "is for a string feature (\"dtype\": \"string\")");
        if (std::string_view(role) != "x") f.fail("decode_raw", "is for the x feature");
        if (raw == "uint8") c.x_decode_raw = DType::u8;
        else if (raw == "int32") c.x_decode_raw = DType::i32;
        else if (raw == "float32") c.x_decode_raw = DType::f32;
        else f.fail("decode_raw", "must be \"uint8\", \"int32\" or \"float32\", got \"" + raw + "\"");
      } else if (spec.dtype == DType::string) {
        f.fail("dtype", "a string feature needs \"decode_raw\" (its bytes' type) to be trained on");
      }
      return spec;
    };
    c.x_feature = spec_of("x");
    c.y_feature = spec_of("y");
    if (c.y_feature.shape.numel() != 1) features.child(c.y_feature.key).fail("shape", "a label has one value (shape [])");
  }
  if (c.source == "text") {
    c.train_files = files_at(d, "files");
    c.text_length = d.get_int("length", 64);
    if (c.text_length <= 0) d.fail("length", "must be a positive number of bytes, got " + std::to_string(c.text_length));
    c.text_bytes = d.get_int("bytes", -1);
    if (c.text_bytes == 0 || c.text_bytes < -1) d.fail("bytes", "must be positive (leave it out for whole files)");
    c.held_out = d.get_number("held_out", 0.1);
    if (!(c.held_out >= 0.0 && c.held_out < 1.0)) d.fail("held_out", "must be in [0, 1)");
    if (d.has("tokenizer")) {
      const JsonReader t = d.child("tokenizer");
      t.expect_keys({"type", "vocab_size", "model_type", "model"});
      c.tokenizer.type = t.get_string("type");
      if (c.tokenizer.type != "sentencepiece") t.fail("type", "must be \"sentencepiece\", got \"" + c.tokenizer.type + "\"");
      const std::int64_t vocab = t.get_int("vocab_size");
      if (vocab < 2 || vocab > 1000000) t.fail("vocab_size", "must be in [2, 1000000], got " + std::to_string(vocab));
      c.tokenizer.vocab_size = static_cast<int>(vocab);
      c.tokenizer.model_type = t.get_string("model_type", "unigram");
      if (c.tokenizer.model_type != "unigram" && c.tokenizer.model_type != "bpe" && c.tokenizer.model_type != "char" &&
          c.tokenizer.model_type != "word")
        t.fail("model_type", "must be \"unigram\", \"bpe\", \"char\" or \"word\", got \"" + c.tokenizer.model_type + "\"");
      c.tokenizer.model = t.get_string("model", "");
    }
  }
  return c;
}

bool is_file_source(const std::string& source) {
  return source == "csv" || source == "idx" || source == "records" || source == "tfrecord";
}

// The config key that names a split's files, for messages.
std::string files_key(const DataConfig& d, bool test) {
  if (d.source == "idx") return test ? "data.test_images" : "data.train_images";
  return test ? "data.test" : "data.train";
}

// The model's output for one row of shape `row`, from its layers' shapes: no weight is
// built. Throws the first layer's InvalidArgument that does not take its input.
Shape output_shape(const RunConfig& c, const Shape& row) {
  DTRAIN_CHECK(c.unbuilt_model != nullptr, "a RunConfig from load_config");
  return c.unbuilt_model->output_shape(row);
}

// The number of classes the model's output tells apart for rows of shape `row` (which the
// model takes: check_model_fits_data said so); nullopt where its output is not [1, N].
std::optional<std::int64_t> model_classes(const RunConfig& c, const Shape& row) {
  const Shape out = output_shape(c, row);
  if (out.rank() == 2) return out[1];
  return std::nullopt;
}

// A split's rows as they are read.
struct Rows {
  bool classes = true;   // the labels are class numbers, else values to regress on
  // The number of classes a label must be below (nullopt: no bound); a label out of range
  // is reported with its file and row.
  std::optional<std::int64_t> class_count;
  std::vector<float> x;  // row-major, row_shape->numel() values per row
  std::vector<double> y;
  std::optional<Shape> row_shape;  // the first row's
  std::string first_file;          // where the first row came from
};

// Every row of a split has the first row's shape, and a finite label: a class number
// (0, 1, ...) for a classifier.
void add_row(Rows& rows, const Tensor& x, double y, const std::string& file, const std::string& where) {
  if (!std::isfinite(y)) DTRAIN_THROW(IoError, where, ": the label ", y, " is not a finite number");
  if (rows.classes && (y != std::floor(y) || y < 0 || y > INT32_MAX))
    DTRAIN_THROW(IoError, where, ": the label ", y, " is not a class number (0, 1, ...); with the loss \"mse\" labels ",
                 "are values to regress on");
  if (!rows.row_shape) {
    rows.row_shape = x.shape();
    rows.first_file = file;
  } else if (x.shape() != *rows.row_shape) {
    DTRAIN_THROW(IoError, where, ": features of shape ", x.shape().to_string(), ", but the rows of ", rows.first_file,
                 " have ", rows.row_shape->to_string());
  }
  if (rows.classes && rows.class_count && y >= static_cast<double>(*rows.class_count))
    DTRAIN_THROW(IoError, where, ": the label ", y, " is not a class number below ", *rows.class_count,
                 ", the width of the model's output");
  const std::vector<float> values = x.to_vector();
  rows.x.insert(rows.x.end(), values.begin(), values.end());
  rows.y.push_back(y);
}

std::string element_types(const data::Element& e) {
  std::string out;
  for (const Tensor& t : e) out += (out.empty() ? "" : ", ") + std::string(dtype_name(t.dtype())) + " " + t.shape().to_string();
  return "(" + out + ")";
}

// Up to `limit` rows (-1: all) of one CSV file.
void read_csv(const std::string& file, const data::CsvOptions& o, std::int64_t limit, Rows& rows) {
  data::Iterator it = data::Dataset::csv({file}, o).make_iterator();
  for (std::int64_t i = 0; limit < 0 || i < limit; ++i) {
    const std::optional<data::Element> e = it.next();
    if (!e) return;
    add_row(rows, (*e)[0], (*e)[1].item(), file, file + ": row " + std::to_string(i + 1));
  }
}

// Up to `limit` records (-1: all) of one record file, each encode_element({features, label}).
void read_records(const std::string& file, std::int64_t limit, Rows& rows) {
  data::Iterator it = data::Dataset::records({file}).make_iterator();
  for (std::int64_t i = 0; limit < 0 || i < limit; ++i) {
    const std::optional<data::Element> record = it.next();
    if (!record) return;
    const std::string where = file + ": record " + std::to_string(i);
    data::Element e;
    try {
      e = data::decode_element((*record)[0]);
    } catch (...) {
      rethrow_with_context(std::current_exception(), where);
    }
    if (e.size() != 2 || e[0].shape().rank() < 1 || e[1].shape().rank() != 0)
      DTRAIN_THROW(IoError, where, ": expected (features, scalar label), got ", element_types(e));
    const double label = e[1].dtype() == DType::i32 ? e[1].data<std::int32_t>()[0] : e[1].item();
    add_row(rows, e[0], label, file, where);
  }
}

// A TFRecord file of tf.train.Example: x and y parsed as the config's features give them.
void read_tfrecord(const DataConfig& d, const std::string& file, std::int64_t limit, Rows& rows) {
  data::Iterator it = data::Dataset::tfrecord({file}, d.compression).make_iterator();
  const std::vector<data::FeatureSpec> specs{d.x_feature, d.y_feature};
  for (std::int64_t i = 0; limit < 0 || i < limit; ++i) {
    const std::optional<data::Element> record = it.next();
    if (!record) return;
    const std::string where = file + ": record " + std::to_string(i);
    std::vector<data::ParsedFeature> parsed;
    try {
      parsed = data::parse_examples((*record)[0], specs);
    } catch (...) {
      rethrow_with_context(std::current_exception(), where);
    }
    Tensor x = parsed[0].values;
    if (d.x_decode_raw) {
      try {
        x = data::decode_raw(x, *d.x_decode_raw);
      } catch (...) {
        rethrow_with_context(std::current_exception(), where + ": feature '" + d.x_feature.key + "'");
      }
    }
    if (x.dtype() != DType::f32) x = x.astype(DType::f32);
    if (x.rank() == 0) x = x.reshape(Shape{1});
    const Tensor& y = parsed[1].values;
    const double label = y.dtype() == DType::i32 ? y.data<std::int32_t>()[0] : y.data<float>()[0];
    add_row(rows, x, label, file, where);
  }
}

// Up to `limit` rows (-1: all) of a csv, records or tfrecord split, its files in order.
Rows read_rows(const DataConfig& d, const std::vector<std::string>& files, std::int64_t limit, bool classes,
               std::optional<std::int64_t> class_count = std::nullopt) {
  Rows rows;
  rows.classes = classes;
  rows.class_count = class_count;
  for (const std::string& file : files) {
    const std::int64_t left = limit < 0 ? -1 : limit - static_cast<std::int64_t>(rows.y.size());
    if (left == 0) break;
    if (d.source == "csv") read_csv(file, d.csv, left, rows);
    else if (d.source == "tfrecord") read_tfrecord(d, file, left, rows);
    else read_records(file, left, rows);
  }
  if (rows.y.empty()) {
    std::string names;
    for (const std::string& f : files) names += (names.empty() ? "" : ", ") + f;
    DTRAIN_THROW(IoError, names, (files.size() > 1 ? " hold" : " holds"), " no rows");
  }
  return rows;
}

// A regression (the loss mse) takes its labels as values; the other losses, as classes.
// The loss's name, given alone or as {"name": ...}; "" where it names none.
std::string loss_name(const RunConfig& c) {
  const json& loss = c.loss_json;
  const json name = loss.is_object() && loss.contains("name") ? loss["name"] : loss;
  return name.is_string() ? name.get<std::string>() : "";
}

bool regression(const RunConfig& c) {
  const std::string name = loss_name(c);
  return name == "mse" || name == "mean_squared_error";
}

data::Split to_split(const Rows& rows, bool integer_labels) {
  const auto n = static_cast<std::int64_t>(rows.y.size());
  std::vector<std::int64_t> dims{n};
  for (std::int64_t e : rows.row_shape->dims()) dims.push_back(e);
  data::Split s;
  s.x = Tensor::from_vector(Shape(dims), std::span<const float>(rows.x));
  if (integer_labels) {
    std::vector<std::int32_t> y(rows.y.size());
    std::transform(rows.y.begin(), rows.y.end(), y.begin(), [](double v) { return static_cast<std::int32_t>(v); });
    s.y = Tensor::from_vector(Shape{n}, std::span<const std::int32_t>(y));
  } else {
    // Regression targets [rows, 1]: the shape of a one-unit output, which mse compares
    // them with element by element.
    std::vector<float> y(rows.y.begin(), rows.y.end());
    s.y = Tensor::from_vector(Shape{n, 1}, std::span<const float>(y));
  }
  return s;
}

Shape row_shape_of(const Tensor& x) {
  return Shape(std::vector<std::int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
}

// An IDX split: each file's errors under its own key, the labels checked against
// `classes` (nullopt: no bound).
data::Split read_idx(const RunConfig& c, bool test, std::optional<std::int64_t> classes) {
  const std::vector<std::string>& files = test ? c.data.test_files : c.data.train_files;
  const std::string images_key = files_key(c.data, test);
  data::Split s;
  s.x = in_file(c.file, images_key, [&] { return data::read_idx_images(files[0]); });
  s.y = in_file(c.file, test ? "data.test_labels" : "data.train_labels",
                [&] { return classes ? data::read_idx_labels(files[1], *classes) : data::read_idx_labels(files[1]); });
  if (s.x.dim(0) != s.y.dim(0))
    throw_in_file<IoError>(c.file, images_key,
                           files[0] + " holds " + std::to_string(s.x.dim(0)) + " images but " + files[1] + " holds " +
                               std::to_string(s.y.dim(0)) + " labels");
  return s;
}

// A file source's splits, read once each. `row`: the shape of the first training row
// (input_shape), which the model was checked against; a label must be below the classes
// the model's output tells apart for it.
data::Classification load_files(const RunConfig& c, const Shape& row) {
  const DataConfig& d = c.data;
  const bool has_test = !d.test_files.empty();
  const std::optional<std::int64_t> classes = model_classes(c, row);
  data::Classification out;
  if (d.source == "idx") {
    out.train = read_idx(c, false, classes);
    if (has_test) out.test = read_idx(c, true, classes);
  } else {
    const bool class_labels = !regression(c);
    auto read = [&](bool test) {
      return in_file(c.file, files_key(d, test),
                     [&] { return read_rows(d, test ? d.test_files : d.train_files, -1, class_labels, classes); });
    };
    const Rows train = read(false);
    const Rows test = has_test ? read(true) : Rows{};
    out.train = to_split(train, class_labels);
    if (has_test) out.test = to_split(test, class_labels);
  }
  // An empty split is found out now, not after training (the test split's evaluation).
  for (const bool test : {false, true}) {
    const std::vector<std::string>& files = test ? d.test_files : d.train_files;
    if (const data::Split& s = test ? out.test : out.train; s.x.defined() && s.x.dim(0) == 0)
      throw_in_file<InvalidArgument>(
          c.file, files_key(d, test),
          (files.size() == 1 || d.source == "idx" ? files[0] + " holds" : "its " + std::to_string(files.size()) + " files hold") +
              " no samples" + (test ? " (leave the test files out to train without a test split)" : ""));
  }
  if (row_shape_of(out.train.x).numel() == 0)
    throw_in_file<InvalidArgument>(c.file, files_key(d, false),
                                   "the rows of " + d.train_files[0] + " have shape " +
                                       row_shape_of(out.train.x).to_string() + ": no features to train on");
  if (has_test && row_shape_of(out.test.x) != row_shape_of(out.train.x))
    throw_in_file<InvalidArgument>(c.file, files_key(d, true),
                                   "the rows of " + d.test_files[0] + " have shape " + row_shape_of(out.test.x).to_string() +
                                       ", but those of " + d.train_files[0] + " (" + files_key(d, false) + ") have " +
                                       row_shape_of(out.train.x).to_string());
  if (out.train.y.dtype() == DType::i32) {
    std::int64_t largest = -1;
    for (const data::Split* s : {&out.train, &out.test})
      if (s->y.defined())
        for (std::int64_t i = 0; i < s->y.numel(); ++i)
          largest = std::max<std::int64_t>(largest, s->y.data<std::int32_t>()[i]);
    out.classes = largest + 1;
  }
  return out;
}

// The config key of the input shape the model declares, for messages.
std::string input_shape_key(const RunConfig& c) {
  const bool given = c.model_json.at("config").contains("input_shape");
  return c.model_config_path + (given ? ".input_shape" : ".build_input_shape");
}

// What the model alone must satisfy, before any data is read: at least one layer, and
// layers that take the input shape it declares.
void check_model(const RunConfig& c) {
  const std::string layers_key = c.model_config_path + ".layers";
  if (c.unbuilt_model->layers.empty()) throw_in_file<InvalidArgument>(c.file, layers_key, "expected at least one layer, got []");
  if (!c.model_input_shape) return;
  try {
    output_shape(c, *c.model_input_shape);
  } catch (const InvalidArgument& e) {
    throw_in_file<InvalidArgument>(c.file, layers_key,
                                   "for rows of shape " + c.model_input_shape->to_string() + " (" + input_shape_key(c) +
                                       "): " + e.what());
  }
}

}  // namespace

void check_model_fits_data(const RunConfig& c, const Shape& row) {
  const std::string& at = c.model_config_path;
  const std::string data = "the data (" + c.data.source + ")";
  if (c.data.source == "text") {
    // A language model: a distribution over the 256 byte values at every position.
    Shape out;
    try {
      out = output_shape(c, row);
    } catch (const InvalidArgument& e) {
      throw_in_file<InvalidArgument>(c.file, at + ".layers", "for " + data + "'s windows of shape " + row.to_string() +
                                                                 ": " + e.what());
    }
    if (loss_name(c) != "sparse_categorical_crossentropy")
      throw_in_file<InvalidArgument>(c.file, "loss", "the text source's targets are the next bytes (class numbers); "
                                                     "use sparse_categorical_crossentropy");
    const bool tokens = !c.data.tokenizer.type.empty();
    const std::string classes = tokens ? std::to_string(c.data.tokenizer.vocab_size) : "256";
    if (out.rank() != 3 || out[1] != row[0] || out[2] < (tokens ? c.data.tokenizer.vocab_size : 256))
      throw_in_file<InvalidArgument>(c.file, at + ".layers",
                                     "a language model over " + data + " gives [1, " + std::to_string(row[0]) + ", " +
                                         classes + "] (a score for each " + (tokens ? "token" : "byte value") +
                                         " at each position) for one window; this model gives " + out.to_string());
    return;
  }
  if (c.model_input_shape && *c.model_input_shape != row)
    throw_in_file<InvalidArgument>(c.file, input_shape_key(c),
                                   "the model takes rows of shape " + c.model_input_shape->to_string() + ", but " + data +
                                       " has rows of shape " + row.to_string());
  Shape out;
  try {
    out = output_shape(c, row);
  } catch (const InvalidArgument& e) {
    throw_in_file<InvalidArgument>(c.file, at + ".layers",
                                   "for " + data + "'s rows of shape " + row.to_string() + ": " + e.what());
  }
  const std::size_t last = c.unbuilt_model->output_layer();
  const bool dense = dynamic_cast<const nn::Dense*>(c.unbuilt_model->layers[last].get()) != nullptr;
  const std::string last_key =
      at + ".layers[" + std::to_string(c.unbuilt_model->json_index[last]) + "]" + (dense ? ".config.units" : "");
  if (c.data.source != "synthetic" && c.data.source != "fashion_mnist") {
    // A file gives each row one label: a class number, checked as the files are read, or
    // under mse the one value to regress on, which one output per row must meet.
    if (regression(c) && !(out.rank() == 2 && out[1] == 1))
      throw_in_file<InvalidArgument>(c.file, last_key,
                                     "the loss mse regresses the one label value each row of " + data +
                                         " has, but the model's output has shape " + out.to_string() +
                                         " for one row: it needs [1, 1] (end with a Dense of 1 unit)");
    return;
  }
  const std::int64_t classes = c.data.source == "synthetic" ? c.data.classes : 10;
  const std::string where = c.data.source == "synthetic" ? " (data.classes)" : " (Fashion-MNIST)";
  const std::string loss = loss_name(c);
  if (regression(c) || loss == "categorical_crossentropy")
    throw_in_file<InvalidArgument>(c.file, "loss",
                                   loss + " needs " + (loss == "categorical_crossentropy" ? "one-hot labels" : "values to regress on") +
                                       ", but " + data + " has labels that are class numbers; use sparse_categorical_crossentropy");
  if (out.rank() != 2)
    throw_in_file<InvalidArgument>(c.file, last_key,
                                   "the model's output has shape " + out.to_string() +
                                       " for one row; a classifier's must be [1, classes] (end with a Flatten or a Dense)");
  if (out[1] < classes)
    throw_in_file<InvalidArgument>(c.file, last_key,
                                   "the last layer gives " + std::to_string(out[1]) + " outputs per row, but " + data +
                                       " has " + std::to_string(classes) + " classes" + where + ": it needs at least " +
                                       std::to_string(classes) + " units");
}

void check_strategy(const std::string& strategy, int replicas) {
  if (strategy != "default" && strategy != "one_device" && strategy != "mirrored" && strategy != "multi_worker" &&
      strategy != "parameter_server")
    DTRAIN_THROW(InvalidArgument, "expected \"default\", \"one_device\", \"mirrored\", \"multi_worker\" or ",
                 "\"parameter_server\", got \"", strategy, "\"");
  if (replicas > 0 && strategy != "mirrored" && strategy != "multi_worker")
    DTRAIN_THROW(InvalidArgument, "replicas ", replicas, " needs strategy \"mirrored\" or \"multi_worker\", not \"",
                 strategy, "\"");
}

nlohmann::json read_json_file(const std::string& path, const std::string& unreadable) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) DTRAIN_THROW(IoError, unreadable, ": ", path, " is a folder");
  std::ifstream in(path);
  if (!in) DTRAIN_THROW(IoError, unreadable);
  return nlohmann::json::parse(in, json_depth_limit(path), /*allow_exceptions=*/false);
}

RunConfig load_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) DTRAIN_THROW(IoError, path, ": is a folder, not a config file");
  std::ifstream in(path);
  if (!in) DTRAIN_THROW(IoError, path, ": cannot open the config file");
  std::stringstream buf;
  buf << in.rdbuf();
  const json doc = parse_json(buf.str(), path);
  RunConfig c;
  c.file = path;
  in_file(path, "", [&] {
    const JsonReader r(doc, "");
    r.expect_keys({"model", "loss", "optimizer", "metrics", "data", "epochs", "batch_size", "seed", "threads",
                   "validation_split", "shuffle", "verbose", "dtype_policy", "strategy", "replicas",
                   "gradient_accumulation_steps", "terminate_on_nan", "checkpoint"});
    c.model_json = normalized_model(r.child("model"));
    if (!r.child("model").has("class_name")) c.model_config_path = "model";
    c.loss_json = r.child("loss").raw();
    c.optimizer_json = r.has("optimizer") ? r.child("optimizer").raw() : json("adam");
    if (r.has("metrics")) {
      const JsonReader m = r.child("metrics");
      m.expect_array();
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (!m.raw()[i].is_string()) m.element(i).fail("", "expected a metric name, got " + m.raw()[i].dump());
        c.metrics.push_back(m.raw()[i].get<std::string>());
        try {
          metrics::get(c.metrics.back());
        } catch (const InvalidArgument& e) {
          m.element(i).fail("", e.what());
        }
      }
    }
    if (r.has("data")) c.data = data_from(r.child("data"));
    c.epochs = r.get_int32("epochs", 1, 0, 1'000'000);
    c.batch_size = r.get_int("batch_size", 32);
    const std::int64_t seed = r.get_int("seed", 0);
    if (seed < 0) r.fail("seed", "must be >= 0");
    c.seed = static_cast<std::uint64_t>(seed);
    c.threads = r.get_int32("threads", 0, 0, 4096);
    c.validation_split = r.get_number("validation_split", 0.0);
    c.shuffle = r.get_bool("shuffle", true);
    c.verbose = r.get_int32("verbose", -1, -1, 2);
    c.dtype_policy = r.get_string("dtype_policy", "");
    if (!c.dtype_policy.empty()) {
      try {
        nn::dtype_policy(c.dtype_policy);
      } catch (const InvalidArgument& e) {
        r.fail("dtype_policy", e.what());
      }
    }
    c.strategy = r.get_string("strategy", "default");
    c.replicas = r.get_int32("replicas", 0, 0, 4096);
    c.gradient_accumulation_steps = r.get_int32("gradient_accumulation_steps", 1, 1, 1'000'000);
    c.terminate_on_nan = r.get_bool("terminate_on_nan", true);
    if (r.has("checkpoint")) c.checkpoint = checkpoint_from(r.child("checkpoint"));
    try {
      check_strategy(c.strategy, c.replicas);
    } catch (const InvalidArgument& e) {
      const bool replicas_wrong = c.replicas > 0 && c.strategy != "mirrored" && c.strategy != "multi_worker";
      r.fail(replicas_wrong ? "replicas" : "strategy", e.what());
    }
    if (c.batch_size <= 0 || c.batch_size > (std::int64_t{1} << 31)) r.fail("batch_size", "must be in [1, 2^31]");
    if (!(c.validation_split >= 0 && c.validation_split < 1)) r.fail("validation_split", "must be in [0, 1)");
    if (c.data.pipeline && c.validation_split > 0)
      r.fail("validation_split", "cannot be combined with data.pipeline; the pipeline trains on the whole training split");
    // Make the pieces now, so that every error in them surfaces before training: the model's
    // layers once and unbuilt (no weights, no seed drawn), kept for the checks against the
    // data, which load_data makes (summary reads no data where the model declares its input).
    UnbuiltModel m = in_file(c.file, "model", [&] {
      return drawing_no_seeds(
          [&] { return unbuilt_model_from_json(c.model_json, c.model_path, c.dtype_policy, c.model_config_path); });
    });
    c.model_input_shape = m.input_shape;
    c.unbuilt_model = std::make_shared<const UnbuiltModel>(std::move(m));
    build_loss(c);
    build_optimizer(c);
    check_model(c);
    return 0;
  });
  return c;
}

std::unique_ptr<Model> build_model(const RunConfig& c) {
  return in_file(c.file, "model", [&] {
    return model_from_json(c.model_json, c.model_path, c.dtype_policy, c.model_config_path);
  });
}

std::shared_ptr<losses::Loss> build_loss(const RunConfig& c) {
  return in_file(c.file, "loss", [&] { return loss_from_json(c.loss_json, "loss"); });
}

std::shared_ptr<optim::Optimizer> build_optimizer(const RunConfig& c) {
  return in_file(c.file, "optimizer", [&] { return optimizer_from_json(c.optimizer_json, "optimizer"); });
}

data::Dataset build_pipeline(const RunConfig& c, const data::Split& train) {
  const PipelineConfig& p = *c.data.pipeline;
  data::Dataset ds = data::Dataset::from_tensor_slices({train.x, train.y});
  if (p.cache) ds = ds.cache();
  if (p.shuffle > 0) ds = ds.shuffle(p.shuffle, c.seed);
  ds = ds.batch(c.batch_size, p.drop_remainder);
  if (p.prefetch != 0) ds = ds.prefetch(p.prefetch);
  return ds;
}

data::Classification load_data(const RunConfig& c) {
  // The model against the data before any is read whole: a file source's row shape comes
  // from its first row (an IDX file's header).
  const Shape row = input_shape(c);
  check_model_fits_data(c, row);
  if (c.data.source == "fashion_mnist") return data::load_fashion_mnist(c.data.path);
  if (is_file_source(c.data.source)) return load_files(c, row);
  if (c.data.source == "text" && !c.data.tokenizer.type.empty()) {
    const DataConfig::Tokenizer& t = c.data.tokenizer;
    return in_file(c.file, "data.tokenizer", [&] {
      return data::token_windows(c.data.train_files, c.data.text_length, c.data.text_bytes, c.data.held_out,
                                 [&](const data::Dataset& lines) {
                                   if (!t.model.empty() && std::filesystem::exists(t.model)) {
                                     data::SentencePiece sp = data::SentencePiece::load(t.model);
                                     if (sp.vocab_size() != t.vocab_size)
                                       DTRAIN_THROW(InvalidArgument, t.model, " holds a vocabulary of ", sp.vocab_size(),
                                                    " pieces where vocab_size is ", t.vocab_size);
                                     return sp;
                                   }
                                   data::SentencePiece sp = data::SentencePiece::train(
                                       lines, {.vocab_size = t.vocab_size, .model_type = t.model_type});
                                   if (!t.model.empty()) sp.save(t.model);
                                   return sp;
                                 });
    });
  }
  if (c.data.source == "text")
    return in_file(c.file, "data.files", [&] {
      return data::text_windows(c.data.train_files, c.data.text_length, c.data.text_bytes, c.data.held_out);
    });
  data::Classification d;
  d.classes = c.data.classes;
  // Test data comes from the same generator, after the training rows.
  data::Split all = data::make_synthetic(c.data.samples + c.data.test_samples, c.data.features, c.data.classes, c.seed,
                                         c.data.labels);
  d.train = {all.x.slice(0, c.data.samples), all.y.slice(0, c.data.samples)};
  if (c.data.test_samples > 0)
    d.test = {all.x.slice(c.data.samples, c.data.samples + c.data.test_samples),
              all.y.slice(c.data.samples, c.data.samples + c.data.test_samples)};
  return d;
}

Shape input_shape(const RunConfig& c) {
  if (c.data.source == "fashion_mnist") return Shape{784};
  if (c.data.source == "synthetic") return Shape{c.data.features};
  if (c.data.source == "text") return Shape{c.data.text_length};
  return in_file(c.file, files_key(c.data, false), [&] {
    if (c.data.source == "idx") {
      const data::IdxHeader h = data::read_idx_header(c.data.train_files[0], 3);
      return Shape{h.dims[1] * h.dims[2]};  // as read_idx_images gives a row
    }
    return *read_rows(c.data, c.data.train_files, 1, !regression(c)).row_shape;
  });
}

}  // namespace dtrain::cli
