#include "model/moe_routing.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>

namespace swiftlet {

void top_k_experts(const float* p, int top_k, std::span<int32_t> order) {
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                    [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
}

int group_pairs_by_expert(std::span<const int32_t> ids, int num_experts, int32_t* experts, int32_t* start,
                          int32_t* pairs) {
  // A counting sort: each expert's count, then where its next pair goes.
  std::vector<int32_t> next(size_t(num_experts), 0);
  for (const int32_t e : ids) {
    if (e >= num_experts) fail("expert {} of a routing is outside 0..{}", e, num_experts - 1);
    if (e >= 0) ++next[size_t(e)];
  }
  int groups = 0;
  int32_t n = 0;
  for (int e = 0; e < num_experts; ++e) {
    if (next[size_t(e)] == 0) continue;
    experts[groups] = e;
    start[groups++] = n;
    const int32_t count = next[size_t(e)];
    next[size_t(e)] = n;
    n += count;
  }
  start[groups] = n;
  for (size_t p = 0; p < ids.size(); ++p)
    if (ids[p] >= 0) pairs[next[size_t(ids[p])]++] = int32_t(p);
  return groups;
}

void ExpertGroups::build(std::span<const int32_t> ids, int num_experts) {
  experts.resize(size_t(num_experts));
  start.resize(size_t(num_experts) + 1);
  pairs.resize(ids.size());
  groups = group_pairs_by_expert(ids, num_experts, experts.data(), start.data(), pairs.data());
  group_of.assign(size_t(num_experts), -1);
  for (int g = 0; g < groups; ++g) group_of[size_t(experts[size_t(g)])] = g;
}

}  // namespace swiftlet
