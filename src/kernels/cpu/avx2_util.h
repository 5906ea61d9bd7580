// Small AVX2 + F16C helpers shared by the SIMD kernels (matmul_avx2.cpp, matmul_q8_avx2.cpp,
// and the token mixers' model/simd_avx2.h). Include only from translation units compiled with
// -mavx2 -mfma -mf16c; callers check the CPU first (cpu_has_avx2()).
#pragma once

#include "core/dtype.h"

#include <immintrin.h>

#include <cstdint>

namespace swiftlet::avx2 {

// Sum of the 8 lanes.
inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Element i of a scales/biases array stored as BF16, F16 or F32.
inline float load_scale(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
// 8 consecutive bf16 (bf16 = true) or f16 values as floats.
inline __m256 load8(const uint16_t* p, bool bf16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

}  // namespace swiftlet::avx2
