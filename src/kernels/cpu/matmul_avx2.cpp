#include "kernels/cpu/matmul_avx2.h"

#include "kernels/cpu/avx2_util.h"

#include "core/error.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace swiftlet::avx2 {

bool cpu_has_avx2() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

namespace {

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

#define SWIFTLET_UNROLL _Pragma("GCC unroll 16")

template <typename Elem, bool Bf16>
inline __m256 load_w8(const Elem* p) {
  if constexpr (std::is_same_v<Elem, float>) return load8(p);
  else return load8(p, Bf16);
}

template <typename Elem, bool Bf16>
inline float w_at(const Elem* p, int64_t c) {
  if constexpr (std::is_same_v<Elem, float>) return p[c];
  else if constexpr (Bf16) return bf16_to_f32(p[c]);
  else return _cvtsh_ss(p[c]);
}

// Dense weights, row r x tokens [t, t + T): each 16 weights are converted once and used for T
// tokens. Each token's sum is formed exactly as dot_dense forms it (two accumulators over 16
// columns, then the tail), so a token gets the same result in decode and in a batch.
template <typename Elem, bool Bf16, int T>
void row_tokens_dense(const Elem* w, int64_t rows, int64_t cols, const float* x, float* y, int64_t r, int64_t t) {
  const Elem* wr = w + r * cols;
  const float* xt[T];
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) xt[j] = x + (t + j) * cols;
  __m256 a0[T], a1[T];
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 w0 = load_w8<Elem, Bf16>(wr + c), w1 = load_w8<Elem, Bf16>(wr + c + 8);
    SWIFTLET_UNROLL
    for (int j = 0; j < T; ++j) {
      a0[j] = _mm256_fmadd_ps(w0, load8(xt[j] + c), a0[j]);
      a1[j] = _mm256_fmadd_ps(w1, load8(xt[j] + c + 8), a1[j]);
    }
  }
  SWIFTLET_UNROLL
  for (int j = 0; j < T; ++j) {
    float s = hsum(_mm256_add_ps(a0[j], a1[j]));
    for (int64_t cc = c; cc < cols; ++cc) s += w_at<Elem, Bf16>(wr, cc) * xt[j][cc];
    y[(t + j) * rows + r] = s;
  }
}

// Y = W X for dense W, rows [r0, r1). n = 1 is memory bound (one row at a time); batches go in
// chunks of rows (about 128 KiB, kept in L2) x tiles of 4 tokens, then 2 and 1.
template <typename Elem, bool Bf16>
void dense_rows(const Elem* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y, int64_t r0,
                int64_t r1) {
  if (n == 1) {
    for (int64_t r = r0; r < r1; ++r) y[r] = dot_dense(w + r * cols, x, cols, Bf16);
    return;
  }
  const int64_t chunk = std::max<int64_t>(8, int64_t(128 << 10) / int64_t(cols * sizeof(Elem)));
  for (int64_t rc = r0; rc < r1; rc += chunk) {
    const int64_t re = std::min(r1, rc + chunk);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4)
      for (int64_t r = rc; r < re; ++r) row_tokens_dense<Elem, Bf16, 4>(w, rows, cols, x, y, r, t);
    if (t + 2 <= n) {
      for (int64_t r = rc; r < re; ++r) row_tokens_dense<Elem, Bf16, 2>(w, rows, cols, x, y, r, t);
      t += 2;
    }
    if (t < n)
      for (int64_t r = rc; r < re; ++r) y[t * rows + r] = dot_dense(w + r * cols, x + t * cols, cols, Bf16);
  }
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
      dense_rows<float, false>(static_cast<const float*>(w.data), w.rows, cols, x, n, y, r0, r1);
      return;
    case WeightFormat::BF16:
      dense_rows<uint16_t, true>(static_cast<const uint16_t*>(w.data), w.rows, cols, x, n, y, r0, r1);
      return;
    case WeightFormat::F16:
      dense_rows<uint16_t, false>(static_cast<const uint16_t*>(w.data), w.rows, cols, x, n, y, r0, r1);
      return;
  }
}

}  // namespace swiftlet::avx2
