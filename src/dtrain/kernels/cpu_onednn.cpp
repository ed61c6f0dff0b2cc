// The oneDNN half of the CPU backend. oneDNN 2.6's API (Debian's) is used: op descriptors
// are built first, then primitive descriptors. Each primitive is built once per shape and
// kept in a cache keyed by everything that shapes it (including the thread count, which
// oneDNN bakes in); building one costs tens of microseconds to milliseconds, so a step
// must never do it twice. Scratchpads are user-managed and come from the caching
// allocator, so executing a cached primitive allocates no tensor memory.
#include "dtrain/kernels/onednn_internal.h"

#include "dtrain/kernels/checks.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtrain::kernels {
using namespace onednn;  // dt and algorithm among them

CpuBackend::CpuBackend() : dnn_(std::make_unique<OneDnn>()) {
  // dtrain keeps each primitive it builds (above), so oneDNN's own process-wide cache of
  // primitives would only make two of dtrain's entries share one primitive's state: on
  // AVX2 CPUs a replica thread then read what another thread's primitive had written,
  // with no ordering between them that ThreadSanitizer could see.
  dnnl::set_primitive_cache_capacity(0);
}
CpuBackend::~CpuBackend() = default;

PrimitiveCacheStats CpuBackend::cache_stats() const {
  return {dnn_->created.load(), dnn_->hits.load()};
}

// a[M,K] (or [K,M] transposed) · b[K,N] (or [N,K] transposed) -> c[M,N].
void CpuBackend::matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& o) {
  check_devices("matmul", device(), {&a, &b, &c, o.bias});
  const MatmulDims d = check_matmul(a, b, c, o);
  const std::int64_t M = d.m, K = d.k, N = d.n, width = d.width, col0 = d.column_begin, col1 = d.column_end;
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: act(bias) or unchanged when accumulating
    if (o.accumulate) return;
    float* out = c.data<float>();
    const float* bias = o.bias ? o.bias->data<float>() : nullptr;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = col0; j < col1; ++j) out[i * width + j] = bias ? bias[j] : 0.0f;
    if (o.activation != Activation::linear) {
      Tensor view = c;
      const Unary u = o.activation == Activation::relu      ? Unary::relu
                      : o.activation == Activation::sigmoid ? Unary::sigmoid
                      : o.activation == Activation::tanh    ? Unary::tanh
                                                            : Unary::gelu;
      unary(u, view, view, 1.0f, 0.0f);
    }
    return;
  }

  // oneDNN's kernels reach into `a` with 32-bit offsets and fault past 2 GiB (16 rows of
  // 40M features): such an `a` is multiplied in parts of less, summed where they split K.
  if (const std::int64_t most = matmul_part_bytes_; static_cast<std::int64_t>(a.nbytes()) > most) {
    const auto row_bytes = static_cast<std::int64_t>(a.nbytes()) / a.dim(0);  // of a as stored
    if (row_bytes > most)
      DTRAIN_THROW(ResourceExhausted, "matmul: a ", a.shape().to_string(), o.transpose_a ? "ᵀ" : "",
                   " has rows of more than ", most, " bytes each, past what the matrix kernels address");
    const std::int64_t rows = most / row_bytes;
    if (!o.transpose_a) {  // parts of M: rows of a and c
      for (std::int64_t i = 0; i < M; i += rows) {
        Tensor part = c.slice(i, std::min(M, i + rows));
        matmul(a.slice(i, std::min(M, i + rows)), b, part, o);
      }
      return;
    }
    // a is stored [K, M]: parts of K, rows of a and of b, each summed into c.
    if (o.transpose_b || o.bias || o.activation != Activation::linear)
      DTRAIN_THROW(ResourceExhausted, "matmul: a ", a.shape().to_string(),
                   "ᵀ of more than ", most,
                   " bytes is multiplied in parts only with b untransposed, no bias and no activation");
    MatmulOptions part = o;
    for (std::int64_t k = 0; k < K; k += rows) {
      matmul(a.slice(k, std::min(K, k + rows)), b.slice(k, std::min(K, k + rows)), c, part);
      part.accumulate = true;
    }
    return;
  }
  if (a.dtype() == DType::f16 || (a.dtype() == DType::bf16 && !dnn_->native_bf16_matmul)) {
    // bfloat16 and float16 to float32 are exact, and so is the product of two such values
    // in float32, so float32 operands give what a 16-bit matmul accumulating in float32
    // gives. (oneDNN's float16 matmul needs AVX512-FP16; it is not asked for.)
    Tensor a32 = Tensor::empty(a.shape()), b32 = Tensor::empty(b.shape());
    convert(a, a32);
    convert(b, b32);
    matmul(a32, b32, c, o);
    return;
  }
  const dt in_type = to_dnnl(a.dtype());
  const dnnl::memory::desc a_md({M, K}, in_type, o.transpose_a ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  const dnnl::memory::desc b_md({K, N}, in_type, o.transpose_b ? dnnl::memory::dims{1, K} : dnnl::memory::dims{width, 1});
  const dnnl::memory::desc c_md({M, N}, dt::f32, dnnl::memory::dims{width, 1});
  const dnnl::memory::desc bias_md({1, N}, dt::f32, dnnl::memory::dims{N, 1});

  Key key;
  key.add(1).add(M).add(K).add(N).add(o.transpose_a).add(o.transpose_b)
      .add(static_cast<int>(a.dtype())).add(o.bias != nullptr)
      .add(static_cast<int>(o.activation)).add(o.accumulate).add(width);
  const Entry& e = dnn_->get(key, [&] {
    dnnl::post_ops ops;
    if (o.accumulate) ops.append_sum(1.0f);
    if (o.activation != Activation::linear)
      ops.append_eltwise(1.0f, activation_algorithm(o.activation), 0.0f, 0.0f);
    dnnl::primitive_attr attr = user_scratchpad_attr();
    attr.set_post_ops(ops);
    auto desc = o.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
    return OneDnn::entry_of<dnnl::matmul>(dnnl::matmul::primitive_desc(desc, attr, dnn_->engine));
  });
  if (o.bias) {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(a_md, a)},
                      {DNNL_ARG_WEIGHTS, dnn_->mem(b_md, b)},
                      {DNNL_ARG_BIAS, dnn_->mem(bias_md, *o.bias)},
                      {DNNL_ARG_DST, dnn_->mem(c_md, c)}});
  } else {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(a_md, a)},
                      {DNNL_ARG_WEIGHTS, dnn_->mem(b_md, b, col0)},
                      {DNNL_ARG_DST, dnn_->mem(c_md, c, col0)}});
  }
}

