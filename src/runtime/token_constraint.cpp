#include "runtime/token_constraint.h"

#include <algorithm>
#include <atomic>
#include <limits>

namespace swiftlet {

// ------------------------------------------------------------------------ TokenConstraint

namespace {
uint64_t new_constraint_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

void MaskJob::run() const {
  if (!grammar) return;
  const int32_t s = grammar->step(state, bytes);
  if (s >= 0) grammar->mask(s, owner, /*prefetch=*/true);
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const VocabTrie> vocab,
                                 std::vector<int32_t> stop_tokens)
    : TokenConstraint(SharedGrammar::standalone(std::move(grammar), std::move(vocab)), std::move(stop_tokens)) {}

TokenConstraint::TokenConstraint(std::shared_ptr<SharedGrammar> grammar, std::vector<int32_t> stop_tokens)
    : shared_(std::move(grammar)), stop_tokens_(std::move(stop_tokens)), own_(*shared_->grammar()),
      state_(own_.start()), shared_state_(shared_->start()), id_(new_constraint_id()) {}

void TokenConstraint::catch_up() {
  shared_state_ = shared_->step(shared_state_, behind_);
  behind_.clear();
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
    if (word == 0) {  // most words of a structural state's mask
      std::fill(logits.begin() + ptrdiff_t(w * 64), logits.begin() + ptrdiff_t(end), kOff);
      continue;
    }
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
  catch_up();
  bool made = false;
  const std::shared_ptr<const TokenMask> m = shared_->mask(shared_state_, id_, /*prefetch=*/false, &made);
  ++(made ? masks_computed_ : masks_reused_);
  const bool stop = own_.accepting(state_);
  const auto budget = uint32_t(std::clamp<int64_t>(tokens_left - 1, 0, Grammar::kInfinite));
  if (m->max_after <= budget) {
    set_bits(logits, m->bits, stop);
    return;
  }
  // Near the end of the budget: only tokens after which the text can still be completed.
  const TokenMask tight = shared_->walk(shared_state_, budget);
  set_bits(logits, tight.any || stop ? tight.bits : m->bits, stop);
}

MaskJob TokenConstraint::next_mask() {
  if (state_ < 0) return {};
  // Catch up without waiting: a prefetch may hold the matcher; then the job carries the bytes.
  if (std::optional<int32_t> s = shared_->try_step(shared_state_, behind_)) {
    shared_state_ = *s;
    behind_.clear();
    if (shared_state_ >= 0 && shared_->has_mask(shared_state_)) return {};
  }
  return {shared_, shared_state_, behind_, id_};
}

bool TokenConstraint::allows(int32_t token, int64_t tokens_left) {
  if (state_ < 0) return false;
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) return own_.accepting(state_);
  const VocabTrie& vocab = *shared_->vocab();
  if (token < 0 || token >= vocab.vocab_size() || vocab.is_special(token)) return false;
  const std::string_view bytes = vocab.token_bytes(token);
  if (bytes.empty()) return false;
  const int32_t next = own_.step(state_, bytes);
  return next != GrammarMatcher::kDead && int64_t(own_.min_remaining(next)) <= tokens_left - 1;
}

void TokenConstraint::accept(int32_t token) {
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) return;
  const VocabTrie& vocab = *shared_->vocab();
  if (state_ < 0 || token < 0 || token >= vocab.vocab_size() || vocab.is_special(token)) {
    state_ = GrammarMatcher::kDead;
    return;
  }
  const std::string_view bytes = vocab.token_bytes(token);
  state_ = own_.step(state_, bytes);
  if (state_ >= 0) behind_.append(bytes);
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
