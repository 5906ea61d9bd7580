// The .qpack version-1 layout: published sizes, JSON round trips, and the validation that
// rejects layouts and manifests that disagree with the model or the format.
#include "format/qpack.h"

#include "core/error.h"
#include "format/quantize.h"
#include "kernels/cpu/ops_ref.h"

#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstring>
#include <random>

namespace swiftlet {
namespace {

using nlohmann::json;

ModelConfig next80b() {
  json j = {{"model_type", "qwen3_next"}, {"hidden_size", 2048}, {"num_hidden_layers", 48},
            {"vocab_size", 151936}, {"num_attention_heads", 16}, {"num_key_value_heads", 2},
            {"head_dim", 256}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e7},
            {"linear_num_key_heads", 16}, {"linear_num_value_heads", 32}, {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128}, {"num_experts", 512}, {"num_experts_per_tok", 10},
            {"moe_intermediate_size", 512}, {"shared_expert_intermediate_size", 512},
            {"full_attention_interval", 4}};
  return ModelConfig::parse(j, "test config");
}

std::array<ProjectionFormat, 3> all(ProjectionFormat f) { return {f, f, f}; }

using swiftlet::testing::error_of;

TEST(QpackFormat, LayoutOf80BMatchesPublishedStride) {
  const ModelConfig c = next80b();
  auto f4 = all({4, 64, DType::BF16});
  QpackLayout l = QpackLayout::plan(c, f4.data());
  EXPECT_EQ(l.expert_count, 512);
  EXPECT_EQ(l.layer_count, 48);
  EXPECT_EQ(l.expert_stride, 1769472u);  // docs/qpack-format.md: exactly 1,769,472 bytes
  EXPECT_EQ(l.payload(), 1769472u);
  ASSERT_EQ(l.sections.size(), 9u);
  const char* names[] = {"gate_proj.weight", "gate_proj.scales", "gate_proj.biases",
                         "up_proj.weight",   "up_proj.scales",   "up_proj.biases",
                         "down_proj.weight", "down_proj.scales", "down_proj.biases"};
  uint64_t off = 0;
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(l.sections[i].name, names[i]);
    EXPECT_EQ(l.sections[i].offset, off);
    off += l.sections[i].size;
  }
  EXPECT_EQ(l.find("up_proj.weight")->offset, 589824u);  // one projection = 589,824 bytes
  EXPECT_EQ(l.find("gate_proj.weight")->shape, (std::vector<int64_t>{512, 256}));
  EXPECT_EQ(l.find("gate_proj.weight")->dtype, DType::U32);
  EXPECT_EQ(l.find("down_proj.weight")->shape, (std::vector<int64_t>{2048, 64}));
  EXPECT_EQ(l.find("down_proj.scales")->shape, (std::vector<int64_t>{2048, 8}));
  EXPECT_NO_THROW(l.validate(c, "test"));

  auto f8 = all({8, 64, DType::BF16});
  EXPECT_EQ(QpackLayout::plan(c, f8.data()).expert_stride, 3342336u);

  auto f16 = all({16, 64, DType::BF16});
  QpackLayout l16 = QpackLayout::plan(c, f16.data());
  ASSERT_EQ(l16.sections.size(), 3u);
  EXPECT_EQ(l16.sections[2].name, "down_proj.weight");
  EXPECT_EQ(l16.sections[2].dtype, DType::BF16);
  EXPECT_EQ(l16.expert_stride, 3u * 512 * 2048 * 2);
  EXPECT_EQ(l16.projection_format(1, c), (ProjectionFormat{16, 64, DType::BF16}));
  EXPECT_EQ(l.projection_format(2, c), (ProjectionFormat{4, 64, DType::BF16}));
}

TEST(QpackFormat, LayoutJsonRoundTripsAndStrideIsAligned) {
  const ModelConfig c = next80b();
  std::array<ProjectionFormat, 3> mixed = {ProjectionFormat{4, 64, DType::BF16}, ProjectionFormat{4, 64, DType::BF16},
                                           ProjectionFormat{8, 32, DType::F16}};
  QpackLayout l = QpackLayout::plan(c, mixed.data());
  EXPECT_EQ(l.expert_stride % kQpackStrideAlign, 0u);
  EXPECT_GE(l.expert_stride, l.payload());
  QpackLayout back = QpackLayout::parse(json::parse(l.to_json().dump()), "rt");
  EXPECT_EQ(back.to_json().dump(), l.to_json().dump());
  EXPECT_NO_THROW(back.validate(c, "rt"));
  EXPECT_EQ(back.projection_format(2, c), (ProjectionFormat{8, 32, DType::F16}));
  EXPECT_EQ(back.linear_layers, c.linear_layers);
}

