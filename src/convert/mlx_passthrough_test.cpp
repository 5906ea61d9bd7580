// MLX checkpoints pass through swiftlet-repack untouched, whatever each module's format: the
// test makes MLX-style checkpoints from the committed 4-bit fixtures with an unquantised router
// and shared expert gate (f32 or bf16) and with per-module 8-bit overrides in other group sizes,
// repacks them, and compares every tensor's bytes between checkpoint and container (Qwen3-Next's
// fused DeltaNet inputs row by row: the container holds them split, docs/qpack.md 4); then runs
// both through the engine.
#include "core/dtype.h"
#include "core/error.h"
#include "experts/qpack_experts.h"
#include "format/hf_config.h"
#include "format/qpack.h"
#include "format/quantize.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "io/mapped_file.h"
#include "model/weights.h"
#include "runtime/model_loader.h"
#include "convert/repack.h"
#include "support/split_inputs.h"
#include "support/test_paths.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using swiftlet::testing::fixture_dir;

struct Variant {
  const char* name;
  DType router_dtype;  // the router and shared expert gate, stored unquantised
  bool overrides;      // a few other modules re-quantised at 8 bits, in groups of 32 or 128
  bool one_layer_experts = false;  // instead: layer 1's experts' down_proj alone at 8 bits
};

const Variant kVariants[] = {{"router_f32", DType::F32, false}, {"router_bf16_8bit", DType::BF16, true}};

bool is_gate(const std::string& module) {
  return module.ends_with("mlp.gate") || module.ends_with("mlp.shared_expert_gate");
}

// The 8-bit overrides of a variant: (module suffix, group size).
int override_group(const Variant& v, const std::string& module) {
  if (v.one_layer_experts) return module.ends_with("layers.1.mlp.switch_mlp.down_proj") ? 64 : 0;
  if (!v.overrides) return 0;
  if (module.ends_with("self_attn.q_proj") || module.ends_with("switch_mlp.down_proj")) return 32;
  if (module.ends_with("embed_tokens") || module.ends_with("linear_attn.out_proj")) return 128;
  return 0;
}

// Float values of a quantised [.., rows, packed] tensor (its bits as the fixture's config says).
std::vector<float> dequantised(const TensorSet& ts, const QuantConfig& q, const std::string& module,
                               int64_t* rows, int64_t* cols) {
  const TensorView& w = ts.get(module + ".weight");
  const TensorView& s = ts.get(module + ".scales");
  const TensorView& b = ts.get(module + ".biases");
  const int bits = q.for_module(module).bits;
  *cols = w.shape.back() * 32 / bits;
  *rows = w.numel() / w.shape.back();
  const int group = int(*cols / s.shape.back());
  std::vector<float> out(size_t(*rows * *cols));
  affine_dequantize(reinterpret_cast<const uint32_t*>(w.data), reinterpret_cast<const uint16_t*>(s.data),
                    reinterpret_cast<const uint16_t*>(b.data), *rows, *cols, bits, group, out.data());
  return out;
}

