// Qwen3-Next's DeltaNet inputs fused and Grouped (in_proj_qkvz, in_proj_ba), as the published
// checkpoints and Swiftlet's containers hold them, and split (in_proj_qkv, in_proj_z, in_proj_b,
// in_proj_a) as swiftlet-repack writes them (DeltaNetLayout, docs/qpack.md 4): the row order by
// hand, what repack writes, both container layouts giving the same logits (float, 4-bit, 8-bit,
// MLX pass-through), and containers holding neither whole.
#include "convert/repack.h"

#include "core/error.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "io/mapped_file.h"
#include "model/weights.h"
#include "runtime/model_info.h"
#include "runtime/model_loader.h"
#include "support/reference_logits.h"
#include "support/split_inputs.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
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
  return swiftlet::testing::reference_prefill(model, tokens);
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

// Replaces a container's model.safetensors by `tensors` (their data may point into the mapped
// original) and updates the manifest; drops checksums.json, whose resident checksum would differ.
void replace_resident(const std::string& dir, const std::vector<TensorToWrite>& tensors) {
  const std::string st = dir + "/model.safetensors";
  write_safetensors(st + ".new", tensors);
  fs::rename(st + ".new", st);
  json m = json::parse(read_text_file(dir + "/manifest.json"));
  m["files"].erase(kQpackChecksumsFile);
  m["files"]["model.safetensors"] = fs::file_size(st);
  fs::remove(dir + "/" + kQpackChecksumsFile);
  write_text(dir + "/manifest.json", m.dump(2));
}

