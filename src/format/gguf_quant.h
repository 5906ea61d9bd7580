// ggml's block formats to fp32: the tensor types swiftlet converts from GGUF files (F32, F16,
// BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS). The layouts and formulas are those of ggml's
// ggml-common.h / ggml-quants.c reference dequantisers, in the same fp32 arithmetic, so a value
// comes out as llama.cpp's CPU reference computes it:
//   Q8_0  32 values: f16 d, int8 q[32];                            x = d * q
//   Q4_0  32 values: f16 d, 16 bytes of nibbles;                   x = d * (q - 8)
//   Q4_1  32 values: f16 d, f16 m, 16 bytes of nibbles;            x = d * q + m
//         (byte j holds value j in its low nibble and value j + 16 in its high one)
//   Q5_0  32 values: f16 d, u32 qh, 16 bytes of nibbles;           x = d * (q - 16)
//   Q5_1  32 values: f16 d, f16 m, u32 qh, 16 bytes of nibbles;    x = d * q + m
//         (value j's fifth bit is bit j of qh)
//   Q4_K 256 values: f16 d, f16 dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes of
//         nibbles; sub-block s of 32: x = (d * sc[s]) * q - (dmin * m[s])
//   Q5_K as Q4_K with 32 bytes of fifth bits (before the nibbles)
//   Q6_K 256 values: 128 bytes of low nibbles, 64 of high 2-bit pairs, int8 scales[16], f16 d;
//         x = (d * sc[s]) * (q - 32) for sub-blocks of 16
//   Q2_K 256 values: 16 scale/min nibble pairs, 64 bytes of 2-bit codes, f16 d, f16 dmin;
//         x = (d * sc[s]) * q - dmin * m[s] for sub-blocks of 16
//   Q3_K 256 values: 32 bytes of third bits, 64 bytes of 2-bit codes, 12 bytes of sixteen 6-bit
//         scales, f16 d; x = (d * (sc[s] - 32)) * (q - (third bit ? 0 : 4))
//   IQ4_NL 32 values: f16 d, 16 bytes of indices into 16 fixed levels; x = d * level[q]
//   IQ4_XS 256 values: f16 d, eight 6-bit scales (u16 of top bits, 4 bytes of nibbles), 128
//         bytes of level indices; x = (d * (ls - 32)) * level[q] for sub-blocks of 32
#pragma once

#include "format/gguf.h"

#include <cstddef>
#include <cstdint>

namespace swiftlet {

// Whether swiftlet converts tensors of ggml type number `t`.
bool gguf_type_readable(uint32_t t);

// Throws Error for a tensor whose type swiftlet cannot convert, naming the tensor and the type
// and saying which files swiftlet can convert instead.
void check_gguf_readable(const GgufTensor& t);

// Dequantises `n` values of type `t` held in `nbytes` bytes at `src` into `out`. n must be whole
// blocks and nbytes exactly their size; anything else (or an unreadable type) throws Error.
void gguf_dequantize(uint32_t t, const uint8_t* src, size_t nbytes, int64_t n, float* out);

// Rows [row0, row0 + rows) of a tensor (rows of ne[0] values; every row is whole blocks) as fp32.
void gguf_dequantize_rows(const GgufTensor& t, int64_t row0, int64_t rows, float* out);

}  // namespace swiftlet
