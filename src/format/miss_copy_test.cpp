// Low-bit miss copies (miss_copy.h): the copy's layout for the target shapes, code widening in
// every form against codes packed and read back here, copies that expand in place to exactly the
// values they store, and a fit better than the group's plain [min, max] range.
#include "format/miss_copy.h"

#include "core/dtype.h"
#include "format/quantize.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace swiftlet {
namespace {

// Codes packed one by one, lowest bit first (the test's own packer).
std::vector<uint8_t> pack(const std::vector<uint32_t>& codes, int bits) {
  std::vector<uint8_t> out((codes.size() * size_t(bits) + 7) / 8, 0);
  for (size_t i = 0; i < codes.size(); ++i)
    for (int b = 0; b < bits; ++b)
      if (codes[i] >> b & 1)
        out[(i * size_t(bits) + size_t(b)) / 8] |= uint8_t(1u << ((i * size_t(bits) + size_t(b)) % 8));
  return out;
}
uint32_t code_at(const uint8_t* p, size_t i, int bits) {
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b)
    q |= uint32_t(p[(i * size_t(bits) + size_t(b)) / 8] >> ((i * size_t(bits) + size_t(b)) % 8) & 1) << b;
  return q;
}

TEST(MissCopyWiden, EveryFormGivesTheCodesBack) {
  std::mt19937 rng(5);
  for (int from : {2, 3}) {
    for (int to : {4, 8}) {
      for (size_t n : {32u, 64u, 96u, 2048u, 2080u}) {
        SCOPED_TRACE(::testing::Message() << from << " -> " << to << " bits, " << n << " codes");
        std::vector<uint32_t> codes(n);
        for (auto& c : codes) c = rng() % (1u << from);
        const std::vector<uint8_t> src = pack(codes, from);
        std::vector<uint8_t> ref(n * size_t(to) / 8, 0xAB), fast(ref.size(), 0xCD), any(ref.size(), 0xEF);
        widen_codes_reference(src.data(), from, ref.data(), to, n);
        widen_codes(src.data(), from, any.data(), to, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(code_at(ref.data(), i, to), codes[i]) << "code " << i;
        EXPECT_EQ(any, ref);
        if (widen_codes_avx2(src.data(), from, fast.data(), to, n)) {
          EXPECT_EQ(fast, ref);
        }
      }
    }
  }
}

ModelConfig expert_shape(int64_t hidden, int64_t inter) {
  ModelConfig c;
  c.hidden_size = hidden;
  c.moe_intermediate_size = inter;
  c.num_experts = 4;
  c.num_layers = 1;
  c.linear_layers = {false};
  return c;
}

QpackLayout full_layout(const ModelConfig& c, int bits) {
  ProjectionFormat f[3];
  for (auto& x : f) x.bits = bits;
  return QpackLayout::plan(c, f);
}

TEST(MissCopyLayout, TheTargetShapesAt2And3Bits) {
  const ModelConfig c = expert_shape(2048, 512);  // both target models
  const QpackLayout full = full_layout(c, 4);
  ASSERT_EQ(full.expert_stride, 1769472u);
  const MissCopyLayout two = MissCopyLayout::plan(full, c, 2);
  // Per projection 512 x 2048 codes at 2 bits (262,144 bytes) + scales + biases (32,768 each).
  EXPECT_EQ(two.payload(), 3u * (262144 + 2 * 32768));
  EXPECT_EQ(two.stride, 983040u);  // 55.6% of the 4-bit expert
  EXPECT_EQ(two.payload_offset, 0u);
  const MissCopyLayout three = MissCopyLayout::plan(full, c, 3);
  EXPECT_EQ(three.stride, 1376256u);
  ASSERT_EQ(two.sections.size(), 9u);
  EXPECT_EQ(two.sections[0].name, "gate_proj.weight");
  EXPECT_EQ(two.sections[0].shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(two.sections[8].name, "down_proj.biases");
  EXPECT_EQ(two.sections[8].offset + two.sections[8].size, two.stride);  // the payload ends the blob
  // A shape whose copy needs padding: the padding comes first.
  const ModelConfig small = expert_shape(256, 192);
  const MissCopyLayout s2 = MissCopyLayout::plan(full_layout(small, 4), small, 2);
  EXPECT_GT(s2.payload_offset, 0u);
  EXPECT_EQ(s2.sections.front().offset, s2.payload_offset);
  EXPECT_EQ(MissCopyLayout::parse(nlohmann::json::parse(s2.to_json().dump()), "x"), s2);
}

TEST(MissCopyLayout, RefusesExpertsItCannotCopy) {
  const ModelConfig c = expert_shape(256, 128);
  EXPECT_NE(testing::error_of([&] { MissCopyLayout::plan(full_layout(c, 16), c, 2); }).find("--bits 4 or 8"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { MissCopyLayout::plan(full_layout(c, 4), c, 5); }).find("2 or 3 bits"),
            std::string::npos);
  ProjectionFormat two[3];
  for (auto& x : two) x.bits = 2;
  EXPECT_NE(testing::error_of([&] { MissCopyLayout::plan(QpackLayout::plan(c, two), c, 3); }).find("save nothing"),
            std::string::npos);
}

// A random 4-bit expert of `c` in a blob of its stride.
std::vector<uint8_t> random_expert(const QpackLayout& full, const ModelConfig& c, uint32_t seed) {
  std::vector<uint8_t> blob(full.expert_stride, 0);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (int p = 0; p < 3; ++p) {
    const QMatrix v = full.view(p, c, blob.data());
    std::vector<float> w(size_t(v.rows * v.cols));
    for (float& x : w) x = nd(rng) + (rng() % 97 == 0 ? 0.2f : 0.0f);  // a few outliers
    const AffineMatrix q = affine_quantize(w.data(), v.rows, v.cols, 4, 64);
    std::memcpy(const_cast<void*>(v.data), q.packed.data(), q.packed.size() * 4);
    std::memcpy(const_cast<void*>(v.scales), q.scales.data(), q.scales.size() * 2);
    std::memcpy(const_cast<void*>(v.biases), q.biases.data(), q.biases.size() * 2);
  }
  return blob;
}

std::vector<float> dequantized(const QMatrix& m) {
  std::vector<float> out(size_t(m.rows * m.cols));
  affine_dequantize(static_cast<const uint32_t*>(m.data), static_cast<const uint16_t*>(m.scales),
                    static_cast<const uint16_t*>(m.biases), m.rows, m.cols, m.bits, m.group_size, out.data());
  return out;
}

TEST(MissCopy, ExpandsInPlaceToTheValuesItStores) {
  for (int bits : {2, 3})
    for (const ModelConfig& c : {expert_shape(256, 128), expert_shape(256, 192)}) {
      SCOPED_TRACE(::testing::Message() << bits << " bits, intermediate " << c.moe_intermediate_size);
      const QpackLayout full = full_layout(c, 4);
      const MissCopyLayout copy = MissCopyLayout::plan(full, c, bits);
      const std::vector<uint8_t> expert = random_expert(full, c, 11);
      std::vector<uint8_t> copy_blob(copy.stride);
      make_miss_copy(full, copy, c, expert.data(), copy_blob.data());
      // As read: the copy in the tail of a full-size slot (the rest holds stale bytes).
      std::vector<uint8_t> slot(full.expert_stride, 0x5A);
      std::memcpy(slot.data() + (full.expert_stride - copy.stride), copy_blob.data(), copy.stride);
      expand_miss_copy(full, copy, c, slot.data());
      for (int p = 0; p < 3; ++p) {
        const QMatrix got = full.view(p, c, slot.data());
        const std::vector<float> values = dequantized(got);
        // The copy's own values, read here from its sections: scale * code + bias.
        const std::string proj = kExpertProjections[p];
        auto sec = [&](const char* part) {
          for (const auto& s : copy.sections)
            if (s.name == proj + part) return copy_blob.data() + s.offset;
          return static_cast<uint8_t*>(nullptr);
        };
        const uint8_t* codes = sec(".weight");
        const auto* scales = reinterpret_cast<const uint16_t*>(sec(".scales"));
        const auto* biases = reinterpret_cast<const uint16_t*>(sec(".biases"));
        const int64_t groups = got.cols / 64;
        double err = 0, ref = 0;
        const std::vector<float> original = dequantized(full.view(p, c, expert.data()));
        for (int64_t r = 0; r < got.rows; ++r)
          for (int64_t k = 0; k < got.cols; ++k) {
            const float want =
                bf16_to_f32(scales[r * groups + k / 64]) * float(code_at(codes, size_t(r * got.cols + k), bits)) +
                bf16_to_f32(biases[r * groups + k / 64]);
            ASSERT_EQ(values[size_t(r * got.cols + k)], want) << "projection " << p << " row " << r << " col " << k;
            const double d = double(want) - original[size_t(r * got.cols + k)];
            err += d * d;
            ref += double(original[size_t(r * got.cols + k)]) * original[size_t(r * got.cols + k)];
          }
        // The fit is a quantisation of the expert, not noise: relative error well below 1.
        EXPECT_LT(std::sqrt(err / ref), bits == 2 ? 0.6 : 0.35) << "projection " << p;
      }
    }
}

// The fitted copy's squared error against the [min, max] quantiser's at the same bits (quantize.h
// does that one at 4 and 8 bits; here it is written out at 2).
TEST(MissCopy, FitsBetterThanTheGroupsRange) {
  const ModelConfig c = expert_shape(256, 128);
  const QpackLayout full = full_layout(c, 4);
  const MissCopyLayout copy = MissCopyLayout::plan(full, c, 2);
  const std::vector<uint8_t> expert = random_expert(full, c, 23);
  std::vector<uint8_t> copy_blob(copy.stride), slot(full.expert_stride);
  make_miss_copy(full, copy, c, expert.data(), copy_blob.data());
  std::memcpy(slot.data() + (full.expert_stride - copy.stride), copy_blob.data(), copy.stride);
  expand_miss_copy(full, copy, c, slot.data());
  double fitted = 0, ranged = 0;
  for (int p = 0; p < 3; ++p) {
    const std::vector<float> x = dequantized(full.view(p, c, expert.data()));
    const std::vector<float> y = dequantized(full.view(p, c, slot.data()));
    for (size_t g = 0; g < x.size(); g += 64) {
      float lo = x[g], hi = x[g];
      for (size_t i = g; i < g + 64; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
      const float s = (hi - lo) / 3;
      for (size_t i = g; i < g + 64; ++i) {
        const float q = s > 0 ? std::clamp(std::nearbyint((x[i] - lo) / s), 0.0f, 3.0f) : 0.0f;
        ranged += std::pow(double(s * q + lo) - x[i], 2);
        fitted += std::pow(double(y[i]) - x[i], 2);
      }
    }
  }
  EXPECT_LT(fitted, 0.8 * ranged) << "fitted " << fitted << ", range " << ranged;
}

}  // namespace
}  // namespace swiftlet
