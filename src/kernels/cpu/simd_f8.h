// An 8-lane float vector, the one building block of the token mixers' and the activations'
// kernels (attention_simd.cpp, delta_net_simd.cpp, activations_simd.cpp), so that each of them is
// one source for both architectures:
//   x86-64: one __m256 (AVX2 + FMA; include only from translation units built with -mavx2 -mfma,
//           whose callers check the CPU first);
//   aarch64: two float32x4_t (NEON, which every aarch64 CPU has).
// Every operation does the same IEEE arithmetic in the same order on both (fused multiply-adds
// where the name says so, the horizontal sums paired alike), so a kernel gives the same bits on
// either architecture.
//
// Internal linkage, as avx2_util.h: a translation unit's copy is compiled for its own flags.
#pragma once

#if defined(__x86_64__)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "simd_f8.h on x86-64 needs -mavx2 -mfma"
#endif
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#else
#error "simd_f8.h: x86-64 (AVX2) or aarch64 (NEON) only"
#endif

#include <cstdint>

namespace swiftlet::simd {
namespace {

#if defined(__x86_64__)

struct F8 {
  __m256 v;
};

inline F8 zero() { return {_mm256_setzero_ps()}; }
inline F8 splat(float x) { return {_mm256_set1_ps(x)}; }
inline F8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void store(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }
// Lane i of out[j] = p[4 i + j]: 32 floats of 8 groups of 4, split by place in the group.
inline void load_deinterleave4(const float* p, F8 out[4]) {
  const __m256i idx = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  for (int j = 0; j < 4; ++j) out[j] = {_mm256_i32gather_ps(p + j, idx, 4)};
}
inline F8 operator+(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline F8 operator-(F8 a, F8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline F8 operator*(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline F8 operator/(F8 a, F8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline F8 fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }   // a b + c, one rounding
inline F8 fnma(F8 a, F8 b, F8 c) { return {_mm256_fnmadd_ps(a.v, b.v, c.v)}; } // c - a b, one rounding
inline F8 min(F8 a, F8 b) { return {_mm256_min_ps(a.v, b.v)}; }
inline F8 max(F8 a, F8 b) { return {_mm256_max_ps(a.v, b.v)}; }

// Sum of the 8 lanes: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
inline float hsum(F8 a) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Lane g of the result = the sum of a[g]'s lanes, as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
inline F8 reduce8(const F8* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0].v, a[1].v), t1 = _mm256_hadd_ps(a[2].v, a[3].v);
  const __m256 t2 = _mm256_hadd_ps(a[4].v, a[5].v), t3 = _mm256_hadd_ps(a[6].v, a[7].v);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return {_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))};
}

// Rounded to the nearest integer, ties to even.
inline F8 round_even(F8 a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }

// p 2^n for integral n in [-126, 128], built in the exponent field in two halves (2^128 alone
// does not fit), and 0 in the lanes where x < lo.
inline F8 scale_pow2_or_zero(F8 p, F8 n, F8 x, F8 lo) {
  const __m256i ni = _mm256_cvtps_epi32(n.v);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  const __m256 below = _mm256_cmp_ps(x.v, lo.v, _CMP_LT_OQ);
  return {_mm256_andnot_ps(below, _mm256_mul_ps(_mm256_mul_ps(p.v, s1), s2))};
}

#else  // aarch64

struct F8 {
  float32x4_t lo, hi;  // lanes 0-3, 4-7
};

inline F8 zero() { return {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
inline F8 splat(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
inline F8 load(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline void store(float* p, F8 a) {
  vst1q_f32(p, a.lo);
  vst1q_f32(p + 4, a.hi);
}
inline void load_deinterleave4(const float* p, F8 out[4]) {
  const float32x4x4_t lo = vld4q_f32(p), hi = vld4q_f32(p + 16);
  for (int j = 0; j < 4; ++j) out[j] = {lo.val[j], hi.val[j]};
}
inline F8 operator+(F8 a, F8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline F8 operator-(F8 a, F8 b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
inline F8 operator*(F8 a, F8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline F8 operator/(F8 a, F8 b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
inline F8 fma(F8 a, F8 b, F8 c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
inline F8 fnma(F8 a, F8 b, F8 c) { return {vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)}; }
// As x86's minps / maxps: the second operand where the comparison is false (NaN included).
inline F8 min(F8 a, F8 b) {
  return {vbslq_f32(vcltq_f32(a.lo, b.lo), a.lo, b.lo), vbslq_f32(vcltq_f32(a.hi, b.hi), a.hi, b.hi)};
}
inline F8 max(F8 a, F8 b) {
  return {vbslq_f32(vcgtq_f32(a.lo, b.lo), a.lo, b.lo), vbslq_f32(vcgtq_f32(a.hi, b.hi), a.hi, b.hi)};
}

inline float hsum(F8 a) {
  const float32x4_t s = vaddq_f32(a.lo, a.hi);
  const float32x4_t t = vaddq_f32(s, vextq_f32(s, s, 2));
  return vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 1);
}

inline F8 reduce8(const F8* a) {
  auto sums4 = [](float32x4_t x0, float32x4_t x1, float32x4_t x2, float32x4_t x3) {
    return vpaddq_f32(vpaddq_f32(x0, x1), vpaddq_f32(x2, x3));
  };
  return {vaddq_f32(sums4(a[0].lo, a[1].lo, a[2].lo, a[3].lo), sums4(a[0].hi, a[1].hi, a[2].hi, a[3].hi)),
          vaddq_f32(sums4(a[4].lo, a[5].lo, a[6].lo, a[7].lo), sums4(a[4].hi, a[5].hi, a[6].hi, a[7].hi))};
}

inline F8 round_even(F8 a) { return {vrndnq_f32(a.lo), vrndnq_f32(a.hi)}; }

inline F8 scale_pow2_or_zero(F8 p, F8 n, F8 x, F8 lo) {
  auto half_lanes = [](float32x4_t p4, float32x4_t n4, float32x4_t x4, float32x4_t lo4) {
    const int32x4_t ni = vcvtq_s32_f32(n4);  // exact: n is integral
    const int32x4_t half = vshrq_n_s32(ni, 1);
    const int32x4_t bias = vdupq_n_s32(127);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(half, bias), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, half), bias), 23));
    const uint32x4_t below = vcltq_f32(x4, lo4);
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(vmulq_f32(vmulq_f32(p4, s1), s2)), below));
  };
  return {half_lanes(p.lo, n.lo, x.lo, lo.lo), half_lanes(p.hi, n.hi, x.hi, lo.hi)};
}

#endif

inline F8 broadcast(const float* p) { return splat(*p); }
// A hint to bring p's cache line into L1 ahead of its use.
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// e^x, relative error ~2e-7 over the float range. Range reduction x = n ln2 + r with
// |r| <= ln2/2 (ln2 split in two for exactness), then a degree-6 polynomial for e^r (the classic
// Cephes expf coefficients) and 2^n built in the exponent bits. Inputs below -87.3 give 0
// (flushed), above 88.7 are clamped there.
inline F8 exp(F8 x) {
  const F8 hi = splat(88.3762626647949f), lo = splat(-87.33654475f);
  const F8 xc = min(max(x, lo), hi);
  const F8 n = round_even(xc * splat(1.44269504088896341f));
  F8 r = fnma(n, splat(0.693359375f), xc);
  r = fnma(n, splat(-2.12194440e-4f), r);
  F8 p = splat(1.9875691500e-4f);
  p = fma(p, r, splat(1.3981999507e-3f));
  p = fma(p, r, splat(8.3334519073e-3f));
  p = fma(p, r, splat(4.1665795894e-2f));
  p = fma(p, r, splat(1.6666665459e-1f));
  p = fma(p, r, splat(5.0000001201e-1f));
  p = fma(p, r * r, r + splat(1.0f));
  return scale_pow2_or_zero(p, n, x, lo);
}

// x sigmoid(x) = x / (1 + e^-x)
inline F8 silu(F8 x) { return x / (splat(1.0f) + exp(zero() - x)); }
inline F8 sigmoid(F8 x) { return splat(1.0f) / (splat(1.0f) + exp(zero() - x)); }

// sum a[i] b[i], 16 at a time in two sums, then 8, then one by one.
inline float dot(const float* a, const float* b, int64_t n) {
  F8 s0 = zero(), s1 = zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = fma(load(a + i), load(b + i), s0);
    s1 = fma(load(a + i + 8), load(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = fma(load(a + i), load(b + i), s0);
  float s = hsum(s0 + s1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// x[i] *= s.
inline void scale_row(float* x, int64_t n, float s) {
  const F8 vs = splat(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(x + i, vs * load(x + i));
  for (; i < n; ++i) x[i] *= s;
}

}  // namespace

// C[m][n] (+)= A[m][k] B[k][n], all row-major with leading dimensions. With `lower`, A is
// lower triangular (A[i][p] = 0 for p > i) and the k loop stops at the diagonal
// (delta_net_simd.cpp).
void gemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc, bool accumulate, bool lower = false);

}  // namespace swiftlet::simd
