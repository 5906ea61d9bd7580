// Arm NEON kernels for Y = W X (aarch64 only). fp32 activations, any weight format
// (matmul_neon.cpp): each row converted to fp32, then 16-lane dot products. int8 activations on
// affine 4/8-bit weights: three forms of one kernel, each in its own translation unit built for its instruction set:
// plain NEON (widening multiply-accumulate, every aarch64 CPU; matmul_q8_neon.cpp), dotprod
// (`sdot`, Armv8.2+ with FEAT_DotProd; matmul_q8_neon_dotprod.cpp) and i8mm (`smmla` on 2 rows x 2
// tokens for batches, `sdot` for decode; matmul_q8_neon_i8mm.cpp). Call a form only when the CPU
// has its extension (cpu_has_dotprod, cpu_has_i8mm). They read the activations prepare_q8 lays
// out (matmul_q8.h, the same quantisation as the x86 kernels), and every form forms each output
// in the same order from exact integer block dots: all three give the same bits, in decode and in
// batches alike.
#pragma once

#include "kernels/cpu/matmul_q8.h"

#include <cstdint>

namespace swiftlet::neon {

bool cpu_has_dotprod();  // HWCAP_ASIMDDP
bool cpu_has_i8mm();     // HWCAP2_I8MM (and dotprod)

// Rows [r0, r1) of Y[t, rows] = W X[t, cols], t < n, fp32 activations (the cpu-f32 backend, and
// the cpu backend on dense weights). A token's results do not depend on n.
void matmul_rows_f32(const QMatrix& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1);

void prepare_q8(const QMatrix& w, const float* x, int64_t n, q8::PreparedQ8& p);

// Rows [r0, r1) of Y[t, rows] = W X[t, cols], t < n, W with q8::supported(W).
void matmul_rows_q8(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1);
void matmul_rows_q8_dotprod(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1);
void matmul_rows_q8_i8mm(const QMatrix& w, const q8::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1);

}  // namespace swiftlet::neon
