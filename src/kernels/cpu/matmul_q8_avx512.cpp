// Y = W X for MLX affine 4/8-bit weights with int8 activations, AVX-512 VNNI (see
// matmul_avx512.h). The structure follows matmul_q8_avx2.cpp: a row at a time for T tokens, the
// factors of 8 blocks (weight scale x activation scale, bias x exact block sum) computed together,
// one horizontal sum per (row, token) at the end. A block of 64 weights is one register: 4-bit
// codes unpacked as [low nibbles | high nibbles] to meet the activations' nibble order, 8-bit
// codes as they are; vpdpbusd takes the codes as unsigned bytes, so value = scale x code + bias
// needs no offset term.
// GCC 12's AVX-512 intrinsics pass undefined vectors to masked builtins, which its uninitialised-
// value analysis reports inside immintrin.h; the diagnostics are silenced for those header lines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "kernels/cpu/matmul_avx512.h"

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/matmul_q8_rows.h"

#include <algorithm>
#include <type_traits>

namespace swiftlet::avx512 {

bool cpu_has_avx512_vnni() {
  return avx2::cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

namespace {

using q8::Ctx;
using q8::kBlock;
using q8::kPrefetch;

// Row r x tokens [t, t + T). Per token: two accumulators of 16 lanes for even and odd blocks and
// one of 8 for the bias terms, summed in the same order whatever T is, so a token's result is
// the same bit for bit in decode and in any batch. 4-bit rows prefetch their codes kPrefetch
// bytes ahead whatever T is: a tile's rows follow one another as decode's do (lm_head for 4
// tokens on the GPU machine's 16-core Xeon: 2.0x one token's time without, 1.5x with).
template <int Bits, int T>
void row_tokens(const Ctx& c, int64_t r, int64_t t) {
  const q8::Row row = q8::row_of(c, r);
  const q8::Tokens<T> tk = q8::tokens_of<T>(c, t);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[T][2];
  __m256 accb[T];
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) {
    acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    accb[j] = _mm256_setzero_ps();
  }
  alignas(32) float sd[T][8];
  for (int64_t b0 = 0; b0 < c.nb; b0 += 8) {
    const int nj = int(std::min<int64_t>(8, c.nb - b0));
    const __m256 s8 = avx2::block_scales8(c.w.scale_dtype, row.scales, b0, nj, c.per);
    const __m256 bias8 = avx2::block_scales8(c.w.scale_dtype, row.biases, b0, nj, c.per);
    SWIFTLET_UNROLL
    for (int j = 0; j < T; ++j) {
      _mm256_store_ps(sd[j], _mm256_mul_ps(s8, _mm256_loadu_ps(tk.d[j] + b0)));
      accb[j] = _mm256_fmadd_ps(bias8, _mm256_loadu_ps(tk.xsum[j] + b0), accb[j]);
    }
    auto block = [&](int k, auto parity) {
      constexpr int a = decltype(parity)::value;
      const int64_t b = b0 + k;
      __m512i codes;
      if constexpr (Bits == 4) {
        if constexpr (a == 0)  // one prefetch per 64-byte line, in token tiles too
          _mm_prefetch(reinterpret_cast<const char*>(row.codes + kPrefetch + b * q8::kBlockBytes<Bits>), _MM_HINT_T0);
        const __m256i pk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.codes + b * 32));
        codes = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(pk), _mm256_srli_epi16(pk, 4), 1), m4);
      } else {
        codes = _mm512_loadu_si512(row.codes + b * 64);
      }
      SWIFTLET_UNROLL
      for (int j = 0; j < T; ++j) {
        const __m512i x = _mm512_loadu_si512(tk.xq[j] + b * kBlock);
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, x);
        acc[j][a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(sd[j][k]), acc[j][a]);
      }
    };
    q8::alternate_accumulators(nj, block);
  }
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j)
    c.y[size_t(t + j) * size_t(c.w.rows) + size_t(r)] =
        _mm512_reduce_add_ps(_mm512_add_ps(acc[j][0], acc[j][1])) + avx2::hsum(accb[j]);
}

// Tiles of up to 8 tokens (AVX-512 has 32 registers: 8 tokens x 2 accumulators fit beside the
// codes); the order of rows and tiles is the AVX2 kernel's (matmul_q8_rows.h).
template <int Bits>
void rows_q8(const Ctx& c, int64_t n, int64_t r0, int64_t r1) {
  q8::tile_rows<8>(c, n, r0, r1,
                   [&](int64_t r, int64_t t, auto tile) { row_tokens<Bits, decltype(tile)::value>(c, r, t); });
}

}  // namespace

void matmul_rows_q8(const QMatrix& w, const avx2::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
  q8::for_bits(w, p, y, [&](const Ctx& c, auto bits) { rows_q8<decltype(bits)::value>(c, n, r0, r1); });
}

}  // namespace swiftlet::avx512