void CpuBackend::unary(Unary op, const Tensor& x, Tensor& y, float alpha, float beta) {
  check_devices("unary", device(), {&x, &y});
  check_unary(op, x, y);
  if (op == Unary::linear && x.dtype() == DType::u8) {
    linear_from_bytes(x, alpha, beta, y);
    return;
  }
  const std::int64_t n = x.numel();
  if (n == 0) return;
  if (op == Unary::clip) {  // oneDNN's clip maps NaN into the range; NaN stays NaN, as in TensorFlow
    const float* in = x.data<float>();
    float* out = y.data<float>();
    for (std::int64_t i = 0; i < n; ++i) out[i] = std::isnan(in[i]) ? in[i] : std::min(std::max(in[i], alpha), beta);
    return;
  }
  // relu's alpha would be its negative slope; only linear takes parameters.
  if (op != Unary::linear) {
    alpha = 0.0f;
    beta = 0.0f;
  }
  const auto md = plain_desc({n}, dt::f32);
  Key key;
  key.add(2).add(static_cast<int>(op)).add(n).add_float(alpha).add_float(beta);
  const Entry& e = dnn_->get(key, [&] {
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, forward_algorithm(op), md, alpha, beta);
    return OneDnn::entry_of<dnnl::eltwise_forward>(dnnl::eltwise_forward::primitive_desc(d, user_scratchpad_attr(), dnn_->engine));
  });
  dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(md, x)}, {DNNL_ARG_DST, dnn_->mem(md, y)}});
}

