#include "format/quantize.h"

#include "core/dtype.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace swiftlet {

namespace {

void check_shape(int64_t cols, int bits, int group_size) {
  SWIFTLET_CHECK(bits == 4 || bits == 8, "affine quantisation supports 4 and 8 bits, not {}", bits);
  SWIFTLET_CHECK(group_size > 0 && group_size % (32 / bits) == 0 && cols % group_size == 0,
                 "{} columns do not split into groups of {} at {} bits", cols, group_size, bits);
}

}  // namespace

void affine_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                     uint32_t* packed, uint16_t* scales, uint16_t* biases) {
  check_shape(cols, bits, group_size);
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  const int per_word = 32 / bits;
  const int64_t groups = rows * (cols / group_size);
  for (int64_t g = 0; g < groups; ++g) {
    const float* x = w + g * group_size;
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int j = 0; j < group_size; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    // The edge with the larger magnitude becomes the bias; the scale is chosen so that this
    // edge is exactly q0 steps from zero, which keeps 0.0 representable.
    const bool min_edge = std::fabs(lo) > std::fabs(hi);
    float scale = std::max((hi - lo) / n_bins, eps);
    if (!min_edge) scale = -scale;
    const float edge = min_edge ? lo : hi;
    const float q0 = std::rint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    uint32_t* out = packed + g * (group_size / per_word);
    for (int k = 0; k < group_size / per_word; ++k) {
      uint32_t word = 0;
      for (int j = 0; j < per_word; ++j) {
        float q = std::rint((x[k * per_word + j] - bias) / scale);
        q = std::min(std::max(q, 0.0f), n_bins);
        word |= uint32_t(q) << (bits * j);
      }
      out[k] = word;
    }
    scales[g] = f32_to_bf16(scale);
    biases[g] = f32_to_bf16(bias);
  }
}

void affine_dequantize(const uint32_t* packed, const uint16_t* scales, const uint16_t* biases,
                       int64_t rows, int64_t cols, int bits, int group_size, float* out) {
  check_shape(cols, bits, group_size);
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const int64_t groups = rows * (cols / group_size);
  for (int64_t g = 0; g < groups; ++g) {
    const float s = bf16_to_f32(scales[g]), b = bf16_to_f32(biases[g]);
    const uint32_t* in = packed + g * (group_size / per_word);
    for (int i = 0; i < group_size; ++i)
      out[g * group_size + i] = s * float((in[i / per_word] >> (bits * (i % per_word))) & mask) + b;
  }
}

QMatrix AffineMatrix::view() const {
  QMatrix m;
  m.format = WeightFormat::Affine;
  m.rows = rows;
  m.cols = cols;
  m.bits = bits;
  m.group_size = group_size;
  m.scale_dtype = DType::BF16;
  m.data = packed.data();
  m.scales = scales.data();
  m.biases = biases.data();
  return m;
}

AffineMatrix affine_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size) {
  AffineMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.bits = bits;
  m.group_size = group_size;
  m.packed.resize(affine_packed_bytes(rows, cols, bits) / 4);
  m.scales.resize(affine_scale_bytes(rows, cols, group_size) / 2);
  m.biases.resize(m.scales.size());
  affine_quantize(w, rows, cols, bits, group_size, m.packed.data(), m.scales.data(), m.biases.data());
  return m;
}

}  // namespace swiftlet
