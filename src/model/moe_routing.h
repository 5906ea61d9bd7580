// The MoE block's routing steps that do not depend on where the experts live (model-math.md 6.1):
// the top-k choice of one token's router output, the grouping of a call's (token, choice) pairs
// by expert, and what a pass does around its routers on the host (MoeRouter: the routing
// observer, a route override, the miss policy, the guesses of the next layers' experts), which the
// CPU and GPU passes share.
#pragma once

#include "model/expert_source.h"
#include "model/miss_policy.h"

#include <cstdint>
#include <functional>
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

// Sees every routing decision (expert tracing): each MoE layer's choices for the tokens of a
// run() call, and in decode the next layer's guessed experts (RoutingHooks::predict_next).
class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  // Layer `layer` routed the tokens at positions pos0 .. pos0 + T - 1 (token ids `tokens`):
  // experts [T][top_k] in router order (highest probability first), their weights [T][top_k]
  // as the MoE applies them. Layers arrive in order 0 .. num_layers - 1 for each call.
  virtual void routed(int layer, int64_t pos0, std::span<const int32_t> tokens, std::span<const int32_t> experts,
                      std::span<const float> weights) = 0;
  // Decode: the experts guessed for layer `layer` of the token at `pos`, before that layer routes.
  virtual void predicted(int /*layer*/, int64_t /*pos*/, std::span<const int32_t> /*experts*/) {}
};

// Chooses the experts instead of the router (replaying recorded routing on another model).
// The router still runs: the chosen experts are weighted by its probabilities, renormalised
// over them when the model normalises its top-k.
class RouteOverride {
 public:
  virtual ~RouteOverride() = default;
  // Fills `experts` (top_k distinct ids in 0 .. num_experts - 1) for the token at `pos`, `layer`.
  virtual void route(int layer, int64_t pos, std::span<int32_t> experts) = 0;
  // Decode prediction: fills the guess for `layer` of the token at `pos` and returns true, or
  // returns false for no guess (the model's own routers do not guess either: they do not choose
  // the experts a replay routes).
  virtual bool predict(int /*layer*/, int64_t /*pos*/, std::span<int32_t> /*experts*/) { return false; }
};

// What a forward pass is asked to do around its routers (ForwardPass::set_routing). The observer
// and the override are not owned and must outlive the calls.
struct RoutingHooks {
  RoutingObserver* observer = nullptr;
  RouteOverride* route_override = nullptr;
  // Decode: guess the experts of the next `predict_next` layers by applying their routers to the
  // residual stream early, and have the expert source start reading them (ExpertSource::predict).
  // 0: off.
  int predict_next = 0;
};

struct PredictionStats {
  uint64_t hits = 0;   // routed experts that had been predicted
  uint64_t total = 0;  // routed experts of layers that had a prediction
  double accuracy() const { return total ? double(hits) / double(total) : 0.0; }
};

// The host's part of routing, the same for every pass: the choice with its weights (the router's
// top-k, or an override's), the observer, what a miss costs (--on-miss), and the decode guesses
// of the next layers.
class MoeRouter {
 public:
  MoeRouter(int num_layers, int num_experts, int top_k, bool norm_topk_prob, ExpertSource* experts)
      : layers_(num_layers), experts_(num_experts), top_k_(top_k), norm_topk_prob_(norm_topk_prob), source_(experts) {}

  void set_hooks(const RoutingHooks& h) { hooks_ = h; }
  RoutingObserver* observer() const { return hooks_.observer; }
  // An override chooses: a pass whose router runs elsewhere (the GPU) hands its logits over.
  bool overridden() const { return hooks_.route_override != nullptr; }
  // Whether predict() has anything to do (guesses asked for, and a source that reads ahead).
  bool predicts() const { return hooks_.predict_next > 0 && source_ && source_->wants_predictions(); }

  // probs: [T][E] router logits, softmaxed in place. Token t (at position pos[t]) gets top_k
  // experts in ids[t][.] (the override's choice, else the highest probabilities) and their weights
  // in w[t][.] (renormalised over the chosen when the model does). Fails on an override's
  // expert that is out of range or repeated.
  void choose(int layer, const int64_t* pos, int64_t T, float* probs, int32_t* ids, float* w);
  // What a routed expert missing from memory costs (miss_policy.h): exact (the default) waits for
  // its read; skip:W leaves out a low-weight one and renormalises the token's others, low-bit:W
  // reads its low-bit copy (lossy both).
  void set_miss_policy(MissPolicy p) { miss_ = p; }
  const MissPolicy& miss_policy() const { return miss_; }
  // The miss policy on a call's choice ([T][top_k] ids and weights, after the observer saw it),
  // before anything asks the source for them: skip:W sets the left-out experts' ids to -1 and
  // tells the source how many; low-bit:W names to the source the misses to read as copies.
  void apply_miss_policy(int layer, std::span<int32_t> ids, std::span<float> w);

  // The layer's choice for the T tokens from pos0 on, for the observer (if any).
  void observe(int layer, int64_t pos0, std::span<const int32_t> tokens, std::span<const int32_t> ids,
               std::span<const float> w) const {
    if (hooks_.observer) hooks_.observer->routed(layer, pos0, tokens, ids, w);
  }

  // Decode of the token at `pos`, `layer` having chosen `actual`: scores the guess made for this
  // layer, then guesses layers layer + 1 .. layer + predict_next (the override's guess, else
  // router_logits(target, out[E]): that layer's norm and router on the residual as it is now) and
  // asks the source to read them. The next layer's guess goes to the observer.
  using RouterLogits = std::function<void(int layer, float* logits)>;
  void predict(int layer, int64_t pos, std::span<const int32_t> actual, const RouterLogits& router_logits);
  const PredictionStats& prediction_stats() const { return prediction_; }

 private:
  int layers_, experts_, top_k_;
  bool norm_topk_prob_;
  ExpertSource* source_;
  RoutingHooks hooks_;
  MissPolicy miss_;
  std::vector<int32_t> order_;      // [E] a token's experts, its top_k first
  std::vector<float> logits_;       // [E] a guessed layer's router output
  std::vector<int32_t> predicted_;  // the guess for layer predicted_layer_
  int predicted_layer_ = -1;
  PredictionStats prediction_;
};

}  // namespace swiftlet
