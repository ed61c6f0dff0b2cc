// TensorBoard's event files and Keras's TensorBoard callback.
//
// An event file is what TensorFlow's summary writer writes: records framed as TFRecord
// (an 8-byte little-endian length, the masked CRC-32C of those 8 bytes, the data, the
// masked CRC-32C of the data) around Event protocol buffers (TensorFlow's event.proto and
// summary.proto), encoded here field by field. The first event says the file's version
// ("brain.Event:2"); then scalars (Summary.Value.simple_value), histograms
// (HistogramProto) and text (a string TensorProto with the "text" plugin's metadata), each
// with its step and wall time. TensorBoard reads a folder of them as one run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/model/callbacks.h"

namespace dtrain {

namespace data {
class RecordWriter;
}

namespace tensorboard {

// Appends events to a new file in `run_dir` (made if missing), named as TensorFlow names
// them: events.out.tfevents.<seconds>.<host>.<pid>.<n>. Each event is flushed when written, so
// that TensorBoard sees a run as it trains; an error writing is an IoError naming the file.
class EventWriter {
 public:
  explicit EventWriter(const std::string& run_dir);
  ~EventWriter();
  const std::string& path() const { return path_; }

  void scalar(const std::string& tag, double value, std::int64_t step);
  // `buckets` equal buckets between the smallest and the largest value (Keras's and
  // tf.summary's 30 by default).
  void histogram(const std::string& tag, std::span<const float> values, std::int64_t step, int buckets = 30);
  // Markdown, shown by TensorBoard's Text tab.
  void text(const std::string& tag, const std::string& markdown, std::int64_t step);

 private:
  std::string path_;
  std::unique_ptr<data::RecordWriter> out_;  // TFRecord's framing
  void write_event(const std::string& event);  // the encoded Event, framed and flushed
};

// Every record of an event file (or any TFRecord file), each length and payload checked
// against its CRC: a damaged or cut-short record is an IoError naming the file and offset.
std::vector<std::string> read_records(const std::string& path);

}  // namespace tensorboard

// Keras's TensorBoard callback. Under log_dir, the run folders TensorBoard lists: "train"
// and "validation" (each worker but the chief of a multi-worker job in worker_<k>/), with
//   epoch_<metric>            every epoch (the validation metrics in "validation")
//   batch_<metric>            every update_freq batches, when update_freq > 0 (Keras's
//                             update_freq=N; 0 is "epoch"), the step counting every batch
//   epoch_steps_per_second    with write_steps_per_second
//   <weight>/histogram        every histogram_freq epochs (0: never)
//   run_config                the model's JSON, its compile settings, at step 0 (text)
// and, for profile_batch = (first, last), a trace of fit's first `last` steps as TensorBoard's
// profile plugin finds it: train/plugins/profile/<time>/<host>.trace.json.gz.
struct TensorBoardOptions {
  std::string log_dir = "logs";
  int histogram_freq = 0;
  std::int64_t update_freq = 0;  // 0: "epoch"; N > 0: every N batches
  bool write_steps_per_second = false;
  std::int64_t profile_first = 0, profile_last = 0;  // 0, 0: no trace
};

class TensorBoard : public Callback {
 public:
  explicit TensorBoard(TensorBoardOptions options);
  const TensorBoardOptions& options() const { return options_; }

  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(std::int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  const ProfilerCallback* tracer() const override { return tracer_.get(); }

  // The run folders this task writes (after on_train_begin).
  std::string train_dir() const;
  std::string validation_dir() const;

 private:
  TensorBoardOptions options_;
  std::string task_dir_;  // log_dir, or log_dir/worker_<k>
  std::unique_ptr<tensorboard::EventWriter> train_, validation_;
  std::shared_ptr<ProfilerCallback> tracer_;
  std::int64_t global_batch_ = 0;  // batches trained so far in this fit
  BatchesSeen seen_;
  std::int64_t epoch_batches_ = 0;
  double epoch_start_ = 0.0;
  void write_histograms(int epoch);
};

}  // namespace dtrain
