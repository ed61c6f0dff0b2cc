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
  int count() override { return 1; }
  std::string absence() override { return ""; }
  DeviceProperties properties(int) override { return {"stand-in GPU (host memory)", limit_, 1, 90}; }
  void* allocate(int, std::size_t bytes) override { return cache_.allocate(bytes); }
  void deallocate(int, void* data, std::size_t bytes) override { cache_.deallocate(data, bytes); }
  DeviceMemoryStats memory_stats(int) override { return cache_.stats(); }
  void release_cached(int) override { cache_.release_cached(); }
  void* allocate_host(std::size_t bytes) override { return cpu_allocator().allocate(bytes); }
  void deallocate_host(void* data, std::size_t bytes) override { cpu_allocator().deallocate(data, bytes); }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) override {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && !src_device.is_cpu()) ++waits_;
    std::memmove(dst, src, bytes);
  }
  void zero(int, void* data, std::size_t bytes) override { std::memset(data, 0, bytes); }
  void synchronize(int) override { ++waits_; }
  std::uint64_t host_waits(int) override { return waits_; }
  // Its work is done when queued: nothing to record or wait for.
  DeviceEvent record(int) override { return nullptr; }
  DeviceEvent copy_beside(int, void* dst, const void* src, std::size_t bytes, const DeviceEvent&) override {
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
  // Called before each timed mark: the backend ends its primitive under way there, as a
  // GPU's kernel ends before a mark queued after it.
  void before_timed_marks(std::function<void()> hook) { before_timed_ = std::move(hook); }
  // Copies to the device made by copy_beside (an input pipeline's).
  std::uint64_t copies_beside() const { return copies_beside_; }
  // Fresh allocations beyond this many bytes fail (0: no limit), as a full GPU's would.
  void set_limit(std::size_t bytes) { limit_ = bytes; }

 private:
  std::size_t limit_ = 0, used_ = 0;
  std::function<void()> before_timed_;
  // Atomic: a prefetching thread copies while the test's thread trains.
  std::atomic<std::uint64_t> waits_{0}, copies_beside_{0};
  std::mutex copies_mutex_;
  bool timing_copies_ = false;
  std::vector<CopySpan> copy_spans_;
  BlockCache cache_;
};

// cuda:0's primitives on the CPU backend, over host views of the stand-in's memory.
class StandInBackend final : public kernels::Backend {
 public:
  Device device() const override { return Device::cuda(0); }
  bool supports(kernels::Primitive op, DType dtype) const override { return cpu().supports(op, dtype); }

