#include "runtime/grammar.h"

#include "core/error.h"

#include <algorithm>

namespace swiftlet {

// ------------------------------------------------------------------------------- Grammar

Grammar::Sequence Grammar::literal(std::string_view s) {
  Sequence seq;
  seq.reserve(s.size());
  for (char c : s) seq.push_back(byte(uint8_t(c)));
  return seq;
}

uint32_t Grammar::add_rule() {
  rules_.emplace_back();
  return uint32_t(rules_.size() - 1);
}

void Grammar::add_alternative(uint32_t rule, const Sequence& seq) {
  rules_[rule].push_back(uint32_t(elements_.size()));
  for (const Element& e : seq) {
    if (e.kind != Element::Kind::End) elements_.push_back(e);
  }
  elements_.push_back({});
}

uint32_t Grammar::rule(const std::vector<Sequence>& alternatives) {
  const uint32_t r = add_rule();
  for (const Sequence& s : alternatives) add_alternative(r, s);
  return r;
}

uint32_t Grammar::repeat(const Sequence& x, int min, int max) {
  Sequence head;
  for (int i = 0; i < min; ++i) head.insert(head.end(), x.begin(), x.end());
  if (max < 0) {  // tail := x tail | ε
    const uint32_t tail = add_rule();
    Sequence more = x;
    more.push_back(ref(tail));
    add_alternative(tail, more);
    add_alternative(tail, {});
    head.push_back(ref(tail));
  } else if (max > min) {  // opt_k := x opt_{k-1} | ε
    uint32_t opt = rule({x, {}});
    for (int k = 1; k < max - min; ++k) {
      Sequence more = x;
      more.push_back(ref(opt));
      opt = rule({more, {}});
    }
    head.push_back(ref(opt));
  }
  return rule({head});
}

std::string Grammar::key() const {
  std::string k;
  auto put = [&](uint32_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(root_);
  put(uint32_t(rules_.size()));
  for (const auto& alts : rules_) {
    put(uint32_t(alts.size()));
    for (uint32_t start : alts) put(start);
  }
  put(uint32_t(elements_.size()));
  for (const Element& e : elements_) {
    k.push_back(char(e.kind));
    if (e.kind == Element::Kind::Rule) put(e.rule);
    if (e.kind == Element::Kind::Bytes) k.append(reinterpret_cast<const char*>(e.set.bits.data()), sizeof e.set.bits);
  }
  return k;
}

void Grammar::finalize() {
  for (size_t r = 0; r < rules_.size(); ++r)
    if (rules_[r].empty()) fail("grammar rule {} has no alternatives", r);
  auto add = [](uint32_t a, uint32_t b) { return std::min(kInfinite, a + b); };
  std::vector<uint32_t> rule_min(rules_.size(), kInfinite);
  auto seq_min = [&](uint32_t pos) {
    uint32_t sum = 0;
    for (; elements_[pos].kind != Element::Kind::End; ++pos)
      sum = add(sum, elements_[pos].kind == Element::Kind::Bytes ? 1 : rule_min[elements_[pos].rule]);
    return sum;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      uint32_t best = rule_min[r];
      for (uint32_t start : rules_[r]) best = std::min(best, seq_min(start));
      if (best < rule_min[r]) {
        rule_min[r] = best;
        changed = true;
      }
    }
  }
  min_from_.assign(elements_.size(), 0);
  for (size_t pos = elements_.size(); pos-- > 0;) {
    const Element& e = elements_[pos];
    if (e.kind == Element::Kind::End) continue;
    min_from_[pos] = add(e.kind == Element::Kind::Bytes ? 1 : rule_min[e.rule], min_from_[pos + 1]);
  }
  if (rule_min[root_] >= kInfinite) fail("the grammar matches no finite text (a rule that only recurses)");
  check_no_left_recursion(rule_min);
}

// The matcher expands references until a byte is on top of every stack: a rule that reaches
// itself through references alone (each before it able to match nothing) would never stop.
void Grammar::check_no_left_recursion(const std::vector<uint32_t>& rule_min) const {
  std::vector<std::vector<uint32_t>> first(rules_.size());  // rules reachable before any byte
  for (size_t r = 0; r < rules_.size(); ++r)
    for (uint32_t pos : rules_[r])
      for (; elements_[pos].kind == Element::Kind::Rule; ++pos) {
        first[r].push_back(elements_[pos].rule);
        if (rule_min[elements_[pos].rule] != 0) break;
      }
  enum : uint8_t { kNew, kOpen, kDone };
  std::vector<uint8_t> mark(rules_.size(), kNew);
  std::vector<std::pair<uint32_t, size_t>> todo;  // iterative DFS: (rule, next edge)
  for (size_t r0 = 0; r0 < rules_.size(); ++r0) {
    if (mark[r0] != kNew) continue;
    todo.push_back({uint32_t(r0), 0});
    mark[r0] = kOpen;
    while (!todo.empty()) {
      auto& [r, i] = todo.back();
      if (i == first[r].size()) {
        mark[r] = kDone;
        todo.pop_back();
        continue;
      }
      const uint32_t s = first[r][i++];
      if (mark[s] == kOpen) fail("the grammar is left-recursive (rule {} reaches itself before any byte)", s);
      if (mark[s] == kNew) {
        mark[s] = kOpen;
        todo.push_back({s, 0});
      }
    }
  }
}

// ------------------------------------------------------------------------ GrammarMatcher

GrammarMatcher::GrammarMatcher(const Grammar& g) : g_(g) {
  std::vector<Stack> stacks;
  for (uint32_t start : g_.alternatives(g_.root())) {
    Stack s{start};
    expand(s, stacks);
  }
  start_ = intern(std::move(stacks));
}

// Brings a stack to a Bytes element on top (or to empty: matched), following rule references
// into every alternative.
void GrammarMatcher::expand(Stack& stack, std::vector<Stack>& out) const {
  if (stack.size() > kMaxDepth) return;
  if (stack.empty()) {
    out.push_back(stack);
    return;
  }
  const uint32_t pos = stack.back();
  const Grammar::Element& e = g_.at(pos);
  if (e.kind == Grammar::Element::Kind::Bytes) {
    out.push_back(stack);
    return;
  }
  stack.pop_back();
  if (e.kind == Grammar::Element::Kind::End) {
    expand(stack, out);
  } else {
    // Continue after the reference once the rule is done; a reference at the end of its
    // alternative leaves no frame (a tail call), so right recursion does not deepen the stack.
    if (g_.at(pos + 1).kind != Grammar::Element::Kind::End) stack.push_back(pos + 1);
    for (uint32_t start : g_.alternatives(e.rule)) {
      Stack s = stack;
      s.push_back(start);
      expand(s, out);
    }
    if (g_.at(pos + 1).kind != Grammar::Element::Kind::End) stack.pop_back();
  }
  stack.push_back(pos);
}

int32_t GrammarMatcher::intern(std::vector<Stack> stacks) {
  if (stacks.empty()) return kDead;
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  std::string key;
  for (const Stack& s : stacks) {
    const uint32_t n = uint32_t(s.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(uint32_t));
  }
  auto [it, fresh] = index_.try_emplace(std::move(key), int32_t(states_.size()));
  if (!fresh) return it->second;
  State st;
  st.next.fill(kUnknown);
  for (const Stack& s : stacks) {
    uint32_t need = 0;
    for (uint32_t pos : s) need = std::min(Grammar::kInfinite, need + g_.min_bytes_from(pos));
    st.min_remaining = std::min(st.min_remaining, need);
    if (s.empty()) st.accepting = true;
    else st.can_continue = true;
  }
  st.stacks = std::move(stacks);
  states_.push_back(std::move(st));
  return it->second;
}

int32_t GrammarMatcher::step_new(int32_t state, uint8_t byte) {
  std::vector<Stack> out;
  for (const Stack& s : states_[size_t(state)].stacks) {
    if (s.empty() || !g_.at(s.back()).set.has(byte)) continue;
    Stack t = s;
    const uint32_t next = t.back() + 1;
    t.pop_back();
    if (g_.at(next).kind != Grammar::Element::Kind::End) t.push_back(next);
    expand(t, out);
  }
  const int32_t id = intern(std::move(out));  // may grow states_: do not hold `cached` across it
  states_[size_t(state)].next[byte] = id;
  return id;
}

int32_t GrammarMatcher::step(int32_t state, std::string_view bytes) {
  for (char c : bytes) {
    state = step(state, uint8_t(c));
    if (state == kDead) break;
  }
  return state;
}

}  // namespace swiftlet
