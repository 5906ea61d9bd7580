// The 8-lane SwiGLU product (see activations.h), one source for AVX2 and NEON (simd_f8.h). On
// x86-64 built with -mavx2 -mfma; activations.cpp calls in here only after checking the CPU.
#include "kernels/cpu/simd_f8.h"

#include <cstdint>

namespace swiftlet::act::vec {

using namespace simd;

void silu_mul(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(g + i, silu(load(g + i)) * load(u + i));
  if (i == n) return;
  // The tail through the same vector code, so an element's result does not depend on its index.
  alignas(32) float tg[8] = {}, tu[8] = {};
  const int64_t r = n - i;
  for (int64_t j = 0; j < r; ++j) {
    tg[j] = g[i + j];
    tu[j] = u[i + j];
  }
  store(tg, silu(load(tg)) * load(tu));
  for (int64_t j = 0; j < r; ++j) g[i + j] = tg[j];
}

}  // namespace swiftlet::act::vec
