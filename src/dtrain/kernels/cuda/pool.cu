// Pooling over channels-last images: a thread per output value forward (max keeps the
// first largest tap and, for backward, where it was), a thread per input value backward,
// gathering from the windows that cover it, so no two threads write one value and the
// result is the same every run.
#include "dtrain/kernels/cuda/common.cuh"

namespace dtrain::kernels::cuda {
namespace {

// The output rows (or columns) whose windows cover input row `i`: [first, last].
__device__ __forceinline__ void covering(long long i, long long window, long long stride, long long pad,
                                         long long outputs, long long& first, long long& last) {
  const long long top = i + pad;  // the input's row in the padded image
  first = top - window + 1 <= 0 ? 0 : (top - window + 1 + stride - 1) / stride;
  last = min(top / stride, outputs - 1);
}

__global__ void max_pool_kernel(const float* x, float* y, std::int32_t* argmax, PoolShape s) {
  DTRAIN_GRID_STRIDE(o, s.n * s.oh * s.ow * s.c) {
    const long long c = o % s.c, ow = o / s.c % s.ow, oh = o / (s.c * s.ow) % s.oh, n = o / (s.c * s.ow * s.oh);
    float best = -INFINITY;
    int where = -1;
    for (long long kh = 0; kh < s.window[0]; ++kh) {
      const long long ih = oh * s.stride[0] - s.pad[0] + kh;
      if (ih < 0 || ih >= s.h) continue;
      for (long long kw = 0; kw < s.window[1]; ++kw) {
        const long long iw = ow * s.stride[1] - s.pad[1] + kw;
        if (iw < 0 || iw >= s.w) continue;
        const float v = x[((n * s.h + ih) * s.w + iw) * s.c + c];
        if (where < 0 || v > best) {
          best = v;
          where = static_cast<int>(ih * s.w + iw);
        }
      }
    }
    y[o] = best;
    if (argmax) argmax[o] = where;
  }
}

__global__ void max_pool_backward_kernel(const float* dy, const std::int32_t* argmax, float* dx, PoolShape s) {
  DTRAIN_GRID_STRIDE(i, s.n * s.h * s.w * s.c) {
    const long long c = i % s.c, iw = i / s.c % s.w, ih = i / (s.c * s.w) % s.h, n = i / (s.c * s.w * s.h);
    long long h0, h1, w0, w1;
    covering(ih, s.window[0], s.stride[0], s.pad[0], s.oh, h0, h1);
    covering(iw, s.window[1], s.stride[1], s.pad[1], s.ow, w0, w1);
    const int me = static_cast<int>(ih * s.w + iw);
    float sum = 0.0f;
    for (long long oh = h0; oh <= h1; ++oh)
      for (long long ow = w0; ow <= w1; ++ow) {
        const long long o = ((n * s.oh + oh) * s.ow + ow) * s.c + c;
        if (argmax[o] == me) sum += dy[o];
      }
    dx[i] = sum;
  }
}

// The taps of output (oh, ow)'s window that fall inside the image.
__device__ __forceinline__ long long taps_inside(long long oh, long long ow, const PoolShape& s) {
  const long long h0 = max(0LL, oh * s.stride[0] - s.pad[0]), h1 = min(s.h, oh * s.stride[0] - s.pad[0] + s.window[0]);
  const long long w0 = max(0LL, ow * s.stride[1] - s.pad[1]), w1 = min(s.w, ow * s.stride[1] - s.pad[1] + s.window[1]);
  return max(0LL, h1 - h0) * max(0LL, w1 - w0);
}

__global__ void average_pool_kernel(const float* x, float* y, PoolShape s) {
  DTRAIN_GRID_STRIDE(o, s.n * s.oh * s.ow * s.c) {
    const long long c = o % s.c, ow = o / s.c % s.ow, oh = o / (s.c * s.ow) % s.oh, n = o / (s.c * s.ow * s.oh);
    float sum = 0.0f;
    for (long long kh = 0; kh < s.window[0]; ++kh) {
      const long long ih = oh * s.stride[0] - s.pad[0] + kh;
      if (ih < 0 || ih >= s.h) continue;
      for (long long kw = 0; kw < s.window[1]; ++kw) {
        const long long iw = ow * s.stride[1] - s.pad[1] + kw;
        if (iw >= 0 && iw < s.w) sum += x[((n * s.h + ih) * s.w + iw) * s.c + c];
      }
    }
    y[o] = sum / static_cast<float>(taps_inside(oh, ow, s));
  }
}

__global__ void average_pool_backward_kernel(const float* dy, float* dx, PoolShape s) {
  DTRAIN_GRID_STRIDE(i, s.n * s.h * s.w * s.c) {
    const long long c = i % s.c, iw = i / s.c % s.w, ih = i / (s.c * s.w) % s.h, n = i / (s.c * s.w * s.h);
    long long h0, h1, w0, w1;
    covering(ih, s.window[0], s.stride[0], s.pad[0], s.oh, h0, h1);
    covering(iw, s.window[1], s.stride[1], s.pad[1], s.ow, w0, w1);
    float sum = 0.0f;
    for (long long oh = h0; oh <= h1; ++oh)
      for (long long ow = w0; ow <= w1; ++ow)
        sum += dy[((n * s.oh + oh) * s.ow + ow) * s.c + c] / static_cast<float>(taps_inside(oh, ow, s));
    dx[i] = sum;
  }
}

}  // namespace

void max_pool(const Launch& l, const float* x, float* y, std::int32_t* argmax, const PoolShape& s) {
  const long long n = s.n * s.oh * s.ow * s.c;
  if (n == 0) return;
  max_pool_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, argmax, s);
  check_launch("max pooling", n, l);
}

void max_pool_backward(const Launch& l, const float* dy, const std::int32_t* argmax, float* dx, const PoolShape& s) {
  const long long n = s.n * s.h * s.w * s.c;
  if (n == 0) return;
  max_pool_backward_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(dy, argmax, dx, s);
  check_launch("max pooling backward", n, l);
}

void average_pool(const Launch& l, const float* x, float* y, const PoolShape& s) {
  const long long n = s.n * s.oh * s.ow * s.c;
  if (n == 0) return;
  average_pool_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(x, y, s);
  check_launch("average pooling", n, l);
}

void average_pool_backward(const Launch& l, const float* dy, float* dx, const PoolShape& s) {
  const long long n = s.n * s.h * s.w * s.c;
  if (n == 0) return;
  average_pool_backward_kernel<<<blocks_for(n, l), kThreads, 0, l.stream>>>(dy, dx, s);
  check_launch("average pooling backward", n, l);
}

}  // namespace dtrain::kernels::cuda
