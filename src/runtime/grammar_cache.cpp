#include "runtime/grammar_cache.h"

#include <algorithm>
#include <limits>

namespace swiftlet {

// ------------------------------------------------------------------------------ MaskStore

std::optional<MaskStore::Found> MaskStore::find(uint64_t key, uint64_t owner) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++stats_.mask_hits;
  const bool other = it->second.owner != owner;
  stats_.masks_shared += other;
  return Found{it->second.mask, other};
}

bool MaskStore::contains(uint64_t key) const {
  std::lock_guard lock(mu_);
  return entries_.contains(key);
}

std::shared_ptr<const TokenMask> MaskStore::put(uint64_t key, TokenMask mask, uint64_t owner, bool prefetched) {
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.mask;
  auto m = std::make_shared<const TokenMask>(std::move(mask));
  ++stats_.masks_computed;
  stats_.masks_prefetched += prefetched;
  lru_.push_front(key);
  entries_.emplace(key, Entry{m, owner, lru_.begin()});
  stats_.mask_bytes += m->bytes();
  // Least recently used out; the mask just made stays (its caller holds it anyway).
  while (stats_.mask_bytes > max_bytes_ && entries_.size() > 1) {
    auto victim = entries_.find(lru_.back());
    stats_.mask_bytes -= victim->second.mask->bytes();
    entries_.erase(victim);
    lru_.pop_back();
    ++stats_.masks_evicted;
  }
  return m;
}

void MaskStore::drop_grammar(uint32_t grammar_id) {
  std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (uint32_t(*it >> 32) != grammar_id) {
      ++it;
      continue;
    }
    auto e = entries_.find(*it);
    stats_.mask_bytes -= e->second.mask->bytes();
    entries_.erase(e);
    it = lru_.erase(it);
  }
}

GrammarCacheStats MaskStore::stats() const {
  std::lock_guard lock(mu_);
  GrammarCacheStats s = stats_;
  s.masks = entries_.size();
  return s;
}

// -------------------------------------------------------------------------- SharedGrammar

namespace {
uint32_t new_grammar_id() {
  static std::atomic<uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

std::shared_ptr<SharedGrammar> SharedGrammar::standalone(std::shared_ptr<const Grammar> grammar,
                                                         std::shared_ptr<const VocabTrie> vocab) {
  return std::make_shared<SharedGrammar>(std::move(grammar), std::move(vocab),
                                         std::make_shared<MaskStore>(std::numeric_limits<size_t>::max()));
}

SharedGrammar::SharedGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabTrie> vocab,
                             std::shared_ptr<MaskStore> store)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), store_(std::move(store)), id_(new_grammar_id()),
      matcher_(*grammar_), start_(matcher_.start()) {}

SharedGrammar::~SharedGrammar() { store_->drop_grammar(id_); }

int32_t SharedGrammar::step(int32_t state, std::string_view bytes) {
  if (bytes.empty() || state < 0) return state;
  std::lock_guard lock(mu_);
  return matcher_.step(state, bytes);
}

std::optional<int32_t> SharedGrammar::try_step(int32_t state, std::string_view bytes) {
  if (bytes.empty() || state < 0) return state;
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;
  return matcher_.step(state, bytes);
}

bool SharedGrammar::has_mask(int32_t state) const { return store_->contains(key(state)); }

size_t SharedGrammar::states() const {
  std::lock_guard lock(mu_);
  return matcher_.state_count();
}

std::shared_ptr<const TokenMask> SharedGrammar::mask(int32_t state, uint64_t owner, bool prefetch, bool* made) {
  if (made) *made = false;
  if (auto f = store_->find(key(state), owner)) return f->mask;
  std::lock_guard lock(mu_);
  // Another thread may have made it while this one waited for the matcher.
  if (auto f = store_->find(key(state), owner)) return f->mask;
  if (made) *made = true;
  return store_->put(key(state), walk_locked(state, Grammar::kInfinite), owner, prefetch);
}

TokenMask SharedGrammar::walk(int32_t state, uint32_t budget) {
  std::lock_guard lock(mu_);
  return walk_locked(state, budget);
}

