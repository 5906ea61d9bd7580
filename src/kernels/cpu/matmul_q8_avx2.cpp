// Y = W X for MLX affine 4/8-bit weights with int8 activations (AVX2; built with -mavx2 -mfma
// -mf16c). See matmul_avx2.h for the layout of PreparedQ8.
//
// The work is done a row at a time for T tokens. Per block of 64 weights, the weights are
// unpacked once and multiplied (vpmaddubsw) with the int8 activations of T tokens; each
// (row, token) pair keeps 8 float partial sums, to which every block adds its int32 dot times
// (weight scale x activation scale). Those factors, the bias term (bias . exact block sums of x)
// and the 8-bit offset term are computed 8 blocks at a time, vectorised, so the inner loop has
// no scalar work and no horizontal sums; one horizontal sum per (row, token) ends the row.
// Decode (n = 1) is memory bound: rows streamed one after another (4-bit: software prefetch).
#include "kernels/cpu/matmul_avx2.h"

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/matmul_q8_rows.h"

#include "core/error.h"

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

namespace swiftlet::avx2 {

namespace {

using q8::Ctx;
using q8::kBlock;
using q8::kPrefetch;

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Quantises 64 floats to int8 with d = amax / 127 (round to nearest even, as lrintf).
// Nibble order (4-bit weights): out[m] = q[2m], out[32 + m] = q[2m + 1], because byte m of the
// 32 packed bytes of a block holds element 2m in its low nibble and 2m + 1 in its high one.
// Otherwise out[m] = q[m] (8-bit weights: byte m is element m).
void quantize_block(const float* x, bool nibble_order, int8_t* out, float& d_out, float& sum_out, float& qsum128_out) {
  __m256 v[8];
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
  for (int k = 0; k < 8; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    sum = _mm256_add_ps(sum, v[k]);
  }
  const float d = hmax(amax) / 127.0f;
  const __m256 inv = _mm256_set1_ps(d > 0 ? 1.0f / d : 0.0f);
  __m256i q[8];
  __m256i isum = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv));  // MXCSR default: nearest even
    isum = _mm256_add_epi32(isum, q[k]);
  }
  // Pack to bytes; packs works per 128-bit lane, so dword j of the result holds elements
  // {0,4,1,5,2,6,3,7}[j] * 4 .. + 3 of the 32; one dword permute restores the order.
  const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i b[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i p01 = _mm256_packs_epi32(q[4 * h], q[4 * h + 1]);
    const __m256i p23 = _mm256_packs_epi32(q[4 * h + 2], q[4 * h + 3]);
    b[h] = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), fix);
  }
  if (nibble_order) {
    // Per lane: even bytes to the low 8, odd bytes to the high 8; then 64-bit chunks
    // (0, 2, 1, 3) give [16 evens | 16 odds] per 32 elements.
    const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14,
                                        1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i e0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b[0], eo), 0xD8);
    const __m256i e1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b[1], eo), 0xD8);
    b[0] = _mm256_permute2x128_si256(e0, e1, 0x20);
    b[1] = _mm256_permute2x128_si256(e0, e1, 0x31);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), b[0]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), b[1]);
  d_out = d;
  sum_out = hsum(sum);
  qsum128_out = 128.0f * float(hsum_i32(isum));
}

// 8 float partial sums of the int32 dot of block b of a row (4-bit: lo/hi nibbles unpacked;
// 8-bit: a = q - 128 and |a|) with one token's int8 block.
inline __m256 dot_q4(__m256i lo, __m256i hi, const int8_t* xq, int64_t b) {
  const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
  const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock + 32));
  // |sum| <= 2 * 2 * 15 * 127 per int16 lane: no saturation.
  const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

// (q - 128) . x with |q - 128| <= 128, so vpmaddubsw's pairs stay within int16; the 128 . x
// part is the offset term.
inline __m256 dot_q8(__m256i a0, __m256i u0, __m256i a1, __m256i u1, const int8_t* xq, int64_t b) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock + 32));
  const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(x0, a0)), ones);
  const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(x1, a1)), ones);
  return _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1));
}

