// AVX2 + FMA activations (see activations.h); compiled with -mavx2 -mfma.
#include "kernels/cpu/simd_avx2.h"

#include <immintrin.h>

#include <cstdint>

namespace swiftlet::act::avx2 {

void silu_mul(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(g + i, _mm256_mul_ps(simd::silu(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  if (i == n) return;
  // The tail through the same vector code, so an element's result does not depend on its index.
  alignas(32) float tg[8] = {}, tu[8] = {};
  const int64_t r = n - i;
  for (int64_t j = 0; j < r; ++j) {
    tg[j] = g[i + j];
    tu[j] = u[i + j];
  }
  _mm256_store_ps(tg, _mm256_mul_ps(simd::silu(_mm256_load_ps(tg)), _mm256_load_ps(tu)));
  for (int64_t j = 0; j < r; ++j) g[i + j] = tg[j];
}

}  // namespace swiftlet::act::avx2
