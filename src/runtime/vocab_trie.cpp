#include "runtime/vocab_trie.h"

#include <algorithm>

namespace swiftlet {

VocabTrie::VocabTrie(const Tokenizer& tok) : tok_(tok), vocab_size_(tok.vocab_size()) {
  std::vector<std::pair<std::string_view, int32_t>> words;
  words.reserve(size_t(vocab_size_));
  for (int32_t id = 0; id < vocab_size_; ++id) {
    const std::string_view b = tok_.token_bytes(id);
    if (!b.empty() && !tok_.is_special(id)) words.push_back({b, id});
  }
  std::sort(words.begin(), words.end());  // same bytes twice: the lower id is kept
  nodes_.push_back({});
  // Builds the subtree of words[lo, hi) that share their first `depth` bytes, under `node`;
  // a node's edges are contiguous (added together once its children exist).
  auto build = [&](auto&& self, uint32_t node, size_t lo, size_t hi, size_t depth) -> void {
    if (lo < hi && words[lo].first.size() == depth) {
      nodes_[node].token = words[lo].second;
      while (lo < hi && words[lo].first.size() == depth) ++lo;
    }
    std::vector<Edge> mine;
    while (lo < hi) {
      const auto b = uint8_t(words[lo].first[depth]);
      size_t end = lo;
      while (end < hi && uint8_t(words[end].first[depth]) == b) ++end;
      const auto child = uint32_t(nodes_.size());
      nodes_.push_back({});
      self(self, child, lo, end, depth + 1);
      mine.push_back({b, child});
      lo = end;
    }
    nodes_[node].first_edge = uint32_t(edges_.size());
    nodes_[node].edge_count = uint32_t(mine.size());
    edges_.insert(edges_.end(), mine.begin(), mine.end());
  };
  build(build, 0, 0, words.size(), 0);
}

}  // namespace swiftlet
