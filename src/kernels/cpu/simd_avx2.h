// AVX2 + FMA building blocks shared by the token mixers (delta_net_avx2.cpp, attention_avx2.cpp).
// Include only from translation units compiled with -mavx2 -mfma; callers check the CPU first.
#pragma once

#include "kernels/cpu/avx2_util.h"

#include <immintrin.h>

#include <cstdint>

namespace swiftlet::simd {

using avx2::hsum;

// e^x for 8 floats, relative error ~2e-7 over the float range. Range reduction
// x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exactness), then a degree-6 polynomial
// for e^r (the classic Cephes expf coefficients) and 2^n built in the exponent bits.
// Inputs below -87.3 give 0 (flushed), above 88.7 give +inf-ish (clamped to 2^128 range).
inline __m256 exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.33654475f);
  const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n is in [-126, 128]; 2^n via the exponent field (n = 128 only for x near the top clamp,
  // where the product is split to stay finite).
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(below, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}

// x * sigmoid(x) = x / (1 + e^-x)
inline __m256 silu(__m256 x) {
  const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

inline __m256 sigmoid(__m256 x) {
  const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// C[m][n] (+)= A[m][k] B[k][n], all row-major with leading dimensions. With `lower`, A is
// lower triangular (A[i][p] = 0 for p > i) and the k loop stops at the diagonal.
void gemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc, bool accumulate, bool lower = false);

}  // namespace swiftlet::simd
