// The CUDA backend's host side: checks (checks.h, shared with the CPU backend), cuBLASLt's
// matrix products with their chosen algorithms cached per shape, and the launches of
// dtrain's kernels (launch.h) on the device's compute stream.
#include "dtrain/kernels/cuda/cuda_backend.h"

#include <array>
#include <atomic>
#include <limits>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "dtrain/core/cuda_runtime.h"
#include "dtrain/core/rng.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cuda/libraries.h"

namespace dtrain::kernels {

namespace cuda {

math::UnaryOp activation_op(Activation a) {
  switch (a) {
    case Activation::relu: return math::UnaryOp::relu;
    case Activation::sigmoid: return math::UnaryOp::sigmoid;
    case Activation::tanh: return math::UnaryOp::tanh;
    case Activation::gelu: return math::UnaryOp::gelu;
    case Activation::linear: break;
  }
  return math::UnaryOp::linear;
}

void check_launch(const char* kernel, std::int64_t elements, const Launch& l) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    detail::check_cuda(status, detail::concat("the launch of kernel ", kernel, " over ", elements, " elements"),
                       l.device);
  if (l.timeline) l.timeline->end_kernel(kernel);
}

}  // namespace cuda

namespace {

// A query's warp holds kMaxAttentionDepth values of q's and v's depth.
void check_attention_depth(const Tensor& q, const Tensor& v) {
  if (q.dim(3) > cuda::kMaxAttentionDepth || v.dim(3) > cuda::kMaxAttentionDepth)
    DTRAIN_THROW(InvalidArgument, "attention on a GPU: key and value depths up to ", cuda::kMaxAttentionDepth,
                 " per head, got ", q.dim(3), " and ", v.dim(3));
}

}  // namespace

namespace {

math::UnaryOp math_op(Unary op) { return static_cast<math::UnaryOp>(op); }

// Tensors 0 to count - 1 in groups of at most kManyTensors, each handed to `launch` as one
// ManyTensors: fill(i, t, k) puts tensor i's pointers in t's place k and returns its size.
template <typename Fill, typename Fn>
void in_groups(std::size_t count, Fill fill, Fn launch) {
  for (std::size_t first = 0; first < count; first += cuda::kManyTensors) {
    cuda::ManyTensors t{};
    std::int64_t end = 0;
    for (std::size_t i = first; i < std::min(count, first + cuda::kManyTensors); ++i) {
      const int k = t.count++;
      end += fill(i, t, k);
      t.ends[k] = end;
    }
    launch(t);
  }
}

// The largest power of two (up to 256) that divides the address: what cuBLASLt's kernels
// may assume of an operand's alignment.
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a >>= 1;
  return a;
}

void check_blas(cublasStatus_t status, const char* call, const std::string& what, int device) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  DTRAIN_THROW(DeviceError, "cuBLASLt error on ", Device::cuda(device).to_string(), " in ", call, " for ", what, ": ",
               cuda::cublaslt().status_string(status));
}

}  // namespace

// ---- cuBLASLt

struct CudaBackend::Blas {
  struct Key {
    std::array<std::int64_t, 16> v{};
    bool operator==(const Key& o) const { return v == o.v; }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      std::uint64_t h = 0x84222325cbf29ce4ull;
      for (const std::int64_t x : k.v) h = mix64(h ^ static_cast<std::uint64_t>(x));
      return static_cast<std::size_t>(h);
    }
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // as NVIDIA advises for Hopper
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  std::mutex mutex;  // plans carry the bias pointer of the call under way
  std::unordered_map<Key, Plan, KeyHash> plans;

  ~Blas() {
    if (handle == nullptr) return;
    const cuda::CublasLt& lt = cuda::cublaslt();
    for (auto& [key, p] : plans) {
      lt.layout_destroy(p.a);
      lt.layout_destroy(p.b);
      lt.layout_destroy(p.c);
      lt.desc_destroy(p.desc);
    }
    lt.destroy(handle);
  }
};

CudaBackend::CudaBackend(int index) : index_(index), blas_(std::make_unique<Blas>()) {
  auto& runtime = detail::cuda_runtime();
  launch_.stream = runtime.stream(index);
  launch_.device = index;
  launch_.multiprocessors = std::max(1, runtime.properties(index).multiprocessors);
  void* host = nullptr;
  detail::check_cuda(cudaHostAlloc(&host, sizeof(Flags), cudaHostAllocMapped | cudaHostAllocPortable),
                     "cudaHostAlloc (the kernels' flags)", index);
  std::memset(host, 0, sizeof(Flags));
  flags_ = static_cast<Flags*>(host);
  void* on_device = nullptr;
  detail::check_cuda(cudaHostGetDevicePointer(&on_device, host, 0), "cudaHostGetDevicePointer", index);
  device_flags_ = static_cast<Flags*>(on_device);
}

CudaBackend::~CudaBackend() {
  // Leaked with the process (cuda_backend keeps every backend): nothing to free in order.
}

cuda::Launch CudaBackend::launch() {
  report_faults();
  detail::cuda_runtime().use(index_);
  cuda::Launch l = launch_;
  l.timeline = timing_.load(std::memory_order_acquire);
  if (l.timeline) l.timeline->start_primitive();
  return l;
}

