// Where fit() draws its batches from: in-memory tensors (gathered by a shuffled index
// order) or a Dataset (one iterator per epoch), as this worker's share of the input.
// Internal to the model layer (sequential.cpp, remote_fit.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/clock.h"
#include "dtrain/core/rng.h"
#include "dtrain/data/dataset.h"
#include "dtrain/model/model.h"

namespace dtrain {

// Where fit() gets its batches from: in-memory tensors (gathered by a shuffled index
// order) or a Dataset (one iterator per epoch).
class Model::BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void begin_epoch(int epoch) = 0;
  // Instead of begin_epoch(epoch) when fit resumes there: the epoch's batches from
  // `batch` on. `first_epoch` is the epoch fit was asked to start at (initial_epoch).
  virtual void resume_at(int first_epoch, int epoch, std::int64_t batch) = 0;
  // Where batches change size within an epoch: its rows from `rows` on; false where the
  // source cannot (a dataset's batches are its own).
  virtual bool resume_at_rows(int /*epoch*/, std::int64_t /*rows*/) { return false; }
  // The rows of each batch from the next on; false where the source cannot change them.
  virtual bool set_batch_size(std::int64_t /*rows*/) { return false; }
  virtual std::int64_t batch_size() const { return 0; }
  // The next batch: the model's inputs and targets (undefined where a worker has none).
  virtual bool next(TensorData& batch) = 0;
  virtual std::int64_t steps() const = 0;  // per epoch; -1 when unknown
  virtual double input_wait() const = 0;   // seconds waited for batches this epoch
  // Multi-worker: true when the batches are this worker's own part of each global batch
  // (a dataset sharded by file or by the program), false when they are global batches
  // every worker reads alike.
  virtual bool per_worker() const { return false; }
  // Multi-worker: how the input is shared among the workers, for the log.
  virtual std::string input_plan() const {
    return "tensors: every worker holds them whole and keeps its replicas' rows of each global batch";
  }
};

namespace detail {

class TensorBatches : public Model::BatchSource {
 public:
  // on_compute_pool: the gather is split over the training thread's compute threads.
  TensorBatches(TensorData data, std::int64_t batch, bool shuffle, std::uint64_t seed, bool on_compute_pool = true)
      : data_(std::move(data)), rows_(data_.rows()), batch_(batch), shuffle_(shuffle), seed_(seed),
        on_compute_pool_(on_compute_pool), order_(shuffle ? static_cast<size_t>(rows_) : 0) {
    sources_ = data_.x;
    sources_.insert(sources_.end(), data_.y.begin(), data_.y.end());
  }
  void begin_epoch(int epoch) override {
    begin_ = 0;
    wait_ = 0;
    if (!shuffle_) return;
    std::iota(order_.begin(), order_.end(), 0);
    // Fisher-Yates with a generator fixed by (seed, epoch).
    Generator g = Generator(seed_).fork(static_cast<std::uint64_t>(epoch));
    for (std::int64_t i = static_cast<std::int64_t>(order_.size()) - 1; i > 0; --i)
      std::swap(order_[i], order_[g.below(static_cast<std::uint64_t>(i + 1))]);
  }
  void resume_at(int /*first_epoch*/, int epoch, std::int64_t batch) override {
    begin_epoch(epoch);
    begin_ = std::min(rows_, batch * batch_);  // the order is a function of (seed, epoch)
  }
  bool resume_at_rows(int epoch, std::int64_t rows) override {
    begin_epoch(epoch);
    begin_ = std::clamp<std::int64_t>(rows, 0, rows_);
    return true;
  }
  bool set_batch_size(std::int64_t rows) override {
    batch_ = std::max<std::int64_t>(1, rows);
    return true;
  }
  std::int64_t batch_size() const override { return batch_; }
  bool next(TensorData& b) override {
    if (begin_ >= rows_) return false;
    const auto t0 = Clock::now();
    const std::int64_t end = std::min(rows_, begin_ + batch_);
    const std::size_t inputs = data_.x.size();
    b.x.resize(inputs);
    b.y.resize(data_.y.size());
    if (shuffle_) {
      data::Element gathered = data::gather_rows(
          sources_, std::span(order_).subspan(static_cast<std::size_t>(begin_), static_cast<std::size_t>(end - begin_)),
          on_compute_pool_);
      for (std::size_t i = 0; i < gathered.size(); ++i) (i < inputs ? b.x[i] : b.y[i - inputs]) = std::move(gathered[i]);
    } else {
      for (std::size_t i = 0; i < sources_.size(); ++i)
        (i < inputs ? b.x[i] : b.y[i - inputs]) = sources_[i].slice(begin_, end);
    }
    begin_ = end;
    wait_ += seconds_since(t0);
    return true;
  }
  std::int64_t steps() const override { return rows_ / batch_ + (rows_ % batch_ != 0 ? 1 : 0); }
  double input_wait() const override { return wait_; }

