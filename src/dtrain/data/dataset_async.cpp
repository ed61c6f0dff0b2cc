// Background stages: prefetch and parallel map. Their threads start on the first next()
// (so restore() can run first), wait on condition variables that also wake on the
// iterator's stop token, and are joined before the upstream stage is destroyed. save()
// quiesces the stage (no pull or computation in flight), then records the upstream's
// position and the finished elements not yet consumed. save() waits at most the
// pipeline's timeout_seconds for that, next() at most its element_timeout_seconds (by
// default without limit); destruction waits for a pull or map call in flight to return,
// since its threads use the stage's state (see docs/data.md).
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "dtrain/core/clock.h"
#include "dtrain/core/threads.h"
#include "dtrain/data/dataset_internal.h"

namespace dtrain::data::detail {
namespace {

// The context of the stages below a background stage, which run on its threads while
// `flag` is true.
IteratorContext below(IteratorContext ctx, std::shared_ptr<const std::atomic<bool>> flag) {
  ctx.background = std::move(flag);
  return ctx;
}

// What save() waits at most for a stage to pause.
Clock::duration save_timeout(const DatasetOptions& o) {
  return timeout_from_seconds(o.timeout_seconds);
}

std::string seconds_text(Clock::duration d) {
  std::ostringstream o;
  o << std::chrono::duration<double>(d).count() << " s";
  return o.str();
}

// Waits on `cv` for `ready` or the iterator's stop, at most the pipeline's
// element_timeout_seconds (none when 0); false when that ran out.
template <typename Lock, typename Ready>
bool wait_for_element(std::condition_variable_any& cv, Lock& lock, const IteratorContext& ctx, Ready ready) {
  if (ctx.options.element_timeout_seconds <= 0) {
    cv.wait(lock, ctx.stop, ready);
    return true;
  }
  return cv.wait_for(lock, ctx.stop, clock_seconds(ctx.options.element_timeout_seconds), ready) ||
         ctx.stop.stop_requested();
}

std::string ms(double seconds) {
  std::ostringstream o;
  o.precision(3);
  o << seconds * 1e3 << " ms";
  return o.str();
}

// ---- prefetch: a producer thread keeps up to `capacity` elements ready. Once it has filled
// the buffer it naps until the consumer has taken half of it, then refills. It wakes
// itself, on a timer set from the consumer's rate. The consumer wakes it only when what is
// left in the buffer would not last while the producer refills: waking a sleeping thread
// costs the waker a system call and an interrupt to the other core (tens of microseconds
// in a virtual machine), which would come out of every training step. With AUTOTUNE the
// capacity starts at 1 and grows each time the consumer finds the buffer empty; and when the consumer's compute threads
// occupy every core and the producer spends its time computing rather than waiting, the
// producer's work could only be taken from a compute thread (which the others then wait
// for), so the stage stops its thread and pulls in the consumer's thread instead.
class PrefetchIterator : public IteratorBase {
 public:
  static constexpr int kSamplesBeforeInline = 8;
  static constexpr int kCpuEvery = 32;  // elements between readings of the producer's CPU time
  // Bounds of the producer's naps while the buffer is full, and how late a nap may end
  // (Linux's default timer slack is 50 µs, and the thread must then be scheduled).
  static constexpr double kShortestNap = 50e-6, kLongestNap = 10e-3, kTimerSlack = 100e-6;

  PrefetchIterator(std::unique_ptr<IteratorBase> in, const IteratorContext& ctx, std::int64_t buffer,
                   std::shared_ptr<std::atomic<bool>> upstream_background, bool may_go_inline)
      : in_(std::move(in)), ctx_(ctx), autotune_(buffer == AUTOTUNE), may_go_inline_(may_go_inline),
        capacity_(autotune_ ? 1 : buffer), max_capacity_(autotune_ ? ctx.options.autotune_max_buffer : buffer),
        upstream_background_(std::move(upstream_background)) {}

  ~PrefetchIterator() override {
    if (producer_.joinable()) {
      producer_.request_stop();
      producer_.join();
    }
  }

