#include "experts/cache_sim.h"

#include "core/error.h"
#include "experts/expert_cache.h"

#include <algorithm>
#include <list>
#include <memory>
#include <set>

namespace swiftlet {

namespace {

// The engine's cache without memory: every slot points at the same byte.
std::unique_ptr<ExpertCache> bookkeeping_cache(int layers, int experts, int64_t slots, bool shares = true) {
  static uint8_t dummy;
  auto c = std::make_unique<ExpertCache>(
      layers, experts, 1, size_t(slots), [](size_t) -> void* { return &dummy; }, [](void*) {});
  c->set_layer_shares(shares);
  return c;
}

// One (token, layer) step through an ExpertCache as QpackExperts drives it in decode: prefetch
// claims the missing experts in ascending id order (their reads in flight: not evictable), never
// evicting an expert of the step itself; the reads land, then acquire takes the experts that were
// in memory first, then the others (each in ascending id order), pins and uses each.
// Returns false when the cache had no slot to give.
bool engine_step(ExpertCache& c, int layer, std::vector<int32_t>& ids, CacheSimResult& r) {
  std::sort(ids.begin(), ids.end());
  auto not_in_step = [&](int victim) {
    return c.layer_of(victim) != layer ||
           std::find(ids.begin(), ids.end(), int32_t(c.expert_of(victim))) == ids.end();
  };
  std::vector<int> fresh;  // slots read by this step
  for (int32_t e : ids)
    if (c.find(layer, e) < 0) {
      const int s = c.claim(layer, e, nullptr, not_in_step);
      if (s < 0) return false;
      fresh.push_back(s);
    }
  for (int s : fresh) c.loaded(s);
  auto was_cached = [&](int s) { return std::find(fresh.begin(), fresh.end(), s) == fresh.end(); };
  std::stable_partition(ids.begin(), ids.end(), [&](int32_t e) { return was_cached(c.find(layer, e)); });
  std::vector<int> pinned;
  for (int32_t e : ids) {
    const int s = c.find(layer, e);
    const bool hit = was_cached(s);
    c.pin(s);
    c.use(s);
    pinned.push_back(s);
    (hit ? r.hits : r.misses)++;
  }
  for (int s : pinned) c.unpin(s);
  return true;
}

CacheSimResult simulate_engine(const RoutingTrace& t, int64_t slots, bool shares) {
  CacheSimResult r;
  if (slots < t.top_k) return r;
  auto c = bookkeeping_cache(t.layers, t.experts, slots, shares);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t.size(); ++i)
    for (int l = 0; l < t.layers; ++l) {
      auto set = t.experts_of(i, l);
      ids.assign(set.begin(), set.end());
      if (!engine_step(*c, l, ids, r)) return {};
    }
  r.feasible = true;
  return r;
}

CacheSimResult simulate_per_layer(const RoutingTrace& t, int64_t slots) {
  CacheSimResult r;
  if (slots / t.layers < t.top_k) return r;
  std::vector<std::unique_ptr<ExpertCache>> pools;
  for (int l = 0; l < t.layers; ++l)
    pools.push_back(bookkeeping_cache(1, t.experts, slots / t.layers + (l < slots % t.layers ? 1 : 0)));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t.size(); ++i)
    for (int l = 0; l < t.layers; ++l) {
      auto set = t.experts_of(i, l);
      ids.assign(set.begin(), set.end());
      if (!engine_step(*pools[size_t(l)], 0, ids, r)) return {};
    }
  r.feasible = true;
  return r;
}

// A step's hits are touched first (most recent), then its misses evict from the old end.
CacheSimResult simulate_lru(const RoutingTrace& t, int64_t slots) {
  CacheSimResult r;
  if (slots < t.top_k) return r;
  std::list<int64_t> order;  // most recent first
  std::vector<std::list<int64_t>::iterator> where(size_t(t.layers) * size_t(t.experts), order.end());
  std::vector<int64_t> missed;
  for (size_t i = 0; i < t.size(); ++i)
    for (int l = 0; l < t.layers; ++l) {
      missed.clear();
      for (uint16_t e : t.experts_of(i, l)) {
        const int64_t key = int64_t(l) * t.experts + e;
        if (where[size_t(key)] == order.end()) {
          missed.push_back(key);
          continue;
        }
        order.splice(order.begin(), order, where[size_t(key)]);
        r.hits++;
      }
      for (int64_t key : missed) {
        if (int64_t(order.size()) == slots) {
          where[size_t(order.back())] = order.end();
          order.pop_back();
        }
        order.push_front(key);
        where[size_t(key)] = order.begin();
        r.misses++;
      }
    }
  r.feasible = true;
  return r;
}

