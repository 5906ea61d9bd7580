#include "format/gguf_quant.h"

#include "core/dtype.h"
#include "core/error.h"

#include <cstring>

namespace swiftlet {

namespace {

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float f16_at(const uint8_t* p) { return f16_to_f32(u16_at(p)); }

void q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

void q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(int(qs[j] & 0xF) - 8) * d;
    y[j + 16] = float(int(qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 0xF) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

// Q5_0 and Q5_1: 32 values, low nibbles as Q4_0 / Q4_1 (values 0-15 low, 16-31 high), the fifth
// bit of value j bit j of the little-endian 32-bit qh; Q5_0 centres at 16, Q5_1 adds its min.
uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint32_t qh = u32_at(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(int((qs[j] & 0xF) | (qh >> j & 1) << 4) - 16) * d;
    y[j + 16] = float(int((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4) - 16) * d;
  }
}

void q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 0xF) | (qh >> j & 1) << 4) * d + m;
    y[j + 16] = float((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4) * d + m;
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block's 12 scale bytes: the
// first four pairs are the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); the last four take
// their low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the top bits of
// bytes 0-3 (scales) and 4-7 (mins).
void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K (qh == nullptr) and Q5_K: four chunks of 64 values, each two sub-blocks of 32 sharing
// 32 bytes of nibbles (low nibbles first); Q5_K's fifth bit of value l of chunk c's first and
// second half is bit 2c and 2c + 1 of qh[l].
void k4_or_k5(const uint8_t* scales, const uint8_t* qh, const uint8_t* qs, float d, float dmin, float* y) {
  for (int c = 0; c < 4; ++c) {
    int sc, m;
    scale_min_k4(2 * c, scales, sc, m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(2 * c + 1, scales, sc, m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l) {
      const int hi1 = qh && (qh[l] >> (2 * c) & 1) ? 16 : 0;
      const int hi2 = qh && (qh[l] >> (2 * c + 1) & 1) ? 16 : 0;
      y[l] = d1 * float((qs[l] & 0xF) + hi1) - m1;
      y[l + 32] = d2 * float((qs[l] >> 4) + hi2) - m2;
    }
    y += 64;
    qs += 32;
  }
}

void q4_k(const uint8_t* b, float* y) { k4_or_k5(b + 4, nullptr, b + 16, f16_at(b), f16_at(b + 2), y); }
void q5_k(const uint8_t* b, float* y) { k4_or_k5(b + 4, b + 16, b + 48, f16_at(b), f16_at(b + 2), y); }

// Q6_K: two halves of 128 values; in each, value l + 32g (g = 0..3, l = 0..31) has its low
// nibble in ql[l] (g = 0, 2: low and high nibble) or ql[l + 32] (g = 1, 3), its top two bits
// in bits 2g, 2g + 1 of qh[l], and its scale in scales[l / 16 + 2g].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
      y[l] = d * float(sc[is]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q2_K: 16 bytes of sub-block scales (low nibble: scale, high: min), 64 bytes of 2-bit codes,
// f16 d, f16 dmin. Two halves of 128 values; in each, code byte l (of 32) holds values
// l + 32 * s for s = 0..3 in its bit pairs, and sub-block i of 16 values uses scale byte i.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = b + 16 + 32 * half;
    for (int s = 0; s < 4; ++s)
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[half * 8 + s * 2 + part];
        const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
        for (int l = 0; l < 16; ++l) y[half * 128 + s * 32 + part * 16 + l] = dl * float(q[part * 16 + l] >> (2 * s) & 3) - ml;
      }
  }
}

// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit codes, 12 bytes of sixteen 6-bit scales, f16 d.
// Values as Q2_K's (without mins); value v's third bit is bit (v / 32) of hmask[v % 32], and a
// clear bit subtracts 4. Scale i (biased by 32): low 4 bits from the nibbles of bytes 0-7 (low
// nibbles for scales 0-7, high for 8-15), top 2 bits from bytes 8-11 (pair i / 4 of byte 8 + i % 4).
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* packed = b + 96;
  const float d = f16_at(b + 108);
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
    const int high = packed[8 + i % 4] >> (2 * (i / 4)) & 3;
    scale[i] = (low | high << 4) - 32;
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = b + 32 + 32 * half;
    for (int s = 0; s < 4; ++s)
      for (int part = 0; part < 2; ++part) {
        const float dl = d * float(scale[half * 8 + s * 2 + part]);
        const int bit = half * 4 + s;
        for (int l = 0; l < 16; ++l) {
          const int k = part * 16 + l;
          const int code = int(q[k] >> (2 * s) & 3) - (hmask[k] >> bit & 1 ? 0 : 4);
          y[half * 128 + s * 32 + k] = dl * float(code);
        }
      }
  }
}