  std::optional<Element> next() override {
    if (!inline_ && should_go_inline()) go_inline();
    if (inline_) return next_inline();
    start();
    std::unique_lock lock(mutex_);
    const auto now = Clock::now();
    if (consumed_ > 0) consumer_time_.add(seconds_between(last_return_, now));
    if (queue_.empty() && !ended_ && !error_) {
      ++waits_;
      if (autotune_ && capacity_ < max_capacity_) ++capacity_;
      cv_.notify_all();
    }
    if (!wait_for_element(cv_, lock, ctx_, [&] { return !queue_.empty() || ended_ || error_; }))
      DTRAIN_THROW(Timeout, "prefetch: next() waited ", ctx_.options.element_timeout_seconds,
                   " s for the producer's next element (a source or map function that never returns?); "
                   "DatasetOptions::element_timeout_seconds sets the limit");
    last_return_ = Clock::now();
    if (!queue_.empty()) {
      Element e = std::move(queue_.front());
      queue_.pop_front();
      ++consumed_;
      // Woken only if what is left would run out before the producer's nap ends (late by up
      // to the timer's slack) and it makes two elements; otherwise its own timer wakes it.
      const bool wake = producer_napping_ && refill_due() &&
                        (!consumer_time_.primed ||
                         last_return_ + clock_seconds(static_cast<double>(queue_.size()) * consumer_time_.value) <
                             nap_until_ + clock_seconds(kTimerSlack + 2 * producer_time_.value));
      if (wake) producer_napping_ = false;  // one notify is enough
      lock.unlock();
      if (wake) cv_.notify_all();
      return e;
    }
    if (error_) std::rethrow_exception(error_);
    if (ended_) return std::nullopt;
    throw Cancelled();  // the iterator is being destroyed: not the end of the data
  }

  IteratorState save() const override {
    const std::unique_lock pull = pause("save()");  // the producer is between pulls
    std::lock_guard lock(mutex_);
    if (error_) DTRAIN_THROW(InvalidArgument, "prefetch: cannot save an iterator whose input failed");
    IteratorState s{{ended_ ? 1 : 0, static_cast<std::int64_t>(queue_.size()), capacity_}, {}, {in_->save()}};
    save_elements(queue_, s);
    return s;
  }

  void restore(const IteratorState& s) override {
    check_state(s, 3, 1, "prefetch");
    DTRAIN_CHECK(!started_, "restore() must come before the first next()");
    ended_ = s.values[0] != 0;
    capacity_ = std::max<std::int64_t>(1, std::min(s.values[2], max_capacity_));
    std::vector<Element> queued = load_elements(s, 3, static_cast<std::size_t>(s.values[1]), "prefetch");
    queue_.assign(std::make_move_iterator(queued.begin()), std::make_move_iterator(queued.end()));
    in_->restore(s.children[0]);
  }

  void report(std::vector<std::string>& lines) const override {
    {
      const std::unique_lock pull = pause("autotune_report()");  // the upstream may be replacing its stages
      in_->report(lines);
    }
    std::lock_guard lock(mutex_);
    lines.push_back("prefetch: buffer " + std::to_string(capacity_) + (autotune_ ? " (AUTOTUNE)" : "") +
                    ", refilled " + std::to_string(burst()) + " at a time; producer " + ms(producer_time_.value) +
                    "/element (" + ms(producer_cpu_.value) + " of it CPU), consumer " + ms(consumer_time_.value) +
                    "/element; the consumer waited on " +
                    std::to_string(waits_) + " of " + std::to_string(consumed_) + " elements" +
                    (inline_ ? "; then inline in the consumer's thread (no idle core, a computing producer)" : ""));
  }

 private:
  // The producer between pulls, held as long as the returned lock: `what` waits at most
  // the pipeline's timeout_seconds for the pull in flight (a source or map function
  // running on the producer's thread) to return.
  std::unique_lock<std::mutex> pause(const char* what) const {
    const Clock::duration limit = save_timeout(ctx_.options);
    std::unique_lock lock(mutex_);
    pausing_ = true;  // the producer starts no pull until this is cleared
    if (!cv_.wait_for(lock, limit, [&] { return !pulling_; })) {
      pausing_ = false;
      lock.unlock();
      cv_.notify_all();
      DTRAIN_THROW(Timeout, "prefetch: ", what, " waited ", seconds_text(limit),
                   " for the producer to finish the element it is making (a source or map function that never "
                   "returns?); DatasetOptions::timeout_seconds sets the limit");
    }
    lock.unlock();
    // The producer lets go of the pull lock a few instructions after it stored its element.
    std::unique_lock pull(pull_mutex_);
    lock.lock();
    pausing_ = false;  // the pull lock holds the producer from here
    lock.unlock();
    cv_.notify_all();
    return pull;
  }

