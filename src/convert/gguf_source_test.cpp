// swiftlet-repack --from-gguf: the committed Hugging Face fixtures written as GGUF files the way
// llama.cpp's convert_hf_to_gguf.py writes them (its renames and transforms, applied here from
// the description of that script: norms + 1, A_log -> -exp(A_log), conv1d squeezed, Qwen3-Next's
// in_proj_qkvz split, Qwen3.5's value heads tiled, experts stacked), converted back, and run:
// the logits must be transformers' (the fixtures' own references).
#include "convert/repack.h"

#include "convert/gguf_tokenizer.h"

#include "core/dtype.h"
#include "core/error.h"
#include "experts/tensor_experts.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/safetensors.h"
#include "model/forward_pass.h"
#include "kernels/cpu/ops_ref.h"
#include "model/weights.h"
#include "core/zstd_frame.h"
#include "tokenizer/tokenizer.h"
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

std::string quantise_q4_1(const float* x, int64_t n) {
  std::string out;
  for (int64_t b = 0; b < n; b += 32) {
    float lo = x[b], hi = x[b];
    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[b + j]), hi = std::max(hi, x[b + j]);
    const float d = (hi - lo) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_f16(d), mh = f32_to_f16(lo);
    out.append(reinterpret_cast<const char*>(&dh), 2);
    out.append(reinterpret_cast<const char*>(&mh), 2);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, int((x[b + j] - lo) * id + 0.5f));
      const int q1 = std::min(15, int((x[b + 16 + j] - lo) * id + 0.5f));
      out.push_back(char(q0 | q1 << 4));
    }
  }
  return out;
}

