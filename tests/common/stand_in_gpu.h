// A GPU for tests, wherever they run: the machine's first CUDA GPU when it has one, else a
// stand-in cuda:0 whose memory is host memory and whose kernels are the CPU backend's. On
// the stand-in, everything above the kernels (placement, copies between devices, fit,
// checkpoints, the optimizer's deferred non-finite report) runs as it does on a GPU, and a
// host read of a GPU tensor outside the runtime and the backend throws, as Tensor::data
// refuses it: CI's check that nothing reads device memory directly. What it cannot check
// is CUDA itself; the same tests then run on the GPU in scripts/gpu-check.sh.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/core/block_cache.h"
#include "dtrain/core/clock.h"
#include "dtrain/core/device.h"
#include "dtrain/kernels/backend.h"
#include "dtrain/kernels/cpu_backend.h"

namespace dtrain::testing {

class StandInRuntime final : public DeviceRuntime {
 public:
  StandInRuntime()
      : cache_("cuda:0 (stand-in)",
               BlockCache::Source{[this](std::size_t n) -> void* {
                                    if (limit_ && used_ + n > limit_) return nullptr;
                                    used_ += n;
                                    return std::aligned_alloc(256, (n + 255) / 256 * 256);
                                  },
                                  [this](void* p) {
                                    std::free(p);
                                    // Sizes are not tracked per block: the limit is a test's
                                    // budget for fresh allocations only.
                                  },
                                  [this]() -> std::pair<std::size_t, std::size_t> {
                                    return {limit_ ? limit_ - std::min(limit_, used_) : 0, limit_};
                                  },
                                  [] {}}) {}
  const char* name() const override { return "stand-in"; }
  int count() override { return count_; }
  // GPUs cuda:0 ... cuda:N-1, all over the one host memory (GpuForTests sets it).
  void set_count(int n) { count_ = n; }
  std::string absence() override { return ""; }
  DeviceProperties properties(int) override { return {"stand-in GPU (host memory)", limit_, 1, 90}; }
  void* allocate(int, std::size_t bytes) override {
    return capturing(0) ? cache_.allocate_in(capture_pool_, bytes) : cache_.allocate(bytes);
  }
  void deallocate(int, void* data, std::size_t bytes) override { cache_.deallocate(data, bytes); }
  DeviceMemoryStats memory_stats(int) override { return cache_.stats(); }
  void release_cached(int) override { cache_.release_cached(); }
  void set_memory_limit(int, std::size_t bytes, const std::string& why) override { cache_.set_limit(bytes, why); }
  void* allocate_host(std::size_t bytes) override { return cpu_allocator().allocate(bytes); }
  void deallocate_host(void* data, std::size_t bytes) override { cpu_allocator().deallocate(data, bytes); }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) override {
    if (bytes == 0) return;
    if (dst_device.is_cpu() || src_device.is_cpu()) refuse_while_capturing("a copy between the host and cuda:0");
    if (dst_device.is_cpu() && !src_device.is_cpu()) ++waits_;
    queue([=] { std::memmove(dst, src, bytes); });
  }
  void zero(int, void* data, std::size_t bytes) override {
    queue([=] { std::memset(data, 0, bytes); });
  }
  void synchronize(int) override {
    refuse_while_capturing("synchronize");
    ++waits_;
  }
  std::uint64_t host_waits(int) override { return waits_; }
  // Its work is done when queued: nothing to record or wait for.
  DeviceEvent record(int) override {
    refuse_while_capturing("an event recorded on the compute stream");
    return nullptr;
  }
  DeviceEvent copy_beside(int, void* dst, const void* src, std::size_t bytes, const DeviceEvent&) override {
    refuse_while_capturing("a copy beside the compute stream");
    const Clock::time_point start = Clock::now();
    if (bytes) std::memmove(dst, src, bytes);
    ++copies_beside_;
    std::lock_guard lock(copies_mutex_);
    if (timing_copies_) copy_spans_.push_back({start, Clock::now()});
    return nullptr;
  }
  void trace_copies(int, bool on) override {
    std::lock_guard lock(copies_mutex_);
    timing_copies_ = on;
    if (!on) copy_spans_.clear();
  }
  void take_copy_spans(int, std::vector<CopySpan>& out) override {
    std::lock_guard lock(copies_mutex_);
    out.assign(copy_spans_.begin(), copy_spans_.end());
    copy_spans_.clear();
  }
  bool timing_copies() {
    std::lock_guard lock(copies_mutex_);
    return timing_copies_;
  }
  void wait(int, const DeviceEvent&) override {}
  // Its kernels run as they are queued: the device's time is the host's.
  DeviceEvent record_timed(int, const DeviceEvent& reuse) override {
    refuse_while_capturing("a timed event recorded on the compute stream");
    if (before_timed_) before_timed_();
    if (!reuse) return std::make_shared<Clock::time_point>(Clock::now());
    *static_cast<Clock::time_point*>(reuse.get()) = Clock::now();
    return reuse;
  }
  double seconds_between(int, const DeviceEvent& from, const DeviceEvent& to) override {
    return std::chrono::duration<double>(*static_cast<Clock::time_point*>(to.get()) -
                                         *static_cast<Clock::time_point*>(from.get()))
        .count();
  }
  // Graphs, as CUDA's: while the capturing thread queues work (the backend's primitives,
  // copies on the device, zeroing), it is recorded as closures instead of run, and each
  // replay runs them in order; the memory the thread allocates meanwhile is the graph's
  // pool.
  bool can_capture(int) override { return true; }
  // Other threads' work runs at once, as CUDA's runtime holds it off until the capture ends.
  void begin_capture(int) override {
    if (capturing_a_graph()) DTRAIN_THROW(InternalError, "begin_capture: this thread is capturing already");
    recording_ = std::make_shared<Graph>();
    recording_->cache = &cache_;
    recording_->pool = capture_pool_ = cache_.open_pool();
    detail::set_capturing_device(0);
  }
  DeviceGraph end_capture(int, bool keep) override {
    if (!capturing(0)) DTRAIN_THROW(InternalError, "end_capture: this thread is not capturing");
    detail::set_capturing_device(-1);
    std::shared_ptr<Graph> graph = std::move(recording_);
    if (!keep) return nullptr;
    ++captures_;
    return graph;
  }
  bool capturing(int) override { return detail::capturing_device() == 0; }
  void replay(int, const DeviceGraph& graph) override {
    refuse_while_capturing("a graph's replay");
    for (const auto& work : static_cast<Graph*>(graph.get())->work) work();
    ++replays_;
  }
  // Runs `work` now, or records it into the graph the calling thread captures.
  void queue(std::function<void()> work) {
    if (capturing(0)) recording_->work.push_back(std::move(work));
    else work();
  }
  void refuse_while_capturing(const char* call) {
    if (capturing(0)) DTRAIN_THROW(NotCapturable, call, " on cuda:0 cannot be part of a CUDA graph");
  }
  int captures() const { return captures_; }
  std::uint64_t replays() const { return replays_; }

