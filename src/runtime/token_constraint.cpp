#include "runtime/token_constraint.h"

#include <algorithm>
#include <limits>

namespace swiftlet {

// ------------------------------------------------------------------------------ VocabTrie

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

// ------------------------------------------------------------------------ TokenConstraint

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabTrie> vocab,
                                 std::vector<int32_t> stop_tokens)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), stop_tokens_(std::move(stop_tokens)),
      matcher_(*grammar_), state_(matcher_.start()) {}

TokenConstraint::Mask TokenConstraint::walk(int32_t state, uint32_t budget) {
  Mask m;
  m.bits.assign((size_t(vocab_->vocab_size()) + 63) / 64, 0);
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
          m.any = true;
        }
      }
      if (child.edge_count) walk_stack_.push_back({edges[e].child, next});
    }
  }
  return m;
}

void TokenConstraint::set_bits(std::span<float> logits, const std::vector<uint64_t>& bits, bool allow_stop) const {
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  std::vector<float> stop_logits;
  for (int32_t t : stop_tokens_) stop_logits.push_back(t >= 0 && size_t(t) < logits.size() ? logits[size_t(t)] : kOff);
  const size_t n = logits.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t word = w < bits.size() ? bits[w] : 0;
    if (word == ~uint64_t(0)) continue;
    const size_t end = std::min(n, (w + 1) * 64);
    for (size_t t = w * 64; t < end; ++t)
      if (!((word >> (t & 63)) & 1)) logits[t] = kOff;
  }
  if (allow_stop)
    for (size_t i = 0; i < stop_tokens_.size(); ++i)
      if (stop_tokens_[i] >= 0 && size_t(stop_tokens_[i]) < n) logits[size_t(stop_tokens_[i])] = stop_logits[i];
}

void TokenConstraint::apply(std::span<float> logits, int64_t tokens_left) {
  static const std::vector<uint64_t> kNone;
  if (state_ < 0) {  // cannot happen through apply/accept; end the answer rather than go on unchecked
    set_bits(logits, kNone, /*allow_stop=*/true);
    return;
  }
  if (masks_.size() <= size_t(state_)) masks_.resize(size_t(state_) + 1);
  if (masks_[size_t(state_)].bits.empty()) {
    masks_[size_t(state_)] = walk(state_, Grammar::kInfinite);
    ++masks_computed_;
  }
  const Mask& m = masks_[size_t(state_)];
  const bool stop = matcher_.accepting(state_);
  const auto budget = uint32_t(std::clamp<int64_t>(tokens_left - 1, 0, Grammar::kInfinite));
  if (m.max_after <= budget) {
    set_bits(logits, m.bits, stop);
    return;
  }
  // Near the end of the budget: only tokens after which the text can still be completed.
  const Mask tight = walk(state_, budget);
  set_bits(logits, tight.any || stop ? tight.bits : m.bits, stop);
}

bool TokenConstraint::allows(int32_t token, int64_t tokens_left) {
  if (state_ < 0) return false;
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) return matcher_.accepting(state_);
  if (token < 0 || token >= vocab_->vocab_size() || vocab_->is_special(token)) return false;
  const std::string_view bytes = vocab_->token_bytes(token);
  if (bytes.empty()) return false;
  const int32_t next = matcher_.step(state_, bytes);
  return next != GrammarMatcher::kDead && int64_t(matcher_.min_remaining(next)) <= tokens_left - 1;
}

void TokenConstraint::accept(int32_t token) {
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) return;
  if (state_ < 0 || vocab_->is_special(token)) {
    state_ = GrammarMatcher::kDead;
    return;
  }
  state_ = matcher_.step(state_, vocab_->token_bytes(token));
}

int32_t sample_constrained(Sampler& sampler, TokenConstraint& c, std::vector<float>& logits, std::vector<float>& scratch,
                           std::span<const int32_t> history, int64_t tokens_left) {
  scratch.assign(logits.begin(), logits.end());
  int32_t next = sampler.sample(logits, history);
  if (!c.allows(next, tokens_left)) {
    logits.swap(scratch);
    c.apply(logits, tokens_left);
    next = sampler.sample(logits, history);
  }
  c.accept(next);
  return next;
}

}  // namespace swiftlet
