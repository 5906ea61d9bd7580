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

// ---- int8 activations (the fast default for affine weights) ----
// Each group of x is quantised to int8 with its own scale (amax / 127), laid out to meet the
// packed weight bytes directly, so a group of 64 weights is two integer multiply-adds
// (vpmaddubsw) instead of 64 float FMAs. The bias term uses the exact fp32 group sums.
struct PreparedQ8 {
  std::vector<int8_t> xq;    // [n][cols] permuted to the weight byte order
  std::vector<float> d;      // [n][groups] activation scale per group
  std::vector<float> xsum;   // [n][groups] exact sum of x per group
  std::vector<int32_t> isum; // [n][groups] sum of xq per group (8-bit weights' offset)
};
bool q8_supported(const QMatrix& w);  // affine, 4 or 8 bits, group a multiple of 64
void prepare_q8(const QMatrix& w, const float* x, int64_t n, PreparedQ8& p);
void matmul_rows_q8(const QMatrix& w, const PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1);

}  // namespace swiftlet::avx2
