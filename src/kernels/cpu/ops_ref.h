// Scalar fp32 reference kernels: the oracle every fast kernel is tested against
// (docs/model-math.md). Plain loops, no SIMD, no threads.
#pragma once

#include "core/qmatrix.h"

#include <cmath>
#include <cstdint>

namespace swiftlet::ref {

// out[0..cols) = row r of W, dequantised.
void dequant_row(const QMatrix& w, int64_t r, float* out);
// y[rows] = W x[cols]
void matvec(const QMatrix& w, const float* x, float* y);
// Y[t, rows] = W X[t, cols] for t < n (row-major activations).
void matmul(const QMatrix& w, const float* x, int64_t n, float* y);

// y = x / sqrt(mean(x^2) + eps) * w   (w already holds 1 + w for zero-centred norms)
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);
// x <- x / sqrt(sum(x^2) + eps) * scale
void l2_norm_scaled(float* x, int64_t n, float eps, float scale);
// NeoX rotate-half rope on the first rot_dim dims of one head (in place).
void rope_neox(float* x, int rot_dim, const float* cos, const float* sin);
void softmax(float* x, int64_t n);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
// torch.nn.functional.softplus with threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace swiftlet::ref
