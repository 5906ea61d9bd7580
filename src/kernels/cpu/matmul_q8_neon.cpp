// The NEON int8-activation kernel for every aarch64 CPU: widening multiplies (this file is built
// for the baseline Armv8-A).
#include "kernels/cpu/matmul_q8_neon.h"

namespace swiftlet::neon {

void matmul_rows_q8(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1) {
  matmul_rows(w, p, n, y, r0, r1);
}

}  // namespace swiftlet::neon
