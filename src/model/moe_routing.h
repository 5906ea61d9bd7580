// The MoE block's routing steps that do not depend on where the experts live (model-math.md 6.1):
// the top-k choice of one token's router output and the grouping of a call's (token, choice)
// pairs by expert, which the CPU pass's routed experts and the GPU prompt's work list share.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace swiftlet {

// Permutes `order` (E entries, overwritten) so that its first top_k are the experts with the
// highest scores p[0 .. E-1], highest first, a tie to the lower id. Probabilities and logits give
// the same choice.
void top_k_experts(const float* p, int top_k, std::span<int32_t> order);

// Token t's j-th choice is pair p = t top_k + j with expert ids[p]. Groups the pairs by expert:
// groups in ascending expert order, each group's pairs in ascending p; a pair with a negative
// expert (left out on a miss) is in no group. Writes experts[g] and the group's range
// start[g] .. start[g + 1] of `pairs` for g < groups, and returns groups. experts needs
// num_experts entries, start num_experts + 1, pairs ids.size(). Fails on an id >= num_experts.
int group_pairs_by_expert(std::span<const int32_t> ids, int num_experts, int32_t* experts, int32_t* start,
                          int32_t* pairs);

// group_pairs_by_expert's result in buffers of its own, with each expert's group.
struct ExpertGroups {
  std::vector<int32_t> experts, start, pairs;
  std::vector<int32_t> group_of;  // [expert] its group, -1 where no pair chose it
  int groups = 0;

  void build(std::span<const int32_t> ids, int num_experts);
  std::span<const int32_t> chosen() const { return std::span(experts).first(size_t(groups)); }
  int64_t size(int g) const { return start[size_t(g) + 1] - start[size_t(g)]; }
};

}  // namespace swiftlet
