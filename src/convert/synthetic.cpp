#include "convert/synthetic.h"

#include "core/dtype.h"
#include "core/error.h"
#include "format/quantize.h"
#include "io/mapped_file.h"
#include "model/weights.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// xoshiro256** (Blackman & Vigna), seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  void fill(uint8_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t r = next();
      std::memcpy(dst + i, &r, 8);
    }
    if (i < n) {
      const uint64_t r = next();
      std::memcpy(dst + i, &r, n - i);
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t mix(uint64_t a, uint64_t b) { return XXH3_64bits_withSeed(&b, sizeof b, a); }
uint64_t name_seed(uint64_t seed, const std::string& name) { return XXH3_64bits_withSeed(name.data(), name.size(), seed); }

// ----------------------------------------------------------------------------------- presets

struct Shape {
  std::string family;  // "qwen3_next" or "qwen3_5_moe"
  int layers, hidden, heads, kv_heads, head_dim;
  int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim;
  int experts, top_k, moe_inter, shared_inter;
  int64_t vocab;
  double rope_theta = 1e7;
  std::vector<int> eos;
  int bos = -1;
};

json make_config(const Shape& s) {
  json t;
  t["hidden_size"] = s.hidden;
  t["num_hidden_layers"] = s.layers;
  t["vocab_size"] = s.vocab;
  t["rms_norm_eps"] = 1e-6;
  t["num_attention_heads"] = s.heads;
  t["num_key_value_heads"] = s.kv_heads;
  t["head_dim"] = s.head_dim;
  t["linear_num_key_heads"] = s.lin_k_heads;
  t["linear_num_value_heads"] = s.lin_v_heads;
  t["linear_key_head_dim"] = s.lin_k_dim;
  t["linear_value_head_dim"] = s.lin_v_dim;
  t["linear_conv_kernel_dim"] = 4;
  t["num_experts"] = s.experts;
  t["num_experts_per_tok"] = s.top_k;
  t["moe_intermediate_size"] = s.moe_inter;
  t["shared_expert_intermediate_size"] = s.shared_inter;
  t["hidden_act"] = "silu";
  t["max_position_embeddings"] = 262144;
  t["attention_bias"] = false;
  if (s.bos >= 0) t["bos_token_id"] = s.bos;
  if (s.eos.size() == 1) t["eos_token_id"] = s.eos[0];
  else if (!s.eos.empty()) t["eos_token_id"] = s.eos;
  if (s.family == "qwen3_next") {
    json c = {{"architectures", {"Qwen3NextForCausalLM"}}, {"model_type", "qwen3_next"}};
    c.update(t);
    c["full_attention_interval"] = 4;
    c["rope_theta"] = s.rope_theta;
    c["partial_rotary_factor"] = 0.25;
    c["rope_scaling"] = nullptr;
    c["norm_topk_prob"] = true;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = json::array();
    c["tie_word_embeddings"] = false;
    c["torch_dtype"] = "bfloat16";
    return c;
  }
  // Qwen3.5/3.6: the multimodal wrapper with a nested text config (vision tower not included).
  json layer_types = json::array();
  for (int i = 0; i < s.layers; ++i) layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  t["model_type"] = "qwen3_5_moe_text";
  t["layer_types"] = layer_types;
  t["attn_output_gate"] = true;
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", s.rope_theta},
                          {"partial_rotary_factor", 0.25}, {"mrope_interleaved", true},
                          {"mrope_section", {11, 11, 10}}};
  t["dtype"] = "bfloat16";
  return json{{"architectures", {"Qwen3_5MoeForConditionalGeneration"}}, {"model_type", "qwen3_5_moe"},
              {"tie_word_embeddings", false}, {"text_config", t}};
}

