// The NEON int8-activation kernel for affine 4/8-bit weights, included by matmul_q8_neon.cpp,
// matmul_q8_neon_dotprod.cpp and matmul_q8_neon_i8mm.cpp, each built for its instruction set and
// each defining that set's entry point (at the end): the block dot takes `sdot` where
// __ARM_FEATURE_DOTPROD is defined and widening multiplies otherwise; with __ARM_FEATURE_MATMUL_INT8
// batches take `smmla` on 2 rows x 2 tokens. The rest has internal linkage, as matmul_q8_rows.h:
// each translation unit keeps its own copy.
//
// Every form computes, per (row, token) and block of 64, the exact int32 dot of the weight codes
// (4-bit: 0..15; 8-bit: q - 128, the 128 . x part being the offset term) with the int8
// activations, then adds 4 blocks at a time, one lane per block, in this order: bias x exact
// block sum, (8-bit) weight scale x activation scale x offset term, dot x weight scale x
// activation scale. One horizontal sum ends the row. The float work thus does not depend on the
// instructions that formed the integer dots nor on the token tile: all forms give the same bits,
// a token alone and in a batch alike (prefix reuse relies on that).
#pragma once

#include "kernels/cpu/matmul_neon.h"
#include "kernels/cpu/matmul_q8_rows.h"

#include "core/dtype.h"

#include <arm_neon.h>

#include <algorithm>
#include <type_traits>

namespace swiftlet::neon {
namespace {

using q8::Ctx;
using q8::kBlock;
using q8::kPrefetch;

// Scales (or biases) of blocks [b0, b0 + 4) of a row as floats (a group of `per` blocks shares
// one); lanes past nj are 0, as the padded activation factors are (0 x garbage could be NaN).
inline float32x4_t block_scales4(DType t, const void* base, int64_t b0, int nj, int per) {
  const uint16_t* h = static_cast<const uint16_t*>(base);
  if (per == 1 && nj == 4) {
    switch (t) {
      case DType::BF16:
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h + b0), 16));
      case DType::F16:
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + b0)));
      default:
        return vld1q_f32(static_cast<const float*>(base) + b0);
    }
  }
  float tmp[4] = {0, 0, 0, 0};
  for (int j = 0; j < nj; ++j) {
    const int64_t i = (b0 + j) / per;
    tmp[j] = t == DType::BF16  ? bf16_to_f32(h[i])
             : t == DType::F16 ? f16_to_f32(h[i])
                               : static_cast<const float*>(base)[i];
  }
  return vld1q_f32(tmp);
}

// A block's 64 weights as 4 x 16 signed bytes, in the order of the prepared activations: 4-bit
// (32 packed bytes) low nibbles of bytes 0-15, 16-31, then high nibbles; 8-bit: q - 128.
template <int Bits>
struct Block {
  int8x16_t v[4];
};
template <int Bits>
inline Block<Bits> load_block(const uint8_t* p) {
  Block<Bits> b;
  if constexpr (Bits == 4) {
    const uint8x16_t lo = vld1q_u8(p), hi = vld1q_u8(p + 16), m = vdupq_n_u8(0x0F);
    b.v[0] = vreinterpretq_s8_u8(vandq_u8(lo, m));
    b.v[1] = vreinterpretq_s8_u8(vandq_u8(hi, m));
    b.v[2] = vreinterpretq_s8_u8(vshrq_n_u8(lo, 4));
    b.v[3] = vreinterpretq_s8_u8(vshrq_n_u8(hi, 4));
  } else {
    const uint8x16_t off = vdupq_n_u8(0x80);
    SWIFTLET_UNROLL
    for (int i = 0; i < 4; ++i) b.v[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p + 16 * i), off));
  }
  return b;
}

// The dot of a block with 64 int8 activations as 4 int32 partial sums (their total is exact).
template <int Bits>
inline int32x4_t block_dot(const Block<Bits>& w, const int8_t* x) {
#if defined(__ARM_FEATURE_DOTPROD)
  int32x4_t s = vdotq_s32(vdupq_n_s32(0), w.v[0], vld1q_s8(x));
  SWIFTLET_UNROLL
  for (int i = 1; i < 4; ++i) s = vdotq_s32(s, w.v[i], vld1q_s8(x + 16 * i));
  return s;
#else
  if constexpr (Bits == 4) {
    // |w x| <= 15 x 127: all 8 products of an int16 lane stay below 2^15.
    int16x8_t p = vmull_s8(vget_low_s8(w.v[0]), vld1_s8(x));
    p = vmlal_high_s8(p, w.v[0], vld1q_s8(x));
    SWIFTLET_UNROLL
    for (int i = 1; i < 4; ++i) {
      const int8x16_t xi = vld1q_s8(x + 16 * i);
      p = vmlal_s8(p, vget_low_s8(w.v[i]), vget_low_s8(xi));
      p = vmlal_high_s8(p, w.v[i], xi);
    }
    return vpaddlq_s16(p);
  } else {
    // |w x| <= 128 x 127: two products per int16 lane, then widened.
    int32x4_t s = vdupq_n_s32(0);
    SWIFTLET_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int8x16_t xi = vld1q_s8(x + 16 * i);
      s = vpadalq_s16(s, vmlal_high_s8(vmull_s8(vget_low_s8(w.v[i]), vget_low_s8(xi)), w.v[i], xi));
    }
    return s;
  }
