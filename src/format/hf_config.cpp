#include "format/hf_config.h"

#include "core/error.h"
#include "io/mapped_file.h"

#include <nlohmann/json.hpp>

namespace swiftlet {

using nlohmann::json;

QuantSpec QuantConfig::for_module(const std::string& path) const {
  auto it = overrides.find(path);
  return it == overrides.end() ? default_spec : it->second;
}

int ModelConfig::num_full_layers() const {
  int n = 0;
  for (bool lin : linear_layers) n += lin ? 0 : 1;
  return n;
}

int64_t ModelConfig::linear_state_bytes() const {
  int64_t per_layer = int64_t(linear_num_value_heads) * linear_key_head_dim * linear_value_head_dim +
                      int64_t(linear_conv_kernel_dim - 1) * conv_dim();
  return per_layer * num_linear_layers() * 4;
}

const char* ModelConfig::family_name() const {
  return family == Family::Qwen3Next ? "Qwen3-Next" : "Qwen3.5/3.6-MoE";
}

namespace {

// Reads typed fields with errors that name the file and key.
struct Reader {
  const json& j;
  const std::string& source;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t integer(const char* k) const {
    if (!has(k)) fail("{}: missing required field '{}'", source, k);
    if (!j[k].is_number_integer()) fail("{}: field '{}' must be an integer, got {}", source, k, j[k].dump());
    return j[k].get<int64_t>();
  }
  int64_t integer(const char* k, int64_t def) const { return has(k) ? integer(k) : def; }
  double number(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) fail("{}: field '{}' must be a number, got {}", source, k, j[k].dump());
    return j[k].get<double>();
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) fail("{}: field '{}' must be true or false, got {}", source, k, j[k].dump());
    return j[k].get<bool>();
  }
};

void positive(const std::string& source, const char* name, int64_t v) {
  if (v <= 0) fail("{}: '{}' must be positive, got {}", source, name, v);
}

QuantConfig parse_quant(const json& q, const std::string& source) {
  QuantConfig qc;
  auto spec = [&](const json& o, const std::string& where) {
    QuantSpec s;
    if (!o.is_object() || !o.contains("bits") || !o["bits"].is_number_integer())
      fail("{}: quantization entry '{}' needs integer 'bits'", source, where);
    s.bits = o["bits"].get<int>();
    if (o.contains("group_size") && !o["group_size"].is_number_integer())
      fail("{}: quantization entry '{}' needs an integer 'group_size'", source, where);
    s.group_size = o.value("group_size", 64);
    if (s.bits != 4 && s.bits != 8)
      fail("{}: quantization '{}' uses {} bits; only 4 and 8 are supported", source, where, s.bits);
    if (s.group_size <= 0 || s.group_size % 8 != 0)
      fail("{}: quantization '{}' group size {} is not a positive multiple of 8", source, where,
           s.group_size);
    return s;
  };
  if (q.contains("mode") && q["mode"].is_string() && q["mode"] != "affine")
    fail("{}: quantization mode '{}' is not supported (only MLX affine)", source,
         q["mode"].get<std::string>());
  qc.default_spec = spec(q, "default");
  for (auto& [k, v] : q.items()) {
    if (k == "bits" || k == "group_size" || k == "mode") continue;
    if (v.is_object()) qc.overrides[k] = spec(v, k);
    else if (v.is_boolean() && !v.get<bool>()) qc.overrides[k] = QuantSpec{0, 64};
  }
  return qc;
}

}  // namespace

