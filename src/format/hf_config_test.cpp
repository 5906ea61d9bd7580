#include "format/hf_config.h"

#include "core/error.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace swiftlet {
namespace {

using nlohmann::json;

json next_80b() {
  return json::parse(R"({
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "partial_rotary_factor": 0.25,
    "rope_theta": 10000000, "rms_norm_eps": 1e-6, "full_attention_interval": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "vocab_size": 151936,
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "tie_word_embeddings": false, "eos_token_id": 151645})");
}

TEST(HfConfig, Qwen3Next80B) {
  ModelConfig c = ModelConfig::parse(next_80b(), "config.json");
  EXPECT_EQ(c.family, Family::Qwen3Next);
  EXPECT_EQ(c.num_full_layers(), 12);
  EXPECT_FALSE(c.is_linear_layer(3));
  EXPECT_TRUE(c.is_linear_layer(4));
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.q_proj_rows(), 8192);
  EXPECT_EQ(c.conv_dim(), 8192);
  EXPECT_EQ(c.kv_bytes_per_token(), 12 * 2 * 512 * 4);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
  EXPECT_FALSE(c.quant.quantized());
}

TEST(HfConfig, Qwen35NestedTextConfigAndRopeParameters) {
  json text = next_80b();
  text.erase("full_attention_interval");
  text.erase("rope_theta");
  text.erase("partial_rotary_factor");
  text["model_type"] = "qwen3_5_moe_text";
  text["num_hidden_layers"] = 8;
  text["layer_types"] = json::array();
  for (int i = 0; i < 8; ++i)
    text["layer_types"].push_back((i + 1) % 4 ? "linear_attention" : "full_attention");
  text["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7},
                             {"partial_rotary_factor", 0.5}, {"mrope_interleaved", true}};
  json root = {{"model_type", "qwen3_5_moe"}, {"text_config", text},
               {"vision_config", {{"depth", 2}}}, {"tie_word_embeddings", true}};
  ModelConfig c = ModelConfig::parse(root, "config.json");
  EXPECT_EQ(c.family, Family::Qwen35Moe);
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_EQ(c.num_full_layers(), 2);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e7f);
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_TRUE(c.tie_word_embeddings);
}

std::string error_of(const json& j) {
  try {
    ModelConfig::parse(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, RefusesWhatItCannotRun) {
  json j = next_80b();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("model_type 'llama' is not supported"), std::string::npos);
  j = next_80b();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("missing required field 'hidden_size'"), std::string::npos);
  j = next_80b();
  j["num_experts"] = "512";
  EXPECT_NE(error_of(j).find("'num_experts' must be an integer"), std::string::npos);
  j = next_80b();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("not a multiple"), std::string::npos);
  j = next_80b();
  j["mlp_only_layers"] = {0};
  EXPECT_NE(error_of(j).find("dense"), std::string::npos);
  j = next_80b();
  j["layer_types"] = {"linear_attention"};
  EXPECT_NE(error_of(j).find("layer_types has 1 entries"), std::string::npos);
  j = next_80b();
  j["quantization"] = {{"bits", 3}, {"group_size", 64}};
  EXPECT_NE(error_of(j).find("3 bits"), std::string::npos);
  // Wrong JSON types are errors that say so, not uncaught json exceptions (fuzz findings).
  j = next_80b();
  j["model_type"] = 7;
  EXPECT_NE(error_of(j).find("'model_type' must be a string, not number"), std::string::npos);
  j = next_80b();
  j["quantization"] = {{"bits", 4}, {"group_size", "64"}};
  EXPECT_NE(error_of(j).find("needs an integer 'group_size'"), std::string::npos);
}

TEST(HfConfig, MlxQuantizationOverrides) {
  json j = next_80b();
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"},
                       {"model.layers.0.mlp.gate", {{"group_size", 64}, {"bits", 8}}}};
  ModelConfig c = ModelConfig::parse(j, "config.json");
  EXPECT_TRUE(c.quant.quantized());
  EXPECT_EQ(c.quant.for_module("model.layers.0.mlp.gate").bits, 8);
  EXPECT_EQ(c.quant.for_module("model.layers.0.mlp.shared_expert.up_proj").bits, 4);
}

}  // namespace
}  // namespace swiftlet
