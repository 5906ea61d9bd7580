// The GGUF source of swiftlet-repack: a llama.cpp model file (architectures qwen3next and
// qwen35moe, one file or split) converted into a container. Every tensor is dequantised to fp32
// (format/gguf_quant.h) and written as the container's formats: MLX affine at --bits 4 or 8, or,
// at --bits 16, the GGUF's own float type (F32, F16, BF16: exact) and fp32 for the block types
// (their exact dequantised values).
//
// llama.cpp's convert_hf_to_gguf.py changes some tensors on the way in; they are changed back
// here, to the MLX names and conventions the container keeps (docs/qpack.md 4):
//   - names: blk.N.attn_qkv -> linear_attn.in_proj_qkv, ffn_gate_exps -> the experts, ...
//   - zero-centred norms are stored as 1 + w: the MLX convention already, kept as is;
//   - A_log is stored as -exp(A_log) (ssm_a): A_log = log(-ssm_a);
//   - conv1d is stored squeezed [channels, kernel]: written as MLX's [channels, kernel, 1];
//   - Qwen3-Next's in_proj_qkvz is stored split (attn_qkv + attn_gate, heads in order), or, in
//     older files, fused (ssm_in, rows grouped per key head as in the checkpoint); in_proj_ba
//     fused (ssm_ba / ssm_beta_alpha, grouped): the grouped ones are split as the
//     safetensors path does;
//   - qwen35moe with fewer key than value heads has its value heads "tiled" (value head j of key
//     head g stored at j * key_heads + g instead of g * (value_heads / key_heads) + j) in the v
//     rows of in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, A_log, dt_bias, the v channels of
//     conv1d and the columns of out_proj: put back in the checkpoint's order.
#include "convert/repack.h"

#include "convert/gguf_tokenizer.h"

#include "core/dtype.h"
#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_quant.h"
#include "format/quantize.h"
#include "model/weights.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {

namespace {

using json = nlohmann::ordered_json;

int64_t meta_int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  // Hybrid models may store per-layer arrays (head_count_kv): the attention layers' value.
  if (v && v->type == GgufType::Array && !v->ints.empty()) {
    int64_t m = 0;
    for (int64_t x : v->ints) m = std::max(m, x);
    return m;
  }
  return f.get_int(key);
}