void CudaBackend::trace_kernels(bool on) {
  std::lock_guard lock(timeline_mutex_);
  if (on && !timeline_) timeline_ = std::make_unique<KernelTimeline>(device());
  timing_.store(on ? timeline_.get() : nullptr, std::memory_order_release);
  if (!on && timeline_) timeline_->clear();
}

std::size_t CudaBackend::kernel_marks() {
  KernelTimeline* t = timing_.load(std::memory_order_acquire);
  return t ? t->count() : 0;
}

void CudaBackend::take_kernel_spans(const DeviceEvent& since, std::vector<KernelSpan>& out) {
  std::lock_guard lock(timeline_mutex_);
  if (!timeline_) {
    out.clear();
    return;
  }
  timeline_->take(since, out);
}

void CudaBackend::library_call_ended(const char* call) {
  if (KernelTimeline* t = timing_.load(std::memory_order_acquire)) t->end_kernel(call);
}

void CudaBackend::report_faults() {
  volatile cuda::DataFault& f = flags_->fault;
  if (f.code == cuda::kFaultNone) return;
  // The kernel that claimed the record may still be writing it: wait for it (rarely needed).
  detail::cuda_runtime().count_wait(index_);
  detail::check_cuda(cudaStreamSynchronize(launch_.stream), "cudaStreamSynchronize (a kernel's fault report)", index_);
  const int code = f.code;
  const long long a = f.a, b = f.b, c = f.c;
  f.code = cuda::kFaultNone;
  if (code == cuda::kFaultLabel)
    DTRAIN_THROW(InvalidArgument, "softmax_cross_entropy: label ", a, " at row ", b, " is outside [0, ", c,
                 ") (found on ", device().to_string(), " by a kernel queued earlier)");
  DTRAIN_THROW(InvalidArgument, "one_hot: label ", a, " at row ", b, " is outside [0, ", c, ") (found on ",
               device().to_string(), " by a kernel queued earlier)");
}

Tensor CudaBackend::scratch(std::size_t bytes) {
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, device());
}

bool CudaBackend::supports(Primitive op, DType dtype) const {
  switch (op) {
    case Primitive::matmul:
    case Primitive::convert:
    case Primitive::conv2d:
    case Primitive::conv2d_backward_data:
    case Primitive::conv2d_backward_weights: return is_floating(dtype);
    default: return dtype == DType::f32;
  }
}

