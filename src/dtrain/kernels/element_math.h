// The per-element arithmetic of the kernels, written once for the host and for CUDA
// devices: conversions to and from bfloat16, the draw behind dropout's mask, activations
// and their derivatives, and the optimizers' updates. The CUDA kernels call these; the CPU
// tests check them against the CPU backend, so the two backends compute one formula (where
// compilers fuse multiply-adds differently, the last bit may still differ). It includes no
// dtrain header, so that nvcc reads it without the rest of the library.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__ __forceinline__
#else
#define DTRAIN_HD inline
#endif

namespace dtrain::kernels::math {

DTRAIN_HD std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

DTRAIN_HD float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// float32 -> bfloat16, nearest even; a NaN stays a (quiet) NaN.
DTRAIN_HD std::uint16_t to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DTRAIN_HD float from_bf16(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

// NaN or infinite: all exponent bits set.
DTRAIN_HD bool not_finite(float x) { return (bits_of(x) & 0x7f800000u) == 0x7f800000u; }

// SplitMix64's finaliser (core/rng.h's mix64, which the host's Generator uses).
DTRAIN_HD std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Generator(seed, counter).uniform_at(i), given mixed_seed = mix64(seed): uniform in
// [0, 1) with 24 bits. Dropout's draw for element i, on either backend.
DTRAIN_HD float uniform_at(std::uint64_t mixed_seed, std::uint64_t counter, std::uint64_t i) {
  return static_cast<float>(mix64(mixed_seed ^ (counter + i)) >> 40) * (1.0f / 16777216.0f);
}

// The unary functions (kernels::Unary, in its order) and their derivatives. Derivatives
// read what backend.h says they read: the output for relu, sigmoid, tanh, exp and sqrt,
// the input for the others.
enum class UnaryOp : std::uint8_t { linear, relu, sigmoid, tanh, gelu, exp, log, square, sqrt, abs, clip, gelu_tanh };

DTRAIN_HD float gelu(float x) {  // exact: x * Φ(x), as oneDNN's gelu_erf
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

DTRAIN_HD float gelu_derivative(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

// GELU's tanh approximation, 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), as
// tf.nn.gelu(approximate=True) and oneDNN's gelu_tanh; and its derivative.
DTRAIN_HD float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

DTRAIN_HD float gelu_tanh_derivative(float x) {
  const float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
}

DTRAIN_HD float unary(UnaryOp op, float x, float alpha, float beta) {
  switch (op) {
    case UnaryOp::linear: return alpha * x + beta;
    case UnaryOp::relu: return x > 0.0f ? x : 0.0f;  // NaN -> 0, as oneDNN's and cuBLASLt's epilogue
    case UnaryOp::sigmoid: return 1.0f / (1.0f + expf(-x));
    case UnaryOp::tanh: return tanhf(x);
    case UnaryOp::gelu: return gelu(x);
    case UnaryOp::exp: return expf(x);
    case UnaryOp::log: return logf(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::sqrt: return sqrtf(x);
    case UnaryOp::abs: return fabsf(x);
    case UnaryOp::clip: return x != x ? x : fminf(fmaxf(x, alpha), beta);
    case UnaryOp::gelu_tanh: return gelu_tanh(x);
  }
  return x;
}

// dx for dy, from `saved` (the forward's output or input, as above).
DTRAIN_HD float unary_backward(UnaryOp op, float saved, float dy, float alpha, float beta) {
  switch (op) {
    case UnaryOp::linear: return alpha * dy;
    case UnaryOp::relu: return saved > 0.0f ? dy : 0.0f;
    case UnaryOp::sigmoid: return dy * saved * (1.0f - saved);
    case UnaryOp::tanh: return dy * (1.0f - saved * saved);
    case UnaryOp::gelu: return dy * gelu_derivative(saved);
    case UnaryOp::exp: return dy * saved;
    case UnaryOp::log: return dy / saved;
    case UnaryOp::square: return dy * 2.0f * saved;
    case UnaryOp::sqrt: return dy / (2.0f * saved);
    case UnaryOp::abs: return saved > 0.0f ? dy : (saved < 0.0f ? -dy : 0.0f);
    case UnaryOp::clip: return saved > alpha && saved < beta ? dy : 0.0f;
    case UnaryOp::gelu_tanh: return dy * gelu_tanh_derivative(saved);
  }
  return dy;
}

// Keras's Adam (AdamW with decay != 0) on one element; step_size carries the bias
// corrections (learning_rate * sqrt(1 - b2^t) / (1 - b1^t)) and decay is lr * weight_decay.
// Returns the new weight; m and v are updated in place.
DTRAIN_HD float adam(float w, float g, float& m, float& v, float b1, float one_minus_b1, float b2, float one_minus_b2,
                     float step_size, float epsilon, float decay, float gradient_scale) {
  const float gi = g * gradient_scale;
  const float mi = b1 * m + one_minus_b1 * gi;
  const float vi = b2 * v + one_minus_b2 * gi * gi;
  m = mi;
  v = vi;
  const float wi = w - decay * w;
  return wi - step_size * mi / (sqrtf(vi) + epsilon);
}

// RmspropUpdate's formula on one element (decay is lr * weight_decay); momentum and
// average null where the optimizer keeps no such slot.
DTRAIN_HD float rmsprop(float w, float g, float& v, float* momentum_slot, float* average, float rho, float square_weight,
                        float momentum, float lr, float epsilon, float decay, float gradient_scale) {
  const float gi = g * gradient_scale;
  const float vi = rho * v + square_weight * gi * gi;
  v = vi;
  float denominator = vi;
  if (average != nullptr) {
    const float ai = rho * *average + square_weight * gi;
    *average = ai;
    denominator = vi - ai * ai;
  }
  const float step = lr * gi / sqrtf(denominator + epsilon);
  const float wi = w - decay * w;
  if (momentum_slot == nullptr) return wi - step;
  const float mi = momentum * *momentum_slot + step;
  *momentum_slot = mi;
  return wi - mi;
}

// Keras's SGD on one element: plain (no velocity), with momentum, or Nesterov's.
DTRAIN_HD float sgd(float w, float g, float* velocity, float lr, float momentum, bool nesterov, float decay,
                    float gradient_scale) {
  if (velocity == nullptr) return w - decay * w - lr * gradient_scale * g;
  if (nesterov) {
    const float gi = gradient_scale * g;
    const float vi = momentum * *velocity - lr * gi;
    *velocity = vi;
    return w - decay * w + momentum * vi - lr * gi;
  }
  const float vi = momentum * *velocity - lr * gradient_scale * g;
  *velocity = vi;
  return w - decay * w + vi;
}

// Batch normalization's figures for one channel, computed in double and rounded once, on
// the host and the device alike. From the sums s = Σx and q = Σx² of n rows (n > 0; the
// variance q / n - mean², at least 0), or with n = 0 from the mean s and the variance q
// themselves (the moving statistics); gamma 1 and beta 0 where the layer has none.
struct BatchNormChannel {
  float mean, variance, inv_std, scale, shift;
};
DTRAIN_HD BatchNormChannel batch_norm_channel(float s, float q, double n, float gamma, float beta, float epsilon) {
  const double mean = n > 0.0 ? s / n : s;
  double variance = q;
  if (n > 0.0) {
    variance = q / n - mean * mean;
    if (!(variance >= 0.0)) variance = 0.0;  // rounding below 0, or NaN sums (their mean is NaN)
  }
  const double inv_std = 1.0 / ::sqrt(variance + static_cast<double>(epsilon));
  return {static_cast<float>(mean), static_cast<float>(variance), static_cast<float>(inv_std),
          static_cast<float>(gamma * inv_std), static_cast<float>(beta - mean * gamma * inv_std)};
}

// Channel j's figures into rows of `c` floats each: coefficients [5, c].
DTRAIN_HD void store_batch_norm_channel(const BatchNormChannel& f, float* out, std::int64_t c, std::int64_t j) {
  out[j] = f.mean;
  out[c + j] = f.variance;
  out[2 * c + j] = f.inv_std;
  out[3 * c + j] = f.scale;
  out[4 * c + j] = f.shift;
}

// The backward's figures for one channel, from channel_sums's [Σdy, Σdy (x - mean)]: the
// replica's own (s, q) and summed over the replicas (total_s, total_q), n rows in all, and
// the forward's mean, inv_std and scale. dx = dy * scale + x * bx + k.
struct BatchNormGradientChannel {
  float dgamma, dbeta, bx, k;
};
DTRAIN_HD BatchNormGradientChannel batch_norm_gradient_channel(float s, float q, float total_s, float total_q, double n,
                                                               float mean, float inv_std, float scale) {
  const double a = scale, is = inv_std;
  const double bx = -a * is * is * total_q / n;
  return {q * inv_std, s, static_cast<float>(bx), static_cast<float>(-a * total_s / n - bx * mean)};
}

// Channel j's backward figures from sums and total [2, c] and the forward's coefficients
// [5, c], into gradients [4, c].
DTRAIN_HD void batch_norm_gradient_at(const float* sums, const float* total, double n, const float* coefficients,
                                      float* gradients, std::int64_t c, std::int64_t j) {
  const BatchNormGradientChannel d = batch_norm_gradient_channel(
      sums[j], sums[c + j], total[j], total[c + j], n, coefficients[j], coefficients[2 * c + j], coefficients[3 * c + j]);
  gradients[j] = d.dgamma;
  gradients[c + j] = d.dbeta;
  gradients[2 * c + j] = d.bx;
  gradients[3 * c + j] = d.k;
}

}  // namespace dtrain::kernels::math
