// Small AVX2 + F16C helpers shared by the x86 products (matmul_avx2.cpp, matmul_q8_avx2.cpp,
// matmul_q8_avx512.cpp). Include only from translation units compiled with at least
// -mavx2 -mfma -mf16c; callers check the CPU first.
//
// The helpers have internal linkage: translation units built for different instruction sets
// (AVX2, AVX-512) each keep their own copy, so the linker can never hand an AVX2-only caller a
// copy compiled with AVX-512 encodings.
#pragma once

#include "core/dtype.h"

#include <immintrin.h>

#include <cstdint>

namespace swiftlet::avx2 {
namespace {

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

// Scales (or biases) of activation blocks [b0, b0 + nj) of one row as floats (blocks of 64
// values; a group of `per` blocks shares one); lanes past nj are 0 (the padded activation
// factors are 0 too, and 0 * garbage could be NaN).
inline __m256 block_scales8(DType t, const void* base, int64_t b0, int nj, int per) {
  if (per == 1 && nj == 8) {
    switch (t) {
      case DType::BF16: return load8(static_cast<const uint16_t*>(base) + b0, true);
      case DType::F16: return load8(static_cast<const uint16_t*>(base) + b0, false);
      default: return _mm256_loadu_ps(static_cast<const float*>(base) + b0);
    }
  }
  if (per == 2 && nj == 8) {  // group 128: 4 values, each twice
    const int64_t g = b0 / 2;
    __m128 v4;
    switch (t) {
      case DType::BF16: {
        const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + g));
        v4 = _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
        break;
      }
      case DType::F16:
        v4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + g)));
        break;
      default: v4 = _mm_loadu_ps(static_cast<const float*>(base) + g);
    }
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v4), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  }
  alignas(32) float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < nj; ++j) tmp[j] = load_scale(t, base, (b0 + j) / per);
  return _mm256_load_ps(tmp);
}

}  // namespace
}  // namespace swiftlet::avx2