#endif
}

// Lane k = the total of block k's partial sums.
inline int32x4_t totals(int32x4_t b0, int32x4_t b1, int32x4_t b2, int32x4_t b3) {
  return vpaddq_s32(vpaddq_s32(b0, b1), vpaddq_s32(b2, b3));
}

// Adds 4 blocks of one (row, token) to acc: s4 and bias4 the row's, the rest the token's.
template <int Bits>
inline float32x4_t accumulate(float32x4_t acc, float32x4_t s4, float32x4_t bias4, const float* d, const float* xsum,
                              const float* qsum, int32x4_t dots) {
  const float32x4_t sd = vmulq_f32(s4, vld1q_f32(d));
  acc = vfmaq_f32(acc, bias4, vld1q_f32(xsum));
  if constexpr (Bits == 8) acc = vfmaq_f32(acc, sd, vld1q_f32(qsum));
  return vfmaq_f32(acc, vcvtq_f32_s32(dots), sd);
}

// Row r x tokens [t, t + T).
template <int Bits, int T>
void row_tokens(const Ctx& c, int64_t r, int64_t t) {
  const q8::Row row = q8::row_of(c, r);
  const q8::Tokens<T> tk = q8::tokens_of<T>(c, t);
  float32x4_t acc[T];
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) acc[j] = vdupq_n_f32(0);
  for (int64_t b0 = 0; b0 < c.nb; b0 += 4) {
    const int nj = int(std::min<int64_t>(4, c.nb - b0));
    if constexpr (Bits == 4) {  // one prefetch per 64-byte line
      __builtin_prefetch(row.codes + kPrefetch + b0 * q8::kBlockBytes<Bits>);
      __builtin_prefetch(row.codes + kPrefetch + b0 * q8::kBlockBytes<Bits> + 64);
    }
    const float32x4_t s4 = block_scales4(c.w.scale_dtype, row.scales, b0, nj, c.per);
    const float32x4_t bias4 = block_scales4(c.w.scale_dtype, row.biases, b0, nj, c.per);
    int32x4_t dots[T][4];
    SWIFTLET_UNROLL
    for (int k = 0; k < 4; ++k) {
      if (k < nj) {
        const Block<Bits> w = load_block<Bits>(row.codes + (b0 + k) * q8::kBlockBytes<Bits>);
        SWIFTLET_UNROLL
        for (int j = 0; j < T; ++j) dots[j][k] = block_dot<Bits>(w, tk.xq[j] + (b0 + k) * kBlock);
      } else {
        SWIFTLET_UNROLL
        for (int j = 0; j < T; ++j) dots[j][k] = vdupq_n_s32(0);
      }
    }
    SWIFTLET_UNROLL
    for (int j = 0; j < T; ++j)
      acc[j] = accumulate<Bits>(acc[j], s4, bias4, tk.d[j] + b0, tk.xsum[j] + b0, tk.qsum[j] + b0,
                                totals(dots[j][0], dots[j][1], dots[j][2], dots[j][3]));
  }
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) c.y[size_t(t + j) * size_t(c.w.rows) + size_t(r)] = vaddvq_f32(acc[j]);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// Rows r, r + 1 x tokens t, t + 1: per block, 8 smmla each multiply 2 x 8 weights (one 8-byte half
// of each row) by 8 x 2 activations into the 2 x 2 int32 dots [r.t, r.t+1, r+1.t, r+1.t+1].
template <int Bits>
void rows2_tokens2(const Ctx& c, int64_t r, int64_t t) {
  const q8::Row ra = q8::row_of(c, r), rb = q8::row_of(c, r + 1);
  const q8::Tokens<2> tk = q8::tokens_of<2>(c, t);
  float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};  // ra.t, ra.t1, rb.t, rb.t1
  for (int64_t b0 = 0; b0 < c.nb; b0 += 4) {
    const int nj = int(std::min<int64_t>(4, c.nb - b0));
    const float32x4_t s4[2] = {block_scales4(c.w.scale_dtype, ra.scales, b0, nj, c.per),
                               block_scales4(c.w.scale_dtype, rb.scales, b0, nj, c.per)};
    const float32x4_t bias4[2] = {block_scales4(c.w.scale_dtype, ra.biases, b0, nj, c.per),
                                  block_scales4(c.w.scale_dtype, rb.biases, b0, nj, c.per)};
    int32x4_t m[4];
    SWIFTLET_UNROLL
    for (int k = 0; k < 4; ++k) {
      m[k] = vdupq_n_s32(0);
      if (k >= nj) continue;
      const Block<Bits> wa = load_block<Bits>(ra.codes + (b0 + k) * q8::kBlockBytes<Bits>);
      const Block<Bits> wb = load_block<Bits>(rb.codes + (b0 + k) * q8::kBlockBytes<Bits>);
      const int8_t* x0 = tk.xq[0] + (b0 + k) * kBlock;
      const int8_t* x1 = tk.xq[1] + (b0 + k) * kBlock;
      SWIFTLET_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int64x2_t a = vreinterpretq_s64_s8(wa.v[i]), b = vreinterpretq_s64_s8(wb.v[i]);
        const int64x2_t xa = vreinterpretq_s64_s8(vld1q_s8(x0 + 16 * i)),
                        xb = vreinterpretq_s64_s8(vld1q_s8(x1 + 16 * i));
        m[k] = vmmlaq_s32(m[k], vreinterpretq_s8_s64(vzip1q_s64(a, b)), vreinterpretq_s8_s64(vzip1q_s64(xa, xb)));
        m[k] = vmmlaq_s32(m[k], vreinterpretq_s8_s64(vzip2q_s64(a, b)), vreinterpretq_s8_s64(vzip2q_s64(xa, xb)));
      }
    }
    // Transpose: output o's dots of the 4 blocks into one vector.
    const int64x2_t lo01 = vreinterpretq_s64_s32(vzip1q_s32(m[0], m[1])),
                    hi01 = vreinterpretq_s64_s32(vzip2q_s32(m[0], m[1]));
    const int64x2_t lo23 = vreinterpretq_s64_s32(vzip1q_s32(m[2], m[3])),
                    hi23 = vreinterpretq_s64_s32(vzip2q_s32(m[2], m[3]));
    const int32x4_t o[4] = {
        vreinterpretq_s32_s64(vzip1q_s64(lo01, lo23)), vreinterpretq_s32_s64(vzip2q_s64(lo01, lo23)),
        vreinterpretq_s32_s64(vzip1q_s64(hi01, hi23)), vreinterpretq_s32_s64(vzip2q_s64(hi01, hi23))};
    SWIFTLET_UNROLL
    for (int q = 0; q < 4; ++q) {
      const int i = q / 2, j = q % 2;  // row, token
      acc[q] = accumulate<Bits>(acc[q], s4[i], bias4[i], tk.d[j] + b0, tk.xsum[j] + b0, tk.qsum[j] + b0, o[q]);
    }
  }
  const size_t rows = size_t(c.w.rows);
  c.y[size_t(t) * rows + size_t(r)] = vaddvq_f32(acc[0]);
  c.y[size_t(t + 1) * rows + size_t(r)] = vaddvq_f32(acc[1]);
  c.y[size_t(t) * rows + size_t(r + 1)] = vaddvq_f32(acc[2]);
  c.y[size_t(t + 1) * rows + size_t(r + 1)] = vaddvq_f32(acc[3]);
}