// c[M, width] (row-major) = op(a) · op(b). cuBLASLt reads column-major matrices, and a
// row-major matrix is its transpose in column-major: so it computes cᵀ = op(b)ᵀ · op(a)ᵀ,
// with b as its first operand and a as its second, and bias along cᵀ's rows (c's columns).
void CudaBackend::matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& o) {
  check_devices("matmul", device(), {&a, &b, &c, o.bias});
  const MatmulDims d = check_matmul(a, b, c, o);
  const cuda::Launch l = launch();
  if (d.m == 0 || d.n == 0) return;
  if (d.k == 0) {  // an empty sum: act(bias), or unchanged when accumulating
    if (!o.accumulate)
      cuda::bias_rows(l, o.bias ? o.bias->device_data<float>() : nullptr, c.device_data<float>(), d.m, d.width,
                      d.column_begin, d.column_end, cuda::activation_op(o.activation));
    return;
  }
  const bool half = is_half(a.dtype());
  const bool tf32 = !half && tensor_float_32_execution();
  const std::size_t elem = dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(a.raw_device_data());
  const char* pb = static_cast<const char*>(b.raw_device_data()) + d.column_begin * static_cast<std::int64_t>(elem);
  float* pc = c.device_data<float>() + d.column_begin;
  // Epilogues cuBLASLt fuses: bias and relu; the other activations run after, on c.
  const bool relu = o.activation == Activation::relu;
  const cublasLtEpilogue_t epilogue = o.bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                             : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  // First operand (b): as stored, [width, K] column-major (ld width), or [K, N] when b is
  // stored transposed (ld K), used transposed. Second (a): [K, M] (ld K), or [M, K] (ld M)
  // transposed. Output: [N, M] column-major, ld width.
  const std::int64_t ld_b = o.transpose_b ? d.k : d.width;
  const std::int64_t ld_a = o.transpose_a ? d.m : d.k;
  Blas::Key key;
  key.v = {d.m, d.n, d.k, ld_a, ld_b, d.width, o.transpose_a, o.transpose_b, static_cast<int>(a.dtype()), tf32, epilogue, o.accumulate,
           alignment_of(pa), alignment_of(pb), alignment_of(pc), o.bias ? alignment_of(o.bias->raw_device_data()) : 0};
  const cuda::CublasLt& lt = cuda::cublaslt();
  const std::string what = detail::concat("a ", a.shape().to_string(), o.transpose_a ? "ᵀ" : "", " · b ",
                                          b.shape().to_string(), o.transpose_b ? "ᵀ" : "", " (", dtype_name(a.dtype()),
                                          ")");
  std::lock_guard lock(blas_->mutex);
  if (blas_->handle == nullptr) {
    check_blas(lt.create(&blas_->handle), "cublasLtCreate", what, index_);
    blas_->workspace = scratch(Blas::kWorkspaceBytes);
  }
  auto it = blas_->plans.find(key);
  if (it == blas_->plans.end()) {
    Blas::Plan p;
    const cudaDataType_t in = a.dtype() == DType::bf16 ? CUDA_R_16BF : a.dtype() == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check_blas(lt.desc_create(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate", what, index_);
    const cublasOperation_t op_first = o.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = o.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_blas(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first), "cublasLtMatmulDescSetAttribute",
               what, index_);
    check_blas(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second),
               "cublasLtMatmulDescSetAttribute", what, index_);
    check_blas(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
               "cublasLtMatmulDescSetAttribute", what, index_);
    if (o.bias) {
      const cudaDataType_t bias_type = CUDA_R_32F;
      check_blas(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                 "cublasLtMatmulDescSetAttribute", what, index_);
    }
    const auto rows_first = static_cast<std::uint64_t>(o.transpose_b ? d.k : d.n);
    const auto cols_first = static_cast<std::uint64_t>(o.transpose_b ? d.n : d.k);
    const auto rows_second = static_cast<std::uint64_t>(o.transpose_a ? d.m : d.k);
    const auto cols_second = static_cast<std::uint64_t>(o.transpose_a ? d.k : d.m);
    check_blas(lt.layout_create(&p.a, in, rows_first, cols_first, ld_b), "cublasLtMatrixLayoutCreate", what, index_);
    check_blas(lt.layout_create(&p.b, in, rows_second, cols_second, ld_a), "cublasLtMatrixLayoutCreate", what, index_);
    check_blas(lt.layout_create(&p.c, CUDA_R_32F, static_cast<std::uint64_t>(d.n), static_cast<std::uint64_t>(d.m),
                                d.width),
               "cublasLtMatrixLayoutCreate", what, index_);
    // The heuristic reads the bias pointer's alignment from the descriptor (cublasLt.h).
    if (o.bias) {
      const void* bias = o.bias->raw_device_data();
      check_blas(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                 "cublasLtMatmulDescSetAttribute", what, index_);
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check_blas(lt.preference_create(&pref), "cublasLtMatmulPreferenceCreate", what, index_);
    const std::uint64_t workspace = Blas::kWorkspaceBytes;
    const std::uint32_t align_a = static_cast<std::uint32_t>(key.v[13]), align_b = static_cast<std::uint32_t>(key.v[12]),
                        align_c = static_cast<std::uint32_t>(key.v[14]);
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> prefs[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c}};
    cublasStatus_t set = lt.preference_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
    for (const auto& [attribute, value] : prefs)
      if (set == CUBLAS_STATUS_SUCCESS) set = lt.preference_set(pref, attribute, value, sizeof(std::uint32_t));
    if (set != CUBLAS_STATUS_SUCCESS) lt.preference_destroy(pref);
    check_blas(set, "cublasLtMatmulPreferenceSetAttribute", what, index_);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = lt.heuristic(blas_->handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    lt.preference_destroy(pref);
    check_blas(status, "cublasLtMatmulAlgoGetHeuristic", what, index_);
    if (found == 0)
      DTRAIN_THROW(DeviceError, "cuBLASLt has no algorithm on ", device().to_string(), " for ", what);
    p.algo = result.algo;
    it = blas_->plans.emplace(key, p).first;
  }
  const Blas::Plan& p = it->second;
  if (o.bias) {
    const void* bias = o.bias->raw_device_data();
    check_blas(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
               "cublasLtMatmulDescSetAttribute", what, index_);
  }
  const float alpha = 1.0f, beta = o.accumulate ? 1.0f : 0.0f;
  check_blas(lt.matmul(blas_->handle, p.desc, &alpha, pb, p.a, pa, p.b, &beta, pc, p.c, pc, p.c, &p.algo,
                       blas_->workspace.raw_device_data(), Blas::kWorkspaceBytes, l.stream),
             "cublasLtMatmul", what, index_);
  library_call_ended("cublasLtMatmul");
  if (o.activation != Activation::linear && !relu)
    cuda::unary(l, cuda::activation_op(o.activation), c.device_data<float>(), c.device_data<float>(), c.numel(), 1.0f, 0.0f);
}

// ---- element-wise

void CudaBackend::unary(Unary op, const Tensor& x, Tensor& y, float alpha, float beta) {
  check_devices("unary", device(), {&x, &y});
  check_unary(op, x, y);
  const cuda::Launch l = launch();
  if (op == Unary::linear && x.dtype() == DType::u8) {
    cuda::linear_from_bytes(l, x.device_data<std::uint8_t>(), alpha, beta, y.device_data<float>(), x.numel());
    return;
  }
  cuda::unary(l, math_op(op), x.device_data<float>(), y.device_data<float>(), x.numel(), alpha, beta);
}

void CudaBackend::unary_backward(Unary op, const Tensor& saved, const Tensor& dy, Tensor& dx, float alpha, float beta) {
  check_devices("unary_backward", device(), {&saved, &dy, &dx});
  check_unary_backward(saved, dy, dx);
  cuda::unary_backward(launch(), math_op(op), saved.device_data<float>(), dy.device_data<float>(),
                       dx.device_data<float>(), dy.numel(), alpha, beta);
}

void CudaBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& c) {
  check_devices("binary", device(), {&a, &b, &c});
  check_binary(a, b, c);
  const cuda::Launch l = launch();
  const auto bop = static_cast<cuda::BinaryOp>(op);
  if (a.shape() == c.shape() && b.shape() == c.shape()) {
    cuda::binary_same(l, bop, a.device_data<float>(), b.device_data<float>(), c.device_data<float>(), c.numel());
    return;
  }
  cuda::Broadcast s;
  s.rank = c.rank();
  const auto stra = a.shape().strides();
  const auto strb = b.shape().strides();
  for (int i = 0; i < s.rank; ++i) {
    s.dims[i] = c.dim(i);
    const int ia = a.rank() - s.rank + i, ib = b.rank() - s.rank + i;
    s.stride_a[i] = ia >= 0 && a.dim(ia) != 1 ? stra[ia] : 0;
    s.stride_b[i] = ib >= 0 && b.dim(ib) != 1 ? strb[ib] : 0;
  }
  cuda::binary_broadcast(l, bop, a.device_data<float>(), b.device_data<float>(), c.device_data<float>(), c.numel(), s);
}