// The 16 levels of IQ4_NL and IQ4_XS (a non-uniform 4-bit grid).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void iq4_values(const uint8_t* qs, float d, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(kIq4Levels[qs[j] & 0xF]);
    y[j + 16] = d * float(kIq4Levels[qs[j] >> 4]);
  }
}

// IQ4_NL: 32 values, f16 d and 16 bytes of level indices (as Q4_0's nibbles).
void iq4_nl(const uint8_t* b, float* y) { iq4_values(b + 2, f16_at(b), y); }

// IQ4_XS: 256 values, f16 d, u16 of the eight sub-block scales' top 2 bits, 4 bytes of their low
// nibbles, then eight sub-blocks of 32 as IQ4_NL's with scale d * (ls - 32).
void iq4_xs(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint16_t high = u16_at(b + 2);
  for (int i = 0; i < 8; ++i) {
    const int ls = (b[4 + i / 2] >> (4 * (i % 2)) & 0xF) | (high >> (2 * i) & 3) << 4;
    iq4_values(b + 8 + 16 * i, d * float(ls - 32), y + 32 * i);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(uint32_t t) {
  switch (GgmlType(t)) {
    case GgmlType::Q8_0:
      return q8_0;
    case GgmlType::Q4_0:
      return q4_0;
    case GgmlType::Q4_1:
      return q4_1;
    case GgmlType::Q5_0:
      return q5_0;
    case GgmlType::Q5_1:
      return q5_1;
    case GgmlType::Q2_K:
      return q2_k;
    case GgmlType::Q3_K:
      return q3_k;
    case GgmlType::Q4_K:
      return q4_k;
    case GgmlType::Q5_K:
      return q5_k;
    case GgmlType::Q6_K:
      return q6_k;
    case GgmlType::IQ4_NL:
      return iq4_nl;
    case GgmlType::IQ4_XS:
      return iq4_xs;
    default:
      return nullptr;
  }
}

}  // namespace

bool gguf_type_readable(uint32_t t) {
  switch (GgmlType(t)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
      return true;
    default:
      return block_fn(t) != nullptr;
  }
}

void check_gguf_readable(const GgufTensor& t) {
  if (!gguf_type_readable(t.type))
    fail(
        "tensor {} has type {}, which swiftlet cannot read; convert from safetensors or a "
        "Q4_K/Q5_K/Q6_K/Q8_0 GGUF",
        t.name, t.type_name());
}

void gguf_dequantize(uint32_t t, const uint8_t* src, size_t nbytes, int64_t n, float* out) {
  if (!gguf_type_readable(t))
    fail(
        "GGUF type {} cannot be read by swiftlet; convert from safetensors or a Q4_K/Q5_K/Q6_K/Q8_0 "
        "GGUF",
        ggml_type_name(t));
  const GgmlTypeInfo info = *ggml_type_info(t);
  if (n < 0 || n % info.block != 0) fail("{} values are not whole {} blocks of {}", n, info.name, info.block);
  const size_t blocks = size_t(n / info.block);
  if (nbytes != blocks * info.block_bytes)
    fail("{} {} values take {} bytes, not {}", n, info.name, blocks * info.block_bytes, nbytes);
  if (n == 0) return;  // an empty tensor: nothing to read (its data pointer may be null)
  switch (GgmlType(t)) {
    case GgmlType::F32:
      to_f32(DType::F32, src, out, size_t(n));
      return;
    case GgmlType::F16:
      to_f32(DType::F16, src, out, size_t(n));
      return;
    case GgmlType::BF16:
      to_f32(DType::BF16, src, out, size_t(n));
      return;
    default:
      break;
  }
  const BlockFn fn = block_fn(t);
  for (size_t k = 0; k < blocks; ++k) fn(src + k * info.block_bytes, out + k * size_t(info.block));
}

void gguf_dequantize_rows(const GgufTensor& t, int64_t row0, int64_t rows, float* out) {
  check_gguf_readable(t);
  const GgmlTypeInfo info = *ggml_type_info(t.type);
  const int64_t cols = t.ne.at(0);
  const int64_t total = cols == 0 ? 0 : t.numel() / cols;
  if (row0 < 0 || rows < 0 || row0 > total || rows > total - row0)
    fail("rows [{}, {}) of tensor {} are outside its {} rows", row0, row0 + rows, t.name, total);
  const size_t row_bytes = size_t(cols / info.block) * info.block_bytes;
  gguf_dequantize(t.type, t.data + size_t(row0) * row_bytes, size_t(rows) * row_bytes, rows * cols, out);
}

}  // namespace swiftlet
