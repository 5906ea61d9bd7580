#include "kernels/cpu/matmul_avx2.h"

#include "core/error.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace swiftlet::avx2 {

bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float load_scale(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p, bool bf16) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

// Dot of one affine row with one prepared activation row.
template <int Bits>
float dot_affine(const QMatrix& w, const uint32_t* row, const float* xp, const float* xsum,
                 const void* srow, const void* brow) {
  const int64_t G = w.group_size, groups = w.cols / G;
  constexpr int per_word = 32 / Bits;
  const __m256i mask = _mm256_set1_epi32((1 << Bits) - 1);
  __m256 total = _mm256_setzero_ps();
  float bias_acc = 0;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 acc = _mm256_setzero_ps();
    const uint32_t* wq = row + g * G / per_word;
    const float* xg = xp + g * G;
    // Each 8-word load holds 8 * per_word values; value (word k, slot j) meets xg[j*8 + k].
    for (int64_t c = 0; c < G; c += 8 * per_word) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + c / per_word));
      const float* xc = xg + c;
      for (int j = 0; j < per_word; ++j) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi32(p, j * Bits), mask);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), load8(xc + j * 8), acc);
      }
    }
    const float s = load_scale(w.scale_dtype, srow, g);
    total = _mm256_fmadd_ps(acc, _mm256_set1_ps(s), total);
    bias_acc += load_scale(w.scale_dtype, brow, g) * xsum[g];
  }
  return hsum(total) + bias_acc;
}

template <typename Elem>
float dot_dense(const Elem* row, const float* x, int64_t cols, bool bf16) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    if constexpr (std::is_same_v<Elem, float>) {
      a0 = _mm256_fmadd_ps(load8(row + c), load8(x + c), a0);
      a1 = _mm256_fmadd_ps(load8(row + c + 8), load8(x + c + 8), a1);
    } else {
      a0 = _mm256_fmadd_ps(load8(row + c, bf16), load8(x + c), a0);
      a1 = _mm256_fmadd_ps(load8(row + c + 8, bf16), load8(x + c + 8), a1);
    }
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; c < cols; ++c) {
    float wv;
    if constexpr (std::is_same_v<Elem, float>) wv = row[c];
    else wv = bf16 ? bf16_to_f32(row[c]) : _cvtsh_ss(row[c]);
    s += wv * x[c];
  }
  return s;
}

}  // namespace

void prepare(const QMatrix& w, const float* x, int64_t n, Prepared& p) {
  if (w.format != WeightFormat::Affine) return;
  const int64_t cols = w.cols, G = w.group_size, groups = cols / G;
  const int per_word = 32 / w.bits;
  const int64_t chunk = 8 * per_word;  // values per 8-word load
  if (p.xp.size() < size_t(n * cols)) p.xp.resize(size_t(n * cols));
  if (p.xsum.size() < size_t(n * groups)) p.xsum.resize(size_t(n * groups));
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    float* dst = p.xp.data() + t * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += chunk)
      for (int k = 0; k < 8; ++k)
        for (int j = 0; j < per_word; ++j) dst[c0 + j * 8 + k] = xt[c0 + k * per_word + j];
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0;
      for (int64_t i = 0; i < G; ++i) s += xt[g * G + i];
      p.xsum[size_t(t * groups + g)] = s;
    }
  }
}

void matmul_rows(const QMatrix& w, const float* x, const Prepared& p, int64_t n, float* y,
                 int64_t r0, int64_t r1) {
  const int64_t cols = w.cols;
  switch (w.format) {
    case WeightFormat::Affine: {
      const int64_t groups = cols / w.group_size;
      const size_t srb = w.scale_row_bytes();
      SWIFTLET_CHECK((w.group_size % (8 * (32 / w.bits))) == 0, "group size {} too small for AVX2 path", w.group_size);
      for (int64_t r = r0; r < r1; ++r) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes());
        const void* srow = static_cast<const uint8_t*>(w.scales) + size_t(r) * srb;
        const void* brow = static_cast<const uint8_t*>(w.biases) + size_t(r) * srb;
        for (int64_t t = 0; t < n; ++t) {
          const float* xp = p.xp.data() + t * cols;
          const float* xs = p.xsum.data() + t * groups;
          y[t * w.rows + r] = w.bits == 4 ? dot_affine<4>(w, row, xp, xs, srow, brow)
                                          : dot_affine<8>(w, row, xp, xs, srow, brow);
        }
      }
      return;
    }
    case WeightFormat::F32:
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t t = 0; t < n; ++t)
          y[t * w.rows + r] = dot_dense(static_cast<const float*>(w.data) + r * cols, x + t * cols, cols, false);
      return;
    case WeightFormat::BF16:
    case WeightFormat::F16: {
      const bool bf16 = w.format == WeightFormat::BF16;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t t = 0; t < n; ++t)
          y[t * w.rows + r] = dot_dense(static_cast<const uint16_t*>(w.data) + r * cols, x + t * cols, cols, bf16);
      return;
    }
  }
}

// ---- int8 activations ----

bool q8_supported(const QMatrix& w) {
  return w.format == WeightFormat::Affine && (w.bits == 4 || w.bits == 8) && w.group_size % 64 == 0;
}

