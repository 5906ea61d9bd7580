// AVX2 + FMA kernels for Y = W X with fp32 activations (compiled with -mavx2 -mfma -mf16c in
// their own translation unit; call only when cpu_has_avx2() says so).
#pragma once

#include "kernels/cpu/qmatrix.h"

#include <cstdint>
#include <vector>

namespace swiftlet::avx2 {

bool cpu_has_avx2();

// Per-call preparation of the activations for affine matrices: each group of x reordered to
// match the packed nibble order, and per-group sums for the bias term.
struct Prepared {
  std::vector<float> xp;    // [n][cols] permuted
  std::vector<float> xsum;  // [n][cols / group]
};
void prepare(const QMatrix& w, const float* x, int64_t n, Prepared& p);

// Rows [r0, r1) of Y[t, rows] = W X[t, cols], t < n. `p` from prepare() for affine W.
void matmul_rows(const QMatrix& w, const float* x, const Prepared& p, int64_t n, float* y,
                 int64_t r0, int64_t r1);

}  // namespace swiftlet::avx2