std::vector<SyntheticPreset> build_presets() {
  std::vector<SyntheticPreset> p;
  p.push_back({"qwen3-next-80b-a3b",
               "Qwen3-Next-80B-A3B shapes: 48 layers, 512 experts top-10, vocab 151936 (~45 GB at 4 bits)", true,
               make_config({"qwen3_next", 48, 2048, 16, 2, 256, 16, 32, 128, 128, 512, 10, 512, 512, 151936,
                            1e7, {151645, 151643}, 151643})});
  p.push_back({"qwen3.5-35b-a3b",
               "Qwen3.5/3.6-35B-A3B shapes (text): 40 layers, 256 experts top-8, vocab 248320 (~19.5 GB at 4 bits)",
               true,
               make_config({"qwen3_5_moe", 40, 2048, 16, 2, 256, 16, 32, 128, 128, 256, 8, 512, 512, 248320,
                            1e7, {248046, 248044}, 248044})});
  p.push_back({"small",
               "80B-shaped layers (hidden 2048, experts of 1.69 MiB) but 8 layers x 128 experts top-10 (~2.4 GB)",
               false,
               make_config({"qwen3_next", 8, 2048, 16, 2, 256, 16, 32, 128, 128, 128, 10, 512, 512, 151936,
                            1e7, {151645, 151643}, 151643})});
  p.push_back({"tiny", "Qwen3-Next family, 4 layers (3 DeltaNet + 1 attention), hidden 128, 16 experts top-4 (~1.5 MB)",
               false, make_config({"qwen3_next", 4, 128, 4, 2, 64, 2, 4, 32, 32, 16, 4, 64, 64, 1024, 1e7, {}})});
  p.push_back({"tiny-q35", "Qwen3.5 family (multimodal wrapper config), 4 layers, hidden 128, 16 experts top-4",
               false, make_config({"qwen3_5_moe", 4, 128, 4, 2, 64, 2, 4, 32, 32, 16, 4, 64, 64, 1024, 1e7, {}})});
  // Rows of 256 values (hidden, the experts' and value widths): llama.cpp's K-quant types
  // (Q4_K, Q5_K, Q6_K blocks of 256) apply to every matrix; every expert serves every token, so
  // that another engine's rounding cannot flip a routing choice. For comparing with llama.cpp.
  p.push_back({"tiny-256", "Qwen3-Next family, 4 layers, hidden 256, 4 experts of 256 x 256 all used, vocab 256 "
               "(whole 256-value blocks for GGUF K-quants)",
               false, make_config({"qwen3_next", 4, 256, 4, 2, 64, 2, 4, 64, 64, 4, 4, 256, 256, 256, 1e7, {}})});
  p.push_back({"tiny-256-q35", "Qwen3.5 family, as tiny-256", false,
               make_config({"qwen3_5_moe", 4, 256, 4, 2, 64, 2, 4, 64, 64, 4, 4, 256, 256, 256, 1e7, {}})});
  return p;
}

json& text_config(json& c) { return c.contains("text_config") ? c["text_config"] : c; }

// ------------------------------------------------------------------------------- the source

bool is_eight_bit_module(const std::string& path) {
  return path.ends_with("mlp.gate") || path.ends_with("shared_expert_gate");
}

class SyntheticSource : public RepackSource {
 public:
  SyntheticSource(const SyntheticPreset& preset, const RepackOptions& o)
      : preset_(preset), config_json_(preset.config), seed_(o.seed), group_(o.group_size) {
    bits_ = o.bits == 0 ? 4 : o.bits;
    if (bits_ != 4 && bits_ != 8 && bits_ != 16) fail("--bits must be 4, 8 or 16, got {}", bits_);
    if (!o.tokenizer.empty()) embed_tokenizer(o.tokenizer);
    config_ = ModelConfig::parse(json::parse(config_json_.dump()), "preset " + preset_.name);
    names_ = NameScheme::mlx(config_);
  }

  std::string describe() const override { return "synthetic:" + preset_.name; }
  const ModelConfig& config() const override { return config_; }
  int quant_bits() const override { return bits_; }
  int quant_group_size() const override { return group_; }

  std::string config_json() const override {
    // The router and the shared expert's gate stay 8-bit (as mlx-lm quantises them).
    std::map<std::string, QuantSpec> overrides;
    if (bits_ != 8)
      for (int i = 0; i < config_.num_layers; ++i)
        for (const char* m : {"mlp.gate", "mlp.shared_expert_gate"}) overrides[names_.layer(i) + m] = QuantSpec{8, group_};
    return quantized_config_json(config_json_, bits_, group_, overrides);
  }

  std::vector<std::pair<std::string, std::string>> files() const override { return files_; }

  std::array<ProjectionFormat, 3> expert_formats() const override {
    std::array<ProjectionFormat, 3> f;
    for (auto& x : f) x = bits_ == 16 ? ProjectionFormat{16, group_, DType::BF16} : ProjectionFormat{bits_, group_, DType::BF16};
    return f;
  }

  std::vector<ResidentItem> resident() override {
    std::vector<ResidentItem> items;
    ModelWeights scratch;
    for_each_dense_tensor(config_, names_, scratch, [&](const DenseTensorSpec& s, auto&&, auto&&) {
      items.push_back(item(s));
    });
    return items;
  }