void prepare_q8(const QMatrix& w, const float* x, int64_t n, PreparedQ8& p) {
  const int64_t cols = w.cols, G = w.group_size, groups = cols / G;
  if (p.xq.size() < size_t(n * cols)) p.xq.resize(size_t(n * cols));
  if (p.d.size() < size_t(n * groups)) {
    p.d.resize(size_t(n * groups));
    p.xsum.resize(size_t(n * groups));
    p.isum.resize(size_t(n * groups));
  }
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    int8_t* qt = p.xq.data() + t * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = xt + g * G;
      float amax = 0, sum = 0;
      for (int64_t i = 0; i < G; ++i) {
        amax = std::max(amax, std::fabs(xg[i]));
        sum += xg[i];
      }
      const float d = amax / 127.0f;
      const float inv = d > 0 ? 1.0f / d : 0.0f;
      int8_t* qg = qt + g * G;
      int32_t isum = 0;
      for (int64_t c0 = 0; c0 < G; c0 += 64) {
        int8_t q[64];
        for (int i = 0; i < 64; ++i) {
          q[i] = int8_t(std::lrintf(xg[c0 + i] * inv));
          isum += q[i];
        }
        if (w.bits == 4) {
          // Byte m of the 32 packed bytes holds elements 8(m/4) + 2(m%4) (low nibble) and +1.
          for (int m = 0; m < 32; ++m) {
            const int e = 8 * (m >> 2) + 2 * (m & 3);
            qg[c0 + m] = q[e];
            qg[c0 + 32 + m] = q[e + 1];
          }
        } else {
          std::memcpy(qg + c0, q, 64);  // 8-bit: byte m is element m
        }
      }
      p.d[size_t(t * groups + g)] = d;
      p.xsum[size_t(t * groups + g)] = sum;
      p.isum[size_t(t * groups + g)] = isum;
    }
  }
}

namespace {

inline __m256i dot_q4_64(const uint8_t* wq, const int8_t* xq) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  const __m256i lo = _mm256_and_si256(p, m4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4);
  const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
  const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
  return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
}

// (q - 128) . x for 32 unsigned 8-bit weights; |q - 128| <= 128 keeps vpmaddubsw exact.
inline __m256i dot_q8_32(const uint8_t* wq, const int8_t* xq) {
  const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
  const __m256i a = _mm256_sub_epi8(p, _mm256_set1_epi8(char(0x80)));
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i s16 = _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(x, a));
  return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
}

// Loads 8 scales (bf16 / f16 / f32) as floats.
inline __m256 load_scales8(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::BF16: return load8(static_cast<const uint16_t*>(base) + i, true);
    case DType::F16: return load8(static_cast<const uint16_t*>(base) + i, false);
    default: return load8(static_cast<const float*>(base) + i);
  }
}

template <int Bits>
float dot_row_q8(const QMatrix& w, const uint8_t* row, const void* srow, const void* brow,
                 const int8_t* xq, const float* d, const float* xsum, const int32_t* isum) {
  const int64_t G = w.group_size, groups = w.cols / G;
  // Per-group factors first, 8 groups at a time: sd = scale * d (and the bias term, a dot of
  // the biases with the exact group sums), so the main loop has no scalar work.
  constexpr int64_t kMaxGroups = 512;
  alignas(32) float sd[kMaxGroups];
  float extra = 0;
  int64_t g8 = 0;
  if (groups <= kMaxGroups) {
    __m256 bsum = _mm256_setzero_ps();
    for (; g8 + 8 <= groups; g8 += 8) {
      const __m256 s = _mm256_mul_ps(load_scales8(w.scale_dtype, srow, g8), load8(d + g8));
      _mm256_store_ps(sd + g8, s);
      bsum = _mm256_fmadd_ps(load_scales8(w.scale_dtype, brow, g8), load8(xsum + g8), bsum);
    }
    extra = hsum(bsum);
  }
  for (int64_t g = g8; g < groups; ++g) {
    const float s = load_scale(w.scale_dtype, srow, g) * d[g];
    if (g < kMaxGroups) sd[g] = s;
    extra += load_scale(w.scale_dtype, brow, g) * xsum[g];
  }
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i s32 = _mm256_setzero_si256();
    for (int64_t c0 = 0; c0 < G; c0 += 64) {
      if constexpr (Bits == 4) {
        s32 = _mm256_add_epi32(s32, dot_q4_64(row + (g * G + c0) / 2, xq + g * G + c0));
      } else {
        s32 = _mm256_add_epi32(s32, dot_q8_32(row + g * G + c0, xq + g * G + c0));
        s32 = _mm256_add_epi32(s32, dot_q8_32(row + g * G + c0 + 32, xq + g * G + c0 + 32));
      }
    }
    const float sdg = g < kMaxGroups ? sd[g] : load_scale(w.scale_dtype, srow, g) * d[g];
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_set1_ps(sdg), acc);
    if constexpr (Bits == 8) extra += sdg * 128.0f * float(isum[g]);
  }
  return hsum(acc) + extra;
}

}  // namespace

void matmul_rows_q8(const QMatrix& w, const PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t cols = w.cols, groups = cols / w.group_size;
  const size_t srb = w.scale_row_bytes(), rb = w.row_bytes();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + size_t(r) * rb;
    const void* srow = static_cast<const uint8_t*>(w.scales) + size_t(r) * srb;
    const void* brow = static_cast<const uint8_t*>(w.biases) + size_t(r) * srb;
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* xq = p.xq.data() + t * cols;
      const float* d = p.d.data() + t * groups;
      const float* xs = p.xsum.data() + t * groups;
      const int32_t* is = p.isum.data() + t * groups;
      y[t * w.rows + r] = w.bits == 4 ? dot_row_q8<4>(w, row, srow, brow, xq, d, xs, is)
                                      : dot_row_q8<8>(w, row, srow, brow, xq, d, xs, is);
    }
  }
}

}  // namespace swiftlet::avx2
