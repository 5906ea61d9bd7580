// Every fast kernel against the scalar reference on random shapes, formats and batch sizes.
#include "kernels/cpu/kernels.h"

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace swiftlet {
namespace {

struct OwnedMatrix {
  QMatrix m;
  std::vector<uint8_t> data, scales, biases;
};

OwnedMatrix random_matrix(std::mt19937& rng, WeightFormat f, int64_t rows, int64_t cols, int bits = 4,
                          DType sdt = DType::BF16) {
  OwnedMatrix o;
  o.m.format = f;
  o.m.rows = rows;
  o.m.cols = cols;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> ud;
  auto put16 = [&](std::vector<uint8_t>& v, size_t i, uint16_t h) { std::memcpy(v.data() + 2 * i, &h, 2); };
  switch (f) {
    case WeightFormat::F32:
      o.data.resize(size_t(rows * cols) * 4);
      for (int64_t i = 0; i < rows * cols; ++i) {
        float v = nd(rng);
        std::memcpy(o.data.data() + 4 * i, &v, 4);
      }
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      o.data.resize(size_t(rows * cols) * 2);
      for (int64_t i = 0; i < rows * cols; ++i)
        put16(o.data, size_t(i), f == WeightFormat::BF16 ? f32_to_bf16(nd(rng)) : f32_to_f16(nd(rng)));
      break;
    case WeightFormat::Affine: {
      o.m.bits = bits;
      o.m.group_size = 64;
      o.m.scale_dtype = sdt;
      o.data.resize(size_t(rows * cols * bits / 8));
      for (auto& b : o.data) b = uint8_t(ud(rng));
      const size_t ng = size_t(rows * cols / 64), es = dtype_size(sdt);
      o.scales.resize(ng * es);
      o.biases.resize(ng * es);
      for (size_t i = 0; i < ng; ++i) {
        float s = nd(rng) * 0.1f, b = nd(rng) * 0.5f;
        if (sdt == DType::F32) {
          std::memcpy(o.scales.data() + 4 * i, &s, 4);
          std::memcpy(o.biases.data() + 4 * i, &b, 4);
        } else {
          put16(o.scales, i, sdt == DType::BF16 ? f32_to_bf16(s) : f32_to_f16(s));
          put16(o.biases, i, sdt == DType::BF16 ? f32_to_bf16(b) : f32_to_f16(b));
        }
      }
      o.m.scales = o.scales.data();
      o.m.biases = o.biases.data();
      break;
    }
  }
  o.m.data = o.data.data();
  return o;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i])) + 2e-4f) << what << " at " << i;
}

// Largest error int8 activations may add to y[t, r]: each x in a group of 64 moves by at most
// half its quantisation step (amax / 127 / 2), times |W|.
std::vector<float> q8_bound(const QMatrix& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> bound(static_cast<size_t>(n * w.rows)), row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    ref::dequant_row(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double b = 0;
      for (int64_t g = 0; g < w.cols / 64; ++g) {
        float amax = 0;
        for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(x[size_t(t * w.cols + g * 64 + i)]));
        for (int i = 0; i < 64; ++i) b += std::fabs(row[size_t(g * 64 + i)]) * amax / 254.0;
      }
      bound[size_t(t * w.rows + r)] = float(b);
    }
  }
  return bound;
}

TEST(Kernels, CpuMatmulMatchesReference) {
  std::mt19937 rng(7);
  struct Case {
    WeightFormat f;
    int bits;
    DType sdt;
  };
  const Case cases[] = {{WeightFormat::F32, 0, DType::BF16},    {WeightFormat::BF16, 0, DType::BF16},
                        {WeightFormat::F16, 0, DType::BF16},    {WeightFormat::Affine, 4, DType::BF16},
                        {WeightFormat::Affine, 8, DType::BF16}, {WeightFormat::Affine, 4, DType::F16},
                        {WeightFormat::Affine, 4, DType::F32},  {WeightFormat::Affine, 8, DType::F32}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (Backend backend : {Backend::CpuF32, Backend::Cpu}) {
    const Kernels& fast = kernels_for(backend);
    for (const Case& c : cases) {
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 64}, {7, 128}, {33, 192}, {130, 512}, {515, 2048}}) {
        if (c.f != WeightFormat::Affine) cols += rows % 5;  // ragged tails for dense formats
        OwnedMatrix w = random_matrix(rng, c.f, rows, cols, c.bits, c.sdt);
        for (int64_t n : {1, 3, 8}) {
          std::vector<float> x(size_t(n * cols));
          for (auto& v : x) v = nd(rng);
          std::vector<float> want(size_t(n * rows)), got(size_t(n * rows));
          ref::matmul(w.m, x.data(), n, want.data());
          fast.matmul(w.m, x.data(), n, got.data());
          const std::string what = fmt::format("{} format {} bits {} {}x{} n={}", fast.name, int(c.f), c.bits, rows, cols, n);
          if (backend == Backend::Cpu && c.f == WeightFormat::Affine) {
            // int8 activations: within the bound, and well inside it on average.
            std::vector<float> bound = q8_bound(w.m, x, n);
            double err = 0, lim = 0;
            for (size_t i = 0; i < got.size(); ++i) {
              ASSERT_LE(std::fabs(got[i] - want[i]), bound[i] + 1e-3f * (1 + std::fabs(want[i]))) << what << " at " << i;
              err += std::fabs(got[i] - want[i]);
              lim += bound[i];
            }
            EXPECT_LT(err, 0.25 * lim) << what;
          } else {
            expect_close(got, want, what);
          }
        }
      }
    }
  }
}

TEST(Kernels, ReferenceDequantFollowsMlxPacking) {
  // One 4-bit row of 64: word k holds elements 8k..8k+7, lowest index in the lowest nibble.
  std::vector<uint32_t> packed(8);
  for (int i = 0; i < 64; ++i) packed[size_t(i / 8)] |= uint32_t(i % 16) << (4 * (i % 8));
  uint16_t scale = f32_to_bf16(0.5f), bias = f32_to_bf16(-1.0f);
  QMatrix m;
  m.format = WeightFormat::Affine;
  m.rows = 1;
  m.cols = 64;
  m.bits = 4;
  m.group_size = 64;
  m.data = packed.data();
  m.scales = &scale;
  m.biases = &bias;
  std::vector<float> row(64);
  ref::dequant_row(m, 0, row.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(row[size_t(i)], 0.5f * float(i % 16) - 1.0f) << i;
}

TEST(Kernels, ParseBackend) {
  EXPECT_EQ(parse_backend("reference"), Backend::Reference);
  EXPECT_THROW(parse_backend("gpu9"), Error);
}

}  // namespace
}  // namespace swiftlet