TEST(QpackFormat, LayoutThatDisagreesWithConfigIsRejected) {
  const ModelConfig c = next80b();
  auto f4 = all({4, 64, DType::BF16});
  const QpackLayout good = QpackLayout::plan(c, f4.data());
  auto err = [&](auto mutate) {
    QpackLayout l = good;
    mutate(l);
    return error_of([&] { l.validate(c, "layout.json"); });
  };
  auto has = [](const std::string& e, const char* what) { return e.find(what) != std::string::npos; };
  std::string e = err([](QpackLayout& l) { l.expert_count = 256; });
  EXPECT_TRUE(has(e, "expertCount 256") && has(e, "num_experts 512")) << e;
  e = err([](QpackLayout& l) { l.layer_count = 40; });
  EXPECT_TRUE(has(e, "layerCount 40")) << e;
  e = err([](QpackLayout& l) { l.linear_layers[3] = true; });
  EXPECT_TRUE(has(e, "layer 3")) << e;
  e = err([](QpackLayout& l) { l.sections[0].shape = {512, 128}; });  // 2-bit-like shape
  EXPECT_TRUE(has(e, "gate_proj")) << e;
  e = err([](QpackLayout& l) { l.sections[6].shape = {1024, 64}; l.sections[6].size = 1024 * 64 * 4; });
  EXPECT_TRUE(has(e, "down_proj")) << e;
  e = err([](QpackLayout& l) { std::swap(l.sections[1], l.sections[2]); });
  EXPECT_TRUE(has(e, "expected [gate_proj.weight, gate_proj.scales")) << e;
  e = err([](QpackLayout& l) { l.sections.pop_back(); });
  EXPECT_TRUE(has(e, "down_proj")) << e;
  e = err([](QpackLayout& l) { l.sections[4].size += 2; });
  EXPECT_TRUE(has(e, "up_proj.scales")) << e;
  e = err([](QpackLayout& l) { l.sections[4].offset -= 2; });
  EXPECT_TRUE(has(e, "overlaps")) << e;
  e = err([](QpackLayout& l) { l.sections[3].offset += 2; });  // U32 words at a 2-byte boundary
  EXPECT_TRUE(has(e, "up_proj.weight") && has(e, "not a multiple of its 4-byte U32")) << e;
  e = err([](QpackLayout& l) { l.sections[8].offset += 1; });  // BF16 biases at an odd byte
  EXPECT_TRUE(has(e, "down_proj.biases") && has(e, "2-byte")) << e;
  e = err([](QpackLayout& l) { l.expert_stride = 1769472 - 16384; });
  EXPECT_TRUE(has(e, "expertStride")) << e;
  e = err([](QpackLayout& l) { l.expert_stride = 1769472 + 4096; });
  EXPECT_TRUE(has(e, "multiple of 16384")) << e;
  e = err([](QpackLayout& l) { l.sections[1].dtype = DType::U8; l.sections[1].size /= 2; });
  EXPECT_TRUE(has(e, "float dtype")) << e;
}

TEST(QpackFormat, ManifestChecksMagicAndVersion) {
  QpackManifest m;
  m.model_name = "qwen3_next";
  m.files = {{"model.safetensors", 123}, {"packed_experts/layer_00.bin", 456}};
  json j = json::parse(m.to_json().dump());
  EXPECT_EQ(j["magic"], "QPACK");
  EXPECT_EQ(j["version"], 1);
  QpackManifest back = QpackManifest::parse(j, "manifest.json");
  EXPECT_EQ(back.files, m.files);
  EXPECT_EQ(back.quant_bits, 4);

  json bad = j;
  bad["magic"] = "GGUF";
  EXPECT_NE(error_of([&] { QpackManifest::parse(bad, "m"); }).find("magic is 'GGUF'"), std::string::npos);
  bad = j;
  bad["version"] = 2;
  EXPECT_NE(error_of([&] { QpackManifest::parse(bad, "m"); }).find("version 2 is not supported"), std::string::npos);
  bad = j;
  bad.erase("magic");
  EXPECT_NE(error_of([&] { QpackManifest::parse(bad, "m"); }).find("no 'magic'"), std::string::npos);
  bad = j;
  bad["files"]["../etc/passwd"] = 1;
  EXPECT_NE(error_of([&] { QpackManifest::parse(bad, "m"); }).find("relative path"), std::string::npos);
  // Optional fields of the wrong JSON type are errors that say so (a fuzz finding), absent ones
  // take their defaults.
  bad = j;
  bad["modelName"] = 8;
  EXPECT_NE(error_of([&] { QpackManifest::parse(bad, "m"); }).find("'modelName' must be a string"), std::string::npos);
  bad = j;
  bad["quantBits"] = "4";
  EXPECT_NE(error_of([&] { QpackManifest::parse(bad, "m"); }).find("'quantBits' must be an integer"), std::string::npos);
  bad = j;
  bad.erase("modelName");
  bad.erase("quantGroupSize");
  EXPECT_EQ(QpackManifest::parse(bad, "m").model_name, "");
}