// Writes dir/model.safetensors and dir/config.json: the fixture with the variant's changes.
void make_checkpoint(const std::string& fixture, const Variant& v, const std::string& dir) {
  fs::create_directories(dir);
  const TensorSet src = TensorSet::open_dir(fixture_dir(fixture));
  json cfg = json::parse(read_text_file(fixture_dir(fixture) + "/config.json"));
  const QuantConfig quant = ModelConfig::load(fixture_dir(fixture) + "/config.json").quant;
  std::deque<std::vector<uint8_t>> store;
  std::vector<TensorToWrite> out;
  auto own = [&](size_t n) -> uint8_t* { return store.emplace_back(n).data(); };
  auto set_quant = [&](const std::string& module, const json& entry) {
    for (const char* k : {"quantization", "quantization_config"})
      if (cfg.contains(k)) {
        if (entry.is_null()) cfg[k].erase(module);
        else cfg[k][module] = entry;
      }
  };
  int gates = 0;
  for (const std::string& name : src.names()) {
    const TensorView& t = src.get(name);
    const std::string module = name.substr(0, name.rfind('.'));
    const std::string part = name.substr(name.rfind('.') + 1);
    const bool quantised = src.contains(module + ".scales");
    if (quantised && is_gate(module)) {
      if (part != "weight") continue;  // scales and biases go with the weight
      int64_t rows, cols;
      const std::vector<float> f = dequantised(src, quant, module, &rows, &cols);
      uint8_t* p = own(f.size() * dtype_size(v.router_dtype));
      if (v.router_dtype == DType::F32) {
        std::memcpy(p, f.data(), f.size() * 4);
      } else {
        for (size_t i = 0; i < f.size(); ++i) reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(f[i]);
      }
      out.push_back({name, v.router_dtype, {rows, cols}, p});
      // mlx-lm leaves an unquantised module out of the block or marks it false: both occur.
      set_quant(module, gates++ % 2 ? json(false) : json());
      continue;
    }
    if (quantised && override_group(v, module) != 0) {
      if (part != "weight") continue;
      int64_t rows, cols;
      const std::vector<float> f = dequantised(src, quant, module, &rows, &cols);
      const int group = override_group(v, module);
      const AffineMatrix q = affine_quantize(f.data(), rows, cols, 8, group);
      std::vector<int64_t> lead(t.shape.begin(), t.shape.end() - 1);
      auto shaped = [&](int64_t last) {
        std::vector<int64_t> s = lead;
        s.push_back(last);
        return s;
      };
      uint8_t* w = own(q.packed.size() * 4);
      std::memcpy(w, q.packed.data(), q.packed.size() * 4);
      uint8_t* sc = own(q.scales.size() * 2);
      std::memcpy(sc, q.scales.data(), q.scales.size() * 2);
      uint8_t* bi = own(q.biases.size() * 2);
      std::memcpy(bi, q.biases.data(), q.biases.size() * 2);
      out.push_back({module + ".weight", DType::U32, shaped(cols / 4), w});
      out.push_back({module + ".scales", DType::BF16, shaped(cols / group), sc});
      out.push_back({module + ".biases", DType::BF16, shaped(cols / group), bi});
      set_quant(module, json{{"group_size", group}, {"bits", 8}});
      continue;
    }
    out.push_back({name, t.dtype, t.shape, t.data});
  }
  ASSERT_GT(gates, 0);
  write_safetensors(dir + "/model.safetensors", out, {{"format", "mlx"}});
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

class MlxPassThrough : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    fixture_ = std::get<0>(GetParam());
    variant_ = kVariants[std::get<1>(GetParam())];
    if (!fs::exists(fixture_dir(fixture_) + "/reference.json")) GTEST_SKIP() << "fixture " << fixture_ << " missing";
    root_ = fs::temp_directory_path() / fmt::format("swiftlet_mlx_{}_{}_{}", ::getpid(), fixture_, variant_.name);
    fs::remove_all(root_);
    make_checkpoint(fixture_, variant_, ckpt());
    RepackOptions o;
    o.output = container();
    repack_from_dir(ckpt(), o);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  std::string ckpt() const { return (root_ / "ckpt").string(); }
  std::string container() const { return (root_ / "model.qpack").string(); }

  std::string fixture_;
  Variant variant_{};
  fs::path root_;
};

TEST_P(MlxPassThrough, EveryTensorKeepsItsBytes) {
  const TensorSet src = TensorSet::open_dir(ckpt());
  const TensorSet dst = TensorSet::open_files({container() + "/model.safetensors"});
  const ModelConfig c = ModelConfig::load(ckpt() + "/config.json");
  // Every resident tensor of the checkpoint is in the container, with its dtype, shape and bytes;
  // Qwen3-Next's fused DeltaNet inputs as their split parts, row by row.
  size_t resident = 0, fused = 0, float_gates = 0;
  for (const std::string& n : src.names()) {
    if (n.find(".switch_mlp.") != std::string::npos) continue;
    const TensorView& s = src.get(n);
    const std::string module = n.substr(0, n.rfind('.'));
    float_gates += is_gate(module) && is_float(s.dtype);
    if (n.find(".linear_attn.in_proj_qkvz.") != std::string::npos ||
        n.find(".linear_attn.in_proj_ba.") != std::string::npos) {
      ++fused;
      continue;
    }
    ++resident;
    const TensorView* d = dst.find(n);
    ASSERT_NE(d, nullptr) << n << " is missing from the container";
    ASSERT_EQ(dtype_name(s.dtype), dtype_name(d->dtype)) << n;
    ASSERT_EQ(s.shape, d->shape) << n;
    ASSERT_EQ(0, std::memcmp(s.data, d->data, s.nbytes)) << n;
  }
  size_t parts = 0;
  for (const std::string& n : dst.names()) {
    const auto f = swiftlet::testing::fused_rows_of(c, n);
    if (!f) continue;
    ++parts;
    const TensorView* s = src.find(f->fused_name);
    ASSERT_NE(s, nullptr) << n << " has no source " << f->fused_name;
    ASSERT_NO_FATAL_FAILURE(swiftlet::testing::expect_rows_from(*s, dst.get(n), *f));
  }
  EXPECT_EQ(parts, 2 * fused);
  EXPECT_EQ(resident + parts, dst.names().size()) << "the container holds tensors the checkpoint does not";
  EXPECT_GT(float_gates, 0u);

  // Every expert's sections in the layer files are the checkpoint's stacked tensors' slices.
  const QpackContainer qc = QpackContainer::open(container());
  const std::string prefix = qc.config.model_type == "qwen3_5_moe" ? "language_model.model.layers." : "model.layers.";
  for (int l = 0; l < qc.layout.layer_count; ++l) {
    const std::string blob = read_text_file(qc.layer_path(l));
    for (int e = 0; e < qc.layout.expert_count; ++e)
      for (const auto& sec : qc.layout.sections) {
        const TensorView& t = src.get(prefix + std::to_string(l) + ".mlp.switch_mlp." + sec.name);
        const size_t per = t.nbytes / size_t(t.shape[0]);
        ASSERT_EQ(per, sec.size) << t.name;
        ASSERT_EQ(0, std::memcmp(blob.data() + size_t(e) * qc.layout.expert_stride + sec.offset,
                                 t.data + size_t(e) * per, per))
            << t.name << " expert " << e;
      }
  }

  // The container's config describes what it holds: no entry quantises the float gates, and the
  // 8-bit overrides keep their bits and group sizes.
  std::set<int> groups;
  for (const auto& [module, spec] : qc.config.quant.overrides) {
    EXPECT_FALSE(is_gate(module) && spec.bits != 0) << module;
    if (override_group(variant_, module) != 0) {
      EXPECT_EQ(spec.bits, 8) << module;
      EXPECT_EQ(spec.group_size, override_group(variant_, module)) << module;
      groups.insert(spec.group_size);
    }
  }
  if (variant_.overrides) {
    EXPECT_EQ(groups, (std::set<int>{32, 128}));
  }
}