  void expert(int layer, int e, const QpackLayout& layout, uint8_t* blob) const override {
    const double H = double(config_.hidden_size), I = double(config_.moe_intermediate_size);
    for (int p = 0; p < 3; ++p) {
      const std::string proj = kExpertProjections[p];
      const int64_t rows = p == 2 ? config_.hidden_size : config_.moe_intermediate_size;
      const int64_t cols = p == 2 ? config_.moe_intermediate_size : config_.hidden_size;
      const float std = float(1.0 / std::sqrt(p == 2 ? I : H));
      const uint64_t seed = mix(mix(mix(seed_, uint64_t(layer)), uint64_t(e)), uint64_t(p) + 1);
      uint8_t* w = blob + layout.find(proj + ".weight")->offset;
      if (bits_ == 16) {
        synth_bf16(seed, size_t(rows * cols), std, reinterpret_cast<uint16_t*>(w));
        continue;
      }
      synth_affine(seed, rows, cols, bits_, group_, std, w,
                   reinterpret_cast<uint16_t*>(blob + layout.find(proj + ".scales")->offset),
                   reinterpret_cast<uint16_t*>(blob + layout.find(proj + ".biases")->offset));
    }
  }

 private:
  void embed_tokenizer(const std::string& path) {
    if (!fs::is_regular_file(path)) fail("tokenizer '{}' does not exist", path);
    // nlohmann::json (a std::map per object): ordered_json's linear lookups are quadratic in
    // the 150k vocabulary entries.
    const nlohmann::json tok = nlohmann::json::parse(read_text_file(path), nullptr, false);
    if (tok.is_discarded() || !tok.contains("model") || !tok["model"].contains("vocab"))
      fail("'{}' is not a Hugging Face tokenizer.json (no model.vocab)", path);
    int64_t max_id = -1;
    for (const auto& [k, v] : tok["model"]["vocab"].items())
      if (v.is_number_integer()) max_id = std::max<int64_t>(max_id, v.get<int64_t>());
    std::vector<int> eos;
    if (tok.contains("added_tokens"))
      for (const auto& a : tok["added_tokens"]) {
        const int64_t id = a.value("id", int64_t(-1));
        max_id = std::max(max_id, id);
        const std::string content = a.value("content", "");
        if (content == "<|im_end|>") eos.insert(eos.begin(), int(id));
        else if (content == "<|endoftext|>") eos.push_back(int(id));
      }
    if (max_id < 0) fail("'{}' has an empty vocabulary", path);
    json& t = text_config(config_json_);
    const int64_t preset_vocab = t["vocab_size"].get<int64_t>();
    // A released model's embedding has padding rows beyond the tokenizer: keep them.
    if (!(preset_.exact_shapes && preset_vocab > max_id)) t["vocab_size"] = max_id + 1;
    if (!eos.empty()) t["eos_token_id"] = eos;
    files_.emplace_back("tokenizer.json", path);
    const fs::path dir = fs::path(path).parent_path();
    for (const char* f : {"tokenizer_config.json", "chat_template.jinja"})
      if (fs::is_regular_file(dir / f)) files_.emplace_back(f, (dir / f).string());
  }

  ResidentItem item(const DenseTensorSpec& s) {
    ResidentItem it;
    const uint64_t seed = name_seed(seed_, s.name);
    switch (s.kind) {
      case TensorKind::Linear: {
        float std = float(1.0 / std::sqrt(double(s.cols)));
        if (s.embedding) std = 1.0f;
        const int bits = bits_ == 16 || s.cols % group_ != 0 ? 16 : is_eight_bit_module(s.name) ? 8 : bits_;
        const int64_t rows = s.rows, cols = s.cols;
        if (bits == 16) {
          it.tensors = {{s.name + ".weight", DType::BF16, {rows, cols}, nullptr}};
          it.produce = [=] {
            TensorBytes b;
            b.owned.resize(size_t(rows * cols) * 2);
            synth_bf16(seed, size_t(rows * cols), std, reinterpret_cast<uint16_t*>(b.owned.data()));
            return std::vector<TensorBytes>{std::move(b)};
          };
          return it;
        }
        const int group = group_;
        it.tensors = {{s.name + ".weight", DType::U32, {rows, cols * bits / 32}, nullptr},
                      {s.name + ".scales", DType::BF16, {rows, cols / group}, nullptr},
                      {s.name + ".biases", DType::BF16, {rows, cols / group}, nullptr}};
        it.produce = [=] {
          std::vector<TensorBytes> out(3);
          out[0].owned.resize(affine_packed_bytes(rows, cols, bits));
          out[1].owned.resize(affine_scale_bytes(rows, cols, group));
          out[2].owned.resize(out[1].owned.size());
          synth_affine(seed, rows, cols, bits, group, std, out[0].owned.data(),
                       reinterpret_cast<uint16_t*>(out[1].owned.data()),
                       reinterpret_cast<uint16_t*>(out[2].owned.data()));
          return out;
        };
        return it;
      }
      case TensorKind::ZeroCentredNorm:
        // MLX stores 1 + w; w = 0 at initialisation.
        return vector_item(s.name, {s.rows}, [](Rng&, int64_t) { return 1.0f; }, seed);
      case TensorKind::Conv:
        return vector_item(s.name, {s.rows, s.cols, 1}, [](Rng& r, int64_t) { return float(r.uniform() - 0.5); }, seed);
      case TensorKind::Vector:
        if (s.name.ends_with("A_log"))  // decay rates as transformers initialises them: A ~ U(1, 16)
          return vector_item(s.name, {s.rows}, [](Rng& r, int64_t) { return float(std::log(1.0 + 15.0 * r.uniform())); }, seed);
        if (s.name.ends_with("dt_bias"))  // softplus^-1 of dt ~ logU(1e-3, 1e-1)
          return vector_item(s.name, {s.rows}, [](Rng& r, int64_t) {
            const double dt = std::exp(std::log(1e-3) + r.uniform() * (std::log(1e-1) - std::log(1e-3)));
            return float(dt + std::log(-std::expm1(-dt)));
          }, seed);
        return vector_item(s.name, {s.rows}, [](Rng&, int64_t) { return 1.0f; }, seed);  // gated norm
    }
    return it;
  }