  // Elements the producer makes per wake-up: it sleeps once the buffer is full and wakes
  // when this many have been taken (guarded by mutex_).
  std::int64_t burst() const { return std::max<std::int64_t>(1, capacity_ / 2); }
  bool refill_due() const { return static_cast<std::int64_t>(queue_.size()) <= capacity_ - burst(); }

  bool should_go_inline() const {
    // Only a stage whose own pulls come from the consumer's thread: one below another
    // background stage would only move its work onto that stage's thread.
    if (!autotune_ || !may_go_inline_ || ctx_.idle_core || !started_ || !ctx_.on_consumer_thread()) return false;
    std::lock_guard lock(mutex_);
    return produced_ >= kSamplesBeforeInline && !error_ && !ended_ && producer_cpu_total_ >= 0.5 * producer_time_total_;
  }

  // Stops the producer after the element it is making (which joins the queue) and pulls
  // in the consumer's thread from now on.
  void go_inline() {
    producer_.request_stop();
    cv_.notify_all();
    producer_.join();
    inline_ = true;
    upstream_background_->store(false, std::memory_order_relaxed);
  }

  std::optional<Element> next_inline() {
    {
      std::lock_guard lock(mutex_);
      if (!queue_.empty()) {
        Element e = std::move(queue_.front());
        queue_.pop_front();
        ++consumed_;
        return e;
      }
      if (error_) std::rethrow_exception(error_);
      if (ended_) return std::nullopt;
    }
    std::lock_guard pull(pull_mutex_);
    std::optional<Element> e;
    try {
      e = in_->next();
    } catch (...) {
      // Kept, as the producer keeps it: every later next() throws it and save() refuses.
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      throw;
    }
    std::lock_guard lock(mutex_);
    if (e) ++consumed_;
    else ended_ = true;
    return e;
  }

  void start() {
    if (started_) return;
    started_ = true;
    producer_ = std::jthread([this](std::stop_token st) { produce(st); });
  }

  double wall_seconds() const {
    return ctx_.clocks ? ctx_.clocks->wall() : seconds_between(Clock::time_point(), Clock::now());
  }
  double cpu_seconds() const { return ctx_.clocks ? ctx_.clocks->thread_cpu() : thread_cpu_seconds(); }

  void produce(std::stop_token st) {
    cpu_mark_ = cpu_seconds();
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        // Full: nap until half the buffer has been taken, checking at half the time the
        // consumer is expected to need to take the elements before then (before the
        // consumer's rate is known, it wakes the producer).
        if (static_cast<std::int64_t>(queue_.size()) >= capacity_) {
          while (!refill_due() && !ended_ && !st.stop_requested()) {
            const auto due = static_cast<double>(static_cast<std::int64_t>(queue_.size()) - (capacity_ - burst()));
            const double nap = consumer_time_.primed ? std::clamp(0.5 * due * consumer_time_.value, kShortestNap, kLongestNap)
                                                     : kLongestNap;
            producer_napping_ = true;
            nap_until_ = Clock::now() + clock_seconds(nap);
            cv_.wait_until(lock, st, nap_until_, [&] { return refill_due() || ended_; });
          }
          producer_napping_ = false;
        }
        cv_.wait(lock, st, [&] { return !pausing_; });  // save() is taking the position
        if (st.stop_requested() || ctx_.stop.stop_requested() || ended_) return;
        pulling_ = true;
      }
      std::lock_guard pull(pull_mutex_);
      // The thread's CPU time costs a system call (hundreds of nanoseconds in a virtual
      // machine, as much as a small element): read for each of the first elements, then
      // every kCpuEvery, the time since (the pulls and their handing over; a nap takes
      // none) shared among the elements pulled meanwhile. The totals the inline rule
      // compares both grow at the readings, over the same pulls.
      const double t0 = wall_seconds();
      std::optional<Element> e;
      std::exception_ptr error;
      try {
        e = in_->next();
      } catch (...) {
        error = std::current_exception();
      }
      const double took = wall_seconds() - t0;
      took_since_mark_ += took;
      double cpu = 0, took_sampled = 0;
      std::int64_t sampled = 0;
      if (++pulled_ <= kSamplesBeforeInline || pulled_ % kCpuEvery == 0) {
        const double now = cpu_seconds();
        cpu = now - cpu_mark_;
        cpu_mark_ = now;
        sampled = pulled_ - pulled_at_mark_;
        pulled_at_mark_ = pulled_;
        took_sampled = std::exchange(took_since_mark_, 0.0);
      }
      std::unique_lock lock(mutex_);
      pulling_ = false;
      if (error) {
        // Moved, not copied: the consumer may rethrow and drop the error at once, and the
        // last reference must not be this thread's (TSan cannot see libstdc++'s count).
        error_ = std::move(error);
      } else if (!e) {
        // The iterator's stop request also makes upstream stages end early; that is not the
        // data's end. (This thread's own stop token, used to go inline, reaches no upstream
        // stage, so an end seen while it is set is the data's.)
        if (!ctx_.stop.stop_requested()) ended_ = true;
      } else {
        producer_time_.add(took);
        if (sampled > 0) producer_cpu_.add(cpu / static_cast<double>(sampled));
        producer_time_total_ += took_sampled;
        producer_cpu_total_ += cpu;
        ++produced_;
        queue_.push_back(std::move(*e));
      }
      const bool last = error_ || !e;
      lock.unlock();
      cv_.notify_all();
      if (last) return;
    }
  }

