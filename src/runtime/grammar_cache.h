// Compiled grammars and their token masks, shared by every request that constrains its answer
// with the same grammar (the same schema, tools, template and think flag give the same rules).
//
// A token mask (which tokens a grammar state allows) costs 0.1 ms to 7 ms to compute: the
// vocabulary trie is walked from the state (vocab_trie.h). A SharedGrammar keeps one matcher for
// all its requests, so a state has one id whichever request reached it, and its mask is computed
// once and kept in the cache's MaskStore, bounded in bytes (least recently used out). The
// GrammarCache maps a grammar's rules (Grammar::key) to its SharedGrammar, bounded in grammars.
//
// Thread safety: a SharedGrammar's matcher is grown under its own mutex (a mask walk holds it);
// the MaskStore and the GrammarCache each have theirs, and neither takes a grammar's lock while
// holding its own, so there is no lock order to break. A mask is a function of the grammar and
// the state's parse stacks alone, so who computes it, when, and how often never changes it.
#pragma once

#include "runtime/grammar.h"
#include "runtime/sampler.h"
#include "runtime/vocab_trie.h"

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace swiftlet {

struct TokenMask {
  using After = std::pair<uint32_t, int32_t>;  // (shortest completion after the token, token)
  std::vector<uint64_t> bits;  // [vocab/64] allowed tokens
  uint32_t max_after = 0;      // largest shortest-completion over the allowed tokens' states
  bool any = false;            // some token is allowed
  // The shortest completion after each allowed token, in bytes: `common_after` for most of them
  // (inside a string, every token that stays in it); the others listed in ascending order,
  // those with less in `below`, those with more in `above`.
  uint32_t common_after = 0;
  std::vector<After> below, above;

  // The allowed tokens whose shortest completion fits in `budget` bytes, without walking the
  // trie again: these bits when all fit; else `bits` (a copy without the longer ones, when the
  // common length fits) or `ids` (the shorter ones). Empty when none fits.
  TokenSet within(uint32_t budget, std::vector<uint64_t>& bits, std::vector<int32_t>& ids) const;
  size_t bytes() const {
    return bits.size() * sizeof(uint64_t) + (below.size() + above.size()) * sizeof(After) + sizeof(TokenMask);
  }
};

struct GrammarCacheStats {
  uint64_t masks_computed = 0;    // trie walks that made a cached mask (prefetches included)
  uint64_t masks_prefetched = 0;  // of those, made ahead of need (mask_prefetcher.h)
  uint64_t mask_hits = 0;         // masks asked for and found made
  uint64_t masks_shared = 0;      // of those, made for another request
  uint64_t masks_evicted = 0;     // dropped for the byte bound
  size_t masks = 0;               // held now
  size_t mask_bytes = 0;          // their size
  uint64_t grammar_hits = 0;      // requests whose grammar was cached
  uint64_t grammar_misses = 0;    // requests that brought a new grammar
  size_t grammars = 0;            // cached now
};

// The masks of every grammar of one cache, keyed by (grammar, state), least recently used out
// past `max_bytes`. Internal to grammar_cache.cpp's classes.
class MaskStore {
 public:
  explicit MaskStore(size_t max_bytes) : max_bytes_(max_bytes) {}
  struct Found {
    std::shared_ptr<const TokenMask> mask;
    bool other_owner = false;  // made for another request
  };
  std::optional<Found> find(uint64_t key, uint64_t owner);
  bool contains(uint64_t key) const;
  // Stores a mask made for `owner`; returns the one stored (an earlier one, if any).
  std::shared_ptr<const TokenMask> put(uint64_t key, TokenMask mask, uint64_t owner, bool prefetched);
  void drop_grammar(uint32_t grammar_id);  // a grammar died: its masks can never be asked for
  GrammarCacheStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const TokenMask> mask;
    uint64_t owner = 0;
    std::list<uint64_t>::iterator lru;
  };
  mutable std::mutex mu_;
  size_t max_bytes_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // most recently used first
  GrammarCacheStats stats_;
};

// One grammar, its matcher and its masks, as the requests using it share them.
class SharedGrammar {
 public:
  // A grammar of its own (no cache): its masks are kept as long as it lives, unbounded.
  static std::shared_ptr<SharedGrammar> standalone(std::shared_ptr<const Grammar> grammar,
                                                   std::shared_ptr<const VocabTrie> vocab);
  SharedGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabTrie> vocab,
                std::shared_ptr<MaskStore> store);
  ~SharedGrammar();
  SharedGrammar(const SharedGrammar&) = delete;
  SharedGrammar& operator=(const SharedGrammar&) = delete;

  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }
  const std::shared_ptr<const VocabTrie>& vocab() const { return vocab_; }
  int32_t start() const { return start_; }
  // The state after `bytes` from `state` (GrammarMatcher::kDead when they leave the grammar).
  int32_t step(int32_t state, std::string_view bytes);
  // The same, without waiting: nothing while another thread holds the matcher (a mask walk).
  std::optional<int32_t> try_step(int32_t state, std::string_view bytes);
  // The mask of a live state, made at most once while the store keeps it. `owner` names the
  // asking request (TokenConstraint::id) for the sharing counter; `made` tells whether this call
  // walked the trie.
  std::shared_ptr<const TokenMask> mask(int32_t state, uint64_t owner, bool prefetch = false, bool* made = nullptr);
  bool has_mask(int32_t state) const;
  // A mask of tokens whose shortest completion after them is at most `budget` bytes, not kept:
  // what TokenMask::within gives from the cached mask, by walking the trie again (tests).
  TokenMask walk(int32_t state, uint32_t budget);
  size_t states() const;

 private:
  uint64_t key(int32_t state) const { return uint64_t(id_) << 32 | uint32_t(state); }
  TokenMask walk_locked(int32_t state, uint32_t budget);
  void sort_by_after(TokenMask& m);  // fills common_after, below and above from walk_after_

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const VocabTrie> vocab_;
  std::shared_ptr<MaskStore> store_;
  const uint32_t id_;
  mutable std::mutex mu_;
  GrammarMatcher matcher_;  // guarded by mu_
  int32_t start_;
  std::vector<std::pair<uint32_t, int32_t>> walk_stack_;  // guarded by mu_: (trie node, state)
  std::vector<TokenMask::After> walk_after_;              // guarded by mu_: the allowed tokens of a walk
  std::vector<uint32_t> walk_count_;                      // guarded by mu_: tokens per completion length
};

struct GrammarCacheOptions {
  size_t max_grammars = 64;              // distinct grammars kept (least recently used out)
  size_t max_mask_bytes = size_t(256) << 20;  // masks of all of them: ~13,000 of 19 KB (Qwen's vocabulary)
};

// The grammars of one vocabulary (an Engine's), shared across requests. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const VocabTrie> vocab, GrammarCacheOptions opts = {});
  // The shared form of `grammar`: the cached one when a grammar with the same rules was seen.
  std::shared_ptr<SharedGrammar> get(std::shared_ptr<const Grammar> grammar);
  GrammarCacheStats stats() const;
  const std::shared_ptr<const VocabTrie>& vocab() const { return vocab_; }

 private:
  struct Entry {
    std::shared_ptr<SharedGrammar> grammar;
    std::list<std::string>::iterator lru;
  };
  std::shared_ptr<const VocabTrie> vocab_;
  GrammarCacheOptions opts_;
  std::shared_ptr<MaskStore> store_;
  mutable std::mutex mu_;
  std::unordered_map<std::string_view, Entry> by_key_;  // views into lru_'s strings
  std::list<std::string> lru_;                          // Grammar::key, most recently used first
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace swiftlet
