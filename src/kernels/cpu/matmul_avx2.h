// AVX2 + FMA kernels for Y = W X: fp32 activations (matmul_avx2.cpp) and int8 activations for
// affine weights (matmul_q8_avx2.cpp), compiled with -mavx2 -mfma -mf16c in their own
// translation units; call only when cpu_has_avx2() says so.
#pragma once

#include "core/qmatrix.h"
#include "kernels/cpu/matmul_q8.h"

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

// Rows [r0, r1) of Y[t, rows] = W X[t, cols], t < n. `p` from prepare() for affine W. Dense
// W with n > 1 goes in tiles of 2 rows x 4 tokens (each weight converted once per 4 tokens).
void matmul_rows(const QMatrix& w, const float* x, const Prepared& p, int64_t n, float* y,
                 int64_t r0, int64_t r1);

// ---- int8 activations (the fast default for affine weights; matmul_q8_avx2.cpp) ----
// The activations quantised per block of 64 as matmul_q8.h describes, so 64 weights are two
// integer multiply-adds (vpmaddubsw) instead of 64 float FMAs.
using PreparedQ8 = q8::PreparedQ8;
inline bool q8_supported(const QMatrix& w) { return q8::supported(w); }
void prepare_q8(const QMatrix& w, const float* x, int64_t n, PreparedQ8& p);
void matmul_rows_q8(const QMatrix& w, const PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1);

}  // namespace swiftlet::avx2