// Turns a container of split inputs into what Swiftlet writes: per DeltaNet layer the fused
// in_proj_qkvz and in_proj_ba, rows Grouped, and no checksums.json.
void make_grouped(const std::string& dir) {
  const ModelConfig c = ModelConfig::load(dir + "/config.json");
  const std::string st = dir + "/model.safetensors";
  {
    const TensorSet ts = TensorSet::open_files({st});
    std::map<std::string, std::vector<uint8_t>> fused;  // fused name -> Grouped bytes
    std::map<std::string, TensorToWrite> fused_meta;
    std::map<std::string, size_t> rows_filled;
    std::vector<TensorToWrite> out;
    for (const std::string& name : ts.names()) {
      const TensorView& t = ts.get(name);
      const auto f = swiftlet::testing::fused_rows_of(c, name);
      if (!f) {
        out.push_back({name, t.dtype, t.shape, t.data});
        continue;
      }
      const size_t row = t.nbytes / size_t(t.shape[0]);
      rows_filled[f->fused_name] += f->rows.size();
      auto& b = fused[f->fused_name];
      b.resize(row * size_t(f->fused_rows));
      for (size_t i = 0; i < f->rows.size(); ++i) std::memcpy(b.data() + size_t(f->rows[i]) * row, t.data + i * row, row);
      std::vector<int64_t> shape = t.shape;
      shape[0] = f->fused_rows;
      fused_meta[f->fused_name] = {f->fused_name, t.dtype, shape, nullptr};
    }
    ASSERT_FALSE(fused.empty());
    ASSERT_EQ(fused.size() % size_t(2 * c.num_linear_layers()), 0u);  // two inputs a layer, each suffix
    for (auto& [name, meta] : fused_meta) {
      ASSERT_EQ(rows_filled[name], size_t(meta.shape[0])) << name << ": its parts do not cover it";
      meta.data = fused[name].data();
      out.push_back(meta);
    }
    replace_resident(dir, out);
  }
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

// swiftlet-repack writes the four split inputs, each row i of a part from the checkpoint's row
// split_row_order[first + i], and no fused input: at --bits 16 the bf16 rows pass through, so the
// bytes show it. Swiftlet, which looks for in_proj_qkvz, refuses such a container by name.
TEST(DeltaNetLayout, RepackWritesTheSplitInputs) {
  if (!has_fixture("next_8l")) GTEST_SKIP() << "fixture missing";
  TempDir tmp;
  const std::string out = container("next_8l", 16, tmp / "m.qpack");
  const ModelConfig c = ModelConfig::load(out + "/config.json");
  const TensorSet src = TensorSet::open_dir(fixture_dir("next_8l"));
  const TensorSet dst = TensorSet::open_files({out + "/model.safetensors"});
  int checked = 0;
  for (const std::string& name : dst.names()) {
    EXPECT_EQ(name.find("in_proj_qkvz"), std::string::npos) << name;
    EXPECT_EQ(name.find("in_proj_ba"), std::string::npos) << name;
    const auto f = swiftlet::testing::fused_rows_of(c, name);
    if (!f) continue;
    ASSERT_NO_FATAL_FAILURE(swiftlet::testing::expect_rows_from(src.get(f->fused_name), dst.get(name), *f));
    ++checked;
  }
  EXPECT_EQ(checked, 4 * c.num_linear_layers());
  const NameScheme n = NameScheme::detect(dst, c);
  EXPECT_EQ(stored_deltanet_layout(dst, c, n), DeltaNetLayout::Split);
  EXPECT_EQ(stored_deltanet_layout(src, c, NameScheme::detect(src, c)), DeltaNetLayout::Grouped);
}

struct LayoutCase {
  const char* fixture;
  int bits;  // 0: as stored (the MLX fixture)
};

class DeltaNetLayoutLogits : public ::testing::TestWithParam<LayoutCase> {};

// A container of fused Grouped inputs (Swiftlet's) is reordered at load: its logits equal those of
// the same weights written split, bit for bit, and so do those of the checkpoint where the
// container holds its exact weights (bf16 at --bits 16, the MLX fixture's bytes).
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
    if (name.find("in_proj_qkvz.") != std::string::npos || name.find("in_proj_ba.") != std::string::npos)
      fused += ts.get(name).nbytes;
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

// Drops tensors from a container's model.safetensors (and its checksums, which then differ).
void drop_tensors(const std::string& dir, const std::vector<std::string>& names) {
  const std::string st = dir + "/model.safetensors";
  {
    const TensorSet ts = TensorSet::open_files({st});
    std::vector<TensorToWrite> out;
    for (const std::string& name : ts.names()) {
      const TensorView& t = ts.get(name);
      if (std::find(names.begin(), names.end(), name) == names.end()) out.push_back({name, t.dtype, t.shape, t.data});
    }
    ASSERT_EQ(out.size() + names.size(), ts.names().size());
    replace_resident(dir, out);
  }
}

// A container that holds a layer's inputs in neither layout whole is refused, naming the tensor
// that is missing, before anything runs.
TEST(DeltaNetLayout, IncompleteInputsAreAClearError) {
  if (!has_fixture("next_8l")) GTEST_SKIP() << "fixture missing";
  TempDir tmp;
  const std::string split = container("next_8l", 16, tmp / "split.qpack");
  const ModelConfig c = ModelConfig::load(split + "/config.json");
  int first = 0;
  while (!c.is_linear_layer(first)) ++first;
  const std::string z = "model.layers." + std::to_string(first) + ".linear_attn.in_proj_z.weight";
  ASSERT_NO_FATAL_FAILURE(drop_tensors(split, {z}));
  std::string e = error_of([&] { load_model(split); });
  EXPECT_NE(e.find("missing tensor '" + z + "'"), std::string::npos) << e;

  // Fused in the first DeltaNet layer, split parts missing in a later one.
  const std::string grouped = container("next_8l", 16, tmp / "grouped.qpack");
  ASSERT_NO_FATAL_FAILURE(make_grouped(grouped));
  int last = c.num_layers - 1;
  while (!c.is_linear_layer(last)) --last;
  ASSERT_GT(last, first);
  const std::string ba = "model.layers." + std::to_string(last) + ".linear_attn.in_proj_ba.weight";
  ASSERT_NO_FATAL_FAILURE(drop_tensors(grouped, {ba}));
  e = error_of([&] { load_model(grouped); });
  EXPECT_NE(e.find("missing tensor '" + ba + "'"), std::string::npos) << e;
}

}  // namespace
}  // namespace swiftlet
