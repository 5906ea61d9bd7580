// swiftlet-repack --from-gguf: the committed Hugging Face fixtures written as GGUF files the way
// llama.cpp's convert_hf_to_gguf.py writes them (its renames and transforms, applied here from
// the description of that script: norms + 1, A_log -> -exp(A_log), conv1d squeezed, Qwen3-Next's
// in_proj_qkvz split, Qwen3.5's value heads tiled, experts stacked), converted back, and run:
// the logits must be transformers' (the fixtures' own references).
#include "convert/repack.h"

#include "core/dtype.h"
#include "core/error.h"
#include "experts/tensor_experts.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/safetensors.h"
#include "kernels/cpu/ops_ref.h"
#include "model/weights.h"
#include "runtime/model_loader.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::error_of;
using swiftlet::testing::fixture_dir;
using swiftlet::testing::max_abs_diff;
using swiftlet::testing::read_f32;
using swiftlet::testing::ScratchDir;

// --------------------------------------------------------------------- a GGUF writer for tests

// Blocks of Q8_0 / Q4_0 by the reference quantisers' rules (ggml's quantize_row_*_ref).
std::string quantise_q8_0(const float* x, int64_t n) {
  std::string out;
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    out.append(reinterpret_cast<const char*>(&dh), 2);
    for (int j = 0; j < 32; ++j) out.push_back(char(int8_t(std::lround(x[b + j] * id))));
  }
  return out;
}

std::string quantise_q4_0(const float* x, int64_t n) {
  std::string out;
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0, m = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[b + j]) > amax) amax = std::fabs(x[b + j]), m = x[b + j];
    const float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d);
    out.append(reinterpret_cast<const char*>(&dh), 2);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, int(x[b + j] * id + 8.5f));
      const int hi = std::min(15, int(x[b + 16 + j] * id + 8.5f));
      out.push_back(char(lo | hi << 4));
    }
  }
  return out;
}

// Matrices (rows of `row` values) in `type` where their rows are whole blocks, else F32.
void add(GgufWriter& w, const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v,
         GgmlType type = GgmlType::F32) {
  const int64_t row = ne[0];
  if ((type == GgmlType::Q8_0 || type == GgmlType::Q4_0) && row % 32 != 0) type = GgmlType::F32;
  std::string bytes;
  if (type == GgmlType::Q8_0) bytes = quantise_q8_0(v.data(), int64_t(v.size()));
  else if (type == GgmlType::Q4_0) bytes = quantise_q4_0(v.data(), int64_t(v.size()));
  else if (type == GgmlType::F32) bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  else
    for (float x : v) {
      const uint16_t h = type == GgmlType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
      bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  w.add_tensor(name, type, std::move(ne), std::move(bytes));
}

std::vector<float> matrix_f32(const TensorSet& ts, const std::string& path, int64_t rows, int64_t cols,
                              const ModelConfig& c) {
  const QMatrix m = view_linear(ts, path, rows, cols, c.quant);
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) ref::dequant_row(m, r, v.data() + r * cols);
  return v;
}

std::vector<float> vector_f32(const TensorSet& ts, const std::string& name) {
  const TensorView& t = ts.get(name);
  std::vector<float> v(size_t(t.numel()));
  to_f32(t.dtype, t.data, v.data(), v.size());
  return v;
}

// Blocks of `head_dim` rows (of `cols` values) from row0 on: value head g * r + j of the
// checkpoint goes to j * key_heads + g (llama.cpp's tiled order for qwen35moe).
void tile_rows(std::vector<float>& m, int64_t cols, int64_t row0, int64_t head_dim, const ModelConfig& c) {
  const int64_t hk = c.linear_num_key_heads, r = c.linear_num_value_heads / hk;
  if (r == 1) return;
  const std::vector<float> in(m.begin() + row0 * cols, m.begin() + (row0 + hk * r * head_dim) * cols);
  for (int64_t g = 0; g < hk; ++g)
    for (int64_t j = 0; j < r; ++j)
      std::memcpy(m.data() + (row0 + (j * hk + g) * head_dim) * cols, in.data() + (g * r + j) * head_dim * cols,
                  size_t(head_dim * cols) * 4);
}

