// Random weight matrices in every stored format and the int8-activation error bound, for the
// tests of the CPU products (kernels_test.cpp) and the operation table (kernels/ops_test.cpp).
#pragma once

#include "core/dtype.h"
#include "core/qmatrix.h"
#include "kernels/cpu/ops_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace swiftlet::testing {

struct OwnedMatrix {
  QMatrix m;
  std::vector<uint8_t> data, scales, biases;
};

inline void put_scale(std::vector<uint8_t>& v, DType sdt, size_t i, float f) {
  if (sdt == DType::F32) {
    std::memcpy(v.data() + 4 * i, &f, 4);
    return;
  }
  const uint16_t h = sdt == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
  std::memcpy(v.data() + 2 * i, &h, 2);
}

inline OwnedMatrix random_matrix(std::mt19937& rng, WeightFormat f, int64_t rows, int64_t cols, int bits = 4,
                          DType sdt = DType::BF16, int group = 64) {
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
      o.m.group_size = group;
      o.m.scale_dtype = sdt;
      o.data.resize(size_t(rows * cols * bits / 8));
      for (auto& b : o.data) b = uint8_t(ud(rng));
      const size_t ng = size_t(rows * cols / group), es = dtype_size(sdt);
      o.scales.resize(ng * es);
      o.biases.resize(ng * es);
      for (size_t i = 0; i < ng; ++i) {
        put_scale(o.scales, sdt, i, nd(rng) * 0.1f);
        put_scale(o.biases, sdt, i, nd(rng) * 0.5f);
      }
      o.m.scales = o.scales.data();
      o.m.biases = o.biases.data();
      break;
    }
  }
  o.m.data = o.data.data();
  return o;
}

inline std::vector<float> random_x(std::mt19937& rng, int64_t n, int64_t cols) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(n * cols));
  for (auto& v : x) v = nd(rng);
  return x;
}

// The float-rounding bound for every y[t, r] of W x summed in any order: 1e-5 sum |W x| + 1e-6
// (it scales with the terms' magnitudes, not with |y|, which cancellation can make small).
inline std::vector<float> float_bound(const QMatrix& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> bound(size_t(n * w.rows)), row(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    ref::dequant_row(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x.data() + t * w.cols;
      double mag = 0;
      for (int64_t c = 0; c < w.cols; ++c) mag += std::fabs(double(row[size_t(c)]) * xt[c]);
      bound[size_t(t * w.rows + r)] = float(1e-5 * mag + 1e-6);
    }
  }
  return bound;
}

// The int8-activation bound for every y[t, r] of W x: each x in a block of 64 is replaced by
// xq * d with d = amax / 127, so it moves by at most d / 2, and the error is at most the sum over
// blocks of d / 2 * sum |scale * q| (the bias term uses exact fp32 block sums, so the bias part of
// W does not enter), plus float rounding: 1e-5 sum |W x| + 1e-6.
inline std::vector<float> q8_bound(const QMatrix& w, const std::vector<float>& x, int64_t n) {
  QMatrix sq = w;  // scale * q only: the same matrix with zero biases
  std::vector<uint8_t> zeros(w.scale_row_bytes() * size_t(w.rows), 0);
  sq.biases = zeros.data();
  std::vector<float> bound = float_bound(w, x, n), row(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    ref::dequant_row(sq, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x.data() + t * w.cols;
      double b = 0;
      for (int64_t g = 0; g < w.cols / 64; ++g) {
        float amax = 0;
        for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(xt[g * 64 + i]));
        for (int i = 0; i < 64; ++i) b += std::fabs(row[size_t(g * 64 + i)]) * amax / 254.0;
      }
      bound[size_t(t * w.rows + r)] += float(b);
    }
  }
  return bound;
}

// Largest |got - want| / bound; <= 1 passes. Also the mean error over the mean bound.
struct Fit {
  double worst = 0, mean_share = 0;
  size_t at = 0;
};
inline Fit fit_q8(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& bound) {
  Fit f;
  double err = 0, lim = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]);
    if (!(e / bound[i] <= f.worst)) {  // NaN counts as the worst
      f.worst = std::isnan(e) ? INFINITY : e / bound[i];
      f.at = i;
    }
    err += e;
    lim += bound[i];
  }
  f.mean_share = err / lim;
  return f;
}

}  // namespace swiftlet::testing
