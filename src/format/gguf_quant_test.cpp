// Hand-built blocks of each type, their expected values written out element by element from the
// documented formulas (not in the loop order of the dequantiser), and a few values by hand.
#include "format/gguf_quant.h"

#include "format/gguf_writer.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <vector>

namespace swiftlet {
namespace {

using swiftlet::testing::error_of;

// fp16 bit patterns of a few exact values.
constexpr uint16_t kOne = 0x3C00, kHalf = 0x3800, kTwo = 0x4000, kQuarter = 0x3400, kMinus1_5 = 0xBE00;

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); }

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(size_t(n), -999.0f);
  gguf_dequantize(uint32_t(t), b.data(), b.size(), n, y.data());
  return y;
}

TEST(GgufQuant, Q8_0) {
  std::vector<uint8_t> b(34);
  put16(b, 0, kQuarter);
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(j * 8 - 128));
  const auto y = dequant(GgmlType::Q8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.25f * float(j * 8 - 128)) << j;
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[31], 30.0f);  // 0.25 * 120
}

TEST(GgufQuant, Q4_0) {
  std::vector<uint8_t> b(18);
  put16(b, 0, kMinus1_5);
  for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(j | ((15 - j) << 4));
  const auto y = dequant(GgmlType::Q4_0, b, 32);
  for (int e = 0; e < 32; ++e) {
    const int q = e < 16 ? e : 15 - (e - 16);  // value e: low nibble of byte e, else high of e-16
    EXPECT_EQ(y[e], -1.5f * float(q - 8)) << e;
  }
  EXPECT_EQ(y[0], 12.0f);    // -1.5 * (0 - 8)
  EXPECT_EQ(y[16], -10.5f);  // high nibble of byte 0 = 15: -1.5 * 7
}

TEST(GgufQuant, Q4_1) {
  std::vector<uint8_t> b(20);
  put16(b, 0, kHalf);
  put16(b, 2, kMinus1_5);
  for (int j = 0; j < 16; ++j) b[4 + j] = uint8_t(((j * 5) & 15) | (((j * 3 + 1) & 15) << 4));
  const auto y = dequant(GgmlType::Q4_1, b, 32);
  for (int e = 0; e < 32; ++e) {
    const int q = e < 16 ? (e * 5) & 15 : ((e - 16) * 3 + 1) & 15;
    EXPECT_EQ(y[e], 0.5f * float(q) - 1.5f) << e;
  }
  EXPECT_EQ(y[16], -1.0f);  // 0.5 * 1 - 1.5
}

// Q5_0 / Q5_1: a 32-bit qh whose bit e is value e's fifth bit (values 0-15 from the low nibbles,
// 16-31 from the high ones).
constexpr uint32_t kQh = 0xA5C3'0F96u;

TEST(GgufQuant, Q5_0) {
  std::vector<uint8_t> b(22);
  put16(b, 0, kHalf);
  std::memcpy(b.data() + 2, &kQh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = uint8_t(((j * 7) & 15) | (((j + 9) & 15) << 4));
  const auto y = dequant(GgmlType::Q5_0, b, 32);
  for (int e = 0; e < 32; ++e) {
    const int low = e < 16 ? (e * 7) & 15 : ((e - 16) + 9) & 15;
    const int q = low + 16 * int(kQh >> e & 1);
    EXPECT_EQ(y[e], 0.5f * float(q - 16)) << e;
  }
  EXPECT_EQ(y[0], -8.0f);   // bit 0 of qh is 0: 0.5 * (0 - 16)
  EXPECT_EQ(y[1], 3.5f);    // bit 1 is 1: 0.5 * (7 + 16 - 16)
  EXPECT_EQ(y[16], 4.5f);   // high nibble of byte 0 = 9, bit 16 is 1: 0.5 * (25 - 16)
}

TEST(GgufQuant, Q5_1) {
  std::vector<uint8_t> b(24);
  put16(b, 0, kQuarter);
  put16(b, 2, kMinus1_5);
  std::memcpy(b.data() + 4, &kQh, 4);
  for (int j = 0; j < 16; ++j) b[8 + j] = uint8_t(((15 - j) & 15) | (((j * 3) & 15) << 4));
  const auto y = dequant(GgmlType::Q5_1, b, 32);
  for (int e = 0; e < 32; ++e) {
    const int low = e < 16 ? 15 - e : ((e - 16) * 3) & 15;
    const int q = low + 16 * int(kQh >> e & 1);
    EXPECT_EQ(y[e], 0.25f * float(q) - 1.5f) << e;
  }
  EXPECT_EQ(y[31], 5.75f);  // high nibble of byte 15 = 45 & 15 = 13, bit 31 set: 0.25 * 29 - 1.5
}

// Bytes of a pseudo-random block (a fixed LCG); tests put exact f16 factors over some of them.
std::vector<uint8_t> random_block(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) {
    seed = seed * 1664525u + 1013904223u;
    x = uint8_t(seed >> 24);
  }
  return b;
}