  std::unique_ptr<IteratorBase> in_;
  IteratorContext ctx_;
  const bool autotune_;
  const bool may_go_inline_;  // false: the thread stays, whatever it spends (a copy to a GPU)
  std::int64_t capacity_;
  const std::int64_t max_capacity_;
  mutable std::mutex mutex_;       // guards everything below
  mutable std::mutex pull_mutex_;  // held by the producer while it pulls and stores an element
  mutable std::condition_variable_any cv_;
  mutable bool pausing_ = false;  // save() or a report waits to take the pull lock
  bool pulling_ = false;          // the producer is pulling (it holds or is taking the pull lock)
  std::deque<Element> queue_;
  bool ended_ = false;
  std::exception_ptr error_;
  bool started_ = false;
  std::int64_t consumed_ = 0, waits_ = 0, produced_ = 0;
  Ema producer_time_, producer_cpu_, consumer_time_;
  bool producer_napping_ = false;  // the producer waits for refill_due() with the buffer full
  Clock::time_point nap_until_;    // ... until then at the latest
  double producer_time_total_ = 0, producer_cpu_total_ = 0;
  // The producer's own (its thread alone): pulls made, and its CPU time at the last reading.
  std::int64_t pulled_ = 0, pulled_at_mark_ = 0;
  double cpu_mark_ = 0, took_since_mark_ = 0;
  Clock::time_point last_return_;
  bool inline_ = false;      // the consumer pulls from upstream itself (consumer thread only)
  const std::shared_ptr<std::atomic<bool>> upstream_background_;
  std::jthread producer_;  // last: joined before the members it uses go away
};

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(NodePtr in, std::int64_t buffer, bool may_go_inline)
      : in_(std::move(in)), buffer_(buffer), may_go_inline_(may_go_inline) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    auto flag = std::make_shared<std::atomic<bool>>(true);
    return std::make_unique<PrefetchIterator>(in_->make(below(ctx, flag)), ctx, buffer_, flag, may_go_inline_);
  }
  std::int64_t cardinality() const override { return in_->cardinality(); }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  std::int64_t buffer_;
  bool may_go_inline_;
};

// ---- parallel map: worker threads pull inputs in order (numbered), apply fn concurrently,
// and file results by number. Deterministic delivery returns results in input order;
// otherwise the first one ready. With AUTOTUNE the number of workers allowed to run is
// ceil(fn time / consumer time per element), within the pipeline's thread budget.
class ParallelMapIterator : public IteratorBase {
 public:
  ParallelMapIterator(std::unique_ptr<IteratorBase> in, const IteratorContext& ctx, MapFn fn,
                      std::int64_t parallelism, bool deterministic)
      : in_(std::move(in)), ctx_(ctx), fn_(std::move(fn)), autotune_(parallelism == AUTOTUNE), deterministic_(deterministic),
        threads_(autotune_ ? thread_budget(ctx.options) : static_cast<int>(parallelism)),
        active_(autotune_ ? 1 : threads_) {}

  ~ParallelMapIterator() override {
    for (auto& w : workers_) w.request_stop();
    workers_.clear();  // joins
  }

