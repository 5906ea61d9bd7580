// Element types as they appear in safetensors headers, and scalar conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace swiftlet {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U64, U32, U16, U8, Bool };

// Parses a safetensors dtype string ("F32", "BF16", ...). Throws Error on an unknown one.
DType parse_dtype(std::string_view s);
std::string_view dtype_name(DType t);
size_t dtype_size(DType t);
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN stays NaN (as torch and MLX do).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of a float dtype (F32/F16/BF16) to fp32.
void to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace swiftlet
