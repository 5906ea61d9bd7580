#include "runtime/token_constraint.h"

#include <algorithm>
#include <atomic>

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

TokenSet TokenConstraint::allowed(int64_t tokens_left) {
  within_ids_.clear();
  TokenSet set;
  if (state_ >= 0) {
    catch_up();
    bool made = false;
    mask_ = shared_->mask(shared_state_, id_, /*prefetch=*/false, &made);
    ++(made ? masks_computed_ : masks_reused_);
    const auto budget = uint32_t(std::clamp<int64_t>(tokens_left - 1, 0, Grammar::kInfinite));
    set = mask_->within(budget, within_bits_, within_ids_);
    // Nothing fits: the answer cannot be completed any more; the grammar still holds.
    if (set.bits.empty() && set.ids.empty() && !own_.accepting(state_)) set = {mask_->bits, {}};
  }
  // A failed answer (cannot happen through allowed/accept) may only end.
  if (state_ < 0 || own_.accepting(state_)) {
    for (int32_t t : stop_tokens_)
      if (t >= 0 && std::find(within_ids_.begin(), within_ids_.end(), t) == within_ids_.end())
        within_ids_.push_back(t);
    set.ids = within_ids_;
  }
  return set;
}

void TokenConstraint::apply(std::span<float> logits, int64_t tokens_left) {
  std::vector<float> held;
  mask_outside(logits, allowed(tokens_left), held);
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

int32_t sample_constrained(Sampler& sampler, TokenConstraint& c, std::span<float> logits,
                           std::span<const int32_t> history, int64_t tokens_left) {
  sampler.penalize(logits, history);
  int32_t next = -1;
  if (sampler.greedy()) {
    next = sampler.pick(logits);
    if (!c.allows(next, tokens_left)) next = sampler.pick_among(logits, c.allowed(tokens_left));
  } else {
    next = sampler.pick_among(logits, c.allowed(tokens_left));
  }
  c.accept(next);
  return next;
}

}  // namespace swiftlet
