#include "experts/tensor_experts.h"

#include "core/error.h"
#include "format/safetensors.h"

namespace swiftlet {

TensorExperts::TensorExperts(const TensorSet& ts, const ModelConfig& c, const NameScheme& n)
    : num_experts_(c.num_experts) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  const int E = c.num_experts;
  table_.resize(size_t(c.num_layers) * size_t(E));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string m = n.layer(l) + "mlp.";
    ExpertWeights* row = &table_[size_t(l) * size_t(E)];
    if (ts.contains(m + "switch_mlp.gate_proj.weight")) {
      layouts_.push_back(ExpertLayout::Stacked);
      for (int e = 0; e < E; ++e) {
        row[e].gate = view_linear(ts, m + "switch_mlp.gate_proj", I, H, c.quant, e);
        row[e].up = view_linear(ts, m + "switch_mlp.up_proj", I, H, c.quant, e);
        row[e].down = view_linear(ts, m + "switch_mlp.down_proj", H, I, c.quant, e);
      }
    } else if (ts.contains(m + "experts.gate_up_proj") || ts.contains(m + "experts.gate_up_proj.weight")) {
      layouts_.push_back(ExpertLayout::Fused);
      const std::string sfx = ts.contains(m + "experts.gate_up_proj") ? "" : ".weight";
      for (int e = 0; e < E; ++e) {
        // gate is the FIRST half of dim 1 (model-math.md 1.3).
        QMatrix gu = view_linear(ts, m + "experts.gate_up_proj", 2 * I, H, c.quant, e, sfx);
        row[e].gate = gu.row_slice(0, I);
        row[e].up = gu.row_slice(I, I);
        row[e].down = view_linear(ts, m + "experts.down_proj", H, I, c.quant, e, sfx);
      }
    } else if (ts.contains(m + "experts.0.gate_proj.weight")) {
      layouts_.push_back(ExpertLayout::PerExpert);
      for (int e = 0; e < E; ++e) {
        const std::string p = m + "experts." + std::to_string(e) + ".";
        row[e].gate = view_linear(ts, p + "gate_proj", I, H, c.quant);
        row[e].up = view_linear(ts, p + "up_proj", I, H, c.quant);
        row[e].down = view_linear(ts, p + "down_proj", H, I, c.quant);
      }
    } else {
      fail("'{}' has no routed experts for layer {} (looked for {}experts.0.gate_proj.weight, "
           "{}experts.gate_up_proj and {}switch_mlp.gate_proj.weight)", ts.source(), l, m, m, m);
    }
  }
}

const ExpertWeights& TensorExperts::get(int layer, int expert) const {
  return table_.at(size_t(layer) * size_t(num_experts_) + size_t(expert));
}

void TensorExperts::acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) {
  for (size_t i = 0; i < experts.size(); ++i) out[i] = get(layer, experts[i]);
}

}  // namespace swiftlet