  // Called before each timed mark: the backend ends its primitive under way there, as a
  // GPU's kernel ends before a mark queued after it.
  void before_timed_marks(std::function<void()> hook) { before_timed_ = std::move(hook); }
  // Copies to the device made by copy_beside (an input pipeline's).
  std::uint64_t copies_beside() const { return copies_beside_; }
  // Fresh allocations beyond this many bytes fail (0: no limit), as a full GPU's would.
  void set_limit(std::size_t bytes) { limit_ = bytes; }

 private:
  int count_ = 1;
  std::size_t limit_ = 0, used_ = 0;
  std::function<void()> before_timed_;
  // Atomic: a prefetching thread copies while the test's thread trains.
  std::atomic<std::uint64_t> waits_{0}, copies_beside_{0};
  std::mutex copies_mutex_;
  bool timing_copies_ = false;
  std::vector<CopySpan> copy_spans_;
  struct Graph {
    std::vector<std::function<void()>> work;
    BlockCache* cache = nullptr;
    int pool = 0;
    ~Graph() { cache->close_pool(pool); }
  };
  std::shared_ptr<Graph> recording_;
  int capture_pool_ = 0, captures_ = 0;
  std::uint64_t replays_ = 0;
  BlockCache cache_;
};

// cuda:N's primitives on the CPU backend, over host views of the stand-in's memory.
class StandInBackend final : public kernels::Backend {
 public:
  explicit StandInBackend(int index = 0) : index_(index) {}
  Device device() const override { return Device::cuda(index_); }
  bool supports(kernels::Primitive op, DType dtype) const override { return cpu().supports(op, dtype); }

