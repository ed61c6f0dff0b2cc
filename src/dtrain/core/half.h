// IEEE float16 ("half") as 16-bit patterns: the conversions from and to float32, rounded to
// nearest even as the F16C instructions round, with a NaN kept a (quiet) NaN. The array
// forms use F16C where the CPU has it and the same arithmetic in software elsewhere, so a
// result never depends on the machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dtrain {

// float32 -> float16: nearest even; beyond the largest half (65504) to infinity; below
// the smallest subnormal (2^-24) to zero, both with the sign kept.
inline std::uint16_t to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // NaN
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // 65520 and up round to infinity
  if (x < 0x38800000u) {                                                      // under 2^-14: subnormal or zero
    if (x <= 0x33000000u) return sign;                                        // 2^-25 and under: to zero (a tie goes even)
    const std::uint32_t shift = 126u - (x >> 23);                             // 14 to 24
    const std::uint32_t mantissa = (x & 0x7fffffu) | 0x800000u;
    std::uint32_t r = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r & 1u))) ++r;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | r);
  }
  x -= 0x38000000u;  // exponent bias 127 -> 15
  std::uint32_t r = x >> 13;
  const std::uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent
  return static_cast<std::uint16_t>(sign | r);
}

// float16 -> float32, exactly (a NaN quiet, as F16C gives it).
inline float from_f16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u);  // a NaN comes out quiet, as F16C's
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // zero or subnormal, exact
    return sign ? -magnitude : magnitude;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Whole arrays: F16C's eight at a time where the CPU has it.
void to_f16(const float* in, std::uint16_t* out, std::size_t n);
void from_f16(const std::uint16_t* in, float* out, std::size_t n);
// acc[i] = to_f16(from_f16(acc[i]) + from_f16(in[i])): a sum of two halves in float32,
// rounded once.
void add_f16(std::uint16_t* acc, const std::uint16_t* in, std::size_t n);
// Whether the array forms use F16C on this machine (for tests and benchmarks).
bool f16c_in_use();

}  // namespace dtrain
