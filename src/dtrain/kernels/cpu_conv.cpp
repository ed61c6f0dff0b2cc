// Convolution and pooling on oneDNN, over channels-last (NHWC) images. The activations
// stay in the caller's NHWC layout; the weights are reordered on every call into the
// blocked layout oneDNN's JIT kernels choose for the shape (format "any"), because a
// convolution given plain HWIO weights runs on oneDNN's GEMM path at a third of the speed
// (measured on AVX2: 34 against 114 GFLOP/s for 16 -> 16 channels at 28x28). Weights are
// small, so their reorder costs little next to the convolution.
#include "dtrain/kernels/onednn_internal.h"

#include "dtrain/kernels/checks.h"

namespace dtrain::kernels {
using namespace onednn;  // dt among them
using tag = dnnl::memory::format_tag;

namespace {

struct ConvShapes {
  dnnl::memory::dims src, weights, dst, bias, strides, dilates, pad_l, pad_r;
  tag weights_tag;
};

// What oneDNN needs to describe one convolution, from the checked sizes.
ConvShapes conv_shapes(const Shape& x, const Shape& k, const Shape& y, const Conv2dOptions& o, const char* op) {
  const ConvDims d = check_conv2d_shapes(x, k, y, o, op);
  ConvShapes s;
  s.src = {d.n, d.c, d.h, d.w};
  s.dst = {d.n, d.f, d.oh, d.ow};
  s.bias = {d.f};
  if (d.groups == 1) {
    s.weights = {d.f, d.c, d.kh, d.kw};
    s.weights_tag = tag::hwio;
  } else {
    s.weights = {d.groups, d.f / d.groups, d.c / d.groups, d.kh, d.kw};
    s.weights_tag = tag::hwigo;
  }
  s.strides = {o.stride[0], o.stride[1]};
  s.dilates = {o.dilation[0] - 1, o.dilation[1] - 1};  // oneDNN counts the gaps
  s.pad_l = {o.pad_begin[0], o.pad_begin[1]};
  s.pad_r = {o.pad_end[0], o.pad_end[1]};
  return s;
}

void add_conv_key(Key& key, int kind, const ConvShapes& s, DType dtype, const Conv2dOptions& o) {
  key.add(kind).add_dims(s.src).add_dims(s.weights).add_dims(s.dst).add_dims(s.strides).add_dims(s.dilates)
      .add_dims(s.pad_l).add_dims(s.pad_r).add(static_cast<int>(dtype)).add(o.bias != nullptr)
      .add(static_cast<int>(o.activation));
}

dnnl::convolution_forward::primitive_desc forward_desc(const ConvShapes& s, dt type, bool bias, Activation act,
                                                       const dnnl::engine& engine) {
  const dnnl::memory::desc src(s.src, type, tag::nhwc), dst(s.dst, dt::f32, tag::nhwc);
  const dnnl::memory::desc wei(s.weights, type, tag::any), b(s.bias, dt::f32, tag::x);
  auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                                  src, wei, b, dst, s.strides, s.dilates, s.pad_l, s.pad_r)
                : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                                  src, wei, dst, s.strides, s.dilates, s.pad_l, s.pad_r);
  dnnl::primitive_attr attr = user_scratchpad_attr();
  if (act != Activation::linear) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, activation_algorithm(act), 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  return dnnl::convolution_forward::primitive_desc(d, attr, engine);
}

dnnl::algorithm pool_algorithm(Pool kind) {
  return kind == Pool::max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
}

struct PoolShapes {
  dnnl::memory::dims src, dst, strides, window, pad_l, pad_r;
};

PoolShapes pool_shapes(const Shape& x, const Shape* y, const Pool2dOptions& o, const char* op) {
  const PoolDims d = check_pool2d_shapes(x, y, o, op);
  return {{d.n, d.c, d.h, d.w}, {d.n, d.c, d.oh, d.ow}, {o.stride[0], o.stride[1]}, {o.window[0], o.window[1]},
          {o.pad_begin[0], o.pad_begin[1]}, {o.pad_end[0], o.pad_end[1]}};
}

dnnl::pooling_forward::primitive_desc pool_forward_desc(const PoolShapes& s, Pool kind, const dnnl::engine& engine) {
  const dnnl::memory::desc src(s.src, dt::f32, tag::nhwc), dst(s.dst, dt::f32, tag::nhwc);
  dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, pool_algorithm(kind), src, dst, s.strides, s.window,
                                s.pad_l, s.pad_r);
  return dnnl::pooling_forward::primitive_desc(d, user_scratchpad_attr(), engine);
}

