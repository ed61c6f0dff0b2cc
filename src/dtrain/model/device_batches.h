// Batches of another source staged on a GPU one step ahead: while the training thread
// trains on batch k, a thread of this source's own draws batch k + 1 from the inner source
// and copies it to the device (DeviceStaging: page-locked memory, the GPU's transfer
// stream, beside its compute stream). The batches, their order and their contents are the
// inner source's. Internal to the model layer (model.cpp): fit's arrays on a GPU.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <stop_token>
#include <thread>

#include "dtrain/core/device_staging.h"
#include "dtrain/model/batch_sources.h"

namespace dtrain::detail {

class DeviceBatches : public Model::BatchSource {
 public:
  // `inner` draws its batches on this source's thread: it must not use the training
  // thread's compute pool (TensorBatches' on_compute_pool false).
  DeviceBatches(Model::BatchSource& inner, Device device)
      : inner_(inner), staging_(device), worker_([this](std::stop_token stop) { run(stop); }) {}
  ~DeviceBatches() override {
    worker_.request_stop();
    worker_.join();  // before the members it uses go
  }
  DeviceBatches(const DeviceBatches&) = delete;
  DeviceBatches& operator=(const DeviceBatches&) = delete;

  void begin_epoch(int epoch) override {
    drain();
    inner_.begin_epoch(epoch);
    at(epoch, 0);
  }
  void resume_at(int first_epoch, int epoch, std::int64_t batch) override {
    drain();
    inner_.resume_at(first_epoch, epoch, batch);
    at(epoch, batch * std::max<std::int64_t>(0, inner_.batch_size()));
  }
  bool resume_at_rows(int epoch, std::int64_t rows) override {
    drain();
    at(epoch, rows);
    return inner_.resume_at_rows(epoch, rows);
  }
  bool set_batch_size(std::int64_t rows) override {
    // A batch drawn ahead with the old size is put back: the inner source starts again at
    // the rows delivered so far.
    if (drain() && !inner_.resume_at_rows(epoch_, rows_delivered_)) return false;
    return inner_.set_batch_size(rows);
  }
  std::int64_t batch_size() const override { return inner_.batch_size(); }
  bool next(TensorData& batch) override {
    const Clock::time_point start = Clock::now();
    if (!in_flight_) request();
    Fetched f = take();
    wait_ += seconds_since(start);
    if (f.error) std::rethrow_exception(f.error);
    if (!f.more) return false;  // the epoch's end: nothing more is drawn ahead
    batch = std::move(f.batch);
    rows_delivered_ += batch.rows();
    request();  // the next batch, while this one trains
    return true;
  }
  std::int64_t steps() const override { return inner_.steps(); }
  double input_wait() const override { return wait_; }
  bool per_worker() const override { return inner_.per_worker(); }
  std::string input_plan() const override { return inner_.input_plan(); }

 private:
  struct Fetched {
    bool more = false;
    TensorData batch;
    std::exception_ptr error;
  };

  void at(int epoch, std::int64_t rows) {
    epoch_ = epoch;
    rows_delivered_ = rows;
    wait_ = 0;
  }

  void request() {
    {
      std::lock_guard lock(mutex_);
      requested_ = true;
      ready_ = false;
    }
    in_flight_ = true;
    cv_.notify_all();
  }
  Fetched take() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return ready_; });
    in_flight_ = false;
    return std::move(fetched_);
  }
  // Waits for a batch drawn ahead and drops it; whether there was one.
  bool drain() {
    if (!in_flight_) return false;
    (void)take();
    return true;
  }

  void run(std::stop_token stop) {
    while (true) {
      {
        std::unique_lock lock(mutex_);
        if (!cv_.wait(lock, stop, [&] { return requested_; })) return;
        requested_ = false;
      }
      Fetched f;
      try {
        f.more = inner_.next(f.batch);
        if (f.more) {
          for (Tensor& t : f.batch.x) t = staging_.stage(t);
          for (Tensor& t : f.batch.y) t = staging_.stage(t);
        }
      } catch (...) {
        f.error = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      fetched_ = std::move(f);
      ready_ = true;
      cv_.notify_all();
    }
  }

  Model::BatchSource& inner_;
  DeviceStaging staging_;
  std::mutex mutex_;
  std::condition_variable_any cv_;
  bool requested_ = false, ready_ = false;  // guarded by mutex_
  Fetched fetched_;                         // guarded by mutex_
  bool in_flight_ = false;                  // the training thread's own
  int epoch_ = 0;
  std::int64_t rows_delivered_ = 0;
  double wait_ = 0;
  std::jthread worker_;  // last: it starts once the rest is made
};

}  // namespace dtrain::detail