  void matmul(const Tensor& a, const Tensor& b, Tensor& c, const kernels::MatmulOptions& o) override {
    check({&a, &b, &c, o.bias});
    run([=, this, a = weak(a), b = weak(b), c = weak(c), b0 = held(o.bias)] {
      Tensor hc = host(c), bias = host(b0);
      kernels::MatmulOptions h = o;
      h.bias = b0.defined() ? &bias : nullptr;
      cpu().matmul(host(a), host(b), hc, h);
    });
  }
  void unary(kernels::Unary op, const Tensor& x, Tensor& y, float alpha, float beta) override {
    check({&x, &y});
    run([=, this, x = weak(x), y = weak(y)] {
      Tensor hy = host(y);
      cpu().unary(op, host(x), hy, alpha, beta);
    });
  }
  void unary_backward(kernels::Unary op, const Tensor& saved, const Tensor& dy, Tensor& dx, float alpha,
                      float beta) override {
    check({&saved, &dy, &dx});
    run([=, this, saved = weak(saved), dy = weak(dy), dx = weak(dx)] {
      Tensor h = host(dx);
      cpu().unary_backward(op, host(saved), host(dy), h, alpha, beta);
    });
  }
  void binary(kernels::Binary op, const Tensor& a, const Tensor& b, Tensor& c) override {
    check({&a, &b, &c});
    run([=, this, a = weak(a), b = weak(b), c = weak(c)] {
      Tensor h = host(c);
      cpu().binary(op, host(a), host(b), h);
    });
  }
  void reduce(kernels::Reduce op, const Tensor& x, Tensor& y) override {
    check({&x, &y});
    run([=, this, x = weak(x), y = weak(y)] {
      Tensor h = host(y);
      cpu().reduce(op, host(x), h);
    });
  }
  void softmax(const Tensor& x, Tensor& y, bool log) override {
    check({&x, &y});
    run([=, this, x = weak(x), y = weak(y)] {
      Tensor h = host(y);
      cpu().softmax(host(x), h, log);
    });
  }
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) override {
    check({&y, &dy, &dx});
    run([=, this, y = weak(y), dy = weak(dy), dx = weak(dx)] {
      Tensor h = host(dx);
      cpu().softmax_backward(host(y), host(dy), h, log);
    });
  }
  void convert(const Tensor& x, Tensor& y) override {
    check({&x, &y});
    run([=, this, x = weak(x), y = weak(y)] {
      Tensor h = host(y);
      cpu().convert(host(x), h);
    });
  }
  void fill(Tensor& y, float value) override {
    check({&y});
    run([=, this, y = weak(y)] {
      Tensor h = host(y);
      cpu().fill(h, value);
    });
  }
  void axpby(float alpha, const Tensor& x, float beta, Tensor& y) override {
    check({&x, &y});
    run([=, this, x = weak(x), y = weak(y)] {
      Tensor h = host(y);
      cpu().axpby(alpha, host(x), beta, h);
    });
  }
  void trace_kernels(bool on) override {
    if (on && !timeline_) timeline_ = std::make_unique<kernels::KernelTimeline>(device());
    if (!on && timeline_) {
      end_primitive();
      timeline_->clear();
    }
    tracing_ = on;
  }
  std::size_t kernel_marks() override { return tracing_ ? timeline_->count() : 0; }
  bool timing_kernels() const { return tracing_; }
  void take_kernel_spans(const DeviceEvent& since, std::vector<kernels::KernelSpan>& out) override {
    out.clear();
    if (!timeline_) return;
    end_primitive();
    timeline_->take(since, out);
  }
  // As a GPU's: the answer is a host wait.
  bool all_finite(std::span<const Tensor* const> tensors) override {
    if (runtime_) runtime_->synchronize(0);
    return finite(tensors);
  }
  // Also as a GPU's: no wait, and the many-variable updates after a failed check skip
  // themselves.
  bool begin_finite_check(std::span<const Tensor* const> tensors) override {
    refuse_while_capturing("begin_finite_check");
    if (checking_) DTRAIN_THROW(InvalidArgument, "begin_finite_check: a check on cuda:0 is under way already");
    check_failed_ = !finite(tensors);
    checking_ = true;
    return true;
  }
  bool finite_check_passed() override {
    if (!std::exchange(checking_, false)) return true;
    return !std::exchange(check_failed_, false);
  }
  bool sgd_update_many(std::span<const kernels::UpdateItem> items, const kernels::SgdUpdate& p) override {
    return skipping() || Backend::sgd_update_many(items, p);
  }
  bool adam_update_many(std::span<const kernels::UpdateItem> items, const kernels::AdamUpdate& p) override {
    return skipping() || Backend::adam_update_many(items, p);
  }
  bool rmsprop_update_many(std::span<const kernels::UpdateItem> items, const kernels::RmspropUpdate& p) override {
    return skipping() || Backend::rmsprop_update_many(items, p);
  }
  // Host waits are counted on `runtime` (the stand-in's).
  void count_waits_on(StandInRuntime* runtime) { runtime_ = runtime; }
  double sum_squares(const Tensor& x) override {
    check({&x});
    refuse_while_capturing("sum_squares (a value read by the host)");
    return cpu().sum_squares(host(x));
  }
  void softmax_cross_entropy(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& log_probs) override {
    check({&logits, &target, &loss, &log_probs});
    run([=, this, logits = weak(logits), target = weak(target), loss = weak(loss), log_probs = weak(log_probs)] {
      Tensor hl = host(loss), hp = host(log_probs);
      cpu().softmax_cross_entropy(host(logits), host(target), hl, hp);
    });
  }
  void softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target, const Tensor& dloss,
                                      Tensor& dlogits) override {
    check({&log_probs, &target, &dloss, &dlogits});
    run([=, this, log_probs = weak(log_probs), target = weak(target), dloss = weak(dloss), dlogits = weak(dlogits)] {
      Tensor h = host(dlogits);
      cpu().softmax_cross_entropy_backward(host(log_probs), host(target), host(dloss), h);
    });
  }
  void dropout(const Tensor& x, float rate, const Generator& generator, Tensor& y, Tensor& mask) override {
    check({&x, &y, &mask});
    refuse_while_capturing("dropout (its seed is drawn on the host at each call)");
    Tensor hy = host(y), hm = host(mask);
    cpu().dropout(host(x), rate, generator, hy, hm);
  }
  void argmax(const Tensor& x, Tensor& out) override {
    check({&x, &out});
    run([=, this, x = weak(x), out = weak(out)] {
      Tensor h = host(out);
      cpu().argmax(host(x), h);
    });
  }
  void one_hot(const Tensor& labels, Tensor& out) override {
    check({&labels, &out});
    run([=, this, labels = weak(labels), out = weak(out)] {
      Tensor h = host(out);
      cpu().one_hot(host(labels), h);
    });
  }
  // As a GPU's: the update returns at once and a non-finite weight is told later.
  bool sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const kernels::SgdUpdate& p) override {
    check({&w, &g, velocity});
    run([=, this, w = weak(w), g = weak(g), velocity_ = held(velocity)] {
      Tensor hw = host(w), hv = host(velocity_);
      deferred_bad_ |= !cpu().sgd_update(hw, host(g), velocity_.defined() ? &hv : nullptr, p);
    });
    return true;
  }
  bool adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const kernels::AdamUpdate& p) override {
    check({&w, &g, &m, &v});
    run([=, this, w = weak(w), g = weak(g), m = weak(m), v = weak(v)] {
      Tensor hw = host(w), hm = host(m), hv = host(v);
      deferred_bad_ |= !cpu().adam_update(hw, host(g), hm, hv, p);
    });
    return true;
  }
  bool rmsprop_update(Tensor& w, const Tensor& g, Tensor& v, Tensor* momentum, Tensor* average,
                      const kernels::RmspropUpdate& p) override {
    check({&w, &g, &v, momentum, average});
    run([=, this, w = weak(w), g = weak(g), v = weak(v), momentum_ = held(momentum), average_ = held(average)] {
      Tensor hw = host(w), hv = host(v), hm = host(momentum_),
             ha = host(average_);
      deferred_bad_ |= !cpu().rmsprop_update(hw, host(g), hv, momentum_.defined() ? &hm : nullptr, average_.defined() ? &ha : nullptr, p);
    });
    return true;
  }
  bool take_deferred_non_finite() override { return std::exchange(deferred_bad_, false); }
  void conv2d(const Tensor& x, const Tensor& kernel, Tensor& y, const kernels::Conv2dOptions& o) override {
    check({&x, &kernel, &y, o.bias});
    run([=, this, x = weak(x), kernel = weak(kernel), y = weak(y), bias_ = held(o.bias)] {
      Tensor hy = host(y), bias = host(bias_);
      kernels::Conv2dOptions h = o;
      h.bias = bias_.defined() ? &bias : nullptr;
      cpu().conv2d(host(x), host(kernel), hy, h);
    });
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& kernel, Tensor& dx, const kernels::Conv2dOptions& o) override {
    check({&dy, &kernel, &dx});
    run([=, this, dy = weak(dy), kernel = weak(kernel), dx = weak(dx)] {
      Tensor h = host(dx);
      cpu().conv2d_backward_data(host(dy), host(kernel), h, o);
    });
  }
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dkernel, Tensor* dbias,
                               const kernels::Conv2dOptions& o) override {
    check({&x, &dy, &dkernel, dbias});
    run([=, this, x = weak(x), dy = weak(dy), dkernel = weak(dkernel), dbias_ = held(dbias)] {
      Tensor hk = host(dkernel), hb = host(dbias_);
      cpu().conv2d_backward_weights(host(x), host(dy), hk, dbias_.defined() ? &hb : nullptr, o);
    });
  }
  std::size_t pool2d_workspace_bytes(const Shape& x, const kernels::Pool2dOptions& o) override {
    return cpu().pool2d_workspace_bytes(x, o);
  }
  void pool2d(const Tensor& x, Tensor& y, Tensor* workspace, const kernels::Pool2dOptions& o) override {
    check({&x, &y, workspace});
    run([=, this, x = weak(x), y = weak(y), workspace_ = held(workspace)] {
      Tensor hy = host(y), hw = host(workspace_);
      cpu().pool2d(host(x), hy, workspace_.defined() ? &hw : nullptr, o);
    });
  }
  void pool2d_backward(const Tensor& dy, const Tensor* workspace, Tensor& dx, const kernels::Pool2dOptions& o) override {
    check({&dy, workspace, &dx});
    run([=, this, dy = weak(dy), dx = weak(dx), workspace_ = held(workspace)] {
      Tensor hd = host(dx), hw = host(workspace_);
      cpu().pool2d_backward(host(dy), workspace_.defined() ? &hw : nullptr, hd, o);
    });
  }
  void channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, Tensor& sums) override {
    check({&a, &b, &center, &sums});
    run([=, this, a = weak(a), b = weak(b), center = weak(center), sums = weak(sums)] {
      Tensor h = host(sums);
      cpu().channel_sums(host(a), host(b), host(center), h);
    });
  }
  void channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, Tensor& y, const Tensor* x2,
                      const Tensor* scale2, bool relu) override {
    check({&x, &scale, &shift, &y, x2, scale2});
    run([=, this, x = weak(x), scale = weak(scale), shift = weak(shift), y = weak(y), x2_ = held(x2), scale2_ = held(scale2)] {
      Tensor hy = host(y), h2 = host(x2_), hs2 = host(scale2_);
      cpu().channel_affine(host(x), host(scale), host(shift), hy, x2_.defined() ? &h2 : nullptr, scale2_.defined() ? &hs2 : nullptr, relu);
    });
  }
  void batch_norm_coefficients(const Tensor& mean, const Tensor& variance, double count, const Tensor& gamma,
                               const Tensor& beta, float epsilon, Tensor& coefficients) override {
    check({&mean, &variance, &gamma, &beta, &coefficients});
    run([=, this, mean = weak(mean), variance = weak(variance), gamma = weak(gamma), beta = weak(beta), coefficients = weak(coefficients)] {
      Tensor h = host(coefficients);
      cpu().batch_norm_coefficients(host(mean), host(variance), count, host(gamma), host(beta), epsilon, h);
    });
  }
  void batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                        const Tensor& coefficients, Tensor& gradients) override {
    check({&sums, &total, &coefficients, &gradients});
    run([=, this, sums = weak(sums), total = weak(total), coefficients = weak(coefficients), gradients = weak(gradients)] {
      Tensor h = host(gradients);
      cpu().batch_norm_gradient_coefficients(host(sums), host(total), count, host(coefficients), h);
    });
  }
  void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                  Tensor& inv_std) override {
    check({&x, &gamma, &beta, &y, &mean, &inv_std});
    run([=, this, x = weak(x), gamma = weak(gamma), beta = weak(beta), y = weak(y), mean = weak(mean), inv_std = weak(inv_std)] {
      Tensor hy = host(y), hm = host(mean), hs = host(inv_std);
      cpu().layer_norm(host(x), host(gamma), host(beta), epsilon, hy, hm, hs);
    });
  }
  void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                           const Tensor& inv_std, Tensor& dx, Tensor* dgamma, Tensor* dbeta) override {
    check({&x, &dy, &gamma, &mean, &inv_std, &dx, dgamma, dbeta});
    run([=, this, x = weak(x), dy = weak(dy), gamma = weak(gamma), mean = weak(mean), inv_std = weak(inv_std), dx = weak(dx), dgamma_ = held(dgamma), dbeta_ = held(dbeta)] {
      Tensor hx = host(dx), hg = host(dgamma_), hb = host(dbeta_);
      cpu().layer_norm_backward(host(x), host(dy), host(gamma), host(mean), host(inv_std), hx, dgamma_.defined() ? &hg : nullptr,
                                dbeta_.defined() ? &hb : nullptr);
    });
  }
  void gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) override {
    check({&table, &ids, &out});
    run([=, this, table = weak(table), ids = weak(ids), out = weak(out)] {
      Tensor h = host(out);
      cpu().gather_rows(host(table), host(ids), h);
    });
  }
  void scatter_add_rows(const Tensor& ids, const Tensor& rows, Tensor& table) override {
    check({&ids, &rows, &table});
    run([=, this, ids = weak(ids), rows = weak(rows), table = weak(table)] {
      Tensor h = host(table);
      cpu().scatter_add_rows(host(ids), host(rows), h);
    });
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const kernels::AttentionOptions& o, Tensor& out,
                 Tensor& lse) override {
    check({&q, &k, &v, &out, &lse, o.mask});
    if (o.dropout_rate > 0.0f)
      refuse_while_capturing("attention's dropout (its seed is drawn on the host at each call)");
    run([=, this, q = weak(q), k = weak(k), v = weak(v), out = weak(out), lse = weak(lse), mask_ = held(o.mask)] {
      Tensor ho = host(out), hl = host(lse), mask = host(mask_);
      kernels::AttentionOptions h = o;
      h.mask = mask_.defined() ? &mask : nullptr;
      cpu().attention(host(q), host(k), host(v), h, ho, hl);
    });
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, const kernels::AttentionOptions& o, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    check({&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, o.mask});
    run([=, this, q = weak(q), k = weak(k), v = weak(v), out = weak(out), lse = weak(lse), dout = weak(dout), dq = weak(dq), dk = weak(dk), dv = weak(dv), mask_ = held(o.mask)] {
      Tensor hq = host(dq), hk = host(dk), hv = host(dv), mask = host(mask_);
      kernels::AttentionOptions h = o;
      h.mask = mask_.defined() ? &mask : nullptr;
      cpu().attention_backward(host(q), host(k), host(v), host(out), host(lse), host(dout), h, hq, hk, hv);
    });
  }
  void copy_block(const Tensor& src, const kernels::Block& from, Tensor& dst, const kernels::Block& to,
                  std::int64_t outer, std::int64_t rows, std::int64_t width) override {
    check({&src, &dst});
    run([=, this, src = weak(src), dst = weak(dst)] {
      Tensor h = host(dst);
      cpu().copy_block(host(src), from, h, to, outer, rows, width);
    });
  }

 private:
  static kernels::CpuBackend& cpu() { return kernels::cpu_backend(); }
  // Runs a primitive's work now, or records it into the graph being captured (closures
  // hold their operands by value: the tensors outlive the call).
  template <typename Work>
  void run(Work work) {
    if (runtime_) runtime_->queue(std::move(work));
    else work();
  }
  void refuse_while_capturing(const char* call) {
    if (runtime_) runtime_->refuse_while_capturing(call);
  }
  // An operand as a recorded closure keeps it: a view that does not hold its memory, as a
  // CUDA graph keeps an address (the memory stays the graph's, or its owner's, meanwhile;
  // holding it would make a variable's next in-place update copy its storage first).
  static Tensor weak(const Tensor& t) {
    if (!t.defined()) return t;
    return Tensor::over(t.raw_device_data(), t.shape(), t.dtype(), nullptr, t.device());
  }
  // An optional operand, kept the same way (undefined where absent).
  static Tensor held(const Tensor* t) { return t ? weak(*t) : Tensor(); }
  bool finite(std::span<const Tensor* const> tensors) {
    std::vector<Tensor> hosts;
    for (const Tensor* t : tensors) {
      check({t});
      hosts.push_back(host(*t));
    }
    std::vector<const Tensor*> pointers;
    for (const Tensor& h : hosts) pointers.push_back(&h);
    return cpu().all_finite(pointers);
  }
  bool skipping() const { return checking_ && check_failed_; }
  // A CPU view of a stand-in tensor's memory (undefined stays undefined).
  static Tensor host(const Tensor& t) {
    if (!t.defined()) return t;
    return Tensor::over(t.raw_device_data(), t.shape(), t.dtype(), nullptr);
  }
  // As a GPU backend: every operand on its GPU. Each primitive starts here, so while kernels
  // are timed the one before ends here (it ran when it was called), or at a timed mark.
  void check(std::initializer_list<const Tensor*> operands) const {
    for (const Tensor* t : operands)
      if (t != nullptr && t->defined() && !(t->device() == device()))
        DTRAIN_THROW(InvalidArgument, "an operand of shape ", t->shape().to_string(), " is on ",
                     t->device().to_string(), ", the others on ", device().to_string());
    if (tracing_) {
      end_primitive();
      timeline_->start_primitive();
      primitive_open_ = true;
    }
  }

 public:
  void end_primitive() const {
    if (!primitive_open_) return;
    primitive_open_ = false;  // first: the end's own mark comes back here
    timeline_->end_kernel("stand-in kernel");
  }

 private:
  bool deferred_bad_ = false;
  bool checking_ = false, check_failed_ = false;  // begin_finite_check's
  StandInRuntime* runtime_ = nullptr;
  int index_;
  bool tracing_ = false;
  mutable bool primitive_open_ = false;
  std::unique_ptr<kernels::KernelTimeline> timeline_;
};