void CudaBackend::reduce(Reduce op, const Tensor& x, Tensor& y) {
  check_devices("reduce", device(), {&x, &y});
  const ReduceDims dims = check_reduce(x, y);
  const cuda::Launch l = launch();
  if (y.numel() == 0) return;
  if (x.numel() == 0) {
    cuda::fill(l, y.device_data<float>(), y.numel(),
               op == Reduce::max ? -std::numeric_limits<float>::infinity()
                                 : (op == Reduce::mean ? std::numeric_limits<float>::quiet_NaN() : 0.0f));
    return;
  }
  if (dims.x == dims.y) {
    y.copy_from(x.reshape(y.shape()));
    return;
  }
  const int rank = static_cast<int>(dims.x.size());
  if (rank > cuda::kMaxRank)
    DTRAIN_THROW(InvalidArgument, "reduce: ", x.shape().to_string(), " has more than ", cuda::kMaxRank, " axes");
  std::array<long long, cuda::kMaxRank> d{};
  std::array<bool, cuda::kMaxRank> reduced{};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims.x[i];
    reduced[i] = dims.y[i] == 1 && dims.x[i] != 1;
  }
  cuda::reduce(l, static_cast<cuda::ReduceOp>(op), x.device_data<float>(), y.device_data<float>(), rank, d.data(),
               reduced.data());
}

void CudaBackend::softmax(const Tensor& x, Tensor& y, bool log) {
  check_devices("softmax", device(), {&x, &y});
  check_softmax(x, y, "softmax");
  const std::int64_t cols = x.dim(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  cuda::softmax(launch(), x.device_data<float>(), y.device_data<float>(), rows, cols, log);
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) {
  check_devices("softmax_backward", device(), {&y, &dy, &dx});
  check_softmax(y, dy, "softmax_backward");
  check_softmax(y, dx, "softmax_backward");
  const std::int64_t cols = y.dim(-1), rows = cols == 0 ? 0 : y.numel() / cols;
  cuda::softmax_backward(launch(), y.device_data<float>(), dy.device_data<float>(), dx.device_data<float>(), rows, cols,
                         log);
}

void CudaBackend::convert(const Tensor& x, Tensor& y) {
  check_devices("convert", device(), {&x, &y});
  check_convert(x, y);
  const cuda::Launch l = launch();
  if (x.dtype() == y.dtype()) {
    y.copy_from(x);
  } else if (x.dtype() == DType::f32) {
    cuda::narrow(l, x.device_data<float>(), static_cast<std::uint16_t*>(y.raw_device_data()), cuda::elem_of(y.dtype()),
                 x.numel());
  } else {
    cuda::widen(l, static_cast<const std::uint16_t*>(x.raw_device_data()), cuda::elem_of(x.dtype()),
                y.device_data<float>(), x.numel());
  }
}

void CudaBackend::fill(Tensor& y, float value) {
  check_devices("fill", device(), {&y});
  y.check_dtype(DType::f32, "fill");
  cuda::fill(launch(), y.device_data<float>(), y.numel(), value);
}

void CudaBackend::axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  check_devices("axpby", device(), {&x, &y});
  check_same_f32(x, y, "axpby");
  cuda::axpby(launch(), alpha, x.device_data<float>(), beta, y.device_data<float>(), x.numel());
}

double CudaBackend::sum_squares(const Tensor& x) {
  check_devices("sum_squares", device(), {&x});
  x.check_dtype(DType::f32, "sum_squares");
  Tensor total = scratch(sizeof(double));
  cuda::sum_squares(launch(), x.device_data<float>(), x.numel(), static_cast<double*>(total.raw_device_data()));
  double out = 0.0;
  detail::cuda_runtime().copy(&out, Device::cpu(), total.raw_device_data(), device(), sizeof out);
  return out;
}