struct Outputs {
  std::vector<float> logits;
  std::vector<RouteRecord> routes;
};

Outputs run(const std::string& model, Backend b, const std::vector<int32_t>& tokens) {
  auto lm = load_model(model);
  Forward fwd(lm->model, b);
  fwd.set_capture(true);
  SessionState st = SessionState::create(lm->model.config);
  Outputs r;
  fwd.run(st, tokens, LogitsMode::All, r.logits);
  r.routes = fwd.routes();
  return r;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The engine runs the unquantised router: the container computes exactly what the checkpoint
// does, the fp32 kernels route as the scalar reference does, and with an f32 router holding the
// fixture's dequantised values the logits are transformers' (which used those same values).
TEST_P(MlxPassThrough, EngineRunsTheStoredRouter) {
  const json ref = json::parse(read_text_file(fixture_dir(fixture_) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const Outputs from_ckpt = run(ckpt(), Backend::Reference, tokens);
  const Outputs from_qpack = run(container(), Backend::Reference, tokens);
  EXPECT_EQ(max_abs_diff(from_ckpt.logits, from_qpack.logits), 0.0f);
  ASSERT_EQ(from_ckpt.routes.size(), from_qpack.routes.size());
  for (size_t i = 0; i < from_ckpt.routes.size(); ++i) EXPECT_EQ(from_ckpt.routes[i].experts, from_qpack.routes[i].experts);

  const Outputs fast = run(container(), Backend::CpuF32, tokens);
  EXPECT_LT(max_abs_diff(fast.logits, from_qpack.logits), 1e-3f);
  ASSERT_EQ(fast.routes.size(), from_qpack.routes.size());
  for (size_t i = 0; i < fast.routes.size(); ++i)
    EXPECT_EQ(fast.routes[i].experts, from_qpack.routes[i].experts) << "layer " << fast.routes[i].layer;

  if (variant_.router_dtype == DType::F32 && !variant_.overrides) {
    const std::string b = read_text_file(fixture_dir(fixture_) + "/prefill_logits.f32");
    std::vector<float> want(b.size() / 4);
    std::memcpy(want.data(), b.data(), b.size());
    EXPECT_LT(max_abs_diff(from_qpack.logits, want), 1e-3f);
  }
}

// The checkpoint's weights dequantised by the test (each module at its own bits and group size,
// format/quantize.h) and stored as fp32, without a quantization block: the float model the
// mixed-precision checkpoint stands for.
void write_dequantised(const std::string& ckpt, const std::string& dir) {
  fs::create_directories(dir);
  const TensorSet src = TensorSet::open_dir(ckpt);
  json cfg = json::parse(read_text_file(ckpt + "/config.json"));
  const QuantConfig quant = ModelConfig::load(ckpt + "/config.json").quant;
  cfg.erase("quantization");
  cfg.erase("quantization_config");
  std::deque<std::vector<float>> store;
  std::vector<TensorToWrite> out;
  for (const std::string& name : src.names()) {
    const TensorView& t = src.get(name);
    const std::string module = name.substr(0, name.rfind('.'));
    if (!src.contains(module + ".scales")) {
      out.push_back({name, t.dtype, t.shape, t.data});
      continue;
    }
    if (!name.ends_with(".weight")) continue;
    int64_t rows, cols;
    store.push_back(dequantised(src, quant, module, &rows, &cols));
    std::vector<int64_t> shape(t.shape.begin(), t.shape.end() - 1);
    shape.push_back(cols);
    out.push_back({name, DType::F32, shape, store.back().data()});
  }
  write_safetensors(dir + "/model.safetensors", out, {{"format", "mlx"}});
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

// Mixed precision is never silently wrong: the container gives the logits of its checkpoint's
// weights dequantised module by module (the 8-bit modules in groups of 32 and 128 included).
TEST_P(MlxPassThrough, LogitsAreThoseOfTheDequantisedWeights) {
  const json ref = json::parse(read_text_file(fixture_dir(fixture_) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  write_dequantised(ckpt(), (root_ / "float").string());
  const Outputs want = run((root_ / "float").string(), Backend::Reference, tokens);
  const Outputs got = run(container(), Backend::Reference, tokens);
  EXPECT_LT(max_abs_diff(got.logits, want.logits), 1e-4f);
  ASSERT_EQ(got.routes.size(), want.routes.size());
  for (size_t i = 0; i < got.routes.size(); ++i) EXPECT_EQ(got.routes[i].experts, want.routes[i].experts);
}

// Experts of one layer at another precision than the rest: a container holds all experts in one
// format, so the repack refuses, naming the layer and the projection of both formats.
TEST(MlxMixedExperts, ARepackRefusesThemNamingTheModules) {
  const std::string fixture = "next_mlx4";
  if (!fs::exists(fixture_dir(fixture) + "/reference.json")) GTEST_SKIP() << "fixture " << fixture << " missing";
  const fs::path dir = fs::temp_directory_path() / fmt::format("swiftlet_mlx_mixed_{}", ::getpid());
  fs::remove_all(dir);
  make_checkpoint(fixture, {"experts_mixed", DType::F32, false, true}, (dir / "ckpt").string());
  RepackOptions o;
  o.output = (dir / "m.qpack").string();
  std::string e;
  try {
    repack_from_dir((dir / "ckpt").string(), o);
  } catch (const Error& x) {
    e = x.what();
  }
  fs::remove_all(dir);
  EXPECT_NE(e.find("layer 1 expert 0 down_proj is stored as 8-bit"), std::string::npos) << e;
  EXPECT_NE(e.find("but layer 0 expert 0 as 4-bit"), std::string::npos) << e;
  EXPECT_NE(e.find("holds all experts in one format"), std::string::npos) << e;
}

// The loader reads bits and group size from the shapes, as mlx-lm's checkpoints make them, so a
// config that leaves an 8-bit module out of its quantization block still loads; an entry that
// contradicts the stored shapes is an error naming the module.
TEST(MlxConfig, ShapesDecideBitsAndAContradictingEntryIsAnError) {
  const std::string fixture = "next_mlx4";
  if (!fs::exists(fixture_dir(fixture) + "/reference.json")) GTEST_SKIP() << "fixture " << fixture << " missing";
  const fs::path dir = fs::temp_directory_path() / fmt::format("swiftlet_mlx_cfg_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "model.safetensors.index.json"})
    fs::create_symlink(fixture_dir(fixture) + "/" + f, dir / f);
  const json base = json::parse(read_text_file(fixture_dir(fixture) + "/config.json"));
  const json ref = json::parse(read_text_file(fixture_dir(fixture) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const std::string b = read_text_file(fixture_dir(fixture) + "/prefill_logits.f32");
  std::vector<float> want(b.size() / 4);
  std::memcpy(want.data(), b.data(), b.size());

  json undeclared = base;
  undeclared["quantization"].erase("model.layers.0.mlp.gate");  // stored at 8 bits, default 4
  std::ofstream(dir / "config.json") << undeclared.dump(2);
  EXPECT_LT(max_abs_diff(run(dir.string(), Backend::Reference, tokens).logits, want), 1e-3f);

  json wrong = base;
  wrong["quantization"]["model.layers.1.linear_attn.out_proj"] = {{"group_size", 64}, {"bits", 8}};
  std::ofstream(dir / "config.json") << wrong.dump(2);
  std::string error;
  try {
    load_model(dir.string());
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("'model.layers.1.linear_attn.out_proj' is stored with 4 bits in groups of 64 but config.json "
                       "declares 8 bits"),
            std::string::npos)
      << error;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Repack, MlxPassThrough,
                         ::testing::Combine(::testing::Values("next_mlx4", "q35_mlx4"), ::testing::Values(0, 1)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kVariants[std::get<1>(info.param)].name;
                         });

}  // namespace
}  // namespace swiftlet