// Value v of a 256-value Q2_K / Q3_K block: its 2-bit code is bits 2s..2s+1 of code byte
// 32 * (v / 128) + v % 32, with s = v % 128 / 32; its sub-block of 16 is v / 16.
int low2(const uint8_t* qs, int v) { return qs[32 * (v / 128) + v % 32] >> (2 * (v % 128 / 32)) & 3; }

TEST(GgufQuant, Q2_K) {
  std::vector<uint8_t> b = random_block(84, 7);
  put16(b, 80, kHalf);     // d
  put16(b, 82, kQuarter);  // dmin
  const auto y = dequant(GgmlType::Q2_K, b, 256);
  for (int v = 0; v < 256; ++v) {
    const uint8_t sc = b[size_t(v / 16)];
    EXPECT_EQ(y[size_t(v)], 0.5f * float(sc & 15) * float(low2(b.data() + 16, v)) - 0.25f * float(sc >> 4)) << v;
  }
}

TEST(GgufQuant, Q3_K) {
  std::vector<uint8_t> b = random_block(110, 11);
  put16(b, 108, kTwo);
  const auto y = dequant(GgmlType::Q3_K, b, 256);
  // The sixteen scales as ggml unpacks them: three little-endian words a0, a1, a2; scale bytes
  // 0-3 = low nibbles of a0 | bits 0-1 of a2's bytes << 4, 4-7 = low nibbles of a1 | bits 2-3,
  // 8-11 = high nibbles of a0 | bits 4-5, 12-15 = high nibbles of a1 | bits 6-7; minus 32.
  uint32_t a[3];
  std::memcpy(a, b.data() + 96, 12);
  const uint32_t lo = 0x0F0F0F0Fu, two = 0x03030303u;
  const uint32_t words[4] = {(a[0] & lo) | (a[2] & two) << 4, (a[1] & lo) | (a[2] >> 2 & two) << 4,
                             (a[0] >> 4 & lo) | (a[2] >> 4 & two) << 4, (a[1] >> 4 & lo) | (a[2] >> 6 & two) << 4};
  int8_t scales[16];
  std::memcpy(scales, words, 16);
  for (int v = 0; v < 256; ++v) {
    const bool high = b[size_t(v % 32)] >> (v / 32) & 1;
    const int q = low2(b.data() + 32, v) - (high ? 0 : 4);
    EXPECT_EQ(y[size_t(v)], 2.0f * float(scales[v / 16] - 32) * float(q)) << v;
  }
}

constexpr float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

TEST(GgufQuant, IQ4_NL) {
  std::vector<uint8_t> b = random_block(18, 3);
  put16(b, 0, kQuarter);
  const auto y = dequant(GgmlType::IQ4_NL, b, 32);
  for (int v = 0; v < 32; ++v) EXPECT_EQ(y[size_t(v)], 0.25f * kLevels[(b[2 + v % 16] >> (4 * (v / 16))) & 15]) << v;
}

TEST(GgufQuant, IQ4_XS) {
  std::vector<uint8_t> b = random_block(136, 5);
  put16(b, 0, kHalf);
  const auto y = dequant(GgmlType::IQ4_XS, b, 256);
  const uint16_t high = uint16_t(b[2] | b[3] << 8);
  for (int v = 0; v < 256; ++v) {
    const int i = v / 32, k = v % 32;
    const int ls = ((b[size_t(4 + i / 2)] >> (4 * (i % 2))) & 15) + 16 * ((high >> (2 * i)) & 3);
    const uint8_t code = b[size_t(8 + 16 * i + k % 16)];
    EXPECT_EQ(y[size_t(v)], 0.5f * float(ls - 32) * kLevels[(code >> (4 * (k / 16))) & 15]) << v;
  }
}

