// Byte-level context-free grammars for constrained decoding, and the matcher that follows one
// byte by byte.
//
// A Grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence
// of elements, each a set of bytes (one byte) or a reference to a rule. Working on bytes, not
// characters, lets a token end in the middle of a UTF-8 character or of a JSON token.
//
// The matcher's state is the set of parse stacks that are still alive (as in llama.cpp's GBNF
// matcher): a stack lists, innermost last, the position of the next element in each rule being
// matched. The empty stack means "the whole root has been matched". States are interned: each
// distinct stack set gets an id, and the transition of an id on a byte is computed once and kept,
// so the matcher grows into a DFA over the states a request actually visits. Grammars must not be
// left-recursive (a rule that can reach itself without consuming a byte); stacks deeper than
// kMaxDepth are dropped, which bounds nesting of recursive rules.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace swiftlet {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void add(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(uint8_t(b));
  }
  void remove(uint8_t b) { bits[b >> 6] &= ~(uint64_t(1) << (b & 63)); }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  static ByteSet of(uint8_t b) {
    ByteSet s;
    s.add(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.add_range(lo, hi);
    return s;
  }
};

class Grammar {
 public:
  struct Element {
    enum class Kind : uint8_t { End, Bytes, Rule };
    Kind kind = Kind::End;
    uint32_t rule = 0;  // Rule
    ByteSet set;        // Bytes
  };
  using Sequence = std::vector<Element>;

  static Element bytes(ByteSet s) { return {Element::Kind::Bytes, 0, s}; }
  static Element byte(uint8_t b) { return bytes(ByteSet::of(b)); }
  static Element ref(uint32_t rule) { return {Element::Kind::Rule, rule, {}}; }
  static Sequence literal(std::string_view s);

  uint32_t add_rule();  // a rule with no alternatives yet (to refer to before it is filled)
  void add_alternative(uint32_t rule, const Sequence& seq);
  // A rule with the given alternatives.
  uint32_t rule(const std::vector<Sequence>& alternatives);
  // x{min,max} as rules; max < 0: unbounded.
  uint32_t repeat(const Sequence& x, int min, int max);
  void set_root(uint32_t rule) { root_ = rule; }

  // Checks every referenced rule has an alternative and computes the shortest completions.
  // Throws Error for a rule with no alternatives, a root that matches nothing, or left recursion.
  void finalize();

  uint32_t root() const { return root_; }
  size_t rule_count() const { return rules_.size(); }
  const Element& at(uint32_t pos) const { return elements_[pos]; }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  // Bytes needed at least to match from element position `pos` to the end of its alternative.
  uint32_t min_bytes_from(uint32_t pos) const { return min_from_[pos]; }
  static constexpr uint32_t kInfinite = 1u << 30;
  // The rules and the root as bytes: two grammars with the same key are one grammar (the same
  // matcher states, the same token masks). GrammarCache shares compiled grammars by it.
  std::string key() const;

 private:
  void check_no_left_recursion(const std::vector<uint32_t>& rule_min) const;

  std::vector<Element> elements_;            // every alternative, each closed by an End
  std::vector<std::vector<uint32_t>> rules_;  // rule -> start positions of its alternatives
  std::vector<uint32_t> min_from_;            // per element position
  uint32_t root_ = 0;
};

class GrammarMatcher {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr size_t kMaxDepth = 512;

  explicit GrammarMatcher(const Grammar& g);

  int32_t start() const { return start_; }
  // kDead when no stack accepts the byte. Inline: the token-mask walk calls it per trie edge.
  int32_t step(int32_t state, uint8_t byte) {
    if (state < 0) return kDead;
    const int32_t known = states_[size_t(state)].next[byte];
    return known != kUnknown ? known : step_new(state, byte);
  }
  int32_t step(int32_t state, std::string_view bytes);
  bool accepting(int32_t state) const { return states_[size_t(state)].accepting; }
  // True when some stack can still take a byte.
  bool can_continue(int32_t state) const { return states_[size_t(state)].can_continue; }
  // Fewest bytes that complete the root from this state (0 when accepting).
  uint32_t min_remaining(int32_t state) const { return states_[size_t(state)].min_remaining; }
  size_t state_count() const { return states_.size(); }

 private:
  using Stack = std::vector<uint32_t>;
  struct State {
    std::vector<Stack> stacks;  // sorted, unique; each top is a Bytes element, or empty
    std::array<int32_t, 256> next;
    bool accepting = false, can_continue = false;
    uint32_t min_remaining = Grammar::kInfinite;
  };
  static constexpr int32_t kUnknown = -2;

  int32_t step_new(int32_t state, uint8_t byte);
  void expand(Stack& stack, std::vector<Stack>& out) const;
  int32_t intern(std::vector<Stack> stacks);

  const Grammar& g_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> index_;  // flattened stack set -> state id
  int32_t start_ = kDead;
};

}  // namespace swiftlet