  template <typename F>
  static ResidentItem vector_item(const std::string& name, std::vector<int64_t> shape, F f, uint64_t seed) {
    ResidentItem it;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    it.tensors = {{name, DType::BF16, std::move(shape), nullptr}};
    it.produce = [=] {
      Rng r(seed);
      TensorBytes b;
      b.owned.resize(size_t(n) * 2);
      auto* out = reinterpret_cast<uint16_t*>(b.owned.data());
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f(r, i));
      return std::vector<TensorBytes>{std::move(b)};
    };
    return it;
  }

  const SyntheticPreset& preset_;
  json config_json_;
  ModelConfig config_;
  NameScheme names_;
  uint64_t seed_;
  int bits_ = 4, group_ = 64;
  std::vector<std::pair<std::string, std::string>> files_;
};

}  // namespace

const std::vector<SyntheticPreset>& synthetic_presets() {
  static const std::vector<SyntheticPreset> presets = build_presets();
  return presets;
}

const SyntheticPreset& find_synthetic_preset(const std::string& name) {
  std::string names;
  for (const auto& p : synthetic_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  fail("unknown synthetic preset '{}'; choose one of: {}", name, names);
}

std::unique_ptr<RepackSource> make_synthetic_source(const std::string& preset, const RepackOptions& opts) {
  return std::make_unique<SyntheticSource>(find_synthetic_preset(preset), opts);
}

void synth_affine(uint64_t seed, int64_t rows, int64_t cols, int bits, int group_size, float std,
                  uint8_t* packed, uint16_t* scales, uint16_t* biases) {
  SWIFTLET_CHECK((bits == 4 || bits == 8) && cols % group_size == 0, "bad synthetic quantisation");
  Rng r(seed);
  r.fill(packed, affine_packed_bytes(rows, cols, bits));
  // Uniform codes on 0..n-1 have mean (n-1)/2 and variance (n^2-1)/12.
  const double n = double(1 << bits);
  const float mag = float(std / std::sqrt((n * n - 1) / 12));
  const float centre = float((n - 1) / 2);
  const uint16_t s_pos = f32_to_bf16(mag), s_neg = f32_to_bf16(-mag);
  const uint16_t b_pos = f32_to_bf16(-centre * bf16_to_f32(s_pos)), b_neg = f32_to_bf16(-centre * bf16_to_f32(s_neg));
  const int64_t groups = rows * (cols / group_size);
  uint64_t signs = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if ((g & 63) == 0) signs = r.next();
    const bool neg = (signs >> (g & 63)) & 1;
    scales[g] = neg ? s_neg : s_pos;
    biases[g] = neg ? b_neg : b_pos;
  }
}

void synth_bf16(uint64_t seed, size_t n, float std, uint16_t* out) {
  // |x| uniform-ish in [a, 2a): E[x^2] = 7a^2/3, so a = std / 1.53; a is a power of two so that
  // the exponent is fixed and the mantissa and sign are raw random bits.
  const int e = int(std::lround(std::log2(double(std) / 1.5275)));
  const uint16_t exp_bits = uint16_t((127 + e) << 7);
  Rng r(seed);
  size_t i = 0;
  while (i < n) {
    uint64_t x = r.next();
    for (int k = 0; k < 4 && i < n; ++k, ++i, x >>= 16)
      out[i] = uint16_t((x & 0x8000) | exp_bits | (x & 0x7f));
  }
}

}  // namespace swiftlet