// The Hugging Face config.json of the model, from llama.cpp's metadata keys.
json hf_config(const GgufModel& g, const std::string& arch) {
  const GgufFile& f = g.meta();
  const std::string a = arch + ".";
  const GgufTensor& embd = g.get("token_embd.weight");
  json c;
  c["model_type"] = arch == "qwen3next" ? "qwen3_next" : "qwen3_5_moe_text";
  c["architectures"] = {arch == "qwen3next" ? "Qwen3NextForCausalLM" : "Qwen3_5MoeForCausalLM"};
  const int64_t H = f.get_int(a + "embedding_length");
  const int64_t heads = meta_int(f, a + "attention.head_count");
  const int64_t mtp = f.find(a + "nextn_predict_layers") ? f.get_int(a + "nextn_predict_layers") : 0;
  c["hidden_size"] = H;
  c["num_hidden_layers"] = f.get_int(a + "block_count") - mtp;
  c["vocab_size"] = embd.ne.size() == 2 ? embd.ne[1] : 0;
  c["rms_norm_eps"] = f.get_float(a + "attention.layer_norm_rms_epsilon");
  c["tie_word_embeddings"] = g.find("output.weight") == nullptr;
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = meta_int(f, a + "attention.head_count_kv");
  const int64_t head_dim = f.find(a + "attention.key_length") ? f.get_int(a + "attention.key_length") : H / heads;
  c["head_dim"] = head_dim;
  c["rope_theta"] = f.find(a + "rope.freq_base") ? f.get_float(a + "rope.freq_base") : 10000.0;
  if (f.find(a + "rope.dimension_count"))
    c["partial_rotary_factor"] = double(f.get_int(a + "rope.dimension_count")) / double(head_dim);
  const int64_t value_heads = f.get_int(a + "ssm.time_step_rank");
  c["linear_num_key_heads"] = f.get_int(a + "ssm.group_count");
  c["linear_num_value_heads"] = value_heads;
  c["linear_key_head_dim"] = f.get_int(a + "ssm.state_size");
  const int64_t inner = f.get_int(a + "ssm.inner_size");
  if (value_heads <= 0 || inner % value_heads != 0)
    fail("'{}': {}ssm.inner_size {} is not a multiple of {}ssm.time_step_rank {}", g.source(), a, inner, a,
         value_heads);
  c["linear_value_head_dim"] = inner / value_heads;
  c["linear_conv_kernel_dim"] = f.get_int(a + "ssm.conv_kernel");
  c["full_attention_interval"] = f.find(a + "full_attention_interval") ? f.get_int(a + "full_attention_interval") : 4;
  c["num_experts"] = f.get_int(a + "expert_count");
  c["num_experts_per_tok"] = f.get_int(a + "expert_used_count");
  c["moe_intermediate_size"] = f.get_int(a + "expert_feed_forward_length");
  c["shared_expert_intermediate_size"] = f.get_int(a + "expert_shared_feed_forward_length");
  c["norm_topk_prob"] = f.find(a + "expert_weights_norm") ? f.get_int(a + "expert_weights_norm") != 0 : true;
  if (f.find("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = f.get_int("tokenizer.ggml.eos_token_id");
  if (f.find("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = f.get_int("tokenizer.ggml.bos_token_id");
  return c;
}

bool is_eight_bit_module(const std::string& path) {
  return path.ends_with("mlp.gate") || path.ends_with("shared_expert_gate");
}

TensorBytes f32_bytes(const std::vector<float>& v) {
  TensorBytes b;
  b.owned.resize(v.size() * 4);
  std::memcpy(b.owned.data(), v.data(), b.owned.size());
  return b;
}

// fp32 values as `dt` (F32, F16 or BF16); exact for values that came from that type.
TensorBytes float_bytes(const float* v, size_t n, DType dt) {
  TensorBytes b;
  b.owned.resize(n * dtype_size(dt));
  if (dt == DType::F32) {
    std::memcpy(b.owned.data(), v, n * 4);
    return b;
  }
  uint16_t* h = reinterpret_cast<uint16_t*>(b.owned.data());
  for (size_t i = 0; i < n; ++i) h[i] = dt == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  return b;
}

DType float_type_of(const GgufTensor& t) {
  switch (GgmlType(t.type)) {
    case GgmlType::F16:
      return DType::F16;
    case GgmlType::BF16:
      return DType::BF16;
    default:
      return DType::F32;  // F32, and the block types' dequantised values
  }
}

class GgufSource : public RepackSource {
 public:
  GgufSource(const std::string& path, const RepackOptions& o) : g_(GgufModel::open(path)) {
    const GgufFile& f = g_.meta();
    if (!f.find("general.architecture")) fail("'{}' has no general.architecture; is it a llama.cpp model file?", path);
    arch_ = f.get_string("general.architecture");
    if (arch_ != "qwen3next" && arch_ != "qwen35moe")
      fail(
          "'{}' is a GGUF file of architecture '{}'; swiftlet converts qwen3next (Qwen3-Next) and "
          "qwen35moe (Qwen3.5/3.6 MoE)",
          path, arch_);
    for (const auto& file : g_.files())
      for (const GgufTensor& t : file->tensors())
        if (t.name.find("nextn") == std::string::npos) check_gguf_readable(t);
    config_json_ = hf_config(g_, arch_);
    config_ = ModelConfig::parse(nlohmann::json::parse(config_json_.dump()), path + " (GGUF metadata)");
    names_ = NameScheme::mlx(config_);
    bits_ = o.bits == 0 ? 4 : o.bits;
    group_ = o.group_size;
    if (bits_ != 4 && bits_ != 8 && bits_ != 16) fail("--bits must be 4, 8 or 16, got {}", bits_);
    ModelWeights scratch;  // every dense tensor present and of its shape before anything is written
    for_each_dense_tensor(
        config_, names_, scratch, [&](const DenseTensorSpec& s, auto&&, auto&&) { check_shape(s); },
        DeltaNetLayout::Split);
    tiled_ = arch_ == "qwen35moe" && config_.linear_num_key_heads != config_.linear_num_value_heads;

    // The experts: separate gate/up/down, or gate and up fused (gate rows first).
    const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size, E = config_.num_experts;
    for (int l = 0; l < config_.num_layers; ++l) {
      const std::string b = fmt::format("blk.{}.", l);
      const bool fused = g_.find(b + "ffn_gate_up_exps.weight") != nullptr;
      auto check = [&](const std::string& name, int64_t rows, int64_t cols) {
        const GgufTensor& t = g_.get(name);
        if (t.ne != std::vector<int64_t>{cols, rows, E})
          fail("'{}': tensor {} has shape {}; expected [{}, {}, {}] (experts, rows, columns)", path, name,
               t.shape_str(), E, rows, cols);
      };
      if (fused) {
        check(b + "ffn_gate_up_exps.weight", 2 * I, H);
      } else {
        check(b + "ffn_gate_exps.weight", I, H);
        check(b + "ffn_up_exps.weight", I, H);
      }
      check(b + "ffn_down_exps.weight", H, I);
    }
    for (int p = 0; p < 3; ++p) {
      const int64_t cols = p == 2 ? I : H;
      const GgufTensor& t = g_.get(expert_tensor(0, p));
      formats_[size_t(p)] = bits_ == 16 || cols % group_ != 0 ? ProjectionFormat{16, group_, float_type_of(t)}
                                                              : ProjectionFormat{bits_, group_, DType::BF16};
    }
    // Last: a constructor that throws leaves no temporary directory behind.
    write_tokenizer_files();
  }

  ~GgufSource() override {
    std::error_code ec;
    if (!files_dir_.empty()) std::filesystem::remove_all(files_dir_, ec);
  }

  std::string describe() const override { return g_.source(); }
  const ModelConfig& config() const override { return config_; }
  int quant_bits() const override { return bits_; }
  int quant_group_size() const override { return group_; }
  std::array<ProjectionFormat, 3> expert_formats() const override { return formats_; }
  std::vector<std::pair<std::string, std::string>> files() const override { return files_; }

  std::string config_json() const override { return quantized_config_json(config_json_, bits_, group_, overrides_); }

  std::vector<ResidentItem> resident() override {
    std::vector<ResidentItem> items;
    ModelWeights scratch;
    overrides_.clear();
    for_each_dense_tensor(
        config_, names_, scratch, [&](const DenseTensorSpec& s, auto&&, auto&&) { items.push_back(resident_item(s)); },
        DeltaNetLayout::Split);
    return items;
  }

  void expert(int layer, int e, const QpackLayout& layout, uint8_t* blob) const override {
    const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size;
    std::vector<float> buf;
    for (int p = 0; p < 3; ++p) {
      const GgufTensor& t = g_.get(expert_tensor(layer, p));
      const bool fused = t.name.find("gate_up") != std::string::npos;
      const int64_t rows = p == 2 ? H : I, cols = p == 2 ? I : H;
      const int64_t per_expert = fused ? 2 * I : rows;
      const int64_t row0 = int64_t(e) * per_expert + (fused && p == 1 ? I : 0);
      buf.resize(size_t(rows * cols));
      gguf_dequantize_rows(t, row0, rows, buf.data());
      const ProjectionFormat& f = formats_[size_t(p)];
      const std::string proj = kExpertProjections[p];
      uint8_t* w = blob + layout.find(proj + ".weight")->offset;
      if (f.affine()) {
        affine_quantize(buf.data(), rows, cols, f.bits, f.group_size, reinterpret_cast<uint32_t*>(w),
                        reinterpret_cast<uint16_t*>(blob + layout.find(proj + ".scales")->offset),
                        reinterpret_cast<uint16_t*>(blob + layout.find(proj + ".biases")->offset));
      } else {
        const TensorBytes b = float_bytes(buf.data(), buf.size(), f.dtype);
        std::memcpy(w, b.data(), b.nbytes());
      }
    }
  }

  void layer_done(int layer) override {
    for (int p = 0; p < 3; ++p) {
      const GgufTensor& t = g_.get(expert_tensor(layer, p));
      release_source_pages(t.data, t.nbytes);
    }
  }

 private:
  // tokenizer.json, tokenizer_config.json and chat_template.jinja rebuilt from the metadata, in a
  // directory of their own until the container has copied them.
  void write_tokenizer_files() {
    if (!g_.meta().find("tokenizer.ggml.tokens")) return;  // no tokenizer: the container has none
    static std::atomic<int> counter{0};
    files_dir_ =
        (std::filesystem::temp_directory_path() / fmt::format("swiftlet-gguf-{}-{}", ::getpid(), counter++)).string();
    std::filesystem::create_directories(files_dir_);
    auto put = [&](const std::string& name, const std::string& text) {
      const std::string p = files_dir_ + "/" + name;
      std::ofstream f(p, std::ios::binary);
      f << text;
      if (!f.flush()) fail("cannot write '{}'", p);
      files_.emplace_back(name, p);
    };
    put("tokenizer.json", gguf_tokenizer_json(g_.meta()));
    put("tokenizer_config.json", gguf_tokenizer_config(g_.meta()));
    if (const std::string t = gguf_chat_template(g_.meta()); !t.empty()) put("chat_template.jinja", t);
  }

  std::string expert_tensor(int layer, int p) const {
    const std::string b = fmt::format("blk.{}.", layer);
    if (p != 2 && g_.find(b + "ffn_gate_up_exps.weight")) return b + "ffn_gate_up_exps.weight";
    return b + (p == 0 ? "ffn_gate_exps.weight" : p == 1 ? "ffn_up_exps.weight" : "ffn_down_exps.weight");
  }

  // A tensor's values, checked to hold `n` of them.
  std::vector<float> values(const GgufTensor& t, int64_t n) const {
    if (t.numel() != n) fail("'{}': tensor {} has shape {}; expected {} values", g_.source(), t.name, t.shape_str(), n);
    std::vector<float> v(static_cast<size_t>(n));
    gguf_dequantize(t.type, t.data, t.nbytes, n, v.data());
    return v;
  }

  // Rows [row0, row0 + heads * head_dim) of a row-major [*, cols] matrix from the tiled value-head
  // order back to the grouped one (see the top of the file).
  void untile_rows(std::vector<float>& m, int64_t cols, int64_t row0, int64_t head_dim) const {
    if (!tiled_) return;
    const int64_t hk = config_.linear_num_key_heads, r = config_.linear_num_value_heads / hk;
    const std::vector<float> in(m.begin() + row0 * cols, m.begin() + (row0 + hk * r * head_dim) * cols);
    for (int64_t g = 0; g < hk; ++g)
      for (int64_t j = 0; j < r; ++j)
        std::memcpy(m.data() + (row0 + (g * r + j) * head_dim) * cols, in.data() + (j * hk + g) * head_dim * cols,
                    size_t(head_dim * cols) * 4);
  }
  void untile_cols(std::vector<float>& m, int64_t rows, int64_t cols, int64_t head_dim) const {
    if (!tiled_) return;
    std::vector<float> t(m.size());  // transpose, untile the rows, transpose back
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = m[size_t(i * cols + j)];
    untile_rows(t, rows, 0, head_dim);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) m[size_t(i * cols + j)] = t[size_t(j * rows + i)];
  }

  // Rows `order` of a grouped fused input (ssm_in, ssm_ba), a part of its split layout.
  std::vector<float> fused_part(const GgufTensor& t, FusedInput which, int part, int64_t cols) const {
    const std::vector<int64_t> order = split_row_order(config_, which);
    const std::vector<float> all = values(t, int64_t(order.size()) * cols);
    const int64_t first_rows = which == FusedInput::Qkvz ? config_.conv_dim() : config_.linear_num_value_heads;
    const int64_t begin = part == 0 ? 0 : first_rows, end = part == 0 ? first_rows : int64_t(order.size());
    std::vector<float> out(size_t((end - begin) * cols));
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(out.data() + (i - begin) * cols, all.data() + order[size_t(i)] * cols, size_t(cols) * 4);
    return out;
  }

  // "blk.N." and the container name's part after the layer prefix ("linear_attn.A_log"), or
  // ("", name) outside the layers.
  std::pair<std::string, std::string> split(const std::string& name) const {
    if (!name.starts_with(names_.layers)) return {"", name};
    const std::string rest = name.substr(names_.layers.size());
    const size_t dot = rest.find('.');
    return {"blk." + rest.substr(0, dot) + ".", rest.substr(dot + 1)};
  }

  // The GGUF tensor the container tensor `s` (MLX name) comes from.
  std::string gguf_name(const DenseTensorSpec& s) const {
    if (s.name == names_.embed) return "token_embd.weight";
    if (s.name == names_.lm_head) return "output.weight";
    if (s.name == names_.final_norm) return "output_norm.weight";
    const auto [b, what] = split(s.name);
    static const std::map<std::string, std::string> kNames = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "post_attention_norm.weight"},
        {"self_attn.q_proj", "attn_q.weight"},
        {"self_attn.k_proj", "attn_k.weight"},
        {"self_attn.v_proj", "attn_v.weight"},
        {"self_attn.o_proj", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"linear_attn.in_proj_qkv", "attn_qkv.weight"},
        {"linear_attn.in_proj_z", "attn_gate.weight"},
        {"linear_attn.in_proj_b", "ssm_beta.weight"},
        {"linear_attn.in_proj_a", "ssm_alpha.weight"},
        {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
        {"linear_attn.A_log", "ssm_a"},
        {"linear_attn.dt_bias", "ssm_dt.bias"},
        {"linear_attn.norm.weight", "ssm_norm.weight"},
        {"linear_attn.out_proj", "ssm_out.weight"},
        {"mlp.gate", "ffn_gate_inp.weight"},
        {"mlp.shared_expert.gate_proj", "ffn_gate_shexp.weight"},
        {"mlp.shared_expert.up_proj", "ffn_up_shexp.weight"},
        {"mlp.shared_expert.down_proj", "ffn_down_shexp.weight"},
        {"mlp.shared_expert_gate", "ffn_gate_inp_shexp.weight"},
    };
    const auto it = kNames.find(what);
    SWIFTLET_CHECK(it != kNames.end(), "no GGUF name for {}", s.name);
    const std::string name = b + it->second;
    if (g_.find(name)) return name;
    // Other forms: Qwen3-Next's fused inputs (ssm_in in older files), dt_bias without its suffix.
    std::vector<std::string> alts;
    if (what == "linear_attn.in_proj_qkv" || what == "linear_attn.in_proj_z") alts = {b + "ssm_in.weight"};
    if (what == "linear_attn.in_proj_b" || what == "linear_attn.in_proj_a")
      alts = {b + "ssm_ba.weight", b + "ssm_beta_alpha.weight"};
    if (what == "linear_attn.dt_bias") alts = {b + "ssm_dt"};
    for (const std::string& alt : alts)
      if (g_.find(alt)) return alt;
    if (!alts.empty())
      fail("the GGUF model '{}' has neither tensor {} nor {} (for {}); is it a complete llama.cpp file?", g_.source(),
           name, fmt::join(alts, " nor "), s.name);
    return name;  // get() names it as missing
  }

  // Throws Error unless the GGUF tensor behind `s` exists and has its shape: a matrix [rows, cols]
  // exactly (a transposed one has the same size), anything else the right number of values.
  void check_shape(const DenseTensorSpec& s) const {
    const GgufTensor& t = g_.get(gguf_name(s));
    if (t.name.ends_with("ssm_in.weight") || t.name.ends_with("ssm_ba.weight") ||
        t.name.ends_with("ssm_beta_alpha.weight"))
      return;  // fused: fused_part() checks the whole
    std::vector<int64_t> ne = t.ne;
    while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
    const bool ok = s.kind == TensorKind::Linear
                        ? ne == std::vector<int64_t>{s.cols, s.rows} ||
                              (s.rows == 1 && ne == std::vector<int64_t>{s.cols})  // ffn_gate_inp_shexp is 1-D
                        : t.numel() == s.rows * s.cols;
    if (!ok)
      fail("'{}': tensor {} has shape {}; {} needs [{}, {}] (rows, columns)", g_.source(), t.name, t.shape_str(),
           s.name, s.rows, s.cols);
  }

  // The fp32 values of the container tensor `s`, changed back from llama.cpp's conventions.
  std::vector<float> dense(const DenseTensorSpec& s) const {
    const GgufTensor& t = g_.get(gguf_name(s));
    const auto [b, what] = split(s.name);
    const int64_t kd = config_.linear_key_dim(), dv = config_.linear_value_head_dim;
    const int64_t H = config_.hidden_size;
    if (t.name.ends_with("ssm_in.weight")) return fused_part(t, FusedInput::Qkvz, what.ends_with("qkv") ? 0 : 1, H);
    if (t.name.ends_with("ssm_ba.weight") || t.name.ends_with("ssm_beta_alpha.weight"))
      return fused_part(t, FusedInput::Ba, what.ends_with("_b") ? 0 : 1, H);
    std::vector<float> v = values(t, s.rows * s.cols);
    if (what == "linear_attn.in_proj_qkv")
      untile_rows(v, H, 2 * kd, dv);
    else if (what == "linear_attn.in_proj_z")
      untile_rows(v, H, 0, dv);
    else if (what == "linear_attn.in_proj_b" || what == "linear_attn.in_proj_a")
      untile_rows(v, H, 0, 1);
    else if (what == "linear_attn.conv1d.weight")
      untile_rows(v, s.cols, 2 * kd, dv);
    else if (what == "linear_attn.dt_bias")
      untile_rows(v, 1, 0, 1);
    else if (what == "linear_attn.out_proj")
      untile_cols(v, s.rows, s.cols, dv);
    else if (what == "linear_attn.A_log") {
      for (float& x : v) {
        if (!(x < 0)) fail("'{}': {} holds {}, but llama.cpp stores -exp(A_log) < 0", g_.source(), t.name, x);
        x = std::log(-x);
      }
      untile_rows(v, 1, 0, 1);
    }
    return v;
  }

  ResidentItem resident_item(const DenseTensorSpec& s) {
    ResidentItem it;
    const std::string name = s.kind == TensorKind::Linear ? s.name + ".weight" : s.name;
    switch (s.kind) {
      case TensorKind::Linear: {
        const int bits = bits_ == 16 ? 16 : is_eight_bit_module(s.name) ? 8 : bits_;
        if (bits == 16 || s.cols % group_ != 0) {
          const DType dt = float_type_of(g_.get(gguf_name(s)));
          it.tensors = {{name, dt, {s.rows, s.cols}, nullptr}};
          it.produce = [this, s, dt] {
            const auto v = dense(s);
            return std::vector<TensorBytes>{float_bytes(v.data(), v.size(), dt)};
          };
          return it;
        }
        const int group = group_;
        it.tensors = {{name, DType::U32, {s.rows, s.cols * bits / 32}, nullptr},
                      {s.name + ".scales", DType::BF16, {s.rows, s.cols / group}, nullptr},
                      {s.name + ".biases", DType::BF16, {s.rows, s.cols / group}, nullptr}};
        if (bits != bits_) overrides_[s.name] = QuantSpec{bits, group};
        it.produce = [this, s, bits, group] {
          const auto v = dense(s);
          std::vector<TensorBytes> out(3);
          out[0].owned.resize(affine_packed_bytes(s.rows, s.cols, bits));
          out[1].owned.resize(affine_scale_bytes(s.rows, s.cols, group));
          out[2].owned.resize(out[1].owned.size());
          affine_quantize(v.data(), s.rows, s.cols, bits, group, reinterpret_cast<uint32_t*>(out[0].owned.data()),
                          reinterpret_cast<uint16_t*>(out[1].owned.data()),
                          reinterpret_cast<uint16_t*>(out[2].owned.data()));
          return out;
        };
        return it;
      }
      case TensorKind::Conv:
        // MLX layout [channels, kernel, 1]: it also tells the loader the norms hold 1 + w.
        it.tensors = {{name, DType::F32, {s.rows, s.cols, 1}, nullptr}};
        break;
      case TensorKind::ZeroCentredNorm:
      case TensorKind::Vector:
        it.tensors = {{name, DType::F32, {s.rows}, nullptr}};
        break;
    }
    it.produce = [this, s] { return std::vector<TensorBytes>{f32_bytes(dense(s))}; };
    return it;
  }

  GgufModel g_;
  std::string arch_;
  json config_json_;
  ModelConfig config_;
  NameScheme names_;
  int bits_ = 4, group_ = 64;
  bool tiled_ = false;
  std::array<ProjectionFormat, 3> formats_;
  std::map<std::string, QuantSpec> overrides_;
  std::string files_dir_;
  std::vector<std::pair<std::string, std::string>> files_;
};

}  // namespace

std::unique_ptr<RepackSource> open_gguf_source(const std::string& path, const RepackOptions& opts) {
  return std::make_unique<GgufSource>(path, opts);
}

}  // namespace swiftlet