  std::optional<Element> next() override {
    start();
    std::unique_lock lock(mutex_);
    if (delivered_ > 0) {
      consumer_time_.add(seconds_since(last_return_));
      if (autotune_) retune();
    }
    if (!wait_for_element(cv_, lock, ctx_, [&] { return ready() || finished(); }))
      DTRAIN_THROW(Timeout, "map: next() waited ", ctx_.options.element_timeout_seconds, " s for element ", delivered_,
                   " (", computing_, " map function call(s) or pulls in flight; one that never returns?); "
                   "DatasetOptions::element_timeout_seconds sets the limit");
    last_return_ = Clock::now();
    if (!ready()) {
      if (finished()) return std::nullopt;
      throw Cancelled();  // the iterator is being destroyed: not the end of the data
    }
    auto it = deterministic_ ? results_.find(delivered_) : results_.begin();
    Result r = std::move(it->second);
    results_.erase(it);
    ++delivered_;
    cv_.notify_all();
    if (r.error) {
      error_seen_ = true;
      std::rethrow_exception(r.error);
    }
    return std::move(r.element);
  }

  IteratorState save() const override {
    std::unique_lock lock(mutex_);
    const Resume resume{*this};
    pause(lock, "save()");
    IteratorState s{{delivered_, input_done_ ? 1 : 0, end_seq_, static_cast<std::int64_t>(results_.size())},
                    {},
                    {in_->save()}};
    bool failed = false;
    for (const auto& [seq, r] : results_) failed |= static_cast<bool>(r.error);
    save_elements(results_, s, [](const auto& item) -> const Element& { return item.second.element; });
    if (failed || error_seen_) DTRAIN_THROW(InvalidArgument, "map: cannot save an iterator whose map function failed");
    return s;
  }

  void restore(const IteratorState& s) override {
    check_state(s, 4, 1, "map");
    DTRAIN_CHECK(workers_.empty(), "restore() must come before the first next()");
    delivered_ = s.values[0];
    input_done_ = s.values[1] != 0;
    end_seq_ = s.values[2];
    results_.clear();
    std::vector<Element> finished = load_elements(s, 4, static_cast<std::size_t>(s.values[3]), "map");
    for (std::size_t i = 0; i < finished.size(); ++i)
      results_[delivered_ + static_cast<std::int64_t>(i)].element = std::move(finished[i]);
    pulled_ = next_seq_ = delivered_ + s.values[3];
    in_->restore(s.children[0]);
  }

  void report(std::vector<std::string>& lines) const override {
    std::unique_lock lock(mutex_);
    {
      // The upstream may be replacing its stages: no pull in flight.
      const Resume resume{*this};
      pause(lock, "autotune_report()");
      in_->report(lines);
    }
    lines.push_back("map: parallelism " + std::to_string(active_) + " of " + std::to_string(threads_) + " threads" +
                    (autotune_ ? " (AUTOTUNE)" : "") + (deterministic_ ? "" : ", non-deterministic") + "; function " +
                    ms(fn_time_.value) + "/element, consumer " + ms(consumer_time_.value) + "/element");
  }

 private:
  struct Result {
    Element element;
    std::exception_ptr error;
  };

  // Resumes the workers on every way out of a pause, exceptions included (destroyed
  // while the caller still holds the lock).
  struct Resume {
    const ParallelMapIterator& self;
    ~Resume() {
      self.paused_ = false;
      self.cv_.notify_all();
    }
  };
  // With `lock` held: stops the workers from starting a pull or a call, and waits at most
  // the pipeline's timeout_seconds for those in flight to finish.
  void pause(std::unique_lock<std::mutex>& lock, const char* what) const {
    paused_ = true;
    const Clock::duration limit = save_timeout(ctx_.options);
    if (!cv_.wait_for(lock, limit, [&] { return computing_ == 0; }))
      DTRAIN_THROW(Timeout, "map: ", what, " waited ", seconds_text(limit), " for ", computing_,
                   " map function call(s) or pulls in flight to finish (one that never returns?); "
                   "DatasetOptions::timeout_seconds sets the limit");
  }

  bool ready() const {
    if (results_.empty()) return false;
    return !deterministic_ || results_.count(delivered_) > 0;
  }
  bool finished() const { return input_done_ && computing_ == 0 && results_.empty() && delivered_ >= end_seq_; }
  std::int64_t in_flight() const { return pulled_ - delivered_; }

  void retune() {
    const double fn = fn_time_.value, consumer = std::max(consumer_time_.value, 1e-6);
    const int want = static_cast<int>(std::clamp(std::ceil(fn / consumer), 1.0, static_cast<double>(threads_)));
    if (want > active_) cv_.notify_all();  // let the newly allowed workers start
    active_ = want;
  }