// The allowed tokens are the trie's token nodes the matcher survives to, with room left for the
// shortest completion after them; a dead prefix prunes its whole subtree.
TokenMask SharedGrammar::walk_locked(int32_t state, uint32_t budget) {
  TokenMask m;
  m.bits.assign((size_t(vocab_->vocab_size()) + 63) / 64, 0);
  walk_after_.clear();
  const auto& nodes = vocab_->nodes();
  const auto& edges = vocab_->edges();
  walk_stack_.clear();
  walk_stack_.push_back({0, state});
  while (!walk_stack_.empty()) {
    const auto [node, s] = walk_stack_.back();
    walk_stack_.pop_back();
    const VocabTrie::Node& n = nodes[node];
    for (uint32_t e = n.first_edge; e < n.first_edge + n.edge_count; ++e) {
      const int32_t next = matcher_.step(s, edges[e].byte);
      if (next == GrammarMatcher::kDead) continue;
      const VocabTrie::Node& child = nodes[edges[e].child];
      if (child.token >= 0) {
        const uint32_t need = matcher_.min_remaining(next);
        if (need <= budget) {
          m.bits[size_t(child.token) >> 6] |= uint64_t(1) << (child.token & 63);
          m.max_after = std::max(m.max_after, need);
          walk_after_.push_back({need, child.token});
        }
      }
      if (child.edge_count) walk_stack_.push_back({edges[e].child, next});
    }
  }
  m.any = !walk_after_.empty();
  sort_by_after(m);
  return m;
}

// Finds the most common completion length (the shortest on ties) and lists the other tokens.
void SharedGrammar::sort_by_after(TokenMask& m) {
  if (walk_after_.empty()) return;
  walk_count_.assign(size_t(m.max_after) + 1, 0);
  for (const auto& [after, token] : walk_after_) ++walk_count_[after];
  m.common_after = uint32_t(std::max_element(walk_count_.begin(), walk_count_.end()) - walk_count_.begin());
  for (const TokenMask::After& a : walk_after_) {
    if (a.first < m.common_after) m.below.push_back(a);
    if (a.first > m.common_after) m.above.push_back(a);
  }
  std::sort(m.below.begin(), m.below.end());
  std::sort(m.above.begin(), m.above.end());
}

TokenSet TokenMask::within(uint32_t budget, std::vector<uint64_t>& out_bits, std::vector<int32_t>& ids) const {
  ids.clear();
  if (!any) return {};
  if (budget >= max_after) return {bits, {}};
  const auto fits = [budget](const After& a) { return a.first <= budget; };
  if (budget >= common_after) {  // all but the tail of `above`
    out_bits = bits;
    for (auto it = std::partition_point(above.begin(), above.end(), fits); it != above.end(); ++it)
      out_bits[size_t(it->second) >> 6] &= ~(uint64_t(1) << (it->second & 63));
    return {out_bits, {}};
  }
  for (auto it = below.begin(); it != below.end() && fits(*it); ++it) ids.push_back(it->second);
  return {{}, ids};
}

// --------------------------------------------------------------------------- GrammarCache

GrammarCache::GrammarCache(std::shared_ptr<const VocabTrie> vocab, GrammarCacheOptions opts)
    : vocab_(std::move(vocab)), opts_(opts), store_(std::make_shared<MaskStore>(opts.max_mask_bytes)) {
  opts_.max_grammars = std::max<size_t>(1, opts_.max_grammars);
}

std::shared_ptr<SharedGrammar> GrammarCache::get(std::shared_ptr<const Grammar> grammar) {
  std::string key = grammar->key();
  std::shared_ptr<SharedGrammar> evicted;  // destroyed outside the lock (it drops its masks)
  std::lock_guard lock(mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    ++hits_;
    return it->second.grammar;
  }
  ++misses_;
  auto shared = std::make_shared<SharedGrammar>(std::move(grammar), vocab_, store_);
  lru_.push_front(std::move(key));
  by_key_.emplace(std::string_view(lru_.front()), Entry{shared, lru_.begin()});
  if (by_key_.size() > opts_.max_grammars) {
    auto victim = by_key_.find(std::string_view(lru_.back()));
    evicted = std::move(victim->second.grammar);  // a request still using it keeps it alive
    by_key_.erase(victim);
    lru_.pop_back();
  }
  return shared;
}

GrammarCacheStats GrammarCache::stats() const {
  GrammarCacheStats s = store_->stats();
  std::lock_guard lock(mu_);
  s.grammar_hits = hits_;
  s.grammar_misses = misses_;
  s.grammars = by_key_.size();
  return s;
}

}  // namespace swiftlet