struct GgufWriteOptions {
  GgmlType matrices = GgmlType::F32;  // type of the weight matrices (1-D tensors stay F32)
  bool fused_qkvz = false;            // Qwen3-Next: ssm_in (older files) instead of attn_qkv + attn_gate
};

// Writes the Hugging Face checkpoint `dir` as llama.cpp would convert it.
void write_as_gguf(const std::string& dir, const std::string& out, const GgufWriteOptions& o) {
  const ModelConfig c = ModelConfig::load(dir + "/config.json");
  const TensorSet ts = TensorSet::open_dir(dir);
  const NameScheme n = NameScheme::detect(ts, c);
  ASSERT_FALSE(norms_hold_one_plus_w(ts, c, n)) << "a Hugging Face fixture is expected";
  const bool next = c.family == Family::Qwen3Next;
  const std::string arch = next ? "qwen3next" : "qwen35moe", a = arch + ".";
  GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_u32(a + "block_count", uint32_t(c.num_layers));
  w.set_u32(a + "embedding_length", uint32_t(c.hidden_size));
  w.set_u32(a + "attention.head_count", uint32_t(c.num_heads));
  w.set_u32(a + "attention.head_count_kv", uint32_t(c.num_kv_heads));
  w.set_u32(a + "attention.key_length", uint32_t(c.head_dim));
  w.set_u32(a + "attention.value_length", uint32_t(c.head_dim));
  w.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.set_f32(a + "rope.freq_base", c.rope_theta);
  w.set_u32(a + "rope.dimension_count", uint32_t(c.rotary_dim()));
  w.set_u32(a + "ssm.conv_kernel", uint32_t(c.linear_conv_kernel_dim));
  w.set_u32(a + "ssm.state_size", uint32_t(c.linear_key_head_dim));
  w.set_u32(a + "ssm.group_count", uint32_t(c.linear_num_key_heads));
  w.set_u32(a + "ssm.time_step_rank", uint32_t(c.linear_num_value_heads));
  w.set_u32(a + "ssm.inner_size", uint32_t(c.linear_value_dim()));
  int interval = 1;
  while (interval <= c.num_layers && c.is_linear_layer(interval - 1)) ++interval;
  for (int l = 0; l < c.num_layers; ++l) ASSERT_EQ(c.is_linear_layer(l), (l + 1) % interval != 0);
  w.set_u32(a + "full_attention_interval", uint32_t(interval));
  w.set_u32(a + "expert_count", uint32_t(c.num_experts));
  w.set_u32(a + "expert_used_count", uint32_t(c.num_experts_per_tok));
  w.set_u32(a + "expert_feed_forward_length", uint32_t(c.moe_intermediate_size));
  w.set_u32(a + "expert_shared_feed_forward_length", uint32_t(c.shared_expert_intermediate_size));

  const int64_t H = c.hidden_size, kd = c.linear_key_dim(), dv = c.linear_value_head_dim;
  const GgmlType mt = o.matrices;
  ModelWeights scratch;
  std::vector<DenseTensorSpec> specs;
  for_each_dense_tensor(c, n, scratch, [&](const DenseTensorSpec& s, auto&&, auto&&) { specs.push_back(s); },
                        stored_deltanet_layout(ts, c, n));
  for (const DenseTensorSpec& s : specs) {
    std::string what = s.name, b;
    if (s.name.starts_with(n.layers)) {
      const std::string rest = s.name.substr(n.layers.size());
      b = "blk." + rest.substr(0, rest.find('.')) + ".";
      what = rest.substr(rest.find('.') + 1);
    }
    if (s.name == n.embed) add(w, "token_embd.weight", {H, s.rows}, matrix_f32(ts, s.name, s.rows, s.cols, c), mt);
    else if (s.name == n.lm_head) add(w, "output.weight", {H, s.rows}, matrix_f32(ts, s.name, s.rows, s.cols, c), mt);
    else if (s.kind == TensorKind::ZeroCentredNorm) {
      std::vector<float> v = vector_f32(ts, s.name);
      for (float& x : v) x += 1.0f;  // llama.cpp stores 1 + w
      static const std::map<std::string, std::string> kNorms = {
          {"input_layernorm.weight", "attn_norm.weight"},
          {"post_attention_layernorm.weight", "post_attention_norm.weight"},
          {"self_attn.q_norm.weight", "attn_q_norm.weight"},
          {"self_attn.k_norm.weight", "attn_k_norm.weight"}};
      add(w, s.name == n.final_norm ? "output_norm.weight" : b + kNorms.at(what), {s.rows}, v);
    } else if (what == "linear_attn.in_proj_qkvz") {
      const std::vector<float> v = matrix_f32(ts, s.name, s.rows, s.cols, c);
      if (o.fused_qkvz) {
        add(w, b + "ssm_in.weight", {H, s.rows}, v, mt);
        continue;
      }
      const std::vector<int64_t> order = split_row_order(c, FusedInput::Qkvz);
      std::vector<float> qkv, z;
      for (size_t i = 0; i < order.size(); ++i)
        (int64_t(i) < c.conv_dim() ? qkv : z).insert((int64_t(i) < c.conv_dim() ? qkv : z).end(),
                                                    v.begin() + order[i] * H, v.begin() + (order[i] + 1) * H);
      add(w, b + "attn_qkv.weight", {H, c.conv_dim()}, qkv, mt);
      add(w, b + "attn_gate.weight", {H, c.linear_value_dim()}, z, mt);
    } else if (what == "linear_attn.in_proj_ba") {
      add(w, b + "ssm_ba.weight", {H, s.rows}, matrix_f32(ts, s.name, s.rows, s.cols, c), mt);
    } else if (what == "linear_attn.in_proj_qkv" || what == "linear_attn.in_proj_z" ||
               what == "linear_attn.in_proj_b" || what == "linear_attn.in_proj_a") {
      std::vector<float> v = matrix_f32(ts, s.name, s.rows, s.cols, c);
      const char* to = what.ends_with("qkv") ? "attn_qkv.weight" : what.ends_with("_z") ? "attn_gate.weight"
                       : what.ends_with("_b") ? "ssm_beta.weight" : "ssm_alpha.weight";
      tile_rows(v, H, what.ends_with("qkv") ? 2 * kd : 0, what.ends_with("qkv") || what.ends_with("_z") ? dv : 1, c);
      add(w, b + to, {H, s.rows}, v, mt);
    } else if (what == "linear_attn.conv1d.weight") {
      std::vector<float> v = vector_f32(ts, s.name);  // [C, 1, K]: the bytes of [C, K]
      if (!next) tile_rows(v, s.cols, 2 * kd, dv, c);
      add(w, b + "ssm_conv1d.weight", {s.cols, s.rows}, v);
    } else if (what == "linear_attn.A_log" || what == "linear_attn.dt_bias") {
      std::vector<float> v = vector_f32(ts, s.name);
      if (what.ends_with("A_log"))
        for (float& x : v) x = -std::exp(x);
      if (!next) tile_rows(v, 1, 0, 1, c);
      add(w, b + (what.ends_with("A_log") ? "ssm_a" : "ssm_dt.bias"), {s.rows}, v);
    } else if (what == "linear_attn.norm.weight") {
      add(w, b + "ssm_norm.weight", {s.rows}, vector_f32(ts, s.name));
    } else if (what == "linear_attn.out_proj") {
      std::vector<float> v = matrix_f32(ts, s.name, s.rows, s.cols, c);
      if (!next) {  // tile the columns: transpose, tile rows, transpose back
        std::vector<float> t(v.size());
        for (int64_t i = 0; i < s.rows; ++i)
          for (int64_t j = 0; j < s.cols; ++j) t[size_t(j * s.rows + i)] = v[size_t(i * s.cols + j)];
        tile_rows(t, s.rows, 0, dv, c);
        for (int64_t i = 0; i < s.rows; ++i)
          for (int64_t j = 0; j < s.cols; ++j) v[size_t(i * s.cols + j)] = t[size_t(j * s.rows + i)];
      }
      add(w, b + "ssm_out.weight", {s.cols, s.rows}, v, mt);
    } else {
      static const std::map<std::string, std::string> kLinear = {
          {"self_attn.q_proj", "attn_q.weight"},       {"self_attn.k_proj", "attn_k.weight"},
          {"self_attn.v_proj", "attn_v.weight"},       {"self_attn.o_proj", "attn_output.weight"},
          {"mlp.gate", "ffn_gate_inp.weight"},         {"mlp.shared_expert.gate_proj", "ffn_gate_shexp.weight"},
          {"mlp.shared_expert.up_proj", "ffn_up_shexp.weight"},
          {"mlp.shared_expert.down_proj", "ffn_down_shexp.weight"}};
      const std::vector<float> v = matrix_f32(ts, s.name, s.rows, s.cols, c);
      if (what == "mlp.shared_expert_gate") add(w, b + "ffn_gate_inp_shexp.weight", {H}, v);  // 1-D, as llama.cpp
      else add(w, b + kLinear.at(what), {s.cols, s.rows}, v, mt);
    }
  }
  // The experts, stacked: [experts, rows, cols].
  const TensorExperts ex(ts, c, n);
  const int64_t I = c.moe_intermediate_size, E = c.num_experts;
  for (int l = 0; l < c.num_layers; ++l)
    for (int p = 0; p < 3; ++p) {
      const int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
      std::vector<float> v(size_t(E * rows * cols));
      for (int e = 0; e < E; ++e) {
        const ExpertWeights& x = ex.get(l, e);
        const QMatrix& m = p == 0 ? x.gate : p == 1 ? x.up : x.down;
        for (int64_t r = 0; r < rows; ++r) ref::dequant_row(m, r, v.data() + (e * rows + r) * cols);
      }
      static const char* kExps[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
      add(w, fmt::format("blk.{}.{}", l, kExps[p]), {cols, rows, E}, v, mt);
    }
  w.write(out);
}

std::vector<float> prefill(const std::string& model, const std::vector<int32_t>& tokens) {
  auto lm = load_model(model);
  Forward fwd(lm->model, Backend::Reference);
  SessionState st = SessionState::create(lm->model.config);
  std::vector<float> logits;
  fwd.run(st, tokens, LogitsMode::All, logits);
  return logits;
}

RepackOptions opts(const std::string& out, int bits) {
  RepackOptions o;
  o.output = out;
  o.bits = bits;
  return o;
}

struct Case {
  std::string fixture;
  bool fused_qkvz;
};

class GgufRepack : public ::testing::TestWithParam<Case> {};

// Done-when: a GGUF of the fixture converts at --bits 16 to transformers' logits.
TEST_P(GgufRepack, F32GgufGivesTransformersLogits) {
  const Case k = GetParam();
  if (!fs::exists(fixture_dir(k.fixture) + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fixture_dir(k.fixture), tmp / "m.gguf", {GgmlType::F32, k.fused_qkvz});
  repack_from_gguf(tmp / "m.gguf", opts(tmp / "m.qpack", 16));
  const auto ref = nlohmann::json::parse(read_text_file(fixture_dir(k.fixture) + "/reference.json"));
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  const std::vector<float> got = prefill(tmp / "m.qpack", tokens);
  EXPECT_LT(max_abs_diff(got, read_f32(fixture_dir(k.fixture) + "/prefill_logits.f32")), 1e-3f);
  EXPECT_LT(max_abs_diff(got, prefill(fixture_dir(k.fixture), tokens)), 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufRepack,
                         ::testing::Values(Case{"next_8l", false}, Case{"next_8l", true},
                                           Case{"q35_text_tied", false}),
                         [](const auto& info) { return info.param.fixture + (info.param.fused_qkvz ? "_ssm_in" : ""); });

}  // namespace
}  // namespace swiftlet
