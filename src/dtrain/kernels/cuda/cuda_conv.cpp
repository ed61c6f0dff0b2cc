// The CUDA backend's convolutions (cuDNN) and pooling (dtrain's kernels, pool.cu), over
// channels-last images as on the CPU. cuDNN takes its filters as [F, KH, KW, C / groups]:
// Keras's [KH, KW, C / groups, F] is transposed into that on each call (weights are small),
// and weight gradients back. Its convolutions pad symmetrically: an input padded unevenly
// (Keras's "same" with an even window or a stride) is copied into a zero-padded buffer first.
// Algorithms are cuDNN's heuristics' first deterministic choice, so a run repeats bit for
// bit (a resumed run too); float32 convolutions are exact float32 unless TF32 is asked for;
// bfloat16 ones run on tensor cores with float32 sums and a bfloat16 result, widened after.
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "dtrain/core/cuda_runtime.h"
#include "dtrain/core/rng.h"
#include "dtrain/kernels/checks.h"
#include "dtrain/kernels/cuda/cuda_backend.h"
#include "dtrain/kernels/cuda/libraries.h"

namespace dtrain::kernels {
namespace {

void check_dnn(cudnnStatus_t status, const char* call, const std::string& what, int device) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  DTRAIN_THROW(DeviceError, "cuDNN error on ", Device::cuda(device).to_string(), " in ", call, " for ", what, ": ",
               cuda::cudnn().error_string(status));
}

cudnnDataType_t dnn_type(DType t) {
  return t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : t == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

std::string describe(const ConvDims& d, DType dtype) {
  return detail::concat("a ", d.kh, "x", d.kw, " convolution of [", d.n, ", ", d.h, ", ", d.w, ", ", d.c, "] into ", d.f,
                        " filters (", dtype_name(dtype), ")");
}

// Padding cuDNN can take: each axis's before and after alike; else the input is padded here.
bool even_padding(const Conv2dOptions& o) { return o.pad_begin[0] == o.pad_end[0] && o.pad_begin[1] == o.pad_end[1]; }

}  // namespace

struct CudaBackend::Dnn {
  struct Key {
    std::array<std::int64_t, 20> v{};
    bool operator==(const Key& o) const { return v == o.v; }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      std::uint64_t h = 0x2545f4914f6cdd1dull;
      for (const std::int64_t x : k.v) h = mix64(h ^ static_cast<std::uint64_t>(x));
      return static_cast<std::size_t>(h);
    }
  };
  // One convolution's descriptors (the input as cuDNN sees it: padded where it had to be)
  // and the algorithm chosen for each direction (-1: not chosen yet).
  struct Plan {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    int forward = -1, backward_data = -1, backward_filter = -1;
    std::size_t forward_bytes = 0, backward_data_bytes = 0, backward_filter_bytes = 0;
    // The math type each algorithm was ranked with: cuDNN picks a kernel by both.
    cudnnMathType_t forward_math{}, backward_data_math{}, backward_filter_math{};
  };
  cudnnHandle_t handle = nullptr;
  std::mutex mutex;
  std::unordered_map<Key, Plan, KeyHash> plans;
};

void CudaBackend::DnnDeleter::operator()(Dnn* d) const { delete d; }

namespace {

// The plan for a convolution of these sizes on an input of h x w (padded where needed).
struct Prepared {
  std::int64_t h, w;          // the input cuDNN sees
  std::int64_t pad_h, pad_w;  // the padding it applies (even)
};

Prepared prepared(const ConvDims& d, const Conv2dOptions& o) {
  if (even_padding(o)) return {d.h, d.w, o.pad_begin[0], o.pad_begin[1]};
  return {d.h + o.pad_begin[0] + o.pad_end[0], d.w + o.pad_begin[1] + o.pad_end[1], 0, 0};
}

}  // namespace