namespace {

// The operands of a check of gradients: float32, on `device`.
void check_finite_operands(const char* call, Device device, std::span<const Tensor* const> tensors) {
  for (const Tensor* t : tensors) {
    check_devices(call, device, {t});
    t->check_dtype(DType::f32, call);
  }
}

// *found = 1 (device memory, or host-mapped) where one of `tensors` holds a NaN or an
// infinity: one launch per kManyTensors of them.
void find_non_finite(const cuda::Launch& l, std::span<const Tensor* const> tensors, int* found) {
  in_groups(
      tensors.size(),
      [&](std::size_t i, cuda::ManyTensors& t, int k) {
        t.g[k] = tensors[i]->device_data<float>();
        return tensors[i]->numel();
      },
      [&](const cuda::ManyTensors& t) { cuda::find_non_finite_many(l, t, found); });
}

}  // namespace

bool CudaBackend::all_finite(std::span<const Tensor* const> tensors) {
  check_finite_operands("all_finite", device(), tensors);
  // Only these kernels write the flag, and each call has waited for its own: no kernel
  // still writes it while the host clears it. One call at a time.
  std::lock_guard lock(finite_mutex_);
  volatile int& flag = flags_->gradient_non_finite;
  flag = 0;
  const cuda::Launch l = launch();
  find_non_finite(l, tensors, &device_flags_->gradient_non_finite);
  synchronize();
  return flag == 0;
}

bool CudaBackend::begin_finite_check(std::span<const Tensor* const> tensors) {
  check_finite_operands("begin_finite_check", device(), tensors);
  if (skip_ != nullptr)
    DTRAIN_THROW(InvalidArgument, "begin_finite_check: a check on ", device().to_string(),
                 " is under way already; finite_check_passed() ends it");
  if (!check_flag_.defined()) check_flag_ = Tensor::empty({1}, DType::i32, device());
  int* flag = check_flag_.device_data<std::int32_t>();
  const cuda::Launch l = launch();
  detail::check_cuda(cudaMemsetAsync(flag, 0, sizeof(int), l.stream), "cudaMemsetAsync (the loss scale's check)",
                     index_);
  find_non_finite(l, tensors, flag);
  detail::check_cuda(cudaMemcpyAsync(&flags_->check_non_finite, flag, sizeof(int), cudaMemcpyDeviceToHost, l.stream),
                     "cudaMemcpyAsync (the loss scale's check, to the host)", index_);
  check_copied_ = detail::cuda_runtime().record(index_);
  skip_ = flag;
  return true;
}

bool CudaBackend::finite_check_passed() {
  if (skip_ == nullptr) return true;
  skip_ = nullptr;
  const DeviceEvent copied = std::move(check_copied_);
  // fit asks once it has waited for the step's loss, when the answer is there already.
  const cudaError_t ready = cudaEventQuery(static_cast<cudaEvent_t>(copied.get()));
  if (ready == cudaErrorNotReady) {
    detail::cuda_runtime().count_wait(index_);
    detail::cuda_runtime().wait(index_, copied);
  } else {
    detail::check_cuda(ready, "cudaEventQuery (the loss scale's check)", index_);
  }
  return flags_->check_non_finite == 0;
}

void CudaBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& log_probs) {
  check_devices("softmax_cross_entropy", device(), {&logits, &target, &loss, &log_probs});
  const bool sparse = check_softmax_cross_entropy(logits, target, loss, log_probs);
  cuda::softmax_cross_entropy(launch(), logits.device_data<float>(),
                              sparse ? target.device_data<std::int32_t>() : nullptr,
                              sparse ? nullptr : target.device_data<float>(), loss.device_data<float>(),
                              log_probs.device_data<float>(), logits.dim(0), logits.dim(1), &device_flags_->fault);
}

void CudaBackend::softmax_cross_entropy_backward(const Tensor& log_probs, const Tensor& target, const Tensor& dloss,
                                                 Tensor& dlogits) {
  check_devices("softmax_cross_entropy_backward", device(), {&log_probs, &target, &dloss, &dlogits});
  check_softmax_cross_entropy_backward(log_probs, target, dloss, dlogits);
  const bool sparse = target.dtype() == DType::i32;
  cuda::softmax_cross_entropy_backward(launch(), log_probs.device_data<float>(),
                                       sparse ? target.device_data<std::int32_t>() : nullptr,
                                       sparse ? nullptr : target.device_data<float>(), dloss.device_data<float>(),
                                       dlogits.device_data<float>(), log_probs.dim(0), log_probs.dim(1));
}

void CudaBackend::refuse_host_seed_while_capturing(const char* op) const {
  detail::cuda_runtime().refuse_while_capturing(
      index_, detail::concat(op, " (its seed is drawn on the host at each call)"));
}

void CudaBackend::dropout(const Tensor& x, float rate, const Generator& generator, Tensor& y, Tensor& mask) {
  check_devices("dropout", device(), {&x, &y, &mask});
  check_dropout(x, rate, y, mask);
  refuse_host_seed_while_capturing("dropout");
  cuda::dropout(launch(), x.device_data<float>(), y.device_data<float>(), mask.device_data<float>(), x.numel(), rate,
                math::mix64(generator.seed()), generator.counter());
}

