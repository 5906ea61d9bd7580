#include "core/dtype.h"

#include "core/error.h"

#include <cmath>

namespace swiftlet {

namespace {
struct Entry {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr Entry kTable[] = {
    {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::F64, "F64", 8}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2}, {DType::I8, "I8", 1},   {DType::U64, "U64", 8},
    {DType::U32, "U32", 4}, {DType::U16, "U16", 2}, {DType::U8, "U8", 1},
    {DType::Bool, "BOOL", 1},
};
}  // namespace

DType parse_dtype(std::string_view s) {
  for (const auto& e : kTable)
    if (e.name == s) return e.type;
  fail("unsupported tensor dtype '{}'", s);
}

std::string_view dtype_name(DType t) { return kTable[size_t(t)].name; }
size_t dtype_size(DType t) { return kTable[size_t(t)].size; }

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while ((man & 0x400) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00;  // NaN
  if (absu >= 0x477ff000u) return sign | 0x7c00;  // overflow to inf (>= 65520)
  if (absu < 0x38800000u) {                       // subnormal or zero in f16
    float a;
    std::memcpy(&a, &absu, 4);
    // 2^-24 is the smallest subnormal; nearbyint rounds half to even.
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);  // round to nearest even at bit 13
  return sign | uint16_t((r - 0x38000000u) >> 13);
}

void to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      fail("cannot convert {} tensor to float", dtype_name(t));
  }
}

}  // namespace swiftlet
