// The NEON kernel with `sdot` (built with -march=armv8.2-a+dotprod); call only when
// cpu_has_dotprod() says so.
#include "kernels/cpu/matmul_q8_neon.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "build this file with -march=armv8.2-a+dotprod"
#endif

namespace swiftlet::neon {

void matmul_rows_q8_dotprod(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
  matmul_rows(w, p, n, y, r0, r1);
}

}  // namespace swiftlet::neon