// Batches: chunks of rows (as q8::tile_rows) in tiles of 2 rows x 2 tokens; a last odd row or
// token takes row_tokens. Decode streams rows through row_tokens (smmla would waste half).
template <int Bits>
void rows_q8(const Ctx& c, int64_t n, int64_t r0, int64_t r1) {
  if (n == 1) {
    for (int64_t r = r0; r < r1; ++r) row_tokens<Bits, 1>(c, r, 0);
    return;
  }
  const int64_t chunk = std::max<int64_t>(8, int64_t(128 << 10) / int64_t(c.rb + 2 * c.srb));
  for (int64_t rc = r0; rc < r1; rc += chunk) {
    const int64_t re = std::min(r1, rc + chunk);
    int64_t t = 0;
    for (; t + 2 <= n; t += 2) {
      int64_t r = rc;
      for (; r + 2 <= re; r += 2) rows2_tokens2<Bits>(c, r, t);
      if (r < re) row_tokens<Bits, 2>(c, r, t);
    }
    if (t < n)
      for (int64_t r = rc; r < re; ++r) row_tokens<Bits, 1>(c, r, t);
  }
}
#else
// Tiles of up to 4 tokens (q8::tile_rows).
template <int Bits>
void rows_q8(const Ctx& c, int64_t n, int64_t r0, int64_t r1) {
  q8::tile_rows<4>(c, n, r0, r1,
                   [&](int64_t r, int64_t t, auto tile) { row_tokens<Bits, decltype(tile)::value>(c, r, t); });
}
#endif

}  // namespace

// The entry point (matmul_neon.h) that the including file's flags make: one per instruction set,
// so a file built without its flags defines the baseline's name twice and the link fails.
#if defined(__ARM_FEATURE_MATMUL_INT8) && defined(__ARM_FEATURE_DOTPROD)
void matmul_rows_q8_i8mm(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
#elif defined(__ARM_FEATURE_DOTPROD)
void matmul_rows_q8_dotprod(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
#else
void matmul_rows_q8(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
#endif
  q8::for_bits(w, p, y, [&](const Ctx& c, auto bits) { rows_q8<decltype(bits)::value>(c, n, r0, r1); });
}

}  // namespace swiftlet::neon