void add_pool_key(Key& key, int kind, const PoolShapes& s, Pool pool) {
  key.add(kind).add(static_cast<int>(pool)).add_dims(s.src).add_dims(s.dst).add_dims(s.strides).add_dims(s.window)
      .add_dims(s.pad_l).add_dims(s.pad_r);
}

// The forward pooling primitive for these shapes, with its workspace's layout (`dnn` is
// the backend's primitive cache).
template <typename Dnn>
const Entry& pool_forward_entry(Dnn& dnn, const PoolShapes& s, Pool kind) {
  Key key;
  add_pool_key(key, 23, s, kind);
  return dnn.get(key, [&] {
    auto pd = pool_forward_desc(s, kind, dnn.engine);
    Entry entry = Dnn::template entry_of<dnnl::pooling_forward>(pd);
    entry.workspace = pd.workspace_desc();
    return entry;
  });
}

// Memory from the caching allocator for the length of one kernel call.
class Scratch {
 public:
  explicit Scratch(std::size_t bytes) : bytes_(bytes), data_(bytes ? cpu_allocator().allocate(bytes) : nullptr) {}
  ~Scratch() {
    if (data_) cpu_allocator().deallocate(data_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* data() const { return data_; }

 private:
  std::size_t bytes_;
  void* data_;
};

}  // namespace

// bfloat16 widened to float32 (exactly) by convert's vectorised loop.
Tensor CpuBackend::widened(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape());
  convert(t, out);
  return out;
}

void CpuBackend::conv2d(const Tensor& x, const Tensor& kernel, Tensor& y, const Conv2dOptions& o) {
  check_devices("conv2d", device(), {&x, &kernel, &y, o.bias});
  check_conv2d(x, kernel, y, o);
  const ConvShapes s = conv_shapes(x.shape(), kernel.shape(), y.shape(), o, "conv2d");
  if (y.numel() == 0) return;
  if (x.dtype() == DType::f16 || (x.dtype() == DType::bf16 && !dnn_->native_bf16_conv)) {
    // bfloat16 and float16 widen to float32 exactly, and float32 products of their values
    // are exact (8 or 11 significant bits each).
    conv2d(widened(x), widened(kernel), y, o);
    return;
  }
  const dt type = to_dnnl(x.dtype());
  Key key;
  add_conv_key(key, 20, s, x.dtype(), o);
  Key reorder_key = key;
  const Entry& e = dnn_->get(key, [&] {
    auto pd = forward_desc(s, type, o.bias != nullptr, o.activation, dnn_->engine);
    Entry entry = OneDnn::entry_of<dnnl::convolution_forward>(pd);
    entry.weights = pd.weights_desc();
    return entry;
  });
  const dnnl::memory::desc user_wei(s.weights, type, s.weights_tag);
  const dnnl::memory::desc src(s.src, type, tag::nhwc), dst(s.dst, dt::f32, tag::nhwc), bias(s.bias, dt::f32, tag::x);
  Scratch blocked(e.weights == user_wei ? 0 : e.weights.get_size());
  dnnl::memory weights = dnn_->mem(user_wei, kernel);
  if (blocked.data()) {
    weights = dnnl::memory(e.weights, dnn_->engine, blocked.data());
    dnn_->reorder(reorder_key, 0, user_wei, dnn_->mem(user_wei, kernel), e.weights, weights);
  }
  if (o.bias) {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(src, x)}, {DNNL_ARG_WEIGHTS, weights},
                      {DNNL_ARG_BIAS, dnn_->mem(bias, *o.bias)}, {DNNL_ARG_DST, dnn_->mem(dst, y)}});
  } else {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(src, x)}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dnn_->mem(dst, y)}});
  }
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& kernel, Tensor& dx, const Conv2dOptions& o) {
  check_devices("conv2d_backward_data", device(), {&dy, &kernel, &dx});
  check_conv2d_backward_data(dy, kernel, dx, o);
  const ConvShapes s = conv_shapes(dx.shape(), kernel.shape(), dy.shape(), o, "conv2d_backward_data");
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) {
    fill(dx, 0.0f);
    return;
  }
  if (dy.dtype() == DType::f16 || (dy.dtype() == DType::bf16 && !dnn_->native_bf16_conv)) {
    conv2d_backward_data(widened(dy), widened(kernel), dx, o);
    return;
  }
  const dt type = to_dnnl(dy.dtype());
  Key key;
  add_conv_key(key, 21, s, dy.dtype(), Conv2dOptions{});
  Key reorder_key = key;
  const dnnl::memory::desc diff_src(s.src, dt::f32, tag::nhwc), diff_dst(s.dst, type, tag::nhwc);
  const Entry& e = dnn_->get(key, [&] {
    auto hint = forward_desc(s, type, false, Activation::linear, dnn_->engine);
    const dnnl::memory::desc wei(s.weights, type, tag::any);
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, diff_src, wei, diff_dst, s.strides,
                                            s.dilates, s.pad_l, s.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad_attr(), dnn_->engine, hint);
    Entry entry = OneDnn::entry_of<dnnl::convolution_backward_data>(pd);
    entry.weights = pd.weights_desc();
    return entry;
  });
  const dnnl::memory::desc user_wei(s.weights, type, s.weights_tag);
  Scratch blocked(e.weights == user_wei ? 0 : e.weights.get_size());
  dnnl::memory weights = dnn_->mem(user_wei, kernel);
  if (blocked.data()) {
    weights = dnnl::memory(e.weights, dnn_->engine, blocked.data());
    dnn_->reorder(reorder_key, 0, user_wei, dnn_->mem(user_wei, kernel), e.weights, weights);
  }
  dnn_->execute(e, {{DNNL_ARG_DIFF_DST, dnn_->mem(diff_dst, dy)}, {DNNL_ARG_WEIGHTS, weights},
                    {DNNL_ARG_DIFF_SRC, dnn_->mem(diff_src, dx)}});
}

void CpuBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dkernel, Tensor* dbias,
                                         const Conv2dOptions& o) {
  check_devices("conv2d_backward_weights", device(), {&x, &dy, &dkernel, dbias});
  check_conv2d_backward_weights(x, dy, dkernel, dbias, o);
  const ConvShapes s = conv_shapes(x.shape(), dkernel.shape(), dy.shape(), o, "conv2d_backward_weights");
  if (dkernel.numel() == 0) return;
  if (dy.numel() == 0 || x.numel() == 0) {
    fill(dkernel, 0.0f);
    if (dbias) fill(*dbias, 0.0f);
    return;
  }
  if (x.dtype() == DType::f16 || (x.dtype() == DType::bf16 && !dnn_->native_bf16_conv)) {
    conv2d_backward_weights(widened(x), widened(dy), dkernel, dbias, o);
    return;
  }
  const dt type = to_dnnl(x.dtype());
  Conv2dOptions keyed;
  keyed.bias = dbias;
  Key key;
  add_conv_key(key, 22, s, x.dtype(), keyed);
  Key reorder_key = key;
  const dnnl::memory::desc src(s.src, type, tag::nhwc), diff_dst(s.dst, type, tag::nhwc);
  const dnnl::memory::desc diff_bias(s.bias, dt::f32, tag::x);
  const Entry& e = dnn_->get(key, [&] {
    auto hint = forward_desc(s, type, dbias != nullptr, Activation::linear, dnn_->engine);
    const dnnl::memory::desc wei(s.weights, dt::f32, tag::any);
    auto d = dbias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src, wei, diff_bias,
                                                              diff_dst, s.strides, s.dilates, s.pad_l, s.pad_r)
                   : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src, wei, diff_dst,
                                                              s.strides, s.dilates, s.pad_l, s.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad_attr(), dnn_->engine, hint);
    Entry entry = OneDnn::entry_of<dnnl::convolution_backward_weights>(pd);
    entry.weights = pd.diff_weights_desc();
    return entry;
  });
  const dnnl::memory::desc user_wei(s.weights, dt::f32, s.weights_tag);
  Scratch blocked(e.weights == user_wei ? 0 : e.weights.get_size());
  dnnl::memory weights = blocked.data() ? dnnl::memory(e.weights, dnn_->engine, blocked.data())
                                        : dnn_->mem(user_wei, dkernel);
  if (dbias) {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(src, x)}, {DNNL_ARG_DIFF_DST, dnn_->mem(diff_dst, dy)},
                      {DNNL_ARG_DIFF_WEIGHTS, weights}, {DNNL_ARG_DIFF_BIAS, dnn_->mem(diff_bias, *dbias)}});
  } else {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(src, x)}, {DNNL_ARG_DIFF_DST, dnn_->mem(diff_dst, dy)},
                      {DNNL_ARG_DIFF_WEIGHTS, weights}});
  }
  if (blocked.data()) dnn_->reorder(reorder_key, 1, e.weights, weights, user_wei, dnn_->mem(user_wei, dkernel));
}