// Whether this machine has a real GPU for dtrain (built with CUDA, and one found).
inline bool real_gpu_present() {
  DeviceRuntime* r = device_runtime(DeviceType::cuda);
  return r != nullptr && std::string(r->name()) == "CUDA" && r->count() > 0;
}

// cuda:0 (to cuda:N-1 with `gpus`) for the guard's life: the machine's GPUs where it has
// that many, else the stand-in, with `gpus` devices over the one host memory.
class GpuForTests {
 public:
  explicit GpuForTests(int gpus = 1) {
    if (real_gpu_present() && device_runtime(DeviceType::cuda)->count() >= gpus) return;
    runtime_ = std::make_unique<StandInRuntime>();
    runtime_->set_count(gpus);
    for (int i = 0; i < gpus; ++i) {
      backends_.push_back(std::make_unique<StandInBackend>(i));
      backends_.back()->count_waits_on(runtime_.get());
    }
    // The trace's marks are cuda:0's.
    runtime_->before_timed_marks([b = backends_.front().get()] { b->end_primitive(); });
    set_device_runtime(DeviceType::cuda, runtime_.get());
    for (int i = 0; i < gpus; ++i) kernels::set_backend(Device::cuda(i), backends_[static_cast<std::size_t>(i)].get());
  }
  ~GpuForTests() {
    if (!runtime_) return;
    for (std::size_t i = 0; i < backends_.size(); ++i) kernels::set_backend(Device::cuda(static_cast<int>(i)), nullptr);
    set_device_runtime(DeviceType::cuda, nullptr);
  }
  GpuForTests(const GpuForTests&) = delete;
  GpuForTests& operator=(const GpuForTests&) = delete;

  bool stand_in() const { return runtime_ != nullptr; }
  StandInBackend* stand_in_backend() { return backends_.empty() ? nullptr : backends_.front().get(); }
  StandInRuntime* stand_in_runtime() { return runtime_.get(); }

 private:
  std::unique_ptr<StandInRuntime> runtime_;
  std::vector<std::unique_ptr<StandInBackend>> backends_;
};

}  // namespace dtrain::testing