// Belady: on a miss with the cache full, evict the cached expert (not needed by this step) whose
// next use is furthest away, never-again first.
CacheSimResult simulate_belady(const RoutingTrace& t, int64_t slots) {
  CacheSimResult r;
  if (slots < t.top_k) return r;
  const size_t steps = t.size() * size_t(t.layers), k = size_t(t.top_k);
  const int64_t never = int64_t(steps);
  // next[s * k + j]: the next step after s that uses the j-th expert of step s.
  std::vector<int64_t> next(steps * k);
  std::vector<int64_t> last(size_t(t.layers) * size_t(t.experts), never);
  for (size_t s = steps; s-- > 0;) {
    const size_t i = s / size_t(t.layers);
    const int l = int(s % size_t(t.layers));
    auto set = t.experts_of(i, l);
    for (size_t j = 0; j < k; ++j) {
      const size_t key = size_t(l) * size_t(t.experts) + set[j];
      next[s * k + j] = last[key];
      last[key] = int64_t(s);
    }
  }
  std::set<std::pair<int64_t, int64_t>> by_next;  // (next use, key)
  std::vector<int64_t> cached(size_t(t.layers) * size_t(t.experts), -1);  // key -> its next use, -1: absent
  std::vector<int64_t> missed;
  for (size_t s = 0; s < steps; ++s) {
    const size_t i = s / size_t(t.layers);
    const int l = int(s % size_t(t.layers));
    auto set = t.experts_of(i, l);
    missed.clear();
    for (size_t j = 0; j < k; ++j) {
      const int64_t key = int64_t(l) * t.experts + set[j];
      if (cached[size_t(key)] < 0) {
        missed.push_back(int64_t(j));
        continue;
      }
      by_next.erase({cached[size_t(key)], key});
      cached[size_t(key)] = next[s * k + j];
      by_next.insert({cached[size_t(key)], key});
      r.hits++;
    }
    for (int64_t j : missed) {
      const int64_t key = int64_t(l) * t.experts + set[size_t(j)];
      if (int64_t(by_next.size()) == slots) {
        // This step's experts all have a next use after s; those already placed must stay.
        auto it = by_next.end();
        for (--it;; --it) {
          const int64_t victim = it->second;
          const bool in_step = victim / t.experts == l &&
                               std::find(set.begin(), set.end(), uint16_t(victim % t.experts)) != set.end();
          if (!in_step) break;
          SWIFTLET_CHECK(it != by_next.begin(), "no victim in a cache of {} slots", slots);
        }
        cached[size_t(it->second)] = -1;
        by_next.erase(it);
      }
      cached[size_t(key)] = next[s * k + size_t(j)];
      by_next.insert({cached[size_t(key)], key});
      r.misses++;
    }
  }
  r.feasible = true;
  return r;
}

}  // namespace

const char* cache_policy_name(CachePolicy p) {
  switch (p) {
    case CachePolicy::Engine: return "lfu";
    case CachePolicy::Global: return "lfu-global";
    case CachePolicy::Lru: return "lru";
    case CachePolicy::PerLayer: return "layer";
    case CachePolicy::Belady: return "belady";
  }
  return "?";
}

CachePolicy parse_cache_policy(const std::string& s) {
  for (CachePolicy p :
       {CachePolicy::Engine, CachePolicy::Global, CachePolicy::Lru, CachePolicy::PerLayer, CachePolicy::Belady})
    if (s == cache_policy_name(p)) return p;
  fail("unknown cache policy '{}': use lfu (the engine's), lfu-global, lru, layer (per-layer pools) or belady", s);
}

CacheSimResult simulate_cache(const RoutingTrace& trace, CachePolicy policy, int64_t slots) {
  if (trace.size() == 0 || slots <= 0) return {};
  switch (policy) {
    case CachePolicy::Engine: return simulate_engine(trace, slots, true);
    case CachePolicy::Global: return simulate_engine(trace, slots, false);
    case CachePolicy::Lru: return simulate_lru(trace, slots);
    case CachePolicy::PerLayer: return simulate_per_layer(trace, slots);
    case CachePolicy::Belady: return simulate_belady(trace, slots);
  }
  return {};
}

TraceLocality trace_locality(const RoutingTrace& t) {
  TraceLocality out;
  uint64_t reused = 0, total = 0, right = 0, routed = 0, guesses = 0;
  uint64_t new_right = 0, new_routed = 0, new_guesses = 0;
  auto in = [](std::span<const uint16_t> set, uint16_t e) { return std::find(set.begin(), set.end(), e) != set.end(); };
  auto ratio = [](uint64_t a, uint64_t b) { return b ? double(a) / double(b) : 0.0; };
  for (size_t i = 0; i < t.size(); ++i)
    for (int l = 0; l < t.layers; ++l) {
      auto now = t.experts_of(i, l);
      const std::span<const uint16_t> before = i > 0 ? t.experts_of(i - 1, l) : std::span<const uint16_t>();
      if (i > 0) {
        for (uint16_t e : now) reused += in(before, e) ? 1 : 0;
        total += now.size();
      }
      auto guess = t.predicted_of(i, l);
      if (guess.empty()) continue;
      out.predicted_steps++;
      for (uint16_t e : now) right += in(guess, e) ? 1 : 0;
      routed += now.size();
      guesses += guess.size();
      if (i == 0) continue;
      for (uint16_t e : now)
        if (!in(before, e)) {
          new_routed++;
          new_right += in(guess, e) ? 1 : 0;
        }
      for (uint16_t e : guess) new_guesses += in(before, e) ? 0 : 1;
    }
  out.reuse_next_token = ratio(reused, total);
  out.prediction_accuracy = ratio(right, routed);
  out.prediction_precision = ratio(right, guesses);
  out.new_expert_recall = ratio(new_right, new_routed);
  out.new_expert_precision = ratio(new_right, new_guesses);
  return out;
}

}  // namespace swiftlet
