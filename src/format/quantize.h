// MLX affine group quantisation (model-math.md 8), the format of .qpack tensors and of mlx-lm
// 4-bit checkpoints:
//   - groups of `group_size` consecutive values along the input (last) axis;
//   - per group: scale and bias stored in bf16, value = scale * q + bias;
//   - q packed into little-endian uint32 words, 32 / bits values per word, the lowest input
//     index in the lowest bits.
// The quantiser follows mlx's affine_quantize (mlx/backend/cpu/quantized.cpp): the edge of the
// group with the larger magnitude (min or max) is hit exactly, the scale may be negative, and the
// codes are computed with the fp32 scale and bias before they are rounded to bf16 for storage.
#pragma once

#include "core/qmatrix.h"

#include <cstdint>
#include <vector>

namespace swiftlet {

// Bytes of the packed codes / of one of scales or biases (bf16) for a [rows, cols] matrix.
inline size_t affine_packed_bytes(int64_t rows, int64_t cols, int bits) {
  return size_t(rows) * size_t(cols) * size_t(bits) / 8;
}
inline size_t affine_scale_bytes(int64_t rows, int64_t cols, int group_size) {
  return size_t(rows) * size_t(cols / group_size) * 2;
}

// Quantises `rows` rows of `cols` fp32 values (row-major). `packed` receives rows * cols * bits / 32
// words, `scales` and `biases` rows * cols / group_size bf16 values. bits: 4 or 8; cols must be
// a multiple of group_size, and group_size a multiple of 32 / bits.
void affine_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                     uint32_t* packed, uint16_t* scales, uint16_t* biases);

// The inverse: out[r, c] = scale * q + bias in fp32 (one product, one sum: as mlx does).
void affine_dequantize(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases,
                       int64_t rows, int64_t cols, int bits, int group_size, float* out);

// An owning quantised matrix, for tests and small tensors.
struct AffineMatrix {
  int64_t rows = 0, cols = 0;
  int bits = 4, group_size = 64;
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;  // bf16
  QMatrix view() const;
};
AffineMatrix affine_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size = 64);

}  // namespace swiftlet
