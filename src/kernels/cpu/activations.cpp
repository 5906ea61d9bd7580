#include "kernels/cpu/activations.h"

#include "kernels/cpu/ops_ref.h"
#if defined(__x86_64__)
#include "kernels/cpu/matmul_avx2.h"
#endif

namespace swiftlet::act {

#if defined(__x86_64__)
namespace avx2 {  // activations_avx2.cpp (built with -mavx2 -mfma); call only when the CPU has them
void silu_mul(float* g, const float* u, int64_t n);
}

namespace {
bool has_avx2() {
  static const bool has = swiftlet::avx2::cpu_has_avx2();
  return has;
}
}  // namespace
#endif

void silu_mul_reference(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = ref::silu(g[i]) * u[i];
}

void silu_mul(float* g, const float* u, int64_t n) {
#if defined(__x86_64__)
  if (has_avx2()) return avx2::silu_mul(g, u, n);
#endif
  silu_mul_reference(g, u, n);
}

}  // namespace swiftlet::act