void CudaBackend::argmax(const Tensor& x, Tensor& out) {
  check_devices("argmax", device(), {&x, &out});
  check_argmax(x, out);
  cuda::argmax(launch(), x.device_data<float>(), out.device_data<std::int32_t>(), x.dim(0), x.dim(1));
}

void CudaBackend::one_hot(const Tensor& labels, Tensor& out) {
  check_devices("one_hot", device(), {&labels, &out});
  check_one_hot(labels, out);
  cuda::one_hot(launch(), labels.device_data<std::int32_t>(), out.device_data<float>(), out.dim(0), out.dim(1),
                &device_flags_->fault);
}

bool CudaBackend::sgd_update(Tensor& w, const Tensor& g, Tensor* velocity, const SgdUpdate& p) {
  check_devices("sgd_update", device(), {&w, &g, velocity});
  check_sgd_update(w, g, velocity);
  cuda::sgd(launch(), w.device_data<float>(), g.device_data<float>(), velocity ? velocity->device_data<float>() : nullptr,
            w.numel(), p.learning_rate, p.momentum, p.nesterov, p.learning_rate * p.weight_decay, p.gradient_scale,
            &device_flags_->non_finite);
  return true;
}

bool CudaBackend::adam_update(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& p) {
  check_devices("adam_update", device(), {&w, &g, &m, &v});
  check_adam_update(w, g, m, v, p);
  cuda::adam(launch(), w.device_data<float>(), g.device_data<float>(), m.device_data<float>(), v.device_data<float>(),
             w.numel(), p.beta_1, p.beta_2, adam_step_size(p), p.epsilon, p.learning_rate * p.weight_decay,
             p.gradient_scale, &device_flags_->non_finite);
  return true;
}

namespace {

// The update items in groups of at most kManyTensors, each handed to `launch` as one ManyTensors.
// `skip`: ManyTensors::skip (a loss scale's check under way, else null).
template <typename Fn>
void in_groups(std::span<const UpdateItem> items, const int* skip, Fn launch) {
  in_groups(
      items.size(),
      [&](std::size_t i, cuda::ManyTensors& t, int k) {
        t.skip = skip;
        const UpdateItem& item = items[i];
        t.w[k] = item.w->device_data<float>();
        t.g[k] = item.g->device_data<float>();
        t.slot0[k] = item.slot0 ? item.slot0->device_data<float>() : nullptr;
        t.slot1[k] = item.slot1 ? item.slot1->device_data<float>() : nullptr;
        t.slot2[k] = item.slot2 ? item.slot2->device_data<float>() : nullptr;
        t.gradient_scale[k] = item.gradient_scale;
        return item.w->numel();
      },
      launch);
}

}  // namespace

bool CudaBackend::sgd_update_many(std::span<const UpdateItem> items, const SgdUpdate& p) {
  for (const UpdateItem& item : items) {
    check_devices("sgd_update_many", device(), {item.w, item.g, item.slot0});
    check_sgd_update(*item.w, *item.g, item.slot0);
  }
  const cuda::Launch l = launch();
  in_groups(items, skip_, [&](const cuda::ManyTensors& t) {
    cuda::sgd_many(l, t, p.learning_rate, p.momentum, p.nesterov, p.learning_rate * p.weight_decay,
                   &device_flags_->non_finite);
  });
  return true;
}

bool CudaBackend::adam_update_many(std::span<const UpdateItem> items, const AdamUpdate& p) {
  for (const UpdateItem& item : items) {
    if (!item.slot0 || !item.slot1) DTRAIN_THROW(InvalidArgument, "adam_update_many: every variable needs m and v");
    check_devices("adam_update_many", device(), {item.w, item.g, item.slot0, item.slot1});
    check_adam_update(*item.w, *item.g, *item.slot0, *item.slot1, p);
  }
  const cuda::Launch l = launch();
  in_groups(items, skip_, [&](const cuda::ManyTensors& t) {
    cuda::adam_many(l, t, p.beta_1, p.beta_2, adam_step_size(p), p.epsilon, p.learning_rate * p.weight_decay,
                    &device_flags_->non_finite);
  });
  return true;
}

bool CudaBackend::rmsprop_update_many(std::span<const UpdateItem> items, const RmspropUpdate& p) {
  for (const UpdateItem& item : items) {
    if (!item.slot0) DTRAIN_THROW(InvalidArgument, "rmsprop_update_many: every variable needs v");
    check_devices("rmsprop_update_many", device(), {item.w, item.g, item.slot0, item.slot1, item.slot2});
    check_rmsprop_update(*item.w, *item.g, *item.slot0, item.slot1, item.slot2);
  }
  const cuda::Launch l = launch();
  in_groups(items, skip_, [&](const cuda::ManyTensors& t) {
    cuda::rmsprop_many(l, t, p.rho, p.square_weight, p.momentum, p.learning_rate, p.epsilon,
                       p.learning_rate * p.weight_decay, &device_flags_->non_finite);
  });
  return true;
}

