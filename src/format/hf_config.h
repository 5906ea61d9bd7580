// The model configuration of both supported families, parsed and validated once from a
// Hugging Face config.json (model-math.md 1). Derived sizes are methods.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace swiftlet {

enum class Family { Qwen3Next, Qwen35Moe };

// Quantisation of one module (MLX affine: value = scale * q + bias, groups along the input axis).
struct QuantSpec {
  int bits = 0;  // 0: not quantised
  int group_size = 64;
};

// The "quantization" block of an MLX config: a default plus per-module overrides keyed by the
// module path (tensor name without ".weight").
struct QuantConfig {
  QuantSpec default_spec;  // bits 0 when the checkpoint is not quantised
  std::map<std::string, QuantSpec> overrides;
  bool quantized() const { return default_spec.bits != 0; }
  QuantSpec for_module(const std::string& path) const;
};

struct ModelConfig {
  Family family = Family::Qwen3Next;
  std::string model_type;  // as in config.json ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")

  int64_t hidden_size = 0;
  int num_layers = 0;
  int64_t vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;

  // Gated full attention.
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool attn_output_gate = true;
  float rope_theta = 10000.0f;
  float partial_rotary_factor = 1.0f;

  // Gated DeltaNet.
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 4;
  // The epsilon of the q/k L2 norms (model-math.md 5.3): fixed by the models, not in config.json.
  static constexpr float kQkL2NormEps = 1e-6f;

  // Mixture of experts.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;

  std::vector<bool> linear_layers;  // per layer: true for Gated DeltaNet, false for attention
  std::vector<int32_t> eos_token_ids;
  QuantConfig quant;

  // Parses and validates. `source` names the file in error messages.
  static ModelConfig parse(const nlohmann::json& j, const std::string& source);
  static ModelConfig load(const std::string& config_json_path);

  bool is_linear_layer(int i) const { return linear_layers.at(size_t(i)); }
  int rotary_dim() const { return int(head_dim * partial_rotary_factor) / 2 * 2; }
  int64_t q_proj_rows() const { return int64_t(num_heads) * head_dim * (attn_output_gate ? 2 : 1); }
  int64_t attn_out_dim() const { return int64_t(num_heads) * head_dim; }
  int64_t kv_dim() const { return int64_t(num_kv_heads) * head_dim; }
  int64_t linear_key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t linear_value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int num_full_layers() const;
  int num_linear_layers() const { return num_layers - num_full_layers(); }
  // Bytes of KV cache per token (fp32 k and v of every full-attention layer).
  int64_t kv_bytes_per_token() const { return int64_t(num_full_layers()) * 2 * kv_dim() * 4; }
  // Bytes of DeltaNet state per session (fp32 recurrent + conv state).
  int64_t linear_state_bytes() const;
  const char* family_name() const;
};

}  // namespace swiftlet
