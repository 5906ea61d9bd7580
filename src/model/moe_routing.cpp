#include "model/moe_routing.h"

#include "core/error.h"
#include "kernels/cpu/ops_ref.h"

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

void MoeRouter::choose(int layer, const int64_t* pos, int64_t T, float* probs, int32_t* ids, float* w) {
  const int E = experts_, k = top_k_;
  order_.resize(size_t(E));
  for (int64_t t = 0; t < T; ++t) {
    float* p = probs + t * E;
    ref::softmax(p, E);
    if (hooks_.route_override) {
      std::iota(order_.begin(), order_.end(), 0);
      hooks_.route_override->route(layer, pos[t], std::span(order_).first(size_t(k)));
      for (int i = 0; i < k; ++i) {
        const int32_t e = order_[size_t(i)];
        if (e < 0 || e >= E || std::count(order_.begin(), order_.begin() + i, e))
          fail("routing override: expert {} for layer {} position {} is out of range or repeated", e, layer, pos[t]);
      }
    } else {
      top_k_experts(p, k, order_);
    }
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += p[order_[size_t(i)]];
    for (int i = 0; i < k; ++i) {
      const int32_t e = order_[size_t(i)];
      ids[t * k + i] = e;
      w[t * k + i] = norm_topk_prob_ ? float(p[e] / sum) : p[e];
    }
  }
}

void MoeRouter::apply_miss_policy(int layer, std::span<int32_t> ids, std::span<float> w) {
  if (miss_.skips()) {
    const int skipped = skip_missed_experts(miss_, experts_, top_k_, norm_topk_prob_, ids, w,
                                            [&](int32_t e) { return source_->ready(layer, e); });
    if (skipped > 0) source_->skipped(layer, skipped);
  }
  if (miss_.reads_low_bit())
    source_->read_low_bit(layer, low_bit_experts(miss_, experts_, top_k_, norm_topk_prob_, ids, w,
                                                 [&](int32_t e) { return source_->held(layer, e); }));
}

void MoeRouter::predict(int layer, int64_t pos, std::span<const int32_t> actual, const RouterLogits& router_logits) {
  if (!predicted_.empty() && predicted_layer_ == layer) {
    int hit = 0;
    for (int32_t e : actual) hit += std::count(predicted_.begin(), predicted_.end(), e) ? 1 : 0;
    prediction_.hits += uint64_t(hit);
    prediction_.total += uint64_t(actual.size());
  }
  predicted_.clear();
  const int k = top_k_;
  order_.resize(size_t(experts_));
  logits_.resize(size_t(experts_));
  for (int ahead = 1; ahead <= hooks_.predict_next && layer + ahead < layers_; ++ahead) {
    const int target = layer + ahead;
    if (hooks_.route_override) {
      if (!hooks_.route_override->predict(target, pos, std::span(order_).first(size_t(k)))) continue;
    } else {
      router_logits(target, logits_.data());
      top_k_experts(logits_.data(), k, order_);
    }
    if (ahead == 1) {
      predicted_.assign(order_.begin(), order_.begin() + k);
      predicted_layer_ = target;
      if (hooks_.observer) hooks_.observer->predicted(target, pos, predicted_);
    }
    source_->predict(target, std::span(order_).first(size_t(k)));
  }
}

}  // namespace swiftlet
