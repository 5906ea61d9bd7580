// A weight matrix [rows, cols] (PyTorch convention: y = W x) in one of the stored formats:
// plain F32/F16/BF16, or MLX affine group quantisation (model-math.md 8):
//   W[r, c] = scale[r, c / g] * q(r, c) + bias[r, c / g],
//   q(r, c) = (packed[r, c * bits / 32] >> (bits * (c % (32 / bits)))) & (2^bits - 1).
// It only points at memory owned elsewhere (a mapped file, an expert cache slot).
#pragma once

#include "core/dtype.h"

#include <cstddef>
#include <cstdint>

namespace swiftlet {

enum class WeightFormat : uint8_t { F32, F16, BF16, Affine };

struct QMatrix {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;  // F*: rows x cols elements; Affine: rows x (cols*bits/32) uint32
  // Affine only:
  int bits = 0;
  int group_size = 0;
  DType scale_dtype = DType::BF16;  // of scales and biases
  const void* scales = nullptr;     // rows x (cols / group_size)
  const void* biases = nullptr;

  bool empty() const { return data == nullptr; }
  // Bytes of one row of `data`, of scales (and of biases).
  size_t row_bytes() const;
  size_t scale_row_bytes() const;
  // Total bytes of data + scales + biases.
  size_t total_bytes() const;
  // A view of rows [r0, r0 + n).
  QMatrix row_slice(int64_t r0, int64_t n) const;
};

}  // namespace swiftlet