 private:
  TensorData data_;
  std::int64_t rows_;
  std::vector<Tensor> sources_;  // the inputs, then the targets, for gathering shuffled rows
  std::int64_t batch_;
  bool shuffle_;
  std::uint64_t seed_;
  bool on_compute_pool_;
  std::vector<std::int64_t> order_;
  std::int64_t begin_ = 0;
  double wait_ = 0;
};

// Elements must be batches of the model's inputs, then its targets (`inputs` of them
// first): (x, y) for a model of one input and one output.
void split_element(const data::Element& e, std::size_t inputs, std::size_t outputs, TensorData& batch, const char* who);

class DatasetBatches : public Model::BatchSource {
 public:
  // `shard`: the pipeline this worker runs (data::auto_shard).
  // `model`'s inputs and outputs tell how an element splits into inputs and targets.
  // A model on a GPU gets its batches there through the pipeline's last stage,
  // prefetch_to_device: copied on a background thread while the step before computes.
  DatasetBatches(const Model& model, data::WorkerShard shard, std::int64_t steps_per_epoch, const char* who = "fit")
      : ds_(std::move(shard.dataset)), own_batches_(shard.own_batches), plan_(std::move(shard.plan)),
        inputs_(model.num_inputs()), outputs_(model.num_outputs()), steps_per_epoch_(steps_per_epoch), who_(who) {
    if (const Device d = model.device(); !d.is_cpu()) ds_ = ds_.prefetch_to_device(d);
  }
  // The whole dataset, as one process reads it.
  DatasetBatches(const Model& model, const data::Dataset& ds, std::int64_t steps_per_epoch, const char* who)
      : DatasetBatches(model, data::auto_shard(ds, 1, 0), steps_per_epoch, who) {}
  void begin_epoch(int epoch) override {
    // A fixed number of steps draws from one iterator across epochs, as Keras does with
    // steps_per_epoch; otherwise every epoch is a new pass over the data.
    if (!it_ || steps_per_epoch_ <= 0) it_.emplace(ds_.make_iterator(static_cast<std::uint64_t>(epoch)));
    taken_ = 0;
    wait_at_epoch_start_ = it_->stats().wait_seconds;
  }
  void resume_at(int first_epoch, int epoch, std::int64_t batch) override {
    // Uninterrupted, a fixed steps_per_epoch draws every epoch from the iterator made at
    // the first epoch; otherwise each epoch has its own. Either way the batches already
    // trained are drawn again and dropped.
    std::int64_t skip = batch;
    if (steps_per_epoch_ > 0) {
      it_.emplace(ds_.make_iterator(static_cast<std::uint64_t>(first_epoch)));
      skip += static_cast<std::int64_t>(epoch - first_epoch) * steps_per_epoch_;
    } else {
      it_.emplace(ds_.make_iterator(static_cast<std::uint64_t>(epoch)));
    }
    for (std::int64_t i = 0; i < skip; ++i)
      if (!it_->next()) break;
    taken_ = batch;
    wait_at_epoch_start_ = it_->stats().wait_seconds;
  }
  bool next(TensorData& batch) override {
    if (steps_per_epoch_ > 0 && taken_ >= steps_per_epoch_) return false;
    std::optional<data::Element> e = it_->next();
    if (!e) {
      if (steps_per_epoch_ > 0 && taken_ < steps_per_epoch_)
        DTRAIN_THROW(InvalidArgument, "fit: the dataset ran out after ", taken_, " of ", steps_per_epoch_,
                     " steps_per_epoch; add .repeat() to the pipeline");
      return false;
    }
    split_element(*e, inputs_, outputs_, batch, who_);
    ++taken_;
    return true;
  }
  std::int64_t steps() const override {
    if (steps_per_epoch_ > 0) return steps_per_epoch_;
    const std::int64_t c = ds_.cardinality();
    return c >= 0 ? c : -1;
  }
  double input_wait() const override { return it_ ? it_->stats().wait_seconds - wait_at_epoch_start_ : 0; }
  bool per_worker() const override { return own_batches_; }
  std::string input_plan() const override { return plan_; }

 private:
  data::Dataset ds_;
  bool own_batches_;
  std::string plan_;
  std::size_t inputs_, outputs_;
  std::int64_t steps_per_epoch_;
  const char* who_;  // the caller, for error messages
  std::optional<data::Iterator> it_;
  std::int64_t taken_ = 0;
  double wait_at_epoch_start_ = 0;
};
// The line a multi-worker fit prints once: how the input is shared among the workers.
std::string shard_plan(const StrategyBackend& strategy, const std::string& input_plan, std::int64_t first_batch);

// The pipeline this worker runs under the model's strategy (auto-sharding by file or data).
data::WorkerShard worker_shard(const StrategyBackend* strategy, const data::Dataset& dataset);

}  // namespace detail
}  // namespace dtrain
