// AVX-512 VNNI kernel for Y = W X with int8 activations on affine 4/8-bit weights
// (matmul_q8_avx512.cpp, compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni); call only
// when cpu_has_avx512_vnni() says so. It takes the activations avx2::prepare_q8 lays out.
#pragma once

#include "kernels/cpu/matmul_avx2.h"

namespace swiftlet::avx512 {

bool cpu_has_avx512_vnni();

// Rows [r0, r1) of Y[t, rows] = W X[t, cols], t < n, W affine with avx2::q8_supported(W).
// One vpdpbusd multiplies a block of 64 weight codes (unsigned) with 64 int8 activations and
// sums them in fours into 16 int32 lanes, where the AVX2 kernel needs two vpmaddubsw, an add and
// a vpmaddwd per 64 (and, for 8-bit codes, an offset term against int16 saturation).
void matmul_rows_q8(const QMatrix& w, const avx2::PreparedQ8& p, int64_t n, float* y, int64_t r0, int64_t r1);

}  // namespace swiftlet::avx512
