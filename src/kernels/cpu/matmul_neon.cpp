// What the NEON kernels share, built for the baseline Armv8-A: the CPU's extensions, the
// activations' preparation for the int8 kernels, which quantises exactly as the x86 kernels do
// (matmul_q8.h: the same int8 codes and scales), and the fp32-activation products.
#include "kernels/cpu/matmul_neon.h"

#include "core/dtype.h"
#include "kernels/cpu/matmul_q8_rows.h"
#include "kernels/cpu/ops_ref.h"

#include <arm_neon.h>
#include <sys/auxv.h>

#include <vector>

// Linux's arm64 <asm/hwcap.h> values (older headers lack HWCAP2_I8MM).
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

namespace swiftlet::neon {

bool cpu_has_dotprod() { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

bool cpu_has_i8mm() { return cpu_has_dotprod() && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }

namespace {

// Quantises 64 floats to int8 with d = amax / 127 (x * (1 / d) rounded to nearest even, as the
// x86 kernels' vcvtps2dq); nibble order for 4-bit weights: evens first, then odds.
void quantize_block(const float* x, bool nibble_order, int8_t* out, float& d_out, float& sum_out, float& qsum128_out) {
  float32x4_t v[16];
  float32x4_t amax = vdupq_n_f32(0), sum = vdupq_n_f32(0);
  for (int k = 0; k < 16; ++k) {
    v[k] = vld1q_f32(x + 4 * k);
    amax = vmaxq_f32(amax, vabsq_f32(v[k]));
    sum = vaddq_f32(sum, v[k]);
  }
  const float d = vmaxvq_f32(amax) / 127.0f;
  const float32x4_t inv = vdupq_n_f32(d > 0 ? 1.0f / d : 0.0f);
  int8x16_t q[4];
  int32x4_t isum = vdupq_n_s32(0);
  for (int i = 0; i < 4; ++i) {
    int32x4_t c[4];
    for (int j = 0; j < 4; ++j) {
      c[j] = vcvtnq_s32_f32(vmulq_f32(v[4 * i + j], inv));
      isum = vaddq_s32(isum, c[j]);
    }
    const int16x8_t h0 = vcombine_s16(vqmovn_s32(c[0]), vqmovn_s32(c[1]));
    const int16x8_t h1 = vcombine_s16(vqmovn_s32(c[2]), vqmovn_s32(c[3]));
    q[i] = vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1));
  }
  if (nibble_order) {
    const int8x16_t e0 = vuzp1q_s8(q[0], q[1]), e1 = vuzp1q_s8(q[2], q[3]);
    const int8x16_t o0 = vuzp2q_s8(q[0], q[1]), o1 = vuzp2q_s8(q[2], q[3]);
    q[0] = e0;
    q[1] = e1;
    q[2] = o0;
    q[3] = o1;
  }
  for (int i = 0; i < 4; ++i) vst1q_s8(out + 16 * i, q[i]);
  d_out = d;
  sum_out = vaddvq_f32(sum);
  qsum128_out = 128.0f * float(vaddvq_s32(isum));
}

// x . y over n floats: 4 x 4 lanes, then the lanes in a fixed order, then the tail.
float dot_f32(const float* a, const float* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  float acc = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Row r of W as fp32: bf16 and f16 8 at a time (both exact), affine through the reference.
void row_to_f32(const QMatrix& w, int64_t r, float* out) {
  if (w.format != WeightFormat::BF16 && w.format != WeightFormat::F16) {
    ref::dequant_row(w, r, out);
    return;
  }
  const bool bf16 = w.format == WeightFormat::BF16;
  const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * w.cols;
  int64_t i = 0;
  for (; i + 8 <= w.cols; i += 8) {
    const uint16x8_t h = vld1q_u16(p + i);
    if (bf16) {
      vst1q_f32(out + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
      vst1q_f32(out + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    } else {
      const float16x8_t f = vreinterpretq_f16_u16(h);
      vst1q_f32(out + i, vcvt_f32_f16(vget_low_f16(f)));
      vst1q_f32(out + i + 4, vcvt_high_f32_f16(f));
    }
  }
  for (; i < w.cols; ++i) out[i] = bf16 ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
}

}  // namespace

void matmul_rows_f32(const QMatrix& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1) {
  thread_local std::vector<float> buf;  // one row as fp32, grown only
  if (buf.size() < size_t(w.cols)) buf.resize(size_t(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = buf.data();
    if (w.format == WeightFormat::F32)
      row = static_cast<const float*>(w.data) + r * w.cols;
    else
      row_to_f32(w, r, buf.data());
    for (int64_t t = 0; t < n; ++t) y[t * w.rows + r] = dot_f32(row, x + t * w.cols, w.cols);
  }
}

void prepare_q8(const QMatrix& w, const float* x, int64_t n, q8::PreparedQ8& p) {
  q8::prepare_tokens(w, x, n, p, quantize_block);
}

}  // namespace swiftlet::neon
