// The resident (dense) weights of a Qwen3-Next / Qwen3.5-MoE model, and the one table that
// names every one of them (for_each_dense_tensor): the loader, the repacker and the validator
// all walk it. Routed experts are not here: they come from an ExpertSource.
#pragma once

#include "format/hf_config.h"
#include "core/qmatrix.h"

#include <memory>
#include <string>
#include <vector>

namespace swiftlet {

class TensorSet;

// Where the tensors of one checkpoint flavour live (HF Qwen3-Next, HF Qwen3.5, MLX Qwen3.5).
struct NameScheme {
  std::string layers;      // "model.layers." + N + "."
  std::string embed;       // module path of the embedding
  std::string final_norm;  // tensor name of the final norm
  std::string lm_head;     // module path of the output projection
  std::string layer(int i) const { return layers + std::to_string(i) + "."; }
  // Detects the scheme from the tensor names present. Throws Error when none fits.
  static NameScheme detect(const TensorSet& ts, const ModelConfig& cfg);
  static NameScheme hf(const ModelConfig& cfg);   // names transformers writes
  static NameScheme mlx(const ModelConfig& cfg);  // names mlx-lm writes (and .qpack keeps)
};

enum class TensorKind {
  Linear,           // a weight matrix, possibly quantised: name is the module path (no ".weight")
  Vector,           // a plain fp32 vector (A_log, dt_bias, the gated norm)
  ZeroCentredNorm,  // RMSNorm weight applied as (1 + w); MLX checkpoints store 1 + w already
  Conv,             // depthwise conv1d weight [channels, 1, kernel] (HF) or [channels, kernel, 1] (MLX)
};

// Qwen3-Next's fused DeltaNet inputs, whose rows a Grouped checkpoint orders per key head.
enum class FusedInput { None, Qkvz, Ba };

// How a checkpoint or container stores the DeltaNet inputs (docs/qpack.md 4, model-math.md 5.1).
// Grouped: Qwen3-Next as published (Hugging Face, MLX, Swiftlet's containers): two fused tensors,
// in_proj_qkvz rows [q_g | k_g | v (r heads) | z (r heads)] and in_proj_ba rows [b (r) | a (r)]
// for each key head g. Split: four tensors in_proj_qkv ([q | k | v]), in_proj_z, in_proj_b and
// in_proj_a, heads in order: Qwen3.5's own layout, and what swiftlet-repack writes for both
// families. The tensor names say which; the loader turns Grouped into Split once.
enum class DeltaNetLayout { Grouped, Split };

struct DenseTensorSpec {
  std::string name;  // module path (Linear) or full tensor name (others)
  TensorKind kind;
  int64_t rows;      // Linear: out features; Vector/Norm: length; Conv: channels
  int64_t cols;      // Linear: in features; Conv: kernel size; else 1
  bool embedding = false;  // the token embedding (quantised like a Linear, read by row)
  FusedInput fused = FusedInput::None;
};

struct AttentionWeights {
  QMatrix q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_norm, k_norm;  // [head_dim], 1 + w applied
};

struct DeltaNetWeights {
  // Qwen3-Next's stored tensors, rows in the Split order ([q | k | v | z], [b | a]) once loaded.
  QMatrix in_proj_qkvz, in_proj_ba;
  // What the forward passes read, heads contiguous: Qwen3.5's own tensors, or Qwen3-Next's row
  // ranges of the two above.
  QMatrix in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;
  QMatrix out_proj;
  std::vector<float> conv1d;  // [conv_dim][kernel]
  std::vector<float> A_log, dt_bias;  // [value_heads]
  std::vector<float> norm;            // [value_head_dim], plain weight (not 1 + w)
};

struct MoeDenseWeights {
  QMatrix router;  // mlp.gate [experts, hidden]
  QMatrix shared_gate_proj, shared_up_proj, shared_down_proj;
  QMatrix shared_expert_gate;  // [1, hidden]
};

struct LayerWeights {
  bool linear = false;
  std::vector<float> input_layernorm, post_attention_layernorm;  // 1 + w applied
  AttentionWeights attn;
  DeltaNetWeights gdn;
  MoeDenseWeights moe;
};

struct ModelWeights {
  QMatrix embed_tokens;
  QMatrix lm_head;  // equals embed_tokens when tied
  std::vector<float> norm;
  std::vector<LayerWeights> layers;
  // Memory the weights above point into besides the mapped file: rows reordered at load.
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> owned;
};

// Calls f(spec, QMatrix* or nullptr, std::vector<float>* or nullptr) for every resident tensor,
// in a fixed order. lm_head is skipped when embeddings are tied. `layout` picks Qwen3-Next's
// DeltaNet inputs: the two fused tensors (Grouped) or the four split ones (Split); Qwen3.5 has
// only the four.
template <typename F>
void for_each_dense_tensor(const ModelConfig& c, const NameScheme& n, ModelWeights& w, F&& f,
                           DeltaNetLayout layout = DeltaNetLayout::Split) {
  const int64_t H = c.hidden_size;
  using K = TensorKind;
  w.layers.resize(size_t(c.num_layers));
  f(DenseTensorSpec{n.embed, K::Linear, c.vocab_size, H, true}, &w.embed_tokens, nullptr);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = n.layer(i);
    LayerWeights& l = w.layers[size_t(i)];
    l.linear = c.is_linear_layer(i);
    f(DenseTensorSpec{p + "input_layernorm.weight", K::ZeroCentredNorm, H, 1}, nullptr, &l.input_layernorm);
    if (l.linear) {
      const std::string a = p + "linear_attn.";
      DeltaNetWeights& g = l.gdn;
      const int64_t kd = c.linear_key_dim(), vd = c.linear_value_dim(), hv = c.linear_num_value_heads;
      if (c.family == Family::Qwen3Next && layout == DeltaNetLayout::Grouped) {
        f(DenseTensorSpec{a + "in_proj_qkvz", K::Linear, 2 * kd + 2 * vd, H, false, FusedInput::Qkvz},
          &g.in_proj_qkvz, nullptr);
        f(DenseTensorSpec{a + "in_proj_ba", K::Linear, 2 * hv, H, false, FusedInput::Ba}, &g.in_proj_ba, nullptr);
      } else {
        f(DenseTensorSpec{a + "in_proj_qkv", K::Linear, c.conv_dim(), H}, &g.in_proj_qkv, nullptr);
        f(DenseTensorSpec{a + "in_proj_z", K::Linear, vd, H}, &g.in_proj_z, nullptr);
        f(DenseTensorSpec{a + "in_proj_b", K::Linear, hv, H}, &g.in_proj_b, nullptr);
        f(DenseTensorSpec{a + "in_proj_a", K::Linear, hv, H}, &g.in_proj_a, nullptr);
      }
      f(DenseTensorSpec{a + "conv1d.weight", K::Conv, c.conv_dim(), c.linear_conv_kernel_dim}, nullptr, &g.conv1d);
      f(DenseTensorSpec{a + "A_log", K::Vector, hv, 1}, nullptr, &g.A_log);
      f(DenseTensorSpec{a + "dt_bias", K::Vector, hv, 1}, nullptr, &g.dt_bias);
      f(DenseTensorSpec{a + "norm.weight", K::Vector, c.linear_value_head_dim, 1}, nullptr, &g.norm);
      f(DenseTensorSpec{a + "out_proj", K::Linear, H, vd}, &g.out_proj, nullptr);
    } else {
      const std::string a = p + "self_attn.";
      AttentionWeights& at = l.attn;
      f(DenseTensorSpec{a + "q_proj", K::Linear, c.q_proj_rows(), H}, &at.q_proj, nullptr);
      f(DenseTensorSpec{a + "k_proj", K::Linear, c.kv_dim(), H}, &at.k_proj, nullptr);
      f(DenseTensorSpec{a + "v_proj", K::Linear, c.kv_dim(), H}, &at.v_proj, nullptr);
      f(DenseTensorSpec{a + "o_proj", K::Linear, H, c.attn_out_dim()}, &at.o_proj, nullptr);
      f(DenseTensorSpec{a + "q_norm.weight", K::ZeroCentredNorm, c.head_dim, 1}, nullptr, &at.q_norm);
      f(DenseTensorSpec{a + "k_norm.weight", K::ZeroCentredNorm, c.head_dim, 1}, nullptr, &at.k_norm);
    }
    f(DenseTensorSpec{p + "post_attention_layernorm.weight", K::ZeroCentredNorm, H, 1}, nullptr,
      &l.post_attention_layernorm);
    const std::string m = p + "mlp.";
    const int64_t si = c.shared_expert_intermediate_size;
    f(DenseTensorSpec{m + "gate", K::Linear, c.num_experts, H}, &l.moe.router, nullptr);
    f(DenseTensorSpec{m + "shared_expert.gate_proj", K::Linear, si, H}, &l.moe.shared_gate_proj, nullptr);
    f(DenseTensorSpec{m + "shared_expert.up_proj", K::Linear, si, H}, &l.moe.shared_up_proj, nullptr);
    f(DenseTensorSpec{m + "shared_expert.down_proj", K::Linear, H, si}, &l.moe.shared_down_proj, nullptr);
    f(DenseTensorSpec{m + "shared_expert_gate", K::Linear, 1, H}, &l.moe.shared_expert_gate, nullptr);
  }
  f(DenseTensorSpec{n.final_norm, K::ZeroCentredNorm, H, 1}, nullptr, &w.norm);
  if (!c.tie_word_embeddings)
    f(DenseTensorSpec{n.lm_head, K::Linear, c.vocab_size, H}, &w.lm_head, nullptr);
  else
    w.lm_head = w.embed_tokens;
}