bool CudaBackend::rmsprop_update(Tensor& w, const Tensor& g, Tensor& v, Tensor* momentum, Tensor* average,
                                 const RmspropUpdate& p) {
  check_devices("rmsprop_update", device(), {&w, &g, &v, momentum, average});
  check_rmsprop_update(w, g, v, momentum, average);
  cuda::rmsprop(launch(), w.device_data<float>(), g.device_data<float>(), v.device_data<float>(),
                momentum ? momentum->device_data<float>() : nullptr, average ? average->device_data<float>() : nullptr,
                w.numel(), p.rho, p.square_weight, p.momentum, p.learning_rate, p.epsilon,
                p.learning_rate * p.weight_decay, p.gradient_scale, &device_flags_->non_finite);
  return true;
}

void CudaBackend::synchronize() {
  detail::cuda_runtime().count_wait(index_);
  detail::check_cuda(cudaStreamSynchronize(launch_.stream), "cudaStreamSynchronize", index_);
  report_faults();
}

bool CudaBackend::take_deferred_non_finite() {
  // fit asks after its step's reads of the loss and the metrics, when the stream has
  // passed the updates already: no wait then.
  const cudaError_t idle = cudaStreamQuery(launch_.stream);
  if (idle == cudaErrorNotReady) {
    synchronize();
  } else {
    detail::check_cuda(idle, "cudaStreamQuery (the updates' non-finite flag)", index_);
    report_faults();  // as synchronize() does: a label out of range the last kernels found
  }
  volatile int& flag = flags_->non_finite;
  const bool bad = flag != 0;
  flag = 0;
  return bad;
}

// ---- normalization and copies

void CudaBackend::channel_sums(const Tensor& a, const Tensor& b, const Tensor& center, Tensor& sums) {
  check_devices("channel_sums", device(), {&a, &b, &center, &sums});
  check_channel_sums(a, b, center, sums);
  const std::int64_t c = channels_of(a), rows = rows_of(a);
  const int chunks = cuda::channel_sum_chunks(rows);
  Tensor partials = scratch(static_cast<std::size_t>(chunks) * 2 * static_cast<std::size_t>(c) * sizeof(double));
  cuda::channel_sums(launch(), a.device_data<float>(), b.device_data<float>(), center.device_data<float>(),
                     sums.device_data<float>(), rows, c, static_cast<double*>(partials.raw_device_data()), chunks);
}

void CudaBackend::channel_affine(const Tensor& x, const Tensor& scale, const Tensor& shift, Tensor& y, const Tensor* x2,
                                 const Tensor* scale2, bool relu) {
  check_devices("channel_affine", device(), {&x, &scale, &shift, &y, x2, scale2});
  check_channel_affine(x, scale, shift, y, x2, scale2);
  cuda::channel_affine(launch(), x.device_data<float>(), scale.device_data<float>(), shift.device_data<float>(),
                       x2 ? x2->device_data<float>() : nullptr, scale2 ? scale2->device_data<float>() : nullptr,
                       y.device_data<float>(), rows_of(x), channels_of(x), relu);
}

void CudaBackend::batch_norm_coefficients(const Tensor& mean, const Tensor& variance, double count,
                                          const Tensor& gamma, const Tensor& beta, float epsilon,
                                          Tensor& coefficients) {
  check_devices("batch_norm_coefficients", device(), {&mean, &variance, &gamma, &beta, &coefficients});
  check_batch_norm_coefficients(mean, variance, gamma, beta, coefficients);
  cuda::batch_norm_coefficients(launch(), mean.device_data<float>(), variance.device_data<float>(), count,
                                gamma.defined() ? gamma.device_data<float>() : nullptr,
                                beta.defined() ? beta.device_data<float>() : nullptr, epsilon,
                                coefficients.device_data<float>(), mean.dim(0));
}

void CudaBackend::batch_norm_gradient_coefficients(const Tensor& sums, const Tensor& total, double count,
                                                   const Tensor& coefficients, Tensor& gradients) {
  check_devices("batch_norm_gradient_coefficients", device(), {&sums, &total, &coefficients, &gradients});
  check_batch_norm_gradient_coefficients(sums, total, count, coefficients, gradients);
  cuda::batch_norm_gradient_coefficients(launch(), sums.device_data<float>(), total.device_data<float>(), count,
                                         coefficients.device_data<float>(), gradients.device_data<float>(),
                                         coefficients.dim(1));
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y,
                             Tensor& mean, Tensor& inv_std) {
  check_devices("layer_norm", device(), {&x, &gamma, &beta, &y, &mean, &inv_std});
  check_layer_norm(x, gamma, beta, y, mean, inv_std);
  cuda::layer_norm(launch(), x.device_data<float>(), gamma.defined() ? gamma.device_data<float>() : nullptr,
                   beta.defined() ? beta.device_data<float>() : nullptr, epsilon, y.device_data<float>(),
                   mean.device_data<float>(), inv_std.device_data<float>(), rows_of(x), channels_of(x));
}

