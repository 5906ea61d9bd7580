// Replays a routing trace (routing_trace.h) through expert caches of a given size and counts
// hits: the engine's own policy (ExpertCache, driven as QpackExperts drives it), the same ranking
// over the whole cache without layer shares, plain LRU, per-layer pools of the engine's policy,
// and Belady's offline optimum. Decode order: token by
// token, each token layer by layer; a (token, layer) step needs its top_k experts in memory at
// once, so a cache must hold at least top_k experts (per pool for per-layer pools).
#pragma once

#include "experts/routing_trace.h"

#include <cstdint>
#include <string>
#include <vector>

namespace swiftlet {

enum class CachePolicy {
  Engine,    // "lfu": ExpertCache (evict the lowest (use count, last use), layer shares), as QpackExperts uses it
  Global,    // "lfu-global": ExpertCache with one ranking over all layers (no layer shares)
  Lru,       // "lru": evict the least recently used expert
  PerLayer,  // "layer": one ExpertCache per layer, the slots split evenly (the first layers get the remainder)
  Belady,    // "belady": evict the expert whose next use is furthest away (offline optimum)
};
const char* cache_policy_name(CachePolicy p);
CachePolicy parse_cache_policy(const std::string& s);  // throws Error listing the names

struct CacheSimResult {
  bool feasible = false;  // false: the cache (or a per-layer pool) holds fewer than top_k experts
  uint64_t hits = 0, misses = 0;
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

// `slots`: how many experts the cache holds.
CacheSimResult simulate_cache(const RoutingTrace& trace, CachePolicy policy, int64_t slots);

// Locality of a trace without a cache.
struct TraceLocality {
  // Share of a token's (layer, expert) choices the previous token (in the trace) also made.
  double reuse_next_token = 0;
  // Next-layer prediction, over the (token, layer) steps that have a guess (steps: how many):
  // recall (prediction_accuracy): share of the routed experts that had been guessed; precision:
  // share of the guesses that were routed (the same when every guess has top_k experts).
  double prediction_accuracy = 0, prediction_precision = 0;
  // The same restricted to what a cache would lack: recall over the routed experts the previous
  // token did not use in that layer, precision over the guesses it did not use (the reads a
  // guess starts), over the steps with a guess and a previous token.
  double new_expert_recall = 0, new_expert_precision = 0;
  uint64_t predicted_steps = 0;
};
TraceLocality trace_locality(const RoutingTrace& trace);

}  // namespace swiftlet
