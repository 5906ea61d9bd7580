// Constrained decoding: which tokens of a byte-level BPE vocabulary keep the output a prefix of
// text a grammar matches (runtime/grammar.h), applied to the logits before sampling.
//
// A token is allowed when the matcher survives all its bytes. The allowed set of a matcher
// state is found by walking the vocabulary as a byte trie from that state (a subtree is skipped
// as soon as its prefix is dead) and is cached per state, so a state seen again costs a bitmask
// copy onto the logits. Special tokens never match grammar text; the stop tokens are allowed
// exactly when the text so far is complete.
//
// The answer must also fit the tokens left (max_tokens): every single byte is a token, so a
// state whose shortest completion is n bytes can always finish in n tokens. A token is allowed
// only if the shortest completion after it fits in the tokens left after it; the cached mask
// serves while no allowed token can break that, a per-step mask near the end of the budget.
// Hence an answer that had room for its shortest completion when it started is always complete.
#pragma once

#include "runtime/grammar.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace swiftlet {

// The vocabulary as a trie over token bytes (special tokens left out). Immutable; shared.
class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer& tok);

  struct Node {
    uint32_t first_edge = 0, edge_count = 0;
    int32_t token = -1;  // the token whose bytes end here, or -1
  };
  struct Edge {
    uint8_t byte;
    uint32_t child;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  int32_t vocab_size() const { return vocab_size_; }
  std::string_view token_bytes(int32_t id) const { return tok_.token_bytes(id); }
  bool is_special(int32_t id) const { return tok_.is_special(id); }

 private:
  Tokenizer tok_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<Edge> edges_;
  int32_t vocab_size_;
};

class TokenConstraint {
 public:
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabTrie> vocab,
                  std::vector<int32_t> stop_tokens);

  // Whether `token` may come next: its bytes keep the text a prefix of the grammar's and the
  // shortest completion after it fits in the tokens left after it (a stop token: the text is
  // complete). `tokens_left`: how many tokens this answer may still take, this one included.
  // Cheap (the token's bytes through the matcher): the sampler tries its pick first.
  bool allows(int32_t token, int64_t tokens_left);
  // Sets the logits of the tokens that may not come next to -inf.
  void apply(std::span<float> logits, int64_t tokens_left);
  // Moves past a sampled token.
  void accept(int32_t token);

  bool complete() const { return state_ >= 0 && matcher_.accepting(state_); }
  bool failed() const { return state_ < 0; }  // a token the grammar did not allow came through
  // Diagnostics for benchmarks and tests.
  size_t states() const { return matcher_.state_count(); }
  size_t masks_computed() const { return masks_computed_; }

 private:
  struct Mask {
    std::vector<uint64_t> bits;  // [vocab/64] allowed tokens
    uint32_t max_after = 0;      // largest shortest-completion over the allowed tokens' states
    bool any = false;            // some token is allowed
  };
  // Walks the trie from `state`; with a budget, keeps only tokens whose shortest completion
  // after them is at most `budget` bytes.
  Mask walk(int32_t state, uint32_t budget);
  void set_bits(std::span<float> logits, const std::vector<uint64_t>& bits, bool allow_stop) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const VocabTrie> vocab_;
  std::vector<int32_t> stop_tokens_;
  GrammarMatcher matcher_;
  int32_t state_;
  std::vector<Mask> masks_;  // per matcher state; empty bits: not computed yet
  size_t masks_computed_ = 0;
  std::vector<std::pair<uint32_t, int32_t>> walk_stack_;  // (trie node, matcher state)
};

// Picks the next token under a constraint, as the generation loop does: the sampler's pick is
// kept when the constraint allows it; otherwise the pick is made again from the logits with
// every disallowed token masked. Both ways a token comes out with its probability among the
// allowed ones (p/Z = p + (1-Z)·p/Z), and the mask, the costly part, is needed only when the
// model wanted something the grammar forbids. `logits` is modified; `scratch` is a buffer of the
// same size. Accepts the token into the constraint and returns it.
int32_t sample_constrained(Sampler& sampler, TokenConstraint& c, std::vector<float>& logits, std::vector<float>& scratch,
                           std::span<const int32_t> history, int64_t tokens_left);

}  // namespace swiftlet