// Row r x tokens [t, t + T). Each token has two accumulators, for even and odd blocks, which
// hide the FMA latency; a token's sums are formed in the same order whatever T is, so a token
// gets bit-identical results in decode (T = 1) and in a batch (prefix reuse relies on that).
// Decode streams rows one after another, 4-bit with a software prefetch (several rows at once
// confuse the hardware prefetchers: measured slower on weights far larger than the caches); a
// tile of tokens visits its rows in the same order and prefetches the same way (docs/log/batching.md).
template <int Bits, int T>
void row_tokens(const Ctx& c, int64_t r, int64_t t) {
  const q8::Row row = q8::row_of(c, r);
  const q8::Tokens<T> tk = q8::tokens_of<T>(c, t);
  const __m256i m4 = _mm256_set1_epi8(0x0F), off = _mm256_set1_epi8(char(0x80));
  __m256 acc[T][2];
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  alignas(32) float sd[T][8];
  for (int64_t b0 = 0; b0 < c.nb; b0 += 8) {
    const int nj = int(std::min<int64_t>(8, c.nb - b0));
    // Factors of the next 8 blocks: sd = weight scale x activation scale; the bias term and
    // (8-bit) the offset term go straight into the accumulators, whose lanes are summed at
    // the end anyway.
    const __m256 s8 = block_scales8(c.w.scale_dtype, row.scales, b0, nj, c.per);
    const __m256 bias8 = block_scales8(c.w.scale_dtype, row.biases, b0, nj, c.per);
    SWIFTLET_UNROLL
    for (int j = 0; j < T; ++j) {
      const __m256 sdv = _mm256_mul_ps(s8, _mm256_loadu_ps(tk.d[j] + b0));
      _mm256_store_ps(sd[j], sdv);
      acc[j][0] = _mm256_fmadd_ps(bias8, _mm256_loadu_ps(tk.xsum[j] + b0), acc[j][0]);
      if constexpr (Bits == 8) acc[j][1] = _mm256_fmadd_ps(sdv, _mm256_loadu_ps(tk.qsum[j] + b0), acc[j][1]);
    }
    // Block k of the 8 into accumulator k % 2; the parity is a constant so that the
    // accumulators stay in registers.
    auto block = [&](int k, auto parity) {
      constexpr int a = decltype(parity)::value;
      const int64_t b = b0 + k;
      if constexpr (Bits == 4 && a == 0)  // one prefetch per 64-byte line, in token tiles too
        _mm_prefetch(reinterpret_cast<const char*>(row.codes + kPrefetch + b * q8::kBlockBytes<Bits>), _MM_HINT_T0);
      if constexpr (Bits == 4) {
        const __m256i pk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.codes + b * 32));
        const __m256i lo = _mm256_and_si256(pk, m4), hi = _mm256_and_si256(_mm256_srli_epi16(pk, 4), m4);
        SWIFTLET_UNROLL
        for (int j = 0; j < T; ++j)
          acc[j][a] = _mm256_fmadd_ps(dot_q4(lo, hi, tk.xq[j], b), _mm256_broadcast_ss(&sd[j][k]), acc[j][a]);
      } else {
        const __m256i* wb = reinterpret_cast<const __m256i*>(row.codes + b * 64);
        const __m256i a0 = _mm256_sub_epi8(_mm256_loadu_si256(wb), off);
        const __m256i a1 = _mm256_sub_epi8(_mm256_loadu_si256(wb + 1), off);
        const __m256i u0 = _mm256_abs_epi8(a0), u1 = _mm256_abs_epi8(a1);
        SWIFTLET_UNROLL
        for (int j = 0; j < T; ++j)
          acc[j][a] = _mm256_fmadd_ps(dot_q8(a0, u0, a1, u1, tk.xq[j], b), _mm256_broadcast_ss(&sd[j][k]), acc[j][a]);
      }
    };
    q8::alternate_accumulators(nj, block);
  }
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j)
    c.y[size_t(t + j) * size_t(c.w.rows) + size_t(r)] = hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
}

// Tiles of up to 4 tokens: 2 x 4 accumulators, plus the unpacked weights, fit the 16 ymm registers.
template <int Bits>
void rows_q8(const Ctx& c, int64_t n, int64_t r0, int64_t r1) {
  q8::tile_rows<4>(c, n, r0, r1,
                   [&](int64_t r, int64_t t, auto tile) { row_tokens<Bits, decltype(tile)::value>(c, r, t); });
}

}  // namespace

void prepare_q8(const QMatrix& w, const float* x, int64_t n, PreparedQ8& p) {
  q8::prepare_tokens(w, x, n, p, quantize_block);
}

void matmul_rows_q8(const QMatrix& w, const PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
  q8::for_bits(w, p, y, [&](const Ctx& c, auto bits) { rows_q8<decltype(bits)::value>(c, n, r0, r1); });
}

}  // namespace swiftlet::avx2