  void start() {
    if (!workers_.empty() || finished()) return;
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this](std::stop_token st) { work(st); });
  }

  void work(std::stop_token st) {
    for (;;) {
      std::int64_t seq;
      std::optional<Element> input;
      std::exception_ptr error;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, st, [&] {
          return input_done_ || (!paused_ && computing_ < active_ && in_flight() < 2 * static_cast<std::int64_t>(active_));
        });
        if (st.stop_requested() || input_done_) return;
        ++computing_;  // counted before the pull, so save() waits for pulls too
        ++pulled_;     // reserves a place in the in-flight window
      }
      {
        // Pulls are serialised (the upstream is single-threaded) and numbered in pull order,
        // without holding the state lock, so a slow upstream does not block the consumer.
        std::lock_guard pull(pull_mutex_);
        {
          std::lock_guard lock(mutex_);
          if (input_done_ || st.stop_requested()) {
            --pulled_;
            --computing_;
            cv_.notify_all();
            return;
          }
          seq = next_seq_++;
        }
        try {
          input = in_->next();
        } catch (...) {
          error = std::current_exception();
        }
        std::lock_guard lock(mutex_);
        if (st.stop_requested()) {  // shutting down: do not start the function
          --computing_;
          cv_.notify_all();
          return;
        }
        if (!input && !error) {
          input_done_ = true;
          end_seq_ = seq;
          --pulled_;
          --computing_;
          cv_.notify_all();
          return;
        }
        if (error) {
          input_done_ = true;
          end_seq_ = seq + 1;
        }
      }
      const bool failed = error != nullptr;
      Result r;
      r.error = std::move(error);  // as above: the consumer holds the last reference
      if (!failed) {
        const auto t0 = Clock::now();
        try {
          r.element = fn_(*input);
        } catch (...) {
          try {
            rethrow_with_context(std::current_exception(), "map: element " + std::to_string(seq));
          } catch (...) {
            r.error = std::current_exception();
          }
        }
        std::lock_guard lock(mutex_);
        fn_time_.add(seconds_since(t0));
      }
      std::lock_guard lock(mutex_);
      results_[seq] = std::move(r);
      --computing_;
      cv_.notify_all();
      if (failed) return;
    }
  }

  std::unique_ptr<IteratorBase> in_;
  IteratorContext ctx_;
  const MapFn fn_;
  const bool autotune_, deterministic_;
  const int threads_;
  int active_;
  mutable std::mutex mutex_;
  mutable std::condition_variable_any cv_;
  mutable bool paused_ = false;
  std::map<std::int64_t, Result> results_;
  mutable std::mutex pull_mutex_;  // held while pulling from the upstream
  // pulled_: inputs taken or reserved; next_seq_: the number the next pull gets.
  std::int64_t pulled_ = 0, next_seq_ = 0, delivered_ = 0, end_seq_ = -1;
  int computing_ = 0;
  bool input_done_ = false, error_seen_ = false;
  Ema fn_time_, consumer_time_;
  Clock::time_point last_return_;
  std::vector<std::jthread> workers_;  // last: joined first
};

class ParallelMapNode : public DatasetNode {
 public:
  ParallelMapNode(NodePtr in, MapFn fn, std::int64_t parallelism, bool deterministic)
      : in_(std::move(in)), fn_(std::move(fn)), parallelism_(parallelism), deterministic_(deterministic) {}
  std::unique_ptr<IteratorBase> make(const IteratorContext& ctx) const override {
    return std::make_unique<ParallelMapIterator>(in_->make(below(ctx, std::make_shared<std::atomic<bool>>(true))), ctx, fn_,
                                                 parallelism_, deterministic_);
  }
  std::int64_t cardinality() const override { return in_->cardinality(); }

  const DatasetNode* input() const override { return in_.get(); }

 private:
  NodePtr in_;
  MapFn fn_;
  std::int64_t parallelism_;
  bool deterministic_;
};

}  // namespace

NodePtr prefetch_node(NodePtr in, std::int64_t buffer, bool may_go_inline) {
  return std::make_shared<PrefetchNode>(std::move(in), buffer, may_go_inline);
}
NodePtr parallel_map_node(NodePtr in, MapFn fn, std::int64_t parallelism, bool deterministic) {
  return std::make_shared<ParallelMapNode>(std::move(in), std::move(fn), parallelism, deterministic);
}

}  // namespace dtrain::data::detail