// The eight sub-blocks' 6-bit scales and mins used for Q4_K and Q5_K, and their 12 bytes packed
// by hand: bytes 0-3 = sc[0..3] | (sc[4..7] >> 4) << 6, bytes 4-7 = m[0..3] | (m[4..7] >> 4) << 6,
// bytes 8-11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4.
constexpr int kSc[8] = {1, 2, 3, 4, 17, 33, 63, 48};
constexpr int kM[8] = {0, 1, 5, 63, 2, 20, 40, 7};
constexpr uint8_t kPacked[12] = {65, 130, 195, 196, 0, 65, 133, 63, 33, 65, 143, 112};

TEST(GgufQuant, Q4_K) {
  std::vector<uint8_t> b(144);
  put16(b, 0, kOne);   // d
  put16(b, 2, kHalf);  // dmin
  std::memcpy(b.data() + 4, kPacked, 12);
  for (int i = 0; i < 128; ++i) b[16 + i] = uint8_t(i * 7 + 3);
  const auto y = dequant(GgmlType::Q4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    // Value e: chunk e / 64 of 32 bytes; its first 32 values are the low nibbles, the next 32
    // the high ones; sub-block e / 32.
    const int chunk = e / 64, in = e % 64, s = e / 32;
    const uint8_t byte = b[16 + chunk * 32 + in % 32];
    const int q = in < 32 ? byte & 15 : byte >> 4;
    EXPECT_EQ(y[e], 1.0f * float(kSc[s]) * float(q) - 0.5f * float(kM[s])) << e;
  }
  // Value 255: sub-block 7 (sc 48, m 7), high nibble of byte 16 + 127 = (127*7+3) & 255 = 124 -> 7.
  EXPECT_EQ(y[255], 48.0f * 7 - 3.5f);
  // Value 200: sub-block 6 (sc 63, m 40), low nibble of byte 16 + 96 + 8 = (104*7+3) & 255 = 219 -> 11.
  EXPECT_EQ(y[200], 63.0f * 11 - 20.0f);
}

TEST(GgufQuant, Q5_K) {
  std::vector<uint8_t> b(176);
  put16(b, 0, kTwo);      // d
  put16(b, 2, kQuarter);  // dmin
  std::memcpy(b.data() + 4, kPacked, 12);
  for (int l = 0; l < 32; ++l) b[16 + l] = uint8_t(l * 37 + 11);  // fifth bits
  for (int i = 0; i < 128; ++i) b[48 + i] = uint8_t(i * 13 + 5);
  const auto y = dequant(GgmlType::Q5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int chunk = e / 64, in = e % 64, s = e / 32, l = in % 32;
    const uint8_t byte = b[48 + chunk * 32 + l];
    const int low = in < 32 ? byte & 15 : byte >> 4;
    const int high = (b[16 + l] >> s) & 1;  // sub-block s's fifth bit is bit s of qh[l]
    EXPECT_EQ(y[e], 2.0f * float(kSc[s]) * float(low + 16 * high) - 0.25f * float(kM[s])) << e;
  }
  // Value 33: sub-block 1 (sc 2, m 1), high nibble of byte 48 + 1 = 18 -> 1, bit 1 of qh[1] = 48 -> 0.
  EXPECT_EQ(y[33], 2.0f * 2 * 1 - 0.25f);
  // Value 0: low nibble of byte 48 = 5, bit 0 of qh[0] = 11 -> 1: 2 * 1 * 21 - 0.
  EXPECT_EQ(y[0], 42.0f);
}

TEST(GgufQuant, Q6_K) {
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = uint8_t(i * 11 + 7);       // low nibbles
  for (int i = 0; i < 64; ++i) b[128 + i] = uint8_t(i * 29 + 3);  // top bit pairs
  const int8_t sc[16] = {1, -2, 3, -4, 5, 6, -7, 8, 127, -128, 10, 11, -12, 13, 14, -15};
  std::memcpy(b.data() + 192, sc, 16);
  put16(b, 208, kQuarter);
  const auto y = dequant(GgmlType::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    // Half h of 128 values, in it group g = (e % 128) / 32 and position l: low nibble from
    // ql[64h + l + 32 (g odd)], its low half for g < 2; top bits (2g, 2g+1) of qh[32h + l];
    // scale sc[8h + 2g + l / 16].
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    const uint8_t lb = b[64 * h + l + ((g & 1) ? 32 : 0)];
    const int low = g < 2 ? lb & 15 : lb >> 4;
    const int top = (b[128 + 32 * h + l] >> (2 * g)) & 3;
    const int q = (low | top << 4) - 32;
    EXPECT_EQ(y[e], 0.25f * float(sc[8 * h + 2 * g + l / 16]) * float(q)) << e;
  }
  // Value 0: ql[0] = 7 -> 7, qh[0] = 3 -> bits 0-1 = 3: q = 7 + 48 - 32 = 23; scale 1.
  EXPECT_EQ(y[0], 0.25f * 23);
}