TEST(QpackFormat, Xxh3MatchesTheLibraryAtEverySize) {
  // xxh3_64 may run an AVX2 build of XXH3; the value must be the library's (and the spec's).
  std::vector<uint8_t> buf(300000);
  std::mt19937 rng(3);
  for (auto& b : buf) b = uint8_t(rng());
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(16), size_t(17), size_t(128), size_t(129), size_t(240),
                   size_t(241), size_t(1023), size_t(1024), size_t(4096), size_t(65537), buf.size()})
    for (size_t off : {size_t(0), size_t(1), size_t(7)}) {
      if (off + n > buf.size()) continue;
      ASSERT_EQ(xxh3_64(buf.data() + off, n), XXH3_64bits(buf.data() + off, n)) << n;
    }
  EXPECT_EQ(xxh3_64("", 0), 0x2d06800538d394c2ull);  // XXH3_64bits of empty input, seed 0
}

TEST(QpackFormat, ChecksumsRoundTrip) {
  QpackChecksums c;
  c.files = {{"model.safetensors", 0xfedcba9876543210ull}};
  c.experts = {{1, 2, 3}, {0xffffffffffffffffull, 0, 42}};
  QpackChecksums back = QpackChecksums::parse(json::parse(c.to_json().dump()), "checksums.json");
  EXPECT_EQ(back.files, c.files);
  EXPECT_EQ(back.experts, c.experts);
  EXPECT_EQ(hash_hex(0xabcull), "0000000000000abc");
  json bad = json::parse(c.to_json().dump());
  bad["experts"][0][1] = "xyz";
  EXPECT_NE(error_of([&] { QpackChecksums::parse(bad, "c"); }).find("layer 0 expert 1"), std::string::npos);
}

TEST(QpackFormat, ViewsReadTheSectionsOfABlob) {
  // A small model: I = 64, H = 128; gate and up 4-bit, down 8-bit.
  json j = json::parse(R"({"model_type": "qwen3_next", "hidden_size": 128, "num_hidden_layers": 2,
    "vocab_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64})");
  const ModelConfig c = ModelConfig::parse(j, "small");
  std::array<ProjectionFormat, 3> f = {ProjectionFormat{4, 64, DType::BF16}, ProjectionFormat{4, 64, DType::BF16},
                                       ProjectionFormat{8, 64, DType::BF16}};
  const QpackLayout l = QpackLayout::plan(c, f.data());
  std::vector<uint8_t> blob(l.expert_stride);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> want(3);
  for (int p = 0; p < 3; ++p) {
    const int64_t rows = p == 2 ? 128 : 64, cols = p == 2 ? 64 : 128;
    std::vector<float> w(size_t(rows * cols));
    for (auto& x : w) x = nd(rng);
    AffineMatrix q = affine_quantize(w.data(), rows, cols, f[size_t(p)].bits);
    const std::string n = kExpertProjections[p];
    std::memcpy(blob.data() + l.find(n + ".weight")->offset, q.packed.data(), q.packed.size() * 4);
    std::memcpy(blob.data() + l.find(n + ".scales")->offset, q.scales.data(), q.scales.size() * 2);
    std::memcpy(blob.data() + l.find(n + ".biases")->offset, q.biases.data(), q.biases.size() * 2);
    want[size_t(p)].resize(w.size());
    affine_dequantize(q.packed.data(), q.scales.data(), q.biases.data(), rows, cols, q.bits, 64, want[size_t(p)].data());
  }
  for (int p = 0; p < 3; ++p) {
    const QMatrix m = l.view(p, c, blob.data());
    std::vector<float> row(size_t(m.cols));
    for (int64_t r = 0; r < m.rows; ++r) {
      ref::dequant_row(m, r, row.data());
      for (int64_t k = 0; k < m.cols; ++k) ASSERT_EQ(row[size_t(k)], want[size_t(p)][size_t(r * m.cols + k)]);
    }
  }
}

}  // namespace
}  // namespace swiftlet
