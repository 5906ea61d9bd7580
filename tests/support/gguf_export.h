// Writes a model (a checkpoint directory or a container, its weights as the engine loads them) as
// the GGUF file llama.cpp's convert_hf_to_gguf.py would have made of its checkpoint: its renames
// and transforms, applied from the description of that script (norms + 1, A_log -> -exp(A_log),
// conv1d squeezed, Qwen3-Next's in_proj_qkvz fused, Qwen3.5's value heads tiled, experts
// stacked), matrices as F32, F16, BF16, Q8_0, Q4_0 or Q4_1. For the GGUF tests and
// tools/reference/llama_cpp_gguf.sh (swiftlet_write_gguf).
#pragma once

#include "core/dtype.h"
#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "kernels/cpu/ops_ref.h"
#include "model/weights.h"
#include "core/zstd_frame.h"
#include "runtime/model_loader.h"
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace swiftlet::testing {

// Blocks of Q8_0 / Q4_0 by the reference quantisers' rules (ggml's quantize_row_*_ref).
inline std::string quantise_q8_0(const float* x, int64_t n) {
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

inline std::string quantise_q4_0(const float* x, int64_t n) {
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

inline std::string quantise_q4_1(const float* x, int64_t n) {
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
inline void add(GgufWriter& w, const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v,
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

inline std::vector<float> rows_f32(const QMatrix& m) {
  std::vector<float> v(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) ref::dequant_row(m, r, v.data() + r * m.cols);
  return v;
}

// Blocks of `head_dim` rows (of `cols` values) from row0 on: value head g * r + j of the
// checkpoint goes to j * key_heads + g (llama.cpp's tiled order for qwen35moe).
inline void tile_rows(std::vector<float>& m, int64_t cols, int64_t row0, int64_t head_dim, const ModelConfig& c) {
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
inline void add_tokenizer(GgufWriter& w, const std::string& model_dir) {
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
    SWIFTLET_CHECK(id == int64_t(tokens.size()), "the tokenizer's ids are not contiguous");
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
inline void write_as_gguf(const std::string& path, const std::string& out, const GgufWriteOptions& o) {
  auto lm = load_model(path);
  const ModelConfig& c = lm->model.config;
  const ModelWeights& mw = lm->model.weights;
  const bool next = c.family == Family::Qwen3Next;
  const std::string arch = next ? "qwen3next" : "qwen35moe", a = arch + ".";
  GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_u32(a + "block_count", uint32_t(c.num_layers));
  w.set_u32(a + "context_length", 262144);
  w.set_u32(a + "embedding_length", uint32_t(c.hidden_size));
  w.set_u32(a + "attention.head_count", uint32_t(c.num_heads));
  w.set_u32(a + "attention.head_count_kv", uint32_t(c.num_kv_heads));
  w.set_u32(a + "attention.key_length", uint32_t(c.head_dim));
  w.set_u32(a + "attention.value_length", uint32_t(c.head_dim));
  w.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.set_f32(a + "rope.freq_base", c.rope_theta);
  w.set_u32(a + "rope.dimension_count", uint32_t(c.rotary_dim()));
  // Qwen3.5's multimodal rope: text positions are the same in every section, which makes it the
  // plain rope; llama.cpp wants the sections (Qwen3.5's own, as its converter writes them).
  if (!next) w.set_i32s(a + "rope.dimension_sections", {11, 11, 10, 0});
  w.set_u32(a + "ssm.conv_kernel", uint32_t(c.linear_conv_kernel_dim));
  w.set_u32(a + "ssm.state_size", uint32_t(c.linear_key_head_dim));
  w.set_u32(a + "ssm.group_count", uint32_t(c.linear_num_key_heads));
  w.set_u32(a + "ssm.time_step_rank", uint32_t(c.linear_num_value_heads));
  w.set_u32(a + "ssm.inner_size", uint32_t(c.linear_value_dim()));
  int interval = 1;
  while (interval <= c.num_layers && c.is_linear_layer(interval - 1)) ++interval;
  for (int l = 0; l < c.num_layers; ++l)
    SWIFTLET_CHECK(c.is_linear_layer(l) == ((l + 1) % interval != 0), "layer types without a period");
  w.set_u32(a + "full_attention_interval", uint32_t(interval));
  w.set_u32(a + "expert_count", uint32_t(c.num_experts));
  w.set_u32(a + "expert_used_count", uint32_t(c.num_experts_per_tok));
  w.set_u32(a + "expert_feed_forward_length", uint32_t(c.moe_intermediate_size));
  w.set_u32(a + "expert_shared_feed_forward_length", uint32_t(c.shared_expert_intermediate_size));
  if (o.tokenizer) {
    add_tokenizer(w, path);
  } else {  // ids only, as llama.cpp reads a model without a vocabulary
    w.set_string("tokenizer.ggml.model", "none");
    w.set_u32(a + "vocab_size", uint32_t(c.vocab_size));
  }

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

}  // namespace swiftlet::testing