  void matmul(const Tensor& a, const Tensor& b, Tensor& c, const kernels::MatmulOptions& o) override {
    check({&a, &b, &c, o.bias});
    Tensor hc = host(c), bias = o.bias ? host(*o.bias) : Tensor();
    kernels::MatmulOptions h = o;
    h.bias = o.bias ? &bias : nullptr;
    cpu().matmul(host(a), host(b), hc, h);
  }
  void unary(kernels::Unary op, const Tensor& x, Tensor& y, float alpha, float beta) override {
    check({&x, &y});
    Tensor hy = host(y);
    cpu().unary(op, host(x), hy, alpha, beta);
  }
  void unary_backward(kernels::Unary op, const Tensor& saved, const Tensor& dy, Tensor& dx, float alpha,
                      float beta) override {
    check({&saved, &dy, &dx});
    Tensor h = host(dx);
    cpu().unary_backward(op, host(saved), host(dy), h, alpha, beta);
  }
  void binary(kernels::Binary op, const Tensor& a, const Tensor& b, Tensor& c) override {
    check({&a, &b, &c});
    Tensor h = host(c);
    cpu().binary(op, host(a), host(b), h);
  }
  void reduce(kernels::Reduce op, const Tensor& x, Tensor& y) override {
    check({&x, &y});
    Tensor h = host(y);
    cpu().reduce(op, host(x), h);
  }
  void softmax(const Tensor& x, Tensor& y, bool log) override {
    check({&x, &y});
    Tensor h = host(y);
    cpu().softmax(host(x), h, log);
  }
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) override {
    check({&y, &dy, &dx});
    Tensor h = host(dx);
    cpu().softmax_backward(host(y), host(dy), h, log);
  }
  void convert(const Tensor& x, Tensor& y) override {
    check({&x, &y});
    Tensor h = host(y);
    cpu().convert(host(x), h);
  }
  void fill(Tensor& y, float value) override {
    check({&y});
    Tensor h = host(y);
    cpu().fill(h, value);
  }
  void axpby(float alpha, const Tensor& x, float beta, Tensor& y) override {
    check({&x, &y});
    Tensor h = host(y);
    cpu().axpby(alpha, host(x), beta, h);
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
    return cpu().sum_squares(host(x));
  }
  void softmax_cross_entropy(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& log_probs) override {
    check({&logits, &target, &loss, &log_probs});
    Tensor hl = host(loss), hp = host(log_probs);
    cpu().softmax_cross_entropy(host(logits), host(target), hl, hp);
  }
  void softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target, const Tensor& dloss,
                                      Tensor& dlogits) override {
    check({&log_probs, &target, &dloss, &dlogits});
    Tensor h = host(dlogits);
    cpu().softmax_cross_entropy_backward(host(log_probs), host(target), host(dloss), h);
  }
  void dropout(const Tensor& x, float rate, const Generator& generator, Tensor& y, Tensor& mask) override {
    check({&x, &y, &mask});
    Tensor hy = host(y), hm = host(mask);
    cpu().dropout(host(x), rate, generator, hy, hm);
  }
  void argmax(const Tensor& x, Tensor& out) override {
    check({&x, &out});
    Tensor h = host(out);
    cpu().argmax(host(x), h);
  }
  void one_hot(const Tensor& labels, Tensor& out) override {
    check({&labels, &out});
    Tensor h = host(out);
    cpu().one_hot(host(labels), h);
  }
  // As a GPU's: the update returns at once and a non-finite weight is told later.
  bool sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const kernels::SgdUpdate& p) override {
    check({&w, &g, velocity});
    Tensor hw = host(w), hv = velocity ? host(*velocity) : Tensor();
    deferred_bad_ |= !cpu().sgd_update(hw, host(g), velocity ? &hv : nullptr, p);
    return true;
  }
  bool adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const kernels::AdamUpdate& p) override {
    check({&w, &g, &m, &v});
    Tensor hw = host(w), hm = host(m), hv = host(v);
    deferred_bad_ |= !cpu().adam_update(hw, host(g), hm, hv, p);
    return true;
  }
  bool rmsprop_update(Tensor& w, const Tensor& g, Tensor& v, Tensor* momentum, Tensor* average,
                      const kernels::RmspropUpdate& p) override {
    check({&w, &g, &v, momentum, average});
    Tensor hw = host(w), hv = host(v), hm = momentum ? host(*momentum) : Tensor(),
           ha = average ? host(*average) : Tensor();
    deferred_bad_ |= !cpu().rmsprop_update(hw, host(g), hv, momentum ? &hm : nullptr, average ? &ha : nullptr, p);
    return true;
  }
  bool take_deferred_non_finite() override { return std::exchange(deferred_bad_, false); }
  void conv2d(const Tensor& x, const Tensor& kernel, Tensor& y, const kernels::Conv2dOptions& o) override {
    check({&x, &kernel, &y, o.bias});
    Tensor hy = host(y), bias = o.bias ? host(*o.bias) : Tensor();
    kernels::Conv2dOptions h = o;
    h.bias = o.bias ? &bias : nullptr;
    cpu().conv2d(host(x), host(kernel), hy, h);
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& kernel, Tensor& dx, const kernels::Conv2dOptions& o) override {
    check({&dy, &kernel, &dx});
    Tensor h = host(dx);
    cpu().conv2d_backward_data(host(dy), host(kernel), h, o);
  }
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dkernel, Tensor* dbias,
                               const kernels::Conv2dOptions& o) override {
    check({&x, &dy, &dkernel, dbias});
    Tensor hk = host(dkernel), hb = dbias ? host(*dbias) : Tensor();
    cpu().conv2d_backward_weights(host(x), host(dy), hk, dbias ? &hb : nullptr, o);
  }
  std::size_t pool2d_workspace_bytes(const Shape& x, const kernels::Pool2dOptions& o) override {
    return cpu().pool2d_workspace_bytes(x, o);
  }
  void pool2d(const Tensor& x, Tensor& y, Tensor* workspace, const kernels::Pool2dOptions& o) override {
    check({&x, &y, workspace});
    Tensor hy = host(y), hw = workspace ? host(*workspace) : Tensor();
    cpu().pool2d(host(x), hy, workspace ? &hw : nullptr, o);
  }
  void pool2d_backward(const Tensor& dy, const Tensor* workspace, Tensor& dx, const kernels::Pool2dOptions& o) override {
    check({&dy, workspace, &dx});
    Tensor hd = host(dx), hw = workspace ? host(*workspace) : Tensor();
    cpu().pool2d_backward(host(dy), workspace ? &hw : nullptr, hd, o);
  }
  void channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, Tensor& sums) override {
    check({&a, &b, &center, &sums});
    Tensor h = host(sums);
    cpu().channel_sums(host(a), host(b), host(center), h);
  }
  void channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, Tensor& y, const Tensor* x2,
                      const Tensor* scale2, bool relu) override {
    check({&x, &scale, &shift, &y, x2, scale2});
    Tensor hy = host(y), h2 = x2 ? host(*x2) : Tensor(), hs2 = scale2 ? host(*scale2) : Tensor();
    cpu().channel_affine(host(x), host(scale), host(shift), hy, x2 ? &h2 : nullptr, scale2 ? &hs2 : nullptr, relu);
  }
  void batch_norm_coefficients(const Tensor& mean, const Tensor& variance, double count, const Tensor& gamma,
                               const Tensor& beta, float epsilon, Tensor& coefficients) override {
    check({&mean, &variance, &gamma, &beta, &coefficients});
    Tensor h = host(coefficients);
    cpu().batch_norm_coefficients(host(mean), host(variance), count, host(gamma), host(beta), epsilon, h);
  }
  void batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                        const Tensor& coefficients, Tensor& gradients) override {
    check({&sums, &total, &coefficients, &gradients});
    Tensor h = host(gradients);
    cpu().batch_norm_gradient_coefficients(host(sums), host(total), count, host(coefficients), h);
  }
  void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                  Tensor& inv_std) override {
    check({&x, &gamma, &beta, &y, &mean, &inv_std});
    Tensor hy = host(y), hm = host(mean), hs = host(inv_std);
    cpu().layer_norm(host(x), host(gamma), host(beta), epsilon, hy, hm, hs);
  }
  void layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                           const Tensor& inv_std, Tensor& dx, Tensor* dgamma, Tensor* dbeta) override {
    check({&x, &dy, &gamma, &mean, &inv_std, &dx, dgamma, dbeta});
    Tensor hx = host(dx), hg = dgamma ? host(*dgamma) : Tensor(), hb = dbeta ? host(*dbeta) : Tensor();
    cpu().layer_norm_backward(host(x), host(dy), host(gamma), host(mean), host(inv_std), hx, dgamma ? &hg : nullptr,
                              dbeta ? &hb : nullptr);
  }
  void gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) override {
    check({&table, &ids, &out});
    Tensor h = host(out);
    cpu().gather_rows(host(table), host(ids), h);
  }
  void scatter_add_rows(const Tensor& ids, const Tensor& rows, Tensor& table) override {
    check({&ids, &rows, &table});
    Tensor h = host(table);
    cpu().scatter_add_rows(host(ids), host(rows), h);
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const kernels::AttentionOptions& o, Tensor& out,
                 Tensor& lse) override {
    check({&q, &k, &v, &out, &lse, o.mask});
    Tensor ho = host(out), hl = host(lse), mask = o.mask ? host(*o.mask) : Tensor();
    kernels::AttentionOptions h = o;
    h.mask = o.mask ? &mask : nullptr;
    cpu().attention(host(q), host(k), host(v), h, ho, hl);
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, const kernels::AttentionOptions& o, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    check({&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, o.mask});
    Tensor hq = host(dq), hk = host(dk), hv = host(dv), mask = o.mask ? host(*o.mask) : Tensor();
    kernels::AttentionOptions h = o;
    h.mask = o.mask ? &mask : nullptr;
    cpu().attention_backward(host(q), host(k), host(v), host(out), host(lse), host(dout), h, hq, hk, hv);
  }
  void copy_block(const Tensor& src, const kernels::Block& from, Tensor& dst, const kernels::Block& to,
                  std::int64_t outer, std::int64_t rows, std::int64_t width) override {
    check({&src, &dst});
    Tensor h = host(dst);
    cpu().copy_block(host(src), from, h, to, outer, rows, width);
  }

 private:
  static kernels::CpuBackend& cpu() { return kernels::cpu_backend(); }
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
  // As a GPU backend: every operand on cuda:0. Each primitive starts here, so while kernels
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
  bool tracing_ = false;
  mutable bool primitive_open_ = false;
  std::unique_ptr<kernels::KernelTimeline> timeline_;
};

