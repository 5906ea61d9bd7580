// Constrained decoding: which tokens of a byte-level BPE vocabulary keep the output a prefix of
// text a grammar matches (runtime/grammar.h), applied to the logits before sampling.
//
// A token is allowed when the matcher survives all its bytes. The allowed set of a matcher
// state is found by walking the vocabulary as a byte trie from that state (a subtree is skipped
// as soon as its prefix is dead) and is cached per state, so a state seen again costs a bitmask
// copy onto the logits; the states and masks of a grammar are shared by every request that uses
// it (grammar_cache.h). Special tokens never match grammar text; the stop tokens are allowed
// exactly when the text so far is complete.
//
// The answer must also fit the tokens left (max_tokens): every single byte is a token, so a
// state whose shortest completion is n bytes can always finish in n tokens. A token is allowed
// only if the shortest completion after it fits in the tokens left after it; the cached mask
// knows that length for each token (TokenMask::within), so the end of the budget needs no walk.
// Hence an answer that had room for its shortest completion when it started is always complete.
#pragma once

#include "runtime/grammar.h"
#include "runtime/grammar_cache.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace swiftlet {

// What a mask prefetch needs (mask_prefetcher.h): the grammar, a state of its matcher and the
// bytes accepted since; no reference to the constraint, which its thread keeps using.
struct MaskJob {
  std::shared_ptr<SharedGrammar> grammar;  // null: nothing to prepare
  int32_t state = GrammarMatcher::kDead;
  std::string bytes;
  uint64_t owner = 0;
  // Steps the state over the bytes and makes its mask unless the cache has it.
  void run() const;
};

class TokenConstraint {
 public:
  // Masks kept for this answer only.
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabTrie> vocab,
                  std::vector<int32_t> stop_tokens);
  // Matcher states and masks shared with the other answers of the same grammar (GrammarCache).
  TokenConstraint(std::shared_ptr<SharedGrammar> grammar, std::vector<int32_t> stop_tokens);

  // Whether `token` may come next: its bytes keep the text a prefix of the grammar's and the
  // shortest completion after it fits in the tokens left after it (a stop token: the text is
  // complete). `tokens_left`: how many tokens this answer may still take, this one included.
  // Cheap (the token's bytes through this answer's own matcher, no lock): the sampler tries its
  // pick first.
  bool allows(int32_t token, int64_t tokens_left);
  // The tokens that may come next (the stop tokens among them when the text is complete). Valid
  // until the next call; every non-const call but allows() may change it.
  TokenSet allowed(int64_t tokens_left);
  // Sets the logits of the tokens that may not come next to -inf.
  void apply(std::span<float> logits, int64_t tokens_left);
  // Moves past a sampled token.
  void accept(int32_t token);

  bool complete() const { return state_ >= 0 && own_.accepting(state_); }
  bool failed() const { return state_ < 0; }  // a token the grammar did not allow came through
  // The mask the next apply() would use, to make ahead of need on another thread; its grammar
  // is null when that mask is already made (or the answer failed).
  MaskJob next_mask();
  // Diagnostics for benchmarks and tests.
  size_t states() const { return shared_->states(); }
  size_t masks_computed() const { return masks_computed_; }  // made by apply(), on the answer's path
  size_t masks_reused() const { return masks_reused_; }      // found made (before, ahead, or for another answer)
  uint64_t id() const { return id_; }
  const SharedGrammar& shared() const { return *shared_; }

 private:
  void catch_up();  // brings shared_state_ to this answer's text (takes the grammar's lock)

  std::shared_ptr<SharedGrammar> shared_;
  std::vector<int32_t> stop_tokens_;
  GrammarMatcher own_;  // this answer's path through the grammar: allows/accept take no lock
  int32_t state_;       // in own_
  int32_t shared_state_;  // the same text's state in shared_'s matcher, `behind_` bytes ago
  std::string behind_;
  uint64_t id_;
  size_t masks_computed_ = 0, masks_reused_ = 0;
  std::shared_ptr<const TokenMask> mask_;  // allowed()'s mask, and its budgeted forms:
  std::vector<uint64_t> within_bits_;
  std::vector<int32_t> within_ids_;
};

// Picks the next token under a constraint: the token the sampler picks from the logits with
// every token the constraint forbids at -inf (penalties first, as Sampler::sample), reading only
// the allowed logits where the sampler can. Greedy keeps the model's own pick when the grammar
// allows it, so a model that agrees with its schema needs no mask. `logits` is modified.
// Accepts the token into the constraint and returns it.
int32_t sample_constrained(Sampler& sampler, TokenConstraint& c, std::span<float> logits,
                           std::span<const int32_t> history, int64_t tokens_left);

}  // namespace swiftlet
