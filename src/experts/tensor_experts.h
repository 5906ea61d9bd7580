// Experts that are already addressable in memory: a mapped Hugging Face or MLX checkpoint.
// Reads all three layouts (model-math.md 1.3 and 8): per expert (mlp.experts.N.gate_proj),
// fused (mlp.experts.gate_up_proj [E, 2I, H] + down_proj [E, H, I]) and MLX stacked
// (mlp.switch_mlp.{gate,up,down}_proj, quantised or not).
#pragma once

#include "format/hf_config.h"
#include "model/expert_source.h"
#include "model/weights.h"

#include <vector>

namespace swiftlet {

class TensorSet;

enum class ExpertLayout { PerExpert, Fused, Stacked };

class TensorExperts : public ExpertSource {
 public:
  // Validates every expert tensor of every layer up front; throws Error naming the first bad one.
  TensorExperts(const TensorSet& ts, const ModelConfig& c, const NameScheme& n);

  int max_batch() const override { return 1 << 30; }
  void acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) override;
  void release(int) override {}

  ExpertLayout layout(int layer) const { return layouts_.at(size_t(layer)); }
  const ExpertWeights& get(int layer, int expert) const;

 private:
  int num_experts_ = 0;
  std::vector<ExpertLayout> layouts_;
  std::vector<ExpertWeights> table_;  // [layer * num_experts + expert]
};

}  // namespace swiftlet