void CudaBackend::layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                      const Tensor& inv_std, Tensor& dx, Tensor* dgamma, Tensor* dbeta) {
  check_devices("layer_norm_backward", device(), {&x, &dy, &gamma, &mean, &inv_std, &dx, dgamma, dbeta});
  check_layer_norm_backward(x, dy, gamma, mean, inv_std, dx, dgamma, dbeta);
  const std::int64_t d = channels_of(x), rows = rows_of(x);
  const int chunks = cuda::layer_norm_chunks(rows);
  Tensor partials;
  if (dgamma || dbeta)
    partials = scratch(static_cast<std::size_t>(chunks) * 2 * static_cast<std::size_t>(d) * sizeof(double));
  cuda::layer_norm_backward(launch(), x.device_data<float>(), dy.device_data<float>(),
                            gamma.defined() ? gamma.device_data<float>() : nullptr, mean.device_data<float>(),
                            inv_std.device_data<float>(), dx.device_data<float>(),
                            dgamma ? dgamma->device_data<float>() : nullptr, dbeta ? dbeta->device_data<float>() : nullptr,
                            rows, d, partials.defined() ? static_cast<double*>(partials.raw_device_data()) : nullptr,
                            chunks);
}

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, Tensor& out,
                            Tensor& lse) {
  check_devices("attention", device(), {&q, &k, &v, &out, &lse, o.mask});
  check_attention(q, k, v, o, out, lse);
  check_attention_depth(q, v);
  if (o.dropout_rate > 0.0f) refuse_host_seed_while_capturing("attention's dropout");
  cuda::attention(launch(), q.device_data<float>(), k.device_data<float>(), v.device_data<float>(),
                  o.mask ? o.mask->device_data<float>() : nullptr, attention_mask_strides(o.mask).batch,
                  attention_mask_strides(o.mask).query, q.dim(0), q.dim(2), q.dim(1), k.dim(1), q.dim(3),
                  v.dim(3), o.scale, o.causal, o.dropout_rate, math::mix64(o.dropout_generator.seed()),
                  o.dropout_generator.counter(), out.device_data<float>(), lse.device_data<float>());
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, const AttentionOptions& o, Tensor& dq,
                                     Tensor& dk, Tensor& dv) {
  check_devices("attention_backward", device(), {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, o.mask});
  check_attention_backward(q, k, v, out, lse, dout, o, dq, dk, dv);
  check_attention_depth(q, v);
  cuda::attention_backward(launch(), q.device_data<float>(), k.device_data<float>(), v.device_data<float>(),
                           o.mask ? o.mask->device_data<float>() : nullptr, attention_mask_strides(o.mask).batch,
                           attention_mask_strides(o.mask).query, out.device_data<float>(),
                           lse.device_data<float>(), dout.device_data<float>(), q.dim(0), q.dim(2), q.dim(1), k.dim(1),
                           q.dim(3), v.dim(3), o.scale, o.causal, o.dropout_rate,
                           math::mix64(o.dropout_generator.seed()), o.dropout_generator.counter(),
                           dq.device_data<float>(), dk.device_data<float>(), dv.device_data<float>());
}

void CudaBackend::gather_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  check_devices("gather_rows", device(), {&table, &ids, &out});
  check_rows_by_id(table, ids, out, "gather_rows");
  cuda::gather_rows(launch(), table.device_data<float>(), ids.device_data<std::int32_t>(), out.device_data<float>(),
                    ids.dim(0), table.dim(1));
}

void CudaBackend::scatter_add_rows(const Tensor& ids, const Tensor& rows, Tensor& table) {
  check_devices("scatter_add_rows", device(), {&ids, &rows, &table});
  check_rows_by_id(table, ids, rows, "scatter_add_rows");
  cuda::scatter_add_rows(launch(), ids.device_data<std::int32_t>(), rows.device_data<float>(), table.device_data<float>(),
                         ids.dim(0), table.dim(1));
}

void CudaBackend::copy_block(const Tensor& src, const Block& from, Tensor& dst, const Block& to, std::int64_t outer,
                             std::int64_t rows, std::int64_t width) {
  check_devices("copy_block", device(), {&src, &dst});
  if (!check_copy_block(src, from, dst, to, outer, rows, width)) return;
  cuda::copy_block(launch(), src.raw_device_data(), from.offset, from.outer_stride, from.row_stride,
                   dst.raw_device_data(), to.offset, to.outer_stride, to.row_stride, outer, rows, width,
                   static_cast<int>(dtype_size(src.dtype())));
}

CudaBackend& cuda_backend(int index) {
  static std::mutex mutex;
  static std::array<std::atomic<CudaBackend*>, 16> backends{};  // leaked: kernels may run during exit
  if (index < 0 || index >= static_cast<int>(backends.size()))
    DTRAIN_THROW(InvalidArgument, "cuda:", index, ": dtrain drives at most ", backends.size(), " GPUs a process");
  auto& slot = backends[static_cast<std::size_t>(index)];
  if (CudaBackend* b = slot.load(std::memory_order_acquire)) return *b;
  std::lock_guard lock(mutex);
  if (slot.load(std::memory_order_relaxed) == nullptr) {
    check_device(Device::cuda(index));
    slot.store(new CudaBackend(index), std::memory_order_release);
  }
  return *slot.load(std::memory_order_relaxed);
}

}  // namespace dtrain::kernels
