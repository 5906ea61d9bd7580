// Code widening of low-bit miss copies (miss_copy.h) compiled for AVX2 (this file only:
// -mavx2), used when the CPU has it. 2 -> 4 bits: each input byte (four codes) becomes a 16-bit
// lane with the codes moved to nibbles; 3 -> 4 bits: each 3 input bytes (eight codes) become a
// 32-bit lane, the codes moved to nibbles in three mask-and-shift steps. Other widths and the
// last few codes go through the reference.
#include "format/miss_copy.h"

#include <immintrin.h>

#include <cstring>

namespace swiftlet {

namespace {

void widen_2_to_4(const uint8_t* src, uint8_t* dst, size_t n) {
  const __m256i lo_nib = _mm256_set1_epi16(0x000F), hi_nib = _mm256_set1_epi16(0x00F0);
  const __m256i even = _mm256_set1_epi16(0x0303), odd = _mm256_set1_epi16(0x0C0C);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {  // 16 bytes in, 32 out
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i / 4)));
    // codes at bits 0, 2 | 4, 6  ->  0, 2 | 8, 10  ->  0, 4 | 8, 12
    const __m256i t = _mm256_or_si256(_mm256_and_si256(x, lo_nib), _mm256_slli_epi16(_mm256_and_si256(x, hi_nib), 4));
    const __m256i u = _mm256_or_si256(_mm256_and_si256(t, even), _mm256_slli_epi16(_mm256_and_si256(t, odd), 2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i / 2), u);
  }
  if (i < n) widen_codes_reference(src + i / 4, 2, dst + i / 2, 4, n - i);
}

void widen_3_to_4(const uint8_t* src, uint8_t* dst, size_t n) {
  // Per 128-bit lane: 12 input bytes, 3 per 32-bit lane (the fourth byte zero).
  const __m256i gather = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,  //
                                          0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
  const __m256i a_lo = _mm256_set1_epi32(0x00000FFF), a_hi = _mm256_set1_epi32(0x00FFF000);
  const __m256i b_lo = _mm256_set1_epi32(0x003F003F), b_hi = _mm256_set1_epi32(0x0FC00FC0);
  const __m256i c_lo = _mm256_set1_epi32(0x07070707), c_hi = _mm256_set1_epi32(0x38383838);
  size_t i = 0;
  // 64 codes: 24 bytes in (two 16-byte loads, the second at +12, so 28 bytes are touched), 32 out.
  for (; i + 64 <= n && (i / 8) * 3 + 28 <= n * 3 / 8; i += 64) {
    const uint8_t* s = src + i / 8 * 3;
    const __m256i x =
        _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(s + 12), reinterpret_cast<const __m128i*>(s));
    __m256i v = _mm256_shuffle_epi8(x, gather);
    // codes at 3k: 0..3 stay, 4..7 move to bit 16 (each 16-bit half holds four codes at 0, 3, 6, 9)
    v = _mm256_or_si256(_mm256_and_si256(v, a_lo), _mm256_slli_epi32(_mm256_and_si256(v, a_hi), 4));
    // 0, 3, 6, 9  ->  0, 3, 8, 11
    v = _mm256_or_si256(_mm256_and_si256(v, b_lo), _mm256_slli_epi32(_mm256_and_si256(v, b_hi), 2));
    // 0, 3, 8, 11  ->  0, 4, 8, 12
    v = _mm256_or_si256(_mm256_and_si256(v, c_lo), _mm256_slli_epi32(_mm256_and_si256(v, c_hi), 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i / 2), v);
  }
  if (i < n) widen_codes_reference(src + i / 8 * 3, 3, dst + i / 2, 4, n - i);
}

}  // namespace

bool widen_codes_avx2(const uint8_t* src, int from, uint8_t* dst, int to, size_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (!avx2 || to != 4 || (from != 2 && from != 3)) return false;
  if (from == 2)
    widen_2_to_4(src, dst, n);
  else
    widen_3_to_4(src, dst, n);
  return true;
}

}  // namespace swiftlet