// Views a (possibly quantised) matrix stored under module path `path`: `path.weight` (float)
// or `path.weight` U32 + `path.scales` + `path.biases` (MLX affine). The presence of `.scales`
// decides which, never the module's name; bits and group size come from the shapes, and where
// `q` names the module, it must agree. `index` >= 0 selects one matrix of a stacked
// [N, rows, ...] tensor. Validates shapes against rows x cols.
QMatrix view_linear(const TensorSet& ts, const std::string& path, int64_t rows, int64_t cols,
                    const QuantConfig& q, int64_t index = -1, const std::string& weight_suffix = ".weight");

// Whether zero-centred norm weights already hold 1 + w (MLX-converted checkpoints: detected,
// as mlx-lm does, by the conv1d weight being in MLX layout [C, K, 1]).
bool norms_hold_one_plus_w(const TensorSet& ts, const ModelConfig& c, const NameScheme& n);

// Row i of a fused input in the Split order is row split_row_order(c, which)[i] of the Grouped
// one: in_proj_qkvz's first conv_dim() rows become in_proj_qkv, the rest in_proj_z; in_proj_ba's
// first linear_num_value_heads rows in_proj_b, the rest in_proj_a.
std::vector<int64_t> split_row_order(const ModelConfig& c, FusedInput which);

// Grouped when the first DeltaNet layer of a Qwen3-Next model has in_proj_qkvz, else Split.
DeltaNetLayout stored_deltanet_layout(const TensorSet& ts, const ModelConfig& c, const NameScheme& n);

// Loads every resident tensor (views into `ts`, vectors converted to fp32 with 1 + w applied).
// Grouped inputs are reordered once into memory of their own (`owned`) and the four split inputs
// are views of their row ranges.
ModelWeights load_dense_weights(const TensorSet& ts, const ModelConfig& c, const NameScheme& n);

}  // namespace swiftlet