// Whether this machine has a real GPU for dtrain (built with CUDA, and one found).
inline bool real_gpu_present() {
  DeviceRuntime* r = device_runtime(DeviceType::cuda);
  return r != nullptr && std::string(r->name()) == "CUDA" && r->count() > 0;
}

// cuda:0 for the guard's life: the real one where present, else the stand-in.
class GpuForTests {
 public:
  GpuForTests() {
    if (real_gpu_present()) return;
    runtime_ = std::make_unique<StandInRuntime>();
    backend_ = std::make_unique<StandInBackend>();
    runtime_->before_timed_marks([b = backend_.get()] { b->end_primitive(); });
    backend_->count_waits_on(runtime_.get());
    set_device_runtime(DeviceType::cuda, runtime_.get());
    kernels::set_backend(Device::cuda(0), backend_.get());
  }
  ~GpuForTests() {
    if (!runtime_) return;
    kernels::set_backend(Device::cuda(0), nullptr);
    set_device_runtime(DeviceType::cuda, nullptr);
  }
  GpuForTests(const GpuForTests&) = delete;
  GpuForTests& operator=(const GpuForTests&) = delete;

  bool stand_in() const { return runtime_ != nullptr; }
  StandInBackend* stand_in_backend() { return backend_.get(); }
  StandInRuntime* stand_in_runtime() { return runtime_.get(); }

 private:
  std::unique_ptr<StandInRuntime> runtime_;
  std::unique_ptr<StandInBackend> backend_;
};

}  // namespace dtrain::testing