void CpuBackend::unary_backward(Unary op, const Tensor& saved, const Tensor& dy, Tensor& dx, float alpha,
                                float beta) {
  check_devices("unary_backward", device(), {&saved, &dy, &dx});
  check_unary_backward(saved, dy, dx);
  const std::int64_t n = dy.numel();
  if (n == 0) return;
  if (op == Unary::linear) {  // the derivative is the constant alpha
    axpby(alpha, dy, 0.0f, dx);
    return;
  }
  if (op != Unary::clip) {
    alpha = 0.0f;
    beta = 0.0f;
  }
  const auto md = plain_desc({n}, dt::f32);
  Key key;
  key.add(3).add(static_cast<int>(op)).add(n).add_float(alpha).add_float(beta);
  const Entry& e = dnn_->get(key, [&] {
    const algorithm alg = backward_algorithm(op);
    dnnl::eltwise_forward::desc fd(dnnl::prop_kind::forward_training, alg, md, alpha, beta);
    dnnl::eltwise_forward::primitive_desc hint(fd, dnn_->engine);
    dnnl::eltwise_backward::desc bd(alg, md, md, alpha, beta);
    return OneDnn::entry_of<dnnl::eltwise_backward>(dnnl::eltwise_backward::primitive_desc(bd, user_scratchpad_attr(), dnn_->engine, hint));
  });
  dnn_->execute(e, {{backward_uses_output(op) ? DNNL_ARG_DST : DNNL_ARG_SRC, dnn_->mem(md, saved)},
                    {DNNL_ARG_DIFF_DST, dnn_->mem(md, dy)},
                    {DNNL_ARG_DIFF_SRC, dnn_->mem(md, dx)}});
}

void CpuBackend::binary(Binary op, const Tensor& a, const Tensor& b, Tensor& c) {
  check_devices("binary", device(), {&a, &b, &c});
  check_binary(a, b, c);
  if (c.numel() == 0) return;
  const bool commutes = op == Binary::add || op == Binary::mul || op == Binary::max || op == Binary::min;
  const Tensor* src0 = &a;
  const Tensor* src1 = &b;
  if (!(a.shape() == c.shape())) {
    if (commutes && b.shape() == c.shape()) {
      std::swap(src0, src1);
    } else {
      binary_loops(op, a, b, c);  // oneDNN broadcasts only its second operand
      return;
    }
  }
  const int rank = std::max(1, c.rank());
  const auto d0 = dims_of(c.shape());
  const auto d1 = padded_dims(src1->shape(), rank);
  const auto md0 = plain_desc(d0, dt::f32);
  const auto md1 = plain_desc(d1, dt::f32);
  Key key;
  key.add(4).add(static_cast<int>(op)).add_dims(d0).add_dims(d1);
  const Entry& e = dnn_->get(key, [&] {
    dnnl::binary::desc d(binary_algorithm(op), md0, md1, md0);
    return OneDnn::entry_of<dnnl::binary>(dnnl::binary::primitive_desc(d, user_scratchpad_attr(), dnn_->engine));
  });
  dnn_->execute(e, {{DNNL_ARG_SRC_0, dnn_->mem(md0, *src0)},
                    {DNNL_ARG_SRC_1, dnn_->mem(md1, *src1)},
                    {DNNL_ARG_DST, dnn_->mem(md0, c)}});
}

