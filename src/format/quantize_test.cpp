// MLX affine quantisation: bit packing, the quantiser's choices, and quantise -> dequantise
// round trips checked against the MLX formula written out independently here.
#include "format/quantize.h"

#include "core/dtype.h"
#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace swiftlet {
namespace {

// The MLX dequantisation formula, written byte-wise (little-endian words) rather than word-wise
// so that it does not share code or assumptions with the implementation under test.
float mlx_value(const AffineMatrix& m, int64_t r, int64_t c) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(m.packed.data());
  const size_t bit = (size_t(r) * size_t(m.cols) + size_t(c)) * size_t(m.bits);
  uint32_t q = bytes[bit / 8];
  if (m.bits == 4) q = (q >> (bit % 8)) & 0xF;
  const size_t g = size_t(r) * size_t(m.cols / m.group_size) + size_t(c / m.group_size);
  return bf16_to_f32(m.scales[g]) * float(q) + bf16_to_f32(m.biases[g]);
}

TEST(QuantizeTest, FourBitPackingLowestIndexInLowestNibble) {
  // 0..15 repeated: max edge (|15| > |0|), scale -1, bias 15, q = 15 - w.
  std::vector<float> w(64);
  for (int j = 0; j < 64; ++j) w[size_t(j)] = float(j % 16);
  AffineMatrix m = affine_quantize(w.data(), 1, 64, 4);
  ASSERT_EQ(m.packed.size(), 8u);
  EXPECT_EQ(m.packed[0], 0x89ABCDEFu);  // q = 15, 14, ..., 8 in nibbles 0..7
  EXPECT_EQ(m.packed[1], 0x01234567u);
  EXPECT_EQ(bf16_to_f32(m.scales[0]), -1.0f);
  EXPECT_EQ(bf16_to_f32(m.biases[0]), 15.0f);
  std::vector<float> back(64);
  affine_dequantize(m.packed.data(), m.scales.data(), m.biases.data(), 1, 64, 4, 64, back.data());
  EXPECT_EQ(back, w);
}

TEST(QuantizeTest, EightBitPackingAndMinEdge) {
  // min edge (|-100| > |-37|): bias -100, scale = -100 / rint(-100 / (63/255)) = 100/405.
  std::vector<float> w(64);
  for (int j = 0; j < 64; ++j) w[size_t(j)] = float(j - 100);
  AffineMatrix m = affine_quantize(w.data(), 1, 64, 8);
  ASSERT_EQ(m.packed.size(), 16u);
  EXPECT_EQ(m.packed[0], 0x0C080400u);  // q = 0, 4, 8, 12 (j * 4.05 rounded)
  EXPECT_EQ(m.packed[15] >> 24, 255u);  // j = 63: 255.15 -> 255
  EXPECT_EQ(m.scales[0], f32_to_bf16(100.0f / 405.0f));
  EXPECT_EQ(bf16_to_f32(m.biases[0]), -100.0f);
}

TEST(QuantizeTest, ConstantZeroGroupDequantisesToZero) {
  std::vector<float> w(128, 0.0f);
  AffineMatrix m = affine_quantize(w.data(), 2, 64, 4);
  std::vector<float> back(128, 1.0f);
  affine_dequantize(m.packed.data(), m.scales.data(), m.biases.data(), 2, 64, 4, 64, back.data());
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

class QuantizeRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(QuantizeRoundTrip, MatchesMlxFormulaAndStaysWithinOneStep) {
  const int bits = GetParam();
  const int64_t rows = 37, cols = 256;
  std::mt19937 rng(1234 + bits);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(size_t(rows * cols));
  for (auto& x : w) x = nd(rng);
  for (int64_t c = 0; c < 64; ++c) w[size_t(5 * cols + c)] = 3.0f;  // a constant group
  for (int64_t c = 64; c < 128; ++c) w[size_t(7 * cols + c)] = float(c % 16) * 0.25f;  // on the grid

  AffineMatrix m = affine_quantize(w.data(), rows, cols, bits);
  ASSERT_EQ(m.packed.size(), size_t(rows * cols * bits / 32));
  ASSERT_EQ(m.scales.size(), size_t(rows * cols / 64));

  std::vector<float> deq(w.size()), row(static_cast<size_t>(cols));
  affine_dequantize(m.packed.data(), m.scales.data(), m.biases.data(), rows, cols, bits, 64, deq.data());
  const QMatrix view = m.view();
  const float levels = float((1 << bits) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    ref::dequant_row(view, r, row.data());  // the engine's reference kernel reads it the same way
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      const float want = mlx_value(m, r, c);
      ASSERT_EQ(deq[i], want) << "r " << r << " c " << c;
      ASSERT_EQ(row[size_t(c)], want) << "r " << r << " c " << c;
      const size_t g = size_t(r * (cols / 64) + c / 64);
      const float s = std::fabs(bf16_to_f32(m.scales[g])), b = std::fabs(bf16_to_f32(m.biases[g]));
      // Half a step inside the range; but mlx snaps the scale so that the larger edge is an
      // exact multiple of it (scale = edge / round(edge / scale)), which can push the other edge
      // up to one step past the last code, where it is clipped. Plus bf16 rounding of scale/bias.
      const float bound = 1.0f * s + (levels * s + b) * (1.0f / 256) + 1e-6f;
      ASSERT_LE(std::fabs(deq[i] - w[i]), bound) << "r " << r << " c " << c;
    }
  }
  for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(deq[size_t(5 * cols + c)], 3.0f);
  if (bits == 4) {  // scale -0.25 and bias 3.75 are exact in bf16
    for (int64_t c = 64; c < 128; ++c) EXPECT_EQ(deq[size_t(7 * cols + c)], float(c % 16) * 0.25f);
  }
}

INSTANTIATE_TEST_SUITE_P(Quantize, QuantizeRoundTrip, ::testing::Values(4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "bit"; });

}  // namespace
}  // namespace swiftlet
