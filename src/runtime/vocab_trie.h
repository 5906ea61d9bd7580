// The vocabulary of a byte-level BPE tokenizer as a trie over token bytes, the structure a
// token mask is computed on (grammar_cache.h): a walk from a grammar state follows the trie's
// edges and skips a subtree as soon as its prefix is dead.
#pragma once

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <string_view>
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

}  // namespace swiftlet
