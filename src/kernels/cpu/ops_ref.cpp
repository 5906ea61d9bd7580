#include "kernels/cpu/ops_ref.h"

#include "core/error.h"

#include <vector>

namespace swiftlet::ref {

namespace {
float scale_at(const QMatrix& w, const void* base, int64_t r, int64_t g) {
  const int64_t groups = w.cols / w.group_size;
  const size_t i = size_t(r * groups + g);
  switch (w.scale_dtype) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F32: return static_cast<const float*>(base)[i];
    default: SWIFTLET_CHECK(false, "bad scale dtype");
  }
  return 0;
}
}  // namespace

void dequant_row(const QMatrix& w, int64_t r, float* out) {
  switch (w.format) {
    case WeightFormat::F32:
      to_f32(DType::F32, static_cast<const float*>(w.data) + r * w.cols, out, size_t(w.cols));
      return;
    case WeightFormat::BF16:
      to_f32(DType::BF16, static_cast<const uint16_t*>(w.data) + r * w.cols, out, size_t(w.cols));
      return;
    case WeightFormat::F16:
      to_f32(DType::F16, static_cast<const uint16_t*>(w.data) + r * w.cols, out, size_t(w.cols));
      return;
    case WeightFormat::Affine: {
      const int per_word = 32 / w.bits;
      const uint32_t mask = (1u << w.bits) - 1;
      const uint32_t* row = static_cast<const uint32_t*>(w.data) + r * (w.cols / per_word);
      for (int64_t c = 0; c < w.cols; ++c) {
        const int64_t g = c / w.group_size;
        uint32_t q = (row[c / per_word] >> (w.bits * (c % per_word))) & mask;
        out[c] = scale_at(w, w.scales, r, g) * float(q) + scale_at(w, w.biases, r, g);
      }
      return;
    }
  }
}

void matvec(const QMatrix& w, const float* x, float* y) { matmul(w, x, 1, y); }

void matmul(const QMatrix& w, const float* x, int64_t n, float* y) {
  std::vector<float> row(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequant_row(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * w.cols;
      double acc = 0;  // double accumulation: the reference should not be the noisy one
      for (int64_t c = 0; c < w.cols; ++c) acc += double(row[size_t(c)]) * xt[c];
      y[t * w.rows + r] = float(acc);
    }
  }
}

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void l2_norm_scaled(float* x, int64_t n, float eps, float scale) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss + eps)) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_neox(float* x, int rot_dim, const float* cos, const float* sin) {
  const int half = rot_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

void softmax(float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = float(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace swiftlet::ref