// FMA_MATH keeps float32 exact (cuDNN's default math allows TF32 on Ampere and later).
static cudnnMathType_t plan_math(DType dtype, bool tf32) {
  return is_half(dtype) ? CUDNN_TENSOR_OP_MATH : (tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
}

// Makes (once) the descriptors of a convolution and returns them, under the lock the caller holds.
static CudaBackend::Dnn::Plan& plan_for(CudaBackend::Dnn& dnn, const ConvDims& d, const Conv2dOptions& o, DType dtype,
                                        bool tf32, int device) {
  const Prepared p = prepared(d, o);
  CudaBackend::Dnn::Key key;
  key.v = {d.n, p.h, p.w, d.c, d.kh, d.kw, d.f, d.oh, d.ow, d.groups, o.stride[0], o.stride[1], o.dilation[0],
           o.dilation[1], p.pad_h, p.pad_w, static_cast<int>(dtype), tf32};
  auto it = dnn.plans.find(key);
  if (it != dnn.plans.end()) return it->second;
  const cuda::Cudnn& lib = cuda::cudnn();
  const std::string what = describe(d, dtype);
  CudaBackend::Dnn::Plan plan;
  const cudnnDataType_t type = dnn_type(dtype);
  check_dnn(lib.tensor_create(&plan.x), "cudnnCreateTensorDescriptor", what, device);
  check_dnn(lib.tensor_set(plan.x, CUDNN_TENSOR_NHWC, type, static_cast<int>(d.n), static_cast<int>(d.c),
                           static_cast<int>(p.h), static_cast<int>(p.w)),
            "cudnnSetTensor4dDescriptor (input)", what, device);
  check_dnn(lib.tensor_create(&plan.y), "cudnnCreateTensorDescriptor", what, device);
  check_dnn(lib.tensor_set(plan.y, CUDNN_TENSOR_NHWC, type, static_cast<int>(d.n), static_cast<int>(d.f),
                           static_cast<int>(d.oh), static_cast<int>(d.ow)),
            "cudnnSetTensor4dDescriptor (output)", what, device);
  check_dnn(lib.filter_create(&plan.w), "cudnnCreateFilterDescriptor", what, device);
  check_dnn(lib.filter_set(plan.w, type, CUDNN_TENSOR_NHWC, static_cast<int>(d.f), static_cast<int>(d.c / d.groups),
                           static_cast<int>(d.kh), static_cast<int>(d.kw)),
            "cudnnSetFilter4dDescriptor", what, device);
  check_dnn(lib.conv_create(&plan.conv), "cudnnCreateConvolutionDescriptor", what, device);
  check_dnn(lib.conv_set(plan.conv, static_cast<int>(p.pad_h), static_cast<int>(p.pad_w), static_cast<int>(o.stride[0]),
                         static_cast<int>(o.stride[1]), static_cast<int>(o.dilation[0]), static_cast<int>(o.dilation[1]),
                         CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "cudnnSetConvolution2dDescriptor", what, device);
  check_dnn(lib.conv_groups(plan.conv, static_cast<int>(d.groups)), "cudnnSetConvolutionGroupCount", what, device);
  check_dnn(lib.conv_math(plan.conv, plan_math(dtype, tf32)), "cudnnSetConvolutionMathType", what, device);
  return dnn.plans.emplace(key, plan).first->second;
}

// The first of cuDNN's ranked algorithms that ran, is deterministic, needs at most 1 GiB and
// keeps the math asked for (FMA: float32 exact); its workspace and math type.
template <typename Perf>
static int choose(const Perf* results, int count, cudnnMathType_t asked, std::size_t& bytes, cudnnMathType_t& math,
                  const std::string& what, const char* direction, int device) {
  for (int i = 0; i < count; ++i)
    if (results[i].status == CUDNN_STATUS_SUCCESS && results[i].determinism == CUDNN_DETERMINISTIC &&
        results[i].memory <= (std::size_t{1} << 30) && (asked != CUDNN_FMA_MATH || results[i].mathType == CUDNN_FMA_MATH)) {
      bytes = results[i].memory;
      math = results[i].mathType;
      return static_cast<int>(results[i].algo);
    }
  DTRAIN_THROW(DeviceError, "cuDNN has no deterministic ", direction, " algorithm on ", Device::cuda(device).to_string(),
               " for ", what);
}

CudaBackend::Dnn& CudaBackend::dnn() {
  std::call_once(dnn_made_, [this] {
    dnn_.reset(new Dnn());
    check_dnn(cuda::cudnn().create(&dnn_->handle), "cudnnCreate", "the backend", index_);
    check_dnn(cuda::cudnn().set_stream(dnn_->handle, launch_.stream), "cudnnSetStream", "the backend", index_);
  });
  return *dnn_;
}

// `x` padded with zeros where the convolution pads unevenly (else x itself).
Tensor CudaBackend::padded_input(const Tensor& x, const ConvDims& d, const Conv2dOptions& o) {
  if (even_padding(o)) return x;
  const Prepared p = prepared(d, o);
  Tensor out = Tensor::zeros({d.n, p.h, p.w, d.c}, x.dtype(), device());
  copy_block(x, {0, d.h * d.w * d.c, d.w * d.c}, out,
             {(o.pad_begin[0] * p.w + o.pad_begin[1]) * d.c, p.h * p.w * d.c, p.w * d.c}, d.n, d.h, d.w * d.c);
  return out;
}

// Keras's kernel [KH, KW, C / groups, F] as cuDNN's [F, KH, KW, C / groups].
Tensor CudaBackend::filters_of(const Tensor& kernel, const ConvDims& d) {
  Tensor out = Tensor::empty({d.f, d.kh, d.kw, d.c / d.groups}, kernel.dtype(), device());
  const cuda::Elem type = cuda::elem_of(kernel.dtype());
  cuda::transpose(launch(), kernel.raw_device_data(), type, out.raw_device_data(), type, d.kh * d.kw * (d.c / d.groups),
                  d.f);
  return out;
}

void CudaBackend::conv2d(const Tensor& x, const Tensor& kernel, Tensor& y, const Conv2dOptions& o) {
  check_devices("conv2d", device(), {&x, &kernel, &y, o.bias});
  const ConvDims d = check_conv2d(x, kernel, y, o);
  if (y.numel() == 0) return;
  const cuda::Launch l = launch();
  const bool half = is_half(x.dtype());
  if (d.h * d.w * d.c == 0 || d.kh * d.kw * (d.c / d.groups) == 0) {
    fill(y, 0.0f);  // an empty sum
  } else {
    const Tensor xp = padded_input(x, d, o), w = filters_of(kernel, d);
    Tensor out = half ? Tensor::empty(y.shape(), x.dtype(), device()) : y;
    Dnn& dn = dnn();
    std::lock_guard lock(dn.mutex);
    Dnn::Plan& p = plan_for(dn, d, o, x.dtype(), tensor_float_32_execution(), index_);
    const cuda::Cudnn& lib = cuda::cudnn();
    const std::string what = describe(d, x.dtype());
    if (p.forward < 0) {
      cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      int count = 0;
      check_dnn(lib.forward_algorithms(dn.handle, p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionForwardAlgorithm_v7", what, index_);
      p.forward = choose(results, count, plan_math(x.dtype(), tensor_float_32_execution()), p.forward_bytes,
                         p.forward_math, what, "forward", index_);
    }
    check_dnn(lib.conv_math(p.conv, p.forward_math), "cudnnSetConvolutionMathType", what, index_);
    Tensor workspace = scratch(p.forward_bytes);
    const float alpha = 1.0f, beta = 0.0f;
    check_dnn(lib.forward(dn.handle, &alpha, p.x, xp.raw_device_data(), p.w, w.raw_device_data(), p.conv,
                          static_cast<cudnnConvolutionFwdAlgo_t>(p.forward), workspace.raw_device_data(), p.forward_bytes,
                          &beta, p.y, out.raw_device_data()),
              "cudnnConvolutionForward", what, index_);
    library_call_ended("cudnnConvolutionForward");
    if (half)
      cuda::widen(l, static_cast<const std::uint16_t*>(out.raw_device_data()), cuda::elem_of(x.dtype()),
                  y.device_data<float>(), y.numel());
  }
  if (o.bias || o.activation != Activation::linear)
    cuda::bias_activation(l, y.device_data<float>(), o.bias ? o.bias->device_data<float>() : nullptr, y.numel() / d.f,
                          d.f, cuda::activation_op(o.activation));
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& kernel, Tensor& dx, const Conv2dOptions& o) {
  check_devices("conv2d_backward_data", device(), {&dy, &kernel, &dx});
  const ConvDims d = check_conv2d_backward_data(dy, kernel, dx, o);
  if (dx.numel() == 0) return;
  if (dy.numel() == 0 || d.kh * d.kw * (d.c / d.groups) == 0) {
    fill(dx, 0.0f);
    return;
  }
  const cuda::Launch l = launch();
  const bool half = is_half(dy.dtype());
  const Prepared pr = prepared(d, o);
  const bool cropped = !even_padding(o);
  // cuDNN writes the gradient of the input it saw: padded where it was, in dy's dtype.
  Tensor out = cropped || half ? Tensor::empty({d.n, pr.h, pr.w, d.c}, dy.dtype(), device()) : dx;
  const Tensor w = filters_of(kernel, d);
  {
    Dnn& dn = dnn();
    std::lock_guard lock(dn.mutex);
    Dnn::Plan& p = plan_for(dn, d, o, dy.dtype(), tensor_float_32_execution(), index_);
    const cuda::Cudnn& lib = cuda::cudnn();
    const std::string what = describe(d, dy.dtype()) + " (gradient of the input)";
    if (p.backward_data < 0) {
      cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int count = 0;
      check_dnn(lib.backward_data_algorithms(dn.handle, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                             &count, results),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7", what, index_);
      p.backward_data = choose(results, count, plan_math(dy.dtype(), tensor_float_32_execution()),
                               p.backward_data_bytes, p.backward_data_math, what, "backward-data", index_);
    }
    check_dnn(lib.conv_math(p.conv, p.backward_data_math), "cudnnSetConvolutionMathType", what, index_);
    Tensor workspace = scratch(p.backward_data_bytes);
    const float alpha = 1.0f, beta = 0.0f;
    check_dnn(lib.backward_data(dn.handle, &alpha, p.w, w.raw_device_data(), p.y, dy.raw_device_data(), p.conv,
                                static_cast<cudnnConvolutionBwdDataAlgo_t>(p.backward_data),
                                workspace.raw_device_data(), p.backward_data_bytes, &beta, p.x, out.raw_device_data()),
              "cudnnConvolutionBackwardData", what, index_);
    library_call_ended("cudnnConvolutionBackwardData");
  }
  if (!cropped && !half) return;
  Tensor wide = out;
  if (half) {
    wide = Tensor::empty(out.shape(), DType::f32, device());
    cuda::widen(l, static_cast<const std::uint16_t*>(out.raw_device_data()), cuda::elem_of(dy.dtype()),
                wide.device_data<float>(), out.numel());
  }
  if (cropped)
    copy_block(wide, {(o.pad_begin[0] * pr.w + o.pad_begin[1]) * d.c, pr.h * pr.w * d.c, pr.w * d.c}, dx,
               {0, d.h * d.w * d.c, d.w * d.c}, d.n, d.h, d.w * d.c);
  else
    dx.copy_from(wide);
}

void CudaBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dkernel, Tensor* dbias,
                                          const Conv2dOptions& o) {
  check_devices("conv2d_backward_weights", device(), {&x, &dy, &dkernel, dbias});
  const ConvDims d = check_conv2d_backward_weights(x, dy, dkernel, dbias, o);
  if (dkernel.numel() == 0) return;
  if (dy.numel() == 0 || x.numel() == 0) {
    fill(dkernel, 0.0f);
    if (dbias) fill(*dbias, 0.0f);
    return;
  }
  const cuda::Launch l = launch();
  const bool half = is_half(x.dtype());
  const Tensor xp = padded_input(x, d, o);
  Tensor filters = Tensor::empty({d.f, d.kh, d.kw, d.c / d.groups}, x.dtype(), device());
  {
    Dnn& dn = dnn();
    std::lock_guard lock(dn.mutex);
    Dnn::Plan& p = plan_for(dn, d, o, x.dtype(), tensor_float_32_execution(), index_);
    const cuda::Cudnn& lib = cuda::cudnn();
    const std::string what = describe(d, x.dtype()) + " (gradient of the kernel)";
    if (p.backward_filter < 0) {
      cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int count = 0;
      check_dnn(lib.backward_filter_algorithms(dn.handle, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                               &count, results),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7", what, index_);
      p.backward_filter = choose(results, count, plan_math(x.dtype(), tensor_float_32_execution()),
                                 p.backward_filter_bytes, p.backward_filter_math, what, "backward-filter", index_);
    }
    check_dnn(lib.conv_math(p.conv, p.backward_filter_math), "cudnnSetConvolutionMathType", what, index_);
    Tensor workspace = scratch(p.backward_filter_bytes);
    const float alpha = 1.0f, beta = 0.0f;
    check_dnn(lib.backward_filter(dn.handle, &alpha, p.x, xp.raw_device_data(), p.y, dy.raw_device_data(), p.conv,
                                  static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.backward_filter),
                                  workspace.raw_device_data(), p.backward_filter_bytes, &beta, p.w,
                                  filters.raw_device_data()),
              "cudnnConvolutionBackwardFilter", what, index_);
    library_call_ended("cudnnConvolutionBackwardFilter");
  }
  // [F, KH, KW, C / groups] back to Keras's [KH, KW, C / groups, F], widened to float32.
  cuda::transpose(l, filters.raw_device_data(), cuda::elem_of(x.dtype()), dkernel.raw_device_data(), cuda::Elem::f32, d.f,
                  d.kh * d.kw * (d.c / d.groups));
  if (dbias) {
    // Σ dy over every row, per filter (in float32).
    Tensor wide = dy;
    if (half) {
      wide = Tensor::empty(dy.shape(), DType::f32, device());
      cuda::widen(l, static_cast<const std::uint16_t*>(dy.raw_device_data()), cuda::elem_of(dy.dtype()),
                  wide.device_data<float>(), dy.numel());
    }
    reduce(Reduce::sum, wide.reshape({dy.numel() / d.f, d.f}), *dbias);
  }
}

// ---- pooling

namespace {

cuda::PoolShape pool_shape(const PoolDims& d, const Pool2dOptions& o) {
  cuda::PoolShape s;
  s.n = d.n;
  s.h = d.h;
  s.w = d.w;
  s.c = d.c;
  s.oh = d.oh;
  s.ow = d.ow;
  for (int i = 0; i < 2; ++i) {
    s.window[i] = o.window[i];
    s.stride[i] = o.stride[i];
    s.pad[i] = o.pad_begin[i];
  }
  return s;
}

}  // namespace

std::size_t CudaBackend::pool2d_workspace_bytes(const Shape& x, const Pool2dOptions& o) {
  if (o.kind != Pool::max) return 0;
  const PoolDims d = check_pool2d_shapes(x, nullptr, o, "pool2d");
  return static_cast<std::size_t>(d.n * d.oh * d.ow * d.c) * sizeof(std::int32_t);
}

void CudaBackend::pool2d(const Tensor& x, Tensor& y, Tensor* workspace, const Pool2dOptions& o) {
  check_devices("pool2d", device(), {&x, &y, workspace});
  x.check_dtype(DType::f32, "pool2d");
  y.check_dtype(DType::f32, "pool2d (output)");
  const PoolDims d = check_pool2d_shapes(x.shape(), &y.shape(), o, "pool2d");
  if (y.numel() == 0) return;
  const cuda::PoolShape s = pool_shape(d, o);
  if (o.kind == Pool::average) {
    cuda::average_pool(launch(), x.device_data<float>(), y.device_data<float>(), s);
    return;
  }
  const std::size_t bytes = pool2d_workspace_bytes(x.shape(), o);
  if (workspace && workspace->nbytes() < bytes)
    DTRAIN_THROW(InvalidArgument, "pool2d: the workspace has ", workspace->nbytes(), " bytes, max pooling of ",
                 x.shape().to_string(), " needs ", bytes, " (pool2d_workspace_bytes)");
  cuda::max_pool(launch(), x.device_data<float>(), y.device_data<float>(),
                 workspace ? static_cast<std::int32_t*>(workspace->raw_device_data()) : nullptr, s);
}

void CudaBackend::pool2d_backward(const Tensor& dy, const Tensor* workspace, Tensor& dx, const Pool2dOptions& o) {
  check_devices("pool2d_backward", device(), {&dy, workspace, &dx});
  dy.check_dtype(DType::f32, "pool2d_backward");
  dx.check_dtype(DType::f32, "pool2d_backward (output)");
  const PoolDims d = check_pool2d_shapes(dx.shape(), &dy.shape(), o, "pool2d_backward");
  if (dx.numel() == 0) return;
  const cuda::PoolShape s = pool_shape(d, o);
  if (o.kind == Pool::average) {
    cuda::average_pool_backward(launch(), dy.device_data<float>(), dx.device_data<float>(), s);
    return;
  }
  const std::size_t bytes = pool2d_workspace_bytes(dx.shape(), o);
  if (!workspace || workspace->nbytes() < bytes)
    DTRAIN_THROW(InvalidArgument, "pool2d_backward: max pooling needs the forward's workspace of ", bytes, " bytes");
  cuda::max_pool_backward(launch(), dy.device_data<float>(),
                          static_cast<const std::int32_t*>(workspace->raw_device_data()), dx.device_data<float>(), s);
}

}  // namespace dtrain::kernels