void CpuBackend::reduce(Reduce op, const Tensor& x, Tensor& y) {
  check_devices("reduce", device(), {&x, &y});
  const ReduceDims dims = check_reduce(x, y);
  const dnnl::memory::dims dx(dims.x.begin(), dims.x.end()), dy(dims.y.begin(), dims.y.end());
  if (y.numel() == 0) return;
  if (x.numel() == 0) {
    fill(y, op == Reduce::max ? -std::numeric_limits<float>::infinity()
                              : (op == Reduce::mean ? std::numeric_limits<float>::quiet_NaN() : 0.0f));
    return;
  }
  if (dx == dy) {
    y.copy_from(x.reshape(y.shape()));
    return;
  }
  // oneDNN 2.6 runs these two common layouts on its reference implementation (hundreds of
  // microseconds for a bias gradient), so the loops in cpu_loops.cpp take them.
  if (reduce_contiguous(op, x, dx, dy, y)) return;
  const auto mdx = plain_desc(dx, dt::f32);
  const auto mdy = plain_desc(dy, dt::f32);
  Key key;
  key.add(5).add(static_cast<int>(op)).add_dims(dx).add_dims(dy);
  const Entry& e = dnn_->get(key, [&] {
    const algorithm alg = op == Reduce::sum    ? algorithm::reduction_sum
                          : op == Reduce::mean ? algorithm::reduction_mean
                                               : algorithm::reduction_max;
    dnnl::reduction::desc d(alg, mdx, mdy, 0.0f, 0.0f);
    return OneDnn::entry_of<dnnl::reduction>(dnnl::reduction::primitive_desc(d, user_scratchpad_attr(), dnn_->engine));
  });
  dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(mdx, x)}, {DNNL_ARG_DST, dnn_->mem(mdy, y)}});
}

void CpuBackend::softmax(const Tensor& x, Tensor& y, bool log) {
  check_devices("softmax", device(), {&x, &y});
  check_softmax(x, y, "softmax");
  if (x.numel() == 0) return;
  const auto d = dims_of(x.shape());
  const auto md = plain_desc(d, dt::f32);
  const int axis = static_cast<int>(d.size()) - 1;
  Key key;
  key.add(6).add(log).add_dims(d);
  const Entry& e = dnn_->get(key, [&] {
    dnnl::softmax_v2_forward::desc sd(dnnl::prop_kind::forward_training,
                                      log ? algorithm::softmax_log : algorithm::softmax_accurate, md, md, axis);
    return OneDnn::entry_of<dnnl::softmax_v2_forward>(dnnl::softmax_v2_forward::primitive_desc(sd, user_scratchpad_attr(), dnn_->engine));
  });
  dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(md, x)}, {DNNL_ARG_DST, dnn_->mem(md, y)}});
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx, bool log) {
  check_devices("softmax_backward", device(), {&y, &dy, &dx});
  check_softmax(y, dy, "softmax_backward");
  check_softmax(y, dx, "softmax_backward");
  if (y.numel() == 0) return;
  const auto d = dims_of(y.shape());
  const auto md = plain_desc(d, dt::f32);
  const int axis = static_cast<int>(d.size()) - 1;
  Key key;
  key.add(7).add(log).add_dims(d);
  const Entry& e = dnn_->get(key, [&] {
    const algorithm alg = log ? algorithm::softmax_log : algorithm::softmax_accurate;
    dnnl::softmax_v2_forward::desc fd(dnnl::prop_kind::forward_training, alg, md, md, axis);
    dnnl::softmax_v2_forward::primitive_desc hint(fd, dnn_->engine);
    dnnl::softmax_v2_backward::desc bd(alg, md, md, md, axis);
    return OneDnn::entry_of<dnnl::softmax_v2_backward>(dnnl::softmax_v2_backward::primitive_desc(bd, user_scratchpad_attr(), dnn_->engine, hint));
  });
  dnn_->execute(e, {{DNNL_ARG_DST, dnn_->mem(md, y)},
                    {DNNL_ARG_DIFF_DST, dnn_->mem(md, dy)},
                    {DNNL_ARG_DIFF_SRC, dnn_->mem(md, dx)}});
}

void CpuBackend::convert(const Tensor& x, Tensor& y) {
  check_devices("convert", device(), {&x, &y});
  check_convert(x, y);
  const std::int64_t n = x.numel();
  if (n == 0) return;
  if (x.dtype() == y.dtype()) {
    y.copy_from(x);
    return;
  }
  // oneDNN 2.6 converts bfloat16 with its reference reorder on CPUs without AVX-512 (14 ms
  // for a 28x28x16 batch of 128 here): dtrain's vectorised loop does it in one pass, with
  // the same rounding (nearest even).
  convert_loops(x, y);
}

CpuBackend& cpu_backend() {
  // Leaked on purpose: tensors in static objects may run kernels during exit.
  static CpuBackend* instance = new CpuBackend();
  return *instance;
}

}  // namespace dtrain::kernels
