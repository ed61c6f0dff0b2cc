// Element types a Tensor can store. f32 is the compute type; bf16 and f16 are storage
// types for mixed precision (converted by kernels); i32 holds integer labels and indices; u8
// holds raw bytes (images, serialized records); string holds byte strings of any length
// (tf.string: text lines, records), one std::string per element, on the CPU only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "dtrain/core/half.h"

namespace dtrain {

// New types go at the end, and kLastDType with them: the values are written in files,
// whose readers refuse any past it.
enum class DType : std::uint8_t { f32, bf16, i32, u8, string, f16 };
inline constexpr DType kLastDType = DType::f16;

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
    case DType::string: return sizeof(std::string);
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::u8: return "uint8";
    case DType::string: return "string";
  }
  return "?";
}

// bfloat16: the top 16 bits of an IEEE float32. Conversion rounds to nearest even,
// and keeps NaN a NaN (a quiet bit is forced so truncation cannot make it infinity).
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  static std::uint16_t from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>((u + rounding) >> 16);
  }
};

// IEEE float16 (half): 5 exponent bits, 10 mantissa bits, largest finite value 65504.
// Conversion rounds to nearest even (core/half.h), beyond 65504 to infinity.
struct float16 {
  std::uint16_t bits = 0;

  float16() = default;
  explicit float16(float f) : bits(to_f16(f)) {}
  explicit operator float() const { return from_f16(bits); }
};

// Whether t holds floating-point values (float32, or a 16-bit storage type).
constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }
// Whether t is one of the 16-bit types mixed precision computes in.
constexpr bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<float16>() { return DType::f16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<std::string>() { return DType::string; }

}  // namespace dtrain