// Matrices (rows of `row` values) in `type` where their rows are whole blocks, else F32.
void add(GgufWriter& w, const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v,
         GgmlType type = GgmlType::F32) {
  const int64_t row = ne[0];
  if ((type == GgmlType::Q8_0 || type == GgmlType::Q4_0 || type == GgmlType::Q4_1) && row % 32 != 0)
    type = GgmlType::F32;
  std::string bytes;
  if (type == GgmlType::Q8_0)
    bytes = quantise_q8_0(v.data(), int64_t(v.size()));
  else if (type == GgmlType::Q4_1)
    bytes = quantise_q4_1(v.data(), int64_t(v.size()));
  else if (type == GgmlType::Q4_0)
    bytes = quantise_q4_0(v.data(), int64_t(v.size()));
  else if (type == GgmlType::F32)
    bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  else
    for (float x : v) {
      const uint16_t h = type == GgmlType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
      bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  w.add_tensor(name, type, std::move(ne), std::move(bytes));
}

std::vector<float> rows_f32(const QMatrix& m) {
  std::vector<float> v(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) ref::dequant_row(m, r, v.data() + r * m.cols);
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
  bool tokenizer = false;             // the model's tokenizer.json and chat template as tokenizer.ggml.*
};

// tokenizer.ggml.* as llama.cpp writes them for a Qwen tokenizer.json: every token by id, type
// 1 (normal), 3 (control: special added tokens) or 4 (user-defined: other added tokens), merges
// as "a b", the eos and padding ids, the chat template.
void add_tokenizer(GgufWriter& w, const std::string& model_dir) {
  const std::string path = Tokenizer::file_in(model_dir);
  std::string text = read_text_file(path);
  if (is_zstd_frame(text)) text = zstd_decompress(text, path);
  const auto j = nlohmann::json::parse(text);
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;
  for (const auto& [tok, id] : j["model"]["vocab"].items()) by_id[id.get<int64_t>()] = {tok, 1};
  for (const auto& t : j["added_tokens"])
    by_id[t["id"].get<int64_t>()] = {t["content"], t["special"].get<bool>() ? 3 : 4};
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (const auto& [id, tt] : by_id) {
    ASSERT_EQ(id, int64_t(tokens.size())) << "ids must be contiguous";
    tokens.push_back(tt.first);
    types.push_back(tt.second);
  }
  std::vector<std::string> merges;
  for (const auto& m : j["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", merges);
  const auto cfg = nlohmann::json::parse(read_text_file(model_dir + "/tokenizer_config.json"));
  auto id_of = [&](const std::string& t) {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == t) return uint32_t(i);
    return uint32_t(0);
  };
  w.set_u32("tokenizer.ggml.eos_token_id", id_of(cfg["eos_token"]));
  w.set_u32("tokenizer.ggml.padding_token_id", id_of(cfg["pad_token"]));
  w.set_string("tokenizer.chat_template", cfg["chat_template"]);
}

// Writes the model at `path` (a checkpoint directory or a container; its weights as loaded:
// norms holding 1 + w, DeltaNet inputs split, heads in the checkpoint's order) as llama.cpp's
// convert_hf_to_gguf.py would have written its checkpoint.
void write_as_gguf(const std::string& path, const std::string& out, const GgufWriteOptions& o) {
  auto lm = load_model(path);
  const ModelConfig& c = lm->model.config;
  const ModelWeights& mw = lm->model.weights;
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
  if (o.tokenizer) add_tokenizer(w, path);

  const int64_t H = c.hidden_size, kd = c.linear_key_dim(), dv = c.linear_value_head_dim;
  const GgmlType mt = o.matrices;
  auto matrix = [&](const std::string& name, const QMatrix& m) { add(w, name, {m.cols, m.rows}, rows_f32(m), mt); };
  matrix("token_embd.weight", mw.embed_tokens);
  if (!c.tie_word_embeddings) matrix("output.weight", mw.lm_head);
  add(w, "output_norm.weight", {H}, mw.norm);  // norms: 1 + w, as llama.cpp stores them
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = mw.layers[size_t(l)];
    const std::string b = fmt::format("blk.{}.", l);
    add(w, b + "attn_norm.weight", {H}, L.input_layernorm);
    add(w, b + "post_attention_norm.weight", {H}, L.post_attention_layernorm);
    if (L.linear) {
      const DeltaNetWeights& g = L.gdn;
      std::vector<float> qkv = rows_f32(g.in_proj_qkv), z = rows_f32(g.in_proj_z);
      std::vector<float> bb = rows_f32(g.in_proj_b), aa = rows_f32(g.in_proj_a);
      if (next) {
        if (o.fused_qkvz) {  // rows back in the checkpoint's grouped order
          const std::vector<int64_t> order = split_row_order(c, FusedInput::Qkvz);
          std::vector<float> fused(order.size() * size_t(H));
          for (size_t i = 0; i < order.size(); ++i) {
            const float* src = int64_t(i) < c.conv_dim() ? qkv.data() + i * size_t(H)
                                                         : z.data() + (i - size_t(c.conv_dim())) * size_t(H);
            std::memcpy(fused.data() + order[i] * H, src, size_t(H) * 4);
          }
          add(w, b + "ssm_in.weight", {H, int64_t(order.size())}, fused, mt);
        } else {
          add(w, b + "attn_qkv.weight", {H, c.conv_dim()}, qkv, mt);
          add(w, b + "attn_gate.weight", {H, c.linear_value_dim()}, z, mt);
        }
        const std::vector<int64_t> order = split_row_order(c, FusedInput::Ba);
        std::vector<float> ba(order.size() * size_t(H));
        for (size_t i = 0; i < order.size(); ++i) {
          const int64_t hv = c.linear_num_value_heads;
          const float* src = int64_t(i) < hv ? bb.data() + i * size_t(H) : aa.data() + (i - size_t(hv)) * size_t(H);
          std::memcpy(ba.data() + order[i] * H, src, size_t(H) * 4);
        }
        add(w, b + "ssm_ba.weight", {H, int64_t(order.size())}, ba, mt);
      } else {
        tile_rows(qkv, H, 2 * kd, dv, c);
        tile_rows(z, H, 0, dv, c);
        tile_rows(bb, H, 0, 1, c);
        tile_rows(aa, H, 0, 1, c);
        add(w, b + "attn_qkv.weight", {H, c.conv_dim()}, qkv, mt);
        add(w, b + "attn_gate.weight", {H, c.linear_value_dim()}, z, mt);
        add(w, b + "ssm_beta.weight", {H, c.linear_num_value_heads}, bb, mt);
        add(w, b + "ssm_alpha.weight", {H, c.linear_num_value_heads}, aa, mt);
      }
      std::vector<float> conv = g.conv1d, alog = g.A_log, dt = g.dt_bias;
      for (float& x : alog) x = -std::exp(x);  // llama.cpp stores -exp(A_log)
      std::vector<float> out_proj = rows_f32(g.out_proj);
      if (!next) {
        tile_rows(conv, c.linear_conv_kernel_dim, 2 * kd, dv, c);
        tile_rows(alog, 1, 0, 1, c);
        tile_rows(dt, 1, 0, 1, c);
        const int64_t R = g.out_proj.rows, C = g.out_proj.cols;  // tile the columns
        std::vector<float> t(out_proj.size());
        for (int64_t i = 0; i < R; ++i)
          for (int64_t j = 0; j < C; ++j) t[size_t(j * R + i)] = out_proj[size_t(i * C + j)];
        tile_rows(t, R, 0, dv, c);
        for (int64_t i = 0; i < R; ++i)
          for (int64_t j = 0; j < C; ++j) out_proj[size_t(i * C + j)] = t[size_t(j * R + i)];
      }
      add(w, b + "ssm_conv1d.weight", {c.linear_conv_kernel_dim, c.conv_dim()}, conv);
      add(w, b + "ssm_a", {c.linear_num_value_heads}, alog);
      add(w, b + "ssm_dt.bias", {c.linear_num_value_heads}, dt);
      add(w, b + "ssm_norm.weight", {dv}, g.norm);
      add(w, b + "ssm_out.weight", {g.out_proj.cols, g.out_proj.rows}, out_proj, mt);
    } else {
      matrix(b + "attn_q.weight", L.attn.q_proj);
      matrix(b + "attn_k.weight", L.attn.k_proj);
      matrix(b + "attn_v.weight", L.attn.v_proj);
      matrix(b + "attn_output.weight", L.attn.o_proj);
      add(w, b + "attn_q_norm.weight", {c.head_dim}, L.attn.q_norm);
      add(w, b + "attn_k_norm.weight", {c.head_dim}, L.attn.k_norm);
    }
    matrix(b + "ffn_gate_inp.weight", L.moe.router);
    matrix(b + "ffn_gate_shexp.weight", L.moe.shared_gate_proj);
    matrix(b + "ffn_up_shexp.weight", L.moe.shared_up_proj);
    matrix(b + "ffn_down_shexp.weight", L.moe.shared_down_proj);
    add(w, b + "ffn_gate_inp_shexp.weight", {H}, rows_f32(L.moe.shared_expert_gate));  // 1-D, as llama.cpp
    // The experts, stacked: [experts, rows, cols].
    const int64_t I = c.moe_intermediate_size, E = c.num_experts;
    std::vector<float> gate(size_t(E * I * H)), up(gate.size()), down(gate.size());
    for (int32_t e = 0; e < E; ++e) {
      ExpertWeights x;
      lm->experts->acquire(l, std::span(&e, 1), std::span(&x, 1));
      for (int64_t r = 0; r < I; ++r) {
        ref::dequant_row(x.gate, r, gate.data() + (e * I + r) * H);
        ref::dequant_row(x.up, r, up.data() + (e * I + r) * H);
      }
      for (int64_t r = 0; r < H; ++r) ref::dequant_row(x.down, r, down.data() + (e * H + r) * I);
      lm->experts->release(l);
    }
    add(w, b + "ffn_gate_exps.weight", {H, I, E}, gate, mt);
    add(w, b + "ffn_up_exps.weight", {H, I, E}, up, mt);
    add(w, b + "ffn_down_exps.weight", {I, H, E}, down, mt);
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

float rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * double(a[i] - b[i]);
  return float(std::sqrt(s / double(std::max<size_t>(1, a.size()))));
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
                         ::testing::Values(Case{"next_8l", false}, Case{"next_8l", true}, Case{"q35_text_tied", false}),
                         [](const auto& info) {
                           return info.param.fixture + (info.param.fused_qkvz ? "_ssm_in" : "");
                         });

// The cost of each GGUF type, and of re-quantising it into the container, on the trained model
// (models/toy.qpack: real weights, so the logits show quantisation error rather than the random
// fixtures' router flips). Largest logit difference over the first reference prompt against the
// container the GGUF was written from, and against the GGUF's own dequantised weights (--bits
// 16): what re-quantising at --bits 8 and 4 adds. docs/gguf.md has the table.
TEST(GgufRepackTypes, EachTypeConvertsAndRequantisesWithinItsError) {
  const std::string toy = swiftlet::testing::source_path("models/toy.qpack");
  const auto ref =
      nlohmann::json::parse(read_text_file(swiftlet::testing::source_path("tests/data/trained/reference.json")));
  const auto tokens = ref["prompts"][0]["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<float> want = prefill(toy, tokens);
  struct Bound {
    GgmlType type;
    float own, bits8, bits4;  // limits on the three differences
  };
  // Limits: 1.5 x the differences measured when the test was written (printed below).
  for (const Bound& b : {Bound{GgmlType::F32, 1e-4f, 2.0f, 2.4f}, Bound{GgmlType::Q8_0, 0.7f, 0.7f, 2.5f},
                         Bound{GgmlType::Q4_0, 3.0f, 0.3f, 3.2f}, Bound{GgmlType::Q4_1, 5.0f, 1.7f, 3.2f}}) {
    ScratchDir tmp;
    write_as_gguf(toy, tmp / "m.gguf", {b.type, false, b.type == GgmlType::F32});
    repack_from_gguf(tmp / "m.gguf", opts(tmp / "16.qpack", 16));
    if (b.type == GgmlType::F32) {  // the tokenizer and template come along
      const Tokenizer tok = Tokenizer::from_file(Tokenizer::file_in(tmp / "16.qpack"));
      EXPECT_EQ(tok.encode("Hello world! This is a test of the tokenizer."),
                (std::vector<int32_t>{9707, 1879, 0, 1096, 374, 264, 1273, 315, 279, 45958, 13}));
      EXPECT_TRUE(fs::exists(tmp / "16.qpack/chat_template.jinja"));
    }
    const std::vector<float> dequantised = prefill(tmp / "16.qpack", tokens);
    const float own = max_abs_diff(dequantised, want);
    float diff[2], rms[3] = {rms_diff(dequantised, want), 0, 0};
    for (int bits : {8, 4}) {
      repack_from_gguf(tmp / "m.gguf", opts(tmp / fmt::format("{}.qpack", bits), bits));
      const std::vector<float> got = prefill(tmp / fmt::format("{}.qpack", bits), tokens);
      diff[bits == 4] = max_abs_diff(got, dequantised);
      rms[bits == 4 ? 2 : 1] = rms_diff(got, dequantised);
    }
    const std::string type = ggml_type_name(uint32_t(b.type));
    std::printf(
        "toy %-5s max|rms: vs the container %.5f|%.5f; --bits 8 vs the GGUF %.5f|%.5f; --bits 4 vs "
        "the GGUF %.5f|%.5f\n",
        type.c_str(), own, rms[0], diff[0], rms[1], diff[1], rms[2]);
    EXPECT_LT(own, b.own) << type;
    EXPECT_LT(diff[0], b.bits8) << type;
    EXPECT_LT(diff[1], b.bits4) << type;
  }
}

// --bits 16 keeps a float GGUF's own type: the bytes pass through exactly.
TEST(GgufRepackTypes, Bits16KeepsTheFloatType) {
  const std::string fx = fixture_dir("next_8l");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fx, tmp / "m.gguf", {GgmlType::F16, false});
  repack_from_gguf(tmp / "m.gguf", opts(tmp / "m.qpack", 16));
  const GgufFile g(tmp / "m.gguf");
  const TensorSet ts = TensorSet::open_files({tmp / "m.qpack/model.safetensors"});
  const TensorView& q = ts.get("model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype, DType::F16);
  const GgufTensor* src = g.find_tensor("blk.3.attn_q.weight");
  ASSERT_NE(src, nullptr);
  ASSERT_EQ(q.nbytes, src->nbytes);
  EXPECT_EQ(std::memcmp(q.data, src->data, q.nbytes), 0);
}

TEST(GgufRepackErrors, OtherArchitecturesTypesAndMissingKeysAreRefusedByName) {
  ScratchDir tmp;
  GgufWriter llama;
  llama.set_string("general.architecture", "llama");
  llama.write(tmp / "llama.gguf");
  EXPECT_NE(error_of([&] {
              open_gguf_source(tmp / "llama.gguf", opts(tmp / "o", 4));
            }).find("architecture 'llama'; swiftlet converts qwen3next"),
            std::string::npos);

  GgufWriter iq;
  iq.set_string("general.architecture", "qwen3next");
  iq.add_tensor("blk.0.ffn_down_exps.weight", GgmlType::IQ2_XS, {256, 1}, std::string(74, '\0'));
  iq.write(tmp / "iq.gguf");
  EXPECT_EQ(error_of([&] { open_gguf_source(tmp / "iq.gguf", opts(tmp / "o", 4)); }),
            "tensor blk.0.ffn_down_exps.weight has type IQ2_XS, which swiftlet cannot read; convert from "
            "safetensors or a Q4_K/Q5_K/Q6_K/Q8_0 GGUF");

  GgufWriter bare;
  bare.set_string("general.architecture", "qwen35moe");
  bare.add_tensor("token_embd.weight", GgmlType::F32, {4, 2}, std::string(32, '\0'));
  bare.write(tmp / "bare.gguf");
  EXPECT_NE(error_of([&] {
              open_gguf_source(tmp / "bare.gguf", opts(tmp / "o", 4));
            }).find("lacks the metadata key 'qwen35moe.embedding_length'"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "o"));
}

// Done-when: the tokenizer rebuilt from the GGUF's metadata gives the original's ids on the
// tokenizer goldens (made with Hugging Face tokenizers), and the chat template comes along.
TEST(GgufRepackTokenizer, RebuiltTokenizerMatchesTheGoldens) {
  const std::string toy = swiftlet::testing::source_path("models/toy.qpack");
  ScratchDir tmp;
  GgufWriter w;
  add_tokenizer(w, toy);
  w.write(tmp / "tok.gguf");
  const GgufFile f(tmp / "tok.gguf");
  const Tokenizer tok = Tokenizer::from_json_string(gguf_tokenizer_json(f));
  const auto goldens =
      nlohmann::json::parse(read_text_file(swiftlet::testing::source_path("tests/data/tokenizer/qwen3_goldens.json")));
  EXPECT_EQ(tok.vocab_size(), goldens["vocab_size"].get<int32_t>());
  int checked = 0, failures = 0;
  for (const auto& c : goldens["encode"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want_plain =
        (c.contains("ids_plain") ? c["ids_plain"] : c["ids"]).get<std::vector<int32_t>>();
    if (tok.encode(text) != want && ++failures <= 10) ADD_FAILURE() << c["name"];
    if (tok.encode(text, false) != want_plain && ++failures <= 10) ADD_FAILURE() << c["name"] << " (plain)";
    ++checked;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GE(checked, 400);
  const auto orig = nlohmann::json::parse(read_text_file(toy + "/tokenizer_config.json"));
  EXPECT_EQ(gguf_chat_template(f), orig["chat_template"].get<std::string>());
  const auto cfg = nlohmann::json::parse(gguf_tokenizer_config(f));
  EXPECT_EQ(cfg["eos_token"], "<|im_end|>");
  EXPECT_EQ(cfg["pad_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["chat_template"], orig["chat_template"]);
}

TEST(GgufRepackTokenizer, OtherTokenizersAreRefusedByName) {
  ScratchDir tmp;
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  w.write(tmp / "spm.gguf");
  EXPECT_NE(error_of([&] { gguf_tokenizer_json(GgufFile(tmp / "spm.gguf")); }).find("tokenizer.ggml.model is 'llama'"),
            std::string::npos);
  GgufWriter p;
  p.set_string("tokenizer.ggml.model", "gpt2");
  p.set_string("tokenizer.ggml.pre", "llama-bpe");
  p.set_strings("tokenizer.ggml.tokens", {"a"});
  p.set_strings("tokenizer.ggml.merges", {});
  p.write(tmp / "pre.gguf");
  EXPECT_NE(
      error_of([&] { gguf_tokenizer_json(GgufFile(tmp / "pre.gguf")); }).find("tokenizer.ggml.pre is 'llama-bpe'"),
      std::string::npos);
}

// A copy of a GGUF file with one tensor's dimensions replaced (same bytes).
void rewrite_with_shape(const std::string& in, const std::string& out, const std::string& name,
                        std::vector<int64_t> ne) {
  const GgufFile f(in);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const GgufTensor& t : f.tensors())
    w.add_tensor(t.name, GgmlType(t.type), t.name == name ? ne : t.ne,
                 std::string(reinterpret_cast<const char*>(t.data), t.nbytes));
  w.write(out);
}

// Refused when the source opens, before anything is written.
TEST(GgufRepackErrors, ATransposedOrMissingTensorIsRefusedByName) {
  const std::string fx = fixture_dir("next_8l");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fx, tmp / "m.gguf", {});
  const GgufFile good(tmp / "m.gguf");
  const GgufTensor& o = *good.find_tensor("blk.3.attn_output.weight");
  rewrite_with_shape(tmp / "m.gguf", tmp / "t.gguf", o.name, {o.ne[1], o.ne[0]});
  const std::string e = error_of([&] { open_gguf_source(tmp / "t.gguf", opts(tmp / "t.qpack", 4)); });
  EXPECT_NE(e.find("tensor blk.3.attn_output.weight has shape"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp / "t.qpack"));
  // Without the gate of Qwen3-Next's DeltaNet input (and no older fused ssm_in): both named.
  {
    const GgufFile f(tmp / "m.gguf");
    GgufWriter w;
    for (const auto& [k, v] : f.metadata()) w.set(k, v);
    for (const GgufTensor& t : f.tensors())
      if (t.name != "blk.0.attn_gate.weight")
        w.add_tensor(t.name, GgmlType(t.type), t.ne, std::string(reinterpret_cast<const char*>(t.data), t.nbytes));
    w.write(tmp / "missing.gguf");
  }
  const std::string m = error_of([&] { open_gguf_source(tmp / "missing.gguf", opts(tmp / "m.qpack", 4)); });
  EXPECT_NE(m.find("has neither tensor blk.0.attn_gate.weight nor blk.0.ssm_in.weight"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(tmp / "m.qpack"));
}

// The executable: converts a GGUF; a file that is not one fails with the reason and writes nothing.
TEST(GgufCli, RepackFromGguf) {
  const std::string fx = fixture_dir("next_8l");
  if (!fs::exists(fx + "/reference.json")) GTEST_SKIP() << "fixture missing";
  ScratchDir tmp;
  write_as_gguf(fx, tmp / "m.gguf", {GgmlType::Q8_0, false});
  const auto ok = swiftlet::testing::run_binary(
      "swiftlet-repack", "--from-gguf " + (tmp / "m.gguf") + " --output " + (tmp / "m.qpack") + " --bits 8 -q");
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_TRUE(fs::exists(tmp / "m.qpack/manifest.json"));
  const auto bad = swiftlet::testing::run_binary("swiftlet-repack",
                                                 "--from-gguf " + fx + "/config.json --output " + (tmp / "bad.qpack"));
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("is not a GGUF file"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(tmp / "bad.qpack"));
}

}  // namespace
}  // namespace swiftlet
