// Qwen3-Next's fused DeltaNet inputs (in_proj_qkvz, in_proj_ba) in the Grouped order of the
// published checkpoints and of version-1 containers, and in the Split order swiftlet-repack writes
// (DeltaNetLayout, docs/qpack.md 2): the row order by hand, what repack records and writes, both
// container layouts giving the same logits (float, 4-bit, 8-bit, MLX pass-through), and bad values.
#include "convert/repack.h"

#include "core/error.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "io/mapped_file.h"
#include "model/weights.h"
#include "runtime/model_info.h"
#include "runtime/model_loader.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using swiftlet::testing::error_of;
using swiftlet::testing::fixture_dir;
using TempDir = swiftlet::testing::ScratchDir;

bool has_fixture(const std::string& name) { return fs::exists(fixture_dir(name) + "/reference.json"); }

// Every position's logits of the fixture's reference prompt.
std::vector<float> prefill(const std::string& model, const std::string& fixture) {
  const json ref = json::parse(read_text_file(fixture_dir(fixture) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  auto lm = load_model(model);
  Forward fwd(lm->model, Backend::Reference);
  SessionState st = SessionState::create(lm->model.config);
  std::vector<float> logits;
  fwd.run(st, tokens, LogitsMode::All, logits);
  return logits;
}

std::string container(const std::string& fixture, int bits, const std::string& out) {
  RepackOptions o;
  o.output = out;
  o.bits = bits;
  return repack_from_dir(fixture_dir(fixture), o).output;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

FusedInput fused_of(const std::string& name) {
  if (name.find("linear_attn.in_proj_qkvz.") != std::string::npos) return FusedInput::Qkvz;
  if (name.find("linear_attn.in_proj_ba.") != std::string::npos) return FusedInput::Ba;
  return FusedInput::None;
}

// Turns a Split container into what a version-1 writer (Swiftlet, or swiftlet before the layout
// field) makes: the fused inputs' rows back in the Grouped order, no deltanetLayout in the manifest,
// and no checksums.json.
void make_grouped(const std::string& dir) {
  const ModelConfig c = ModelConfig::load(dir + "/config.json");
  const std::string st = dir + "/model.safetensors";
  {
    const TensorSet ts = TensorSet::open_files({st});
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<TensorToWrite> out;
    int moved = 0;
    for (const std::string& name : ts.names()) {
      const TensorView& t = ts.get(name);
      const FusedInput which = fused_of(name);
      if (which == FusedInput::None) {
        out.push_back({name, t.dtype, t.shape, t.data});
        continue;
      }
      const std::vector<int64_t> order = split_row_order(c, which);
      ASSERT_EQ(int64_t(order.size()), t.shape[0]) << name;
      const size_t row = t.nbytes / order.size();
      auto& b = bufs.emplace_back(t.nbytes);
      for (size_t i = 0; i < order.size(); ++i) std::memcpy(b.data() + size_t(order[i]) * row, t.data + i * row, row);
      out.push_back({name, t.dtype, t.shape, b.data()});
      ++moved;
    }
    ASSERT_GT(moved, 0);
    write_safetensors(st + ".new", out);
  }
  fs::rename(st + ".new", st);
  json m = json::parse(read_text_file(dir + "/manifest.json"));
  ASSERT_EQ(m.value("deltanetLayout", ""), "split");
  m.erase("deltanetLayout");
  m["files"].erase(kQpackChecksumsFile);
  m["files"]["model.safetensors"] = fs::file_size(st);
  fs::remove(dir + "/" + kQpackChecksumsFile);
  write_text(dir + "/manifest.json", m.dump(2));
}

// Worked by hand for 2 key heads of 2 value heads each, dk = dv = 1. Grouped in_proj_qkvz rows:
// head 0 q0 k0 v0 v1 z0 z1 (rows 0-5), head 1 q1 k1 v2 v3 z2 z3 (rows 6-11); in_proj_ba: head 0
// b0 b1 a0 a1, head 1 b2 b3 a2 a3. Split: q0 q1 k0 k1 v0..v3 z0..z3, and b0..b3 a0..a3.
TEST(DeltaNetLayout, SplitRowOrderByHand) {
  ModelConfig c;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 1;
  c.linear_value_head_dim = 1;
  EXPECT_EQ(split_row_order(c, FusedInput::Qkvz), (std::vector<int64_t>{0, 6, 1, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
  EXPECT_EQ(split_row_order(c, FusedInput::Ba), (std::vector<int64_t>{0, 1, 4, 5, 2, 3, 6, 7}));
  // dk = 2, dv = 3, one value head a key head: q_g, k_g, v_g, z_g blocks of whole heads move.
  c.linear_num_value_heads = 2;
  c.linear_key_head_dim = 2;
  c.linear_value_head_dim = 3;
  EXPECT_EQ(split_row_order(c, FusedInput::Qkvz),
            (std::vector<int64_t>{0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 6, 14, 15, 16, 7, 8, 9, 17, 18, 19}));
}

// swiftlet-repack says "split" and writes each fused input's row i from the checkpoint's row
// split_row_order[i]: at --bits 16 the bf16 rows pass through, so the bytes show it.
TEST(DeltaNetLayout, RepackRecordsAndWritesTheSplitLayout) {
  if (!has_fixture("next_8l")) GTEST_SKIP() << "fixture missing";
  TempDir tmp;
  const std::string out = container("next_8l", 16, tmp / "m.qpack");
  const json m = json::parse(read_text_file(out + "/manifest.json"));
  EXPECT_EQ(m.value("deltanetLayout", ""), "split");
  const ModelConfig c = ModelConfig::load(out + "/config.json");
  const TensorSet src = TensorSet::open_dir(fixture_dir("next_8l"));
  const TensorSet dst = TensorSet::open_files({out + "/model.safetensors"});
  int checked = 0;
  for (const std::string& name : dst.names()) {
    const FusedInput which = fused_of(name);
    if (which == FusedInput::None) continue;
    const TensorView& a = src.get(name);
    const TensorView& b = dst.get(name);
    ASSERT_EQ(a.dtype, b.dtype) << name;
    ASSERT_EQ(a.nbytes, b.nbytes) << name;
    const std::vector<int64_t> order = split_row_order(c, which);
    const size_t row = a.nbytes / order.size();
    for (size_t i = 0; i < order.size(); ++i)
      ASSERT_EQ(0, std::memcmp(b.data + i * row, a.data + size_t(order[i]) * row, row)) << name << " row " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 2 * c.num_linear_layers());
}

struct LayoutCase {
  const char* fixture;
  int bits;  // 0: as stored (the MLX fixture)
};

class DeltaNetLayoutLogits : public ::testing::TestWithParam<LayoutCase> {};

// A container in the old (Grouped) layout is reordered at load: its logits equal those of the same
// weights written Split, bit for bit, and so do those of the checkpoint where the container holds
// its exact weights (bf16 at --bits 16, the MLX fixture's bytes).
TEST_P(DeltaNetLayoutLogits, OldAndNewContainersAgree) {
  const LayoutCase p = GetParam();
  if (!has_fixture(p.fixture)) GTEST_SKIP() << "fixture missing";
  TempDir tmp;
  const std::string split = container(p.fixture, p.bits, tmp / "split.qpack");
  const std::string grouped = container(p.fixture, p.bits, tmp / "grouped.qpack");
  ASSERT_NO_FATAL_FAILURE(make_grouped(grouped));
  ASSERT_NE(read_text_file(split + "/model.safetensors"), read_text_file(grouped + "/model.safetensors"));
  const std::vector<float> a = prefill(split, p.fixture), b = prefill(grouped, p.fixture);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  if (p.bits == 16 || p.bits == 0) {
    EXPECT_EQ(a, prefill(fixture_dir(p.fixture), p.fixture));
  }
  // The Grouped container's resident memory counts the reordered copy of the fused inputs.
  uint64_t fused = 0;
  const TensorSet ts = TensorSet::open_files({grouped + "/model.safetensors"});
  for (const std::string& name : ts.names())
    if (fused_of(name) != FusedInput::None) fused += ts.get(name).nbytes;
  EXPECT_GT(fused, 0u);
  EXPECT_EQ(summarize_model(split).resident_bytes, fs::file_size(split + "/model.safetensors"));
  EXPECT_EQ(summarize_model(grouped).resident_bytes, fs::file_size(grouped + "/model.safetensors") + fused);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeltaNetLayoutLogits,
                         ::testing::Values(LayoutCase{"next_8l", 16}, LayoutCase{"next_8l", 4},
                                           LayoutCase{"next_8l", 8}, LayoutCase{"next_mlx4", 0}),
                         [](const auto& info) {
                           return std::string(info.param.fixture) + "_" + std::to_string(info.param.bits) + "bit";
                         });

// An unknown or mistyped deltanetLayout is refused with what to do, before anything runs.
TEST(DeltaNetLayout, UnknownLayoutIsAClearError) {
  if (!has_fixture("next_8l")) GTEST_SKIP() << "fixture missing";
  TempDir tmp;
  const std::string out = container("next_8l", 4, tmp / "m.qpack");
  json m = json::parse(read_text_file(out + "/manifest.json"));
  for (const json& bad : {json("diagonal"), json(2), json("Split")}) {
    m["deltanetLayout"] = bad;
    write_text(out + "/manifest.json", m.dump(2));
    const std::string e = error_of([&] { load_model(out); });
    EXPECT_NE(e.find("deltanetLayout"), std::string::npos) << e;
    EXPECT_NE(e.find(bad.is_string() ? "'" + bad.get<std::string>() + "'" : bad.dump()), std::string::npos) << e;
    EXPECT_NE(e.find("\"grouped\" and \"split\""), std::string::npos) << e;
    EXPECT_NE(e.find("update swiftlet"), std::string::npos) << e;
  }
  m["deltanetLayout"] = "grouped";  // a known value: loads (the rows are then read as Grouped)
  write_text(out + "/manifest.json", m.dump(2));
  EXPECT_NO_THROW(load_model(out));
}

}  // namespace
}  // namespace swiftlet