std::size_t CpuBackend::pool2d_workspace_bytes(const Shape& x, const Pool2dOptions& o) {
  if (o.kind != Pool::max) return 0;
  const PoolShapes s = pool_shapes(x, nullptr, o, "pool2d");
  const Entry& e = pool_forward_entry(*dnn_, s, o.kind);
  return e.workspace.get_size();
}

void CpuBackend::pool2d(const Tensor& x, Tensor& y, Tensor* workspace, const Pool2dOptions& o) {
  check_devices("pool2d", device(), {&x, &y, workspace});
  x.check_dtype(DType::f32, "pool2d");
  y.check_dtype(DType::f32, "pool2d (output)");
  const PoolShapes s = pool_shapes(x.shape(), &y.shape(), o, "pool2d");
  const Entry& e = pool_forward_entry(*dnn_, s, o.kind);
  if (y.numel() == 0) return;
  const dnnl::memory::desc src(s.src, dt::f32, tag::nhwc), dst(s.dst, dt::f32, tag::nhwc);
  const std::size_t ws_bytes = e.workspace.get_size();
  Scratch discarded(workspace == nullptr ? ws_bytes : 0);
  void* ws = nullptr;
  if (ws_bytes) {
    if (workspace) {
      if (workspace->nbytes() < ws_bytes)
        DTRAIN_THROW(InvalidArgument, "pool2d: the workspace has ", workspace->nbytes(), " bytes, max pooling of ",
                     x.shape().to_string(), " needs ", ws_bytes, " (pool2d_workspace_bytes)");
      ws = workspace->raw_data();
    } else {
      ws = discarded.data();
    }
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(src, x)}, {DNNL_ARG_DST, dnn_->mem(dst, y)},
                      {DNNL_ARG_WORKSPACE, dnnl::memory(e.workspace, dnn_->engine, ws)}});
  } else {
    dnn_->execute(e, {{DNNL_ARG_SRC, dnn_->mem(src, x)}, {DNNL_ARG_DST, dnn_->mem(dst, y)}});
  }
}

void CpuBackend::pool2d_backward(const Tensor& dy, const Tensor* workspace, Tensor& dx, const Pool2dOptions& o) {
  check_devices("pool2d_backward", device(), {&dy, workspace, &dx});
  dy.check_dtype(DType::f32, "pool2d_backward");
  dx.check_dtype(DType::f32, "pool2d_backward (output)");
  const PoolShapes s = pool_shapes(dx.shape(), &dy.shape(), o, "pool2d_backward");
  if (dx.numel() == 0) return;
  Key key;
  add_pool_key(key, 24, s, o.kind);
  const dnnl::memory::desc diff_src(s.src, dt::f32, tag::nhwc), diff_dst(s.dst, dt::f32, tag::nhwc);
  const Entry& e = dnn_->get(key, [&] {
    auto hint = pool_forward_desc(s, o.kind, dnn_->engine);
    dnnl::pooling_backward::desc d(pool_algorithm(o.kind), diff_src, diff_dst, s.strides, s.window, s.pad_l, s.pad_r);
    dnnl::pooling_backward::primitive_desc pd(d, user_scratchpad_attr(), dnn_->engine, hint);
    Entry entry = OneDnn::entry_of<dnnl::pooling_backward>(pd);
    entry.workspace = pd.workspace_desc();
    return entry;
  });
  const std::size_t ws_bytes = e.workspace.get_size();
  if (ws_bytes) {
    if (!workspace || workspace->nbytes() < ws_bytes)
      DTRAIN_THROW(InvalidArgument, "pool2d_backward: max pooling needs the forward's workspace of ", ws_bytes,
                   " bytes");
    dnn_->execute(e, {{DNNL_ARG_DIFF_DST, dnn_->mem(diff_dst, dy)}, {DNNL_ARG_DIFF_SRC, dnn_->mem(diff_src, dx)},
                      {DNNL_ARG_WORKSPACE, dnnl::memory(e.workspace, dnn_->engine, workspace->raw_data())}});
  } else {
    dnn_->execute(e, {{DNNL_ARG_DIFF_DST, dnn_->mem(diff_dst, dy)}, {DNNL_ARG_DIFF_SRC, dnn_->mem(diff_src, dx)}});
  }
}

}  // namespace dtrain::kernels
