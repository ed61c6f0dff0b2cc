#include "dtrain/core/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace dtrain {
namespace {

#if defined(__x86_64__)
#define DTRAIN_HAS_F16C_PATH 1

__attribute__((target("avx,f16c"))) void to_f16_f16c(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = to_f16(in[i]);
}

__attribute__((target("avx,f16c"))) void from_f16_f16c(const std::uint16_t* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = from_f16(in[i]);
}

__attribute__((target("avx,f16c"))) void add_f16_f16c(std::uint16_t* acc, const std::uint16_t* in, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m128i sum = _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(acc + i), sum);
  }
  for (; i < n; ++i) acc[i] = to_f16(from_f16(acc[i]) + from_f16(in[i]));
}

bool cpu_has_f16c() {
  // F16C is CPUID leaf 1's ECX bit 29 (spelled out: not every compiler's
  // __builtin_cpu_supports knows it); "avx" also checks that the OS saves the registers.
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
  }();
  return has;
}
#else
#define DTRAIN_HAS_F16C_PATH 0
bool cpu_has_f16c() { return false; }
#endif

}  // namespace

bool f16c_in_use() { return cpu_has_f16c(); }

void to_f16(const float* in, std::uint16_t* out, std::size_t n) {
#if DTRAIN_HAS_F16C_PATH
  if (cpu_has_f16c()) return to_f16_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = to_f16(in[i]);
}

void from_f16(const std::uint16_t* in, float* out, std::size_t n) {
#if DTRAIN_HAS_F16C_PATH
  if (cpu_has_f16c()) return from_f16_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = from_f16(in[i]);
}

void add_f16(std::uint16_t* acc, const std::uint16_t* in, std::size_t n) {
#if DTRAIN_HAS_F16C_PATH
  if (cpu_has_f16c()) return add_f16_f16c(acc, in, n);
#endif
  for (std::size_t i = 0; i < n; ++i) acc[i] = to_f16(from_f16(acc[i]) + from_f16(in[i]));
}

}  // namespace dtrain
