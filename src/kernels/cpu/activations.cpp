#include "kernels/cpu/activations.h"

#include "kernels/cpu/ops_ref.h"
#include "kernels/cpu/simd_cpu.h"

namespace swiftlet::act {

#if SWIFTLET_F8_KERNELS
namespace vec {  // activations_simd.cpp; call only when simd::cpu_runs_f8()
void silu_mul(float* g, const float* u, int64_t n);
}
#endif

void silu_mul_reference(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = ref::silu(g[i]) * u[i];
}

void silu_mul(float* g, const float* u, int64_t n) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8()) return vec::silu_mul(g, u, n);
#endif
  silu_mul_reference(g, u, n);
}

}  // namespace swiftlet::act