ModelConfig ModelConfig::parse(const json& root, const std::string& source) {
  if (!root.is_object()) fail("{}: not a JSON object", source);
  ModelConfig c;
  if (root.contains("model_type") && !root["model_type"].is_string())
    fail("{}: 'model_type' must be a string, not {}", source, root["model_type"].type_name());
  const std::string top_type = root.value("model_type", "");
  const json* text = &root;
  if (top_type == "qwen3_next") {
    c.family = Family::Qwen3Next;
  } else if (top_type == "qwen3_5_moe") {
    c.family = Family::Qwen35Moe;
    if (root.contains("text_config") && root["text_config"].is_object()) text = &root["text_config"];
  } else if (top_type == "qwen3_5_moe_text") {
    c.family = Family::Qwen35Moe;
  } else if (top_type.empty()) {
    fail("{}: no 'model_type'; is this a Hugging Face config.json?", source);
  } else {
    fail("{}: model_type '{}' is not supported; swiftlet runs qwen3_next (Qwen3-Next-80B-A3B) and "
         "qwen3_5_moe (Qwen3.5/3.6-35B-A3B)", source, top_type);
  }
  c.model_type = top_type;
  Reader r{*text, source};
  Reader top{root, source};

  c.hidden_size = r.integer("hidden_size");
  c.num_layers = int(r.integer("num_hidden_layers"));
  c.vocab_size = r.integer("vocab_size");
  c.rms_norm_eps = float(r.number("rms_norm_eps", 1e-6));
  // The multimodal wrapper owns lm_head, so its top-level flag decides tying there.
  c.tie_word_embeddings = top.has("tie_word_embeddings") ? top.boolean("tie_word_embeddings", false)
                                                          : r.boolean("tie_word_embeddings", false);
  c.num_heads = int(r.integer("num_attention_heads"));
  c.num_kv_heads = int(r.integer("num_key_value_heads", c.num_heads));
  c.head_dim = int(r.integer("head_dim", c.num_heads ? c.hidden_size / c.num_heads : 0));
  c.attn_output_gate = r.boolean("attn_output_gate", true);

  // Rope settings live at top level (older configs) or in rope_parameters (transformers 5).
  const json* rope = text->contains("rope_parameters") && (*text)["rope_parameters"].is_object()
                         ? &(*text)["rope_parameters"] : nullptr;
  Reader rr{rope ? *rope : *text, source};
  c.rope_theta = float(rr.number("rope_theta", r.number("rope_theta", 10000.0)));
  c.partial_rotary_factor =
      float(rr.number("partial_rotary_factor", r.number("partial_rotary_factor", 1.0)));
  if (rope && rope->contains("rope_type") && (*rope)["rope_type"].is_string()) {
    std::string t = (*rope)["rope_type"];
    if (t != "default" && t != "mrope")
      fail("{}: rope_type '{}' is not supported (only the default rope)", source, t);
  }
  if (text->contains("rope_scaling") && !(*text)["rope_scaling"].is_null())
    fail("{}: rope_scaling is set; scaled rope (YaRN) is not supported yet", source);

  c.linear_num_key_heads = int(r.integer("linear_num_key_heads"));
  c.linear_num_value_heads = int(r.integer("linear_num_value_heads"));
  c.linear_key_head_dim = int(r.integer("linear_key_head_dim"));
  c.linear_value_head_dim = int(r.integer("linear_value_head_dim"));
  c.linear_conv_kernel_dim = int(r.integer("linear_conv_kernel_dim", 4));

  c.num_experts = int(r.integer("num_experts"));
  c.num_experts_per_tok = int(r.integer("num_experts_per_tok"));
  c.moe_intermediate_size = r.integer("moe_intermediate_size");
  c.shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size");
  c.norm_topk_prob = c.family == Family::Qwen35Moe ? true : r.boolean("norm_topk_prob", true);

  if (r.integer("decoder_sparse_step", 1) != 1 ||
      (text->contains("mlp_only_layers") && (*text)["mlp_only_layers"].is_array() &&
       !(*text)["mlp_only_layers"].empty()))
    fail("{}: dense (non-MoE) MLP layers (decoder_sparse_step / mlp_only_layers) are not "
         "supported; the released Qwen3-Next and Qwen3.5 models have none", source);

  for (auto [name, v] : {std::pair{"hidden_size", c.hidden_size},
                         {"num_hidden_layers", int64_t(c.num_layers)},
                         {"vocab_size", c.vocab_size},
                         {"num_attention_heads", int64_t(c.num_heads)},
                         {"num_key_value_heads", int64_t(c.num_kv_heads)},
                         {"head_dim", int64_t(c.head_dim)},
                         {"linear_num_key_heads", int64_t(c.linear_num_key_heads)},
                         {"linear_num_value_heads", int64_t(c.linear_num_value_heads)},
                         {"linear_key_head_dim", int64_t(c.linear_key_head_dim)},
                         {"linear_value_head_dim", int64_t(c.linear_value_head_dim)},
                         {"linear_conv_kernel_dim", int64_t(c.linear_conv_kernel_dim)},
                         {"num_experts", int64_t(c.num_experts)},
                         {"num_experts_per_tok", int64_t(c.num_experts_per_tok)},
                         {"moe_intermediate_size", c.moe_intermediate_size}})
    positive(source, name, v);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
         c.num_heads, c.num_kv_heads);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", source,
         c.linear_num_value_heads, c.linear_num_key_heads);
  if (c.num_experts_per_tok > c.num_experts)
    fail("{}: num_experts_per_tok {} exceeds num_experts {}", source, c.num_experts_per_tok,
         c.num_experts);
  if (c.partial_rotary_factor <= 0 || c.partial_rotary_factor > 1)
    fail("{}: partial_rotary_factor {} must be in (0, 1]", source, c.partial_rotary_factor);

  // Layer kinds: an explicit list, or every full_attention_interval-th layer is attention.
  if (text->contains("layer_types") && (*text)["layer_types"].is_array()) {
    const auto& lt = (*text)["layer_types"];
    if (int(lt.size()) != c.num_layers)
      fail("{}: layer_types has {} entries for {} layers", source, lt.size(), c.num_layers);
    for (const auto& t : lt) {
      std::string s = t.is_string() ? t.get<std::string>() : t.dump();
      if (s == "linear_attention") c.linear_layers.push_back(true);
      else if (s == "full_attention") c.linear_layers.push_back(false);
      else fail("{}: unknown layer type '{}' (expected linear_attention or full_attention)", source, s);
    }
  } else {
    int interval = int(r.integer("full_attention_interval", 4));
    positive(source, "full_attention_interval", interval);
    for (int i = 0; i < c.num_layers; ++i) c.linear_layers.push_back((i + 1) % interval != 0);
  }

  auto eos = text->contains("eos_token_id") ? (*text)["eos_token_id"] : root.value("eos_token_id", json());
  if (eos.is_number_integer()) c.eos_token_ids.push_back(eos.get<int32_t>());
  else if (eos.is_array())
    for (const auto& e : eos)
      if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int32_t>());

  const json* q = nullptr;
  if (root.contains("quantization") && root["quantization"].is_object()) q = &root["quantization"];
  else if (root.contains("quantization_config") && root["quantization_config"].is_object() &&
           root["quantization_config"].contains("bits"))
    q = &root["quantization_config"];
  if (q) c.quant = parse_quant(*q, source);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  json j = json::parse(read_text_file(path), nullptr, false);
  if (j.is_discarded()) fail("'{}' is not valid JSON", path);
  return parse(j, path);
}

}  // namespace swiftlet
