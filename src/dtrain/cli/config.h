// The training config a `dtrain` command reads: model, loss, optimizer, metrics, data and
// run settings in one JSON file. Every error names the file and the key's JSON path.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/data/dataset.h"
#include "dtrain/data/example.h"
#include "dtrain/data/datasets.h"
#include "dtrain/model/sequential.h"
#include "dtrain/model/serialization.h"

namespace dtrain::cli {

// An input pipeline over the loaded data: from_tensor_slices -> [cache] -> [shuffle] ->
// batch(batch_size) -> [prefetch].
struct PipelineConfig {
  bool cache = false;
  std::int64_t shuffle = 0;   // buffer size; 0 = no shuffling
  std::int64_t prefetch = 0;  // 0 = none, -1 = AUTOTUNE
  bool drop_remainder = false;
};

// Where the data comes from. The file sources (csv, idx, records) are read into memory
// whole; nothing here streams from disk.
struct DataConfig {
  std::string source = "synthetic";  // "fashion_mnist", "synthetic", "csv", "idx", "records", "tfrecord" or "text"
  std::string path;                  // fashion_mnist: directory ("" = default)
  std::int64_t samples = 1000, test_samples = 0, features = 100, classes = 10;
  data::SyntheticLabels labels = data::SyntheticLabels::random;
  // File sources, paths as the config gives them. csv, records: the files of each split,
  // read in order; idx: {images, labels}. No test files: no test split.
  std::vector<std::string> train_files, test_files;
  data::CsvOptions csv;  // csv: label_column (always set), header, delimiter, select_columns
  // tfrecord: files of tf.train.Example (a glob of shards, or a list), their compression,
  // and the features x (the row) and y (the label) are parsed from, as FixedLenFeature
  // specs; x may be a string feature of raw bytes (decode_raw: its type).
  data::Compression compression = data::Compression::none;
  data::FeatureSpec x_feature, y_feature;
  std::optional<DType> x_decode_raw;
  // text (a language model's windows, data::text_windows): the window's bytes, at most this
  // many bytes of the files (-1: all), and the share held out as the test split.
  std::int64_t text_length = 64, text_bytes = -1;
  double held_out = 0.1;
  // text: "tokenizer": {"type": "sentencepiece", "vocab_size", "model_type", "model"}: the
  // windows hold subword ids (data::token_windows) instead of bytes. model: a .model file
  // to read where it exists, else to write the one trained on the training text to.
  struct Tokenizer {
    std::string type;  // "" (bytes) or "sentencepiece"
    int vocab_size = 0;
    std::string model_type = "unigram";
    std::string model;
  } tokenizer;
  std::optional<PipelineConfig> pipeline;
};

// Checkpoints to resume from (BackupAndRestore, docs/checkpoints.md): the config's
// "checkpoint": {"dir", "every", "keep"}; dtrain fit's --checkpoint-dir, --checkpoint-every
// and --keep-checkpoints override it.
struct CheckpointConfig {
  std::string dir;         // empty: no checkpoints; a path as given (relative to the working directory)
  std::int64_t every = 0;  // training batches between saves; 0: at the end of every epoch ("epoch")
  bool keep = false;       // keep the backups when fit ends (by default they are deleted then)
};

struct RunConfig {
  std::string file;  // where it was read from, for messages
  nlohmann::json model_json;
  std::string model_path = "model";
  // Where the model's {"layers", "input_shape"} object is in the file, for messages:
  // "model" in the short form, "model.config" in Model::to_json()'s.
  std::string model_config_path = "model.config";
  // The model's layers as load_config made them, once and never built (no weights, no seed
  // drawn from the training sequence): the checks of the model against the data take its
  // shapes from them. Copies of the config share them.
  std::shared_ptr<const UnbuiltModel> unbuilt_model;
  std::optional<Shape> model_input_shape;  // the input shape the model declares, if any
  nlohmann::json loss_json, optimizer_json;
  std::vector<std::string> metrics;
  DataConfig data;
  int epochs = 1;
  std::int64_t batch_size = 32;
  std::uint64_t seed = 0;
  int threads = 0;  // 0: every core
  double validation_split = 0.0;
  bool shuffle = true;
  int verbose = -1;
  // "float32", "mixed_bfloat16" or "mixed_float16" for every layer; empty: what the model
  // JSON says. "mixed_float16" trains with dynamic loss scaling.
  std::string dtype_policy;
  // "default" (one device), "one_device", "mirrored" or "multi_worker" (TF_CONFIG says
  // the cluster); replicas: mirrored's (0: one per core), or each worker's (0: one).
  // batch_size is then the global batch.
  std::string strategy = "default";
  int replicas = 0;
  int gradient_accumulation_steps = 1;
  // fit ends at the first batch whose loss or weights are not finite (TerminateOnNaN);
  // false trains on, as Keras does without the callback. The summary records it either way.
  bool terminate_on_nan = true;
  CheckpointConfig checkpoint;
};

// Checks a strategy name and replica count; the message says what is expected.
void check_strategy(const std::string& strategy, int replicas);

// Reads and validates the whole file up front, so a typo fails before any training. Reads
// no data (a csv source's first line excepted, for its column names), builds no weights
// and draws no seed; the model is checked against the data by load_data.
RunConfig load_config(const std::string& path);

// The JSON in the file at `path`, discarded (is_discarded()) when it is not JSON, for the
// caller to say what it expected; an IoError starting with `unreadable` when the file
// cannot be read.
nlohmann::json read_json_file(const std::string& path, const std::string& unreadable);

// The pieces, built from a validated config.
std::unique_ptr<Model> build_model(const RunConfig& c);
std::shared_ptr<losses::Loss> build_loss(const RunConfig& c);
std::shared_ptr<optim::Optimizer> build_optimizer(const RunConfig& c);
// The data the config names, in memory, each file read once. File sources: x float32
// [rows, features...]; y float32 [rows, 1] with classes = 0 when the loss is mse (a
// regression), else int32 [rows] of class numbers with classes = the largest label + 1, each
// below the width of the model's output. Errors name the config file, the key and the data
// file (and the row or record of a bad label). The model is checked against the data's row
// shape (check_model_fits_data) before any file is read whole.
data::Classification load_data(const RunConfig& c);
// One input row's shape, without loading the data: from the config (synthetic,
// fashion_mnist), an IDX images file's header, or the first training row of a csv or
// records source.
Shape input_shape(const RunConfig& c);
// The model against rows of shape `row`: the input shape it declares, its layers' shapes,
// and, for the class labels of the synthetic and Fashion-MNIST sources, the loss and the
// last layer's width (a file's labels are checked as they are read). Builds no weights.
// Throws InvalidArgument "FILE: KEY: message".
void check_model_fits_data(const RunConfig& c, const Shape& row);
// The training Dataset the config's pipeline describes (requires c.data.pipeline).
data::Dataset build_pipeline(const RunConfig& c, const data::Split& train);

}  // namespace dtrain::cli