TEST(GgufQuant, FloatTypes) {
  std::vector<uint8_t> f16(4), bf16(4), f32(8);
  put16(f16, 0, kMinus1_5);
  put16(f16, 2, kTwo);
  put16(bf16, 0, 0x3f80);  // 1.0
  put16(bf16, 2, 0xc040);  // -3.0
  const float fv[2] = {0.1f, -7.0f};
  std::memcpy(f32.data(), fv, 8);
  EXPECT_EQ(dequant(GgmlType::F16, f16, 2), (std::vector<float>{-1.5f, 2.0f}));
  EXPECT_EQ(dequant(GgmlType::BF16, bf16, 2), (std::vector<float>{1.0f, -3.0f}));
  EXPECT_EQ(dequant(GgmlType::F32, f32, 2), (std::vector<float>{0.1f, -7.0f}));
}

TEST(GgufQuant, LengthsMustBeWholeBlocksOfTheirBytes) {
  std::vector<uint8_t> b(34 * 2);
  float y[64];
  EXPECT_NE(error_of([&] { gguf_dequantize(8, b.data(), b.size(), 48, y); }).find("not whole Q8_0 blocks"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gguf_dequantize(8, b.data(), 67, 64, y); }).find("take 68 bytes, not 67"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gguf_dequantize(12, b.data(), b.size(), 64, y); }).find("blocks of 256"), std::string::npos);
  EXPECT_EQ(error_of([&] { gguf_dequantize(8, b.data(), b.size(), 64, y); }), "(no error)");
  EXPECT_EQ(error_of([&] { gguf_dequantize(0, nullptr, 0, 0, nullptr); }), "(no error)");  // empty
}

TEST(GgufQuant, OtherTypesAreRefusedByName) {
  for (uint32_t t : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 10u, 11u, 12u, 13u, 14u, 20u, 23u, 30u})
    EXPECT_TRUE(gguf_type_readable(t)) << t;
  for (uint32_t t : {15u, 16u, 17u, 18u, 19u, 21u, 22u, 29u, 39u, 4u, 1000u}) EXPECT_FALSE(gguf_type_readable(t)) << t;
  GgufTensor t;
  t.name = "blk.3.ffn_down_exps.weight";
  t.type = uint32_t(GgmlType::IQ2_XS);
  EXPECT_EQ(error_of([&] { check_gguf_readable(t); }),
            "tensor blk.3.ffn_down_exps.weight has type IQ2_XS, which swiftlet cannot read; convert "
            "from safetensors or a Q4_K/Q5_K/Q6_K/Q8_0 GGUF");
  float y[256];
  uint8_t z[74] = {};
  EXPECT_NE(error_of([&] { gguf_dequantize(17, z, 74, 256, y); }).find("IQ2_XS"), std::string::npos);
}

TEST(GgufQuant, RowsOfATensorInAFile) {
  // A [3, 32] Q4_0 tensor whose row r has d = r + 1 and every nibble 9: values r + 1.
  std::string bytes;
  const uint16_t ds[3] = {kOne, kTwo, 0x4200};  // 1, 2, 3
  for (uint16_t d : ds) {
    bytes.append(reinterpret_cast<const char*>(&d), 2);
    bytes.append(16, char(0x99));
  }
  GgufWriter w;
  w.add_tensor("w", GgmlType::Q4_0, {32, 3}, bytes);
  swiftlet::testing::ScratchDir dir;
  w.write(dir / "w.gguf");
  GgufFile f(dir / "w.gguf");
  const GgufTensor& t = f.tensors().at(0);
  std::vector<float> y(64);
  gguf_dequantize_rows(t, 1, 2, y.data());
  EXPECT_EQ(y[0], 2.0f);
  EXPECT_EQ(y[31], 2.0f);
  EXPECT_EQ(y[32], 3.0f);
  EXPECT_NE(error_of([&] { gguf_dequantize_rows(t, 2, 2, y.data()); }).find("outside its 3 rows"), std::string::npos);
}

}  // namespace
}  // namespace swiftlet
