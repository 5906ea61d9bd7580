// String contents as grammar rules: characters written as JSON escapes them (or raw), the
// ECMA-262 subset of `pattern` that tool schemas use, and the formats, which are written here as
// patterns of that subset (RFC 3339 dates and times, RFC 4122 UUIDs, dotted IPv4, full IPv6,
// plain e-mail addresses and URIs: every text they produce is valid, not every valid text is
// produced).
//
// The pattern subset: literals, `.`, classes `[...]` / `[^...]` of ASCII characters and ranges,
// the escapes \d \w \s \D \W \S \t \n \r \f \v \0 \xHH \uHHHH and escaped punctuation,
// groups `(...)`, `(?:...)`, `(?<name>...)`, alternation, quantifiers ? * + {n} {n,} {n,m} (lazy
// or not: the same strings), and `^` / `$` at the start / end of a top-level alternative. A
// pattern matches anywhere in the string (ECMA-262 `test`), so an unanchored side gets any text.
// Outside the subset (lookaround, backreferences, \b, anchors elsewhere, non-ASCII classes) the
// pattern is not enforced.
#include "runtime/json_schema_parts.h"

#include <fmt/format.h>

#include <vector>

namespace swiftlet::schema_parts {
namespace {

using Seq = Grammar::Sequence;

Seq ref(uint32_t r) { return {Grammar::ref(r)}; }

struct Node {
  enum class Kind { Chars, Text, Seq, Alt, Repeat };
  Kind kind = Kind::Seq;
  CharClass chars;          // Chars
  std::string text;         // Text: one non-ASCII character's UTF-8 bytes
  std::vector<Node> kids;   // Seq, Alt; Repeat: one
  int min = 0, max = -1;    // Repeat

  bool nullable() const {
    switch (kind) {
      case Kind::Chars:
      case Kind::Text: return false;
      case Kind::Seq:
        for (const Node& k : kids)
          if (!k.nullable()) return false;
        return true;
      case Kind::Alt:
        for (const Node& k : kids)
          if (k.nullable()) return true;
        return false;
      case Kind::Repeat: return min == 0 || kids[0].nullable();
    }
    return true;
  }
};

Node make(Node::Kind kind) {
  Node n;
  n.kind = kind;
  return n;
}

struct Branch {
  Node body;
  bool start = false, end = false;  // anchored by ^ / $
};

class Unsupported {
 public:
  explicit Unsupported(std::string why) : why(std::move(why)) {}
  std::string why;
};

constexpr int kMaxRepeat = 4096;

ByteSet word_chars() {
  ByteSet s = ByteSet::range('a', 'z');
  s.add_range('A', 'Z');
  s.add_range('0', '9');
  s.add('_');
  return s;
}
ByteSet space_chars() {
  ByteSet s;
  for (char c : std::string_view(" \t\n\r\f\v")) s.add(uint8_t(c));
  return s;
}
ByteSet complement(const ByteSet& s) {
  ByteSet c;
  for (int b = 0; b < 128; ++b)
    if (!s.has(uint8_t(b))) c.add(uint8_t(b));
  return c;
}

class Parser {
 public:
  explicit Parser(std::string_view re) : re_(re) {}

  std::vector<Branch> parse() {
    std::vector<Branch> out;
    for (;;) {
      Branch b;
      if (peek('^')) {
        ++i_;
        b.start = true;
      }
      b.body = sequence(/*top=*/true, b.end);
      out.push_back(std::move(b));
      if (i_ == re_.size()) break;
      if (re_[i_] == '|') {
        ++i_;
        continue;
      }
      throw Unsupported(fmt::format("unbalanced ')' at offset {}", i_));
    }
    return out;
  }

 private:
  bool peek(char c) const { return i_ < re_.size() && re_[i_] == c; }

  Node alternation() {
    Node alt = make(Node::Kind::Alt);
    bool end = false;
    for (;;) {
      alt.kids.push_back(sequence(false, end));
      if (!peek('|')) break;
      ++i_;
    }
    return alt;
  }

  Node sequence(bool top, bool& end) {
    Node seq = make(Node::Kind::Seq);
    while (i_ < re_.size() && re_[i_] != '|' && re_[i_] != ')') {
      if (re_[i_] == '$') {
        if (!top || (i_ + 1 < re_.size() && re_[i_ + 1] != '|')) throw Unsupported("'$' inside the pattern");
        ++i_;
        end = true;
        break;
      }
      if (re_[i_] == '^') throw Unsupported("'^' inside the pattern");
      Node atom_node = atom();
      quantify(atom_node);
      seq.kids.push_back(std::move(atom_node));
    }
    return seq;
  }

  void quantify(Node& n) {
    for (bool first = true;; first = false) {
      if (i_ >= re_.size()) return;
      int min = -1, max = -1;
      const char c = re_[i_];
      if (c == '*') min = 0;
      else if (c == '+') min = 1;
      else if (c == '?') min = 0, max = 1;
      else if (c == '{' && braces(min, max)) {
      } else {
        return;
      }
      if (!first) throw Unsupported("a quantifier after a quantifier");
      if (c != '{') ++i_;
      if (peek('?')) ++i_;  // lazy: the same strings
      if (max >= 0 && max < min) throw Unsupported("a quantifier {n,m} with m < n");
      if (min > kMaxRepeat || max > kMaxRepeat) throw Unsupported("a quantifier over 4096");
      if (max < 0 && n.nullable()) throw Unsupported("an unbounded quantifier over what may match nothing");
      Node r = make(Node::Kind::Repeat);
      r.min = min;
      r.max = max;
      r.kids.push_back(std::move(n));
      n = std::move(r);
      return;
    }
  }

  // {n}, {n,}, {n,m} at i_: consumes it and returns true; false leaves i_ (a literal '{').
  bool braces(int& min, int& max) {
    size_t j = i_ + 1;
    auto number = [&](int& v) {
      const size_t s = j;
      long x = 0;
      while (j < re_.size() && re_[j] >= '0' && re_[j] <= '9') x = std::min(x * 10 + (re_[j++] - '0'), 1000000L);
      v = int(x);
      return j > s;
    };
    if (!number(min)) return false;
    max = min;
    if (j < re_.size() && re_[j] == ',') {
      ++j;
      max = -1;
      if (j < re_.size() && re_[j] != '}' && !number(max)) return false;
    }
    if (j >= re_.size() || re_[j] != '}') return false;
    i_ = j + 1;
    return true;
  }

  Node chars(const CharClass& c) {
    Node n = make(Node::Kind::Chars);
    n.chars = c;
    return n;
  }
  Node ascii(uint8_t b) {
    CharClass c;
    c.ascii.add(b);
    return chars(c);
  }

  Node atom() {
    const char c = re_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        if (re_.substr(i_, 2) == "?:") {
          i_ += 2;
        } else if (re_.substr(i_, 2) == "?<" && i_ + 2 < re_.size() && re_[i_ + 2] != '=' && re_[i_ + 2] != '!') {
          const size_t close = re_.find('>', i_);
          if (close == std::string_view::npos) throw Unsupported("an unterminated group name");
          i_ = close + 1;
        } else {
          throw Unsupported("lookaround (?=, (?!, (?<=, (?<!");
        }
      }
      Node inner = alternation();
      if (!peek(')')) throw Unsupported("an unterminated group");
      ++i_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      CharClass any;
      any.ascii = complement(ByteSet());
      any.ascii.remove('\n');
      any.ascii.remove('\r');
      any.non_ascii = true;
      any.no_line_terminators = true;
      return chars(any);
    }
    if (c == '\\') {
      ++i_;
      CharClass cls;
      if (escape(cls, /*in_class=*/false)) return chars(cls);
      throw Unsupported("an escape outside the subset");
    }
    if (c == '*' || c == '+' || c == '?') throw Unsupported("a quantifier with nothing before it");
    if (uint8_t(c) >= 0x80) return utf8_literal();
    ++i_;
    return ascii(uint8_t(c));
  }

  Node utf8_literal() {
    const uint8_t lead = uint8_t(re_[i_]);
    const size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (n == 1 || i_ + n > re_.size()) throw Unsupported("text that is not UTF-8");
    Node t = make(Node::Kind::Text);
    t.text = std::string(re_.substr(i_, n));
    i_ += n;
    return t;
  }

  // After a backslash: fills `cls` and returns true, or false for an escape outside the subset.
  bool escape(CharClass& cls, bool in_class) {
    if (i_ >= re_.size()) throw Unsupported("a pattern ending in a backslash");
    const char c = re_[i_++];
    auto hex = [&](size_t n) {
      if (i_ + n > re_.size()) throw Unsupported("a short hex escape");
      unsigned v = 0;
      for (size_t k = 0; k < n; ++k) {
        const char h = re_[i_ + k];
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) throw Unsupported("a bad hex escape");
        v = v * 16 + unsigned(d);
      }
      i_ += n;
      if (v >= 0x80) throw Unsupported("a non-ASCII escape");
      cls.ascii.add(uint8_t(v));
      return true;
    };
    switch (c) {
      case 'd': cls.ascii.add_range('0', '9'); return true;
      case 'w': cls.ascii = word_chars(); return true;
      case 's': cls.ascii = space_chars(); return true;
      case 'D': cls.ascii = complement(ByteSet::range('0', '9')); cls.non_ascii = true; return true;
      case 'W': cls.ascii = complement(word_chars()); cls.non_ascii = true; return true;
      case 'S': cls.ascii = complement(space_chars()); return true;  // non-ASCII spaces exist: ASCII only
      case 't': cls.ascii.add('\t'); return true;
      case 'n': cls.ascii.add('\n'); return true;
      case 'r': cls.ascii.add('\r'); return true;
      case 'f': cls.ascii.add('\f'); return true;
      case 'v': cls.ascii.add('\v'); return true;
      case '0': cls.ascii.add(0); return true;
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'b':
        if (in_class) {
          cls.ascii.add('\b');
          return true;
        }
        return false;
      default:
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) && uint8_t(c) < 0x80) {
          cls.ascii.add(uint8_t(c));  // escaped punctuation: itself
          return true;
        }
        return false;  // \B, \1, \p{...}, \c...
    }
  }

  Node char_class() {
    ++i_;  // '['
    bool negate = false;
    if (peek('^')) {
      negate = true;
      ++i_;
    }
    CharClass cls;
    while (i_ < re_.size() && re_[i_] != ']') {
      int lo = -1;
      CharClass one;
      if (re_[i_] == '\\') {
        ++i_;
        if (!escape(one, /*in_class=*/true)) throw Unsupported("an escape in a class outside the subset");
      } else if (uint8_t(re_[i_]) >= 0x80) {
        throw Unsupported("a non-ASCII character in a class");
      } else {
        one.ascii.add(uint8_t(re_[i_++]));
      }
      // A single character may start a range a-b.
      int count = 0;
      for (int b = 0; b < 128; ++b)
        if (one.ascii.has(uint8_t(b))) {
          ++count;
          lo = b;
        }
      if (count == 1 && !one.non_ascii && i_ + 1 < re_.size() && re_[i_] == '-' && re_[i_ + 1] != ']') {
        ++i_;
        CharClass to;
        if (re_[i_] == '\\') {
          ++i_;
          if (!escape(to, true)) throw Unsupported("an escape in a class outside the subset");
        } else if (uint8_t(re_[i_]) >= 0x80) {
          throw Unsupported("a non-ASCII range in a class");
        } else {
          to.ascii.add(uint8_t(re_[i_++]));
        }
        int hi = -1, n = 0;
        for (int b = 0; b < 128; ++b)
          if (to.ascii.has(uint8_t(b))) {
            ++n;
            hi = b;
          }
        if (n != 1 || hi < lo) throw Unsupported("a bad range in a class");
        one.ascii.add_range(uint8_t(lo), uint8_t(hi));
      }
      for (int k = 0; k < 4; ++k) cls.ascii.bits[size_t(k)] |= one.ascii.bits[size_t(k)];
      cls.non_ascii |= one.non_ascii;
    }
    if (!peek(']')) throw Unsupported("an unterminated class");
    ++i_;
    if (negate) {
      if (cls.non_ascii) throw Unsupported("a negated class of \\D, \\W");
      cls.ascii = complement(cls.ascii);
      cls.non_ascii = true;
    }
    return chars(cls);
  }

  std::string_view re_;
  size_t i_ = 0;
};

}  // namespace

TextRules::TextRules(Grammar& g, TextMode mode) : g_(g), mode_(std::move(mode)) {}

uint32_t TextRules::multibyte(bool no_line_terminators) {
  int64_t& cached = utf8_[no_line_terminators ? 1 : 0];
  if (cached >= 0) return uint32_t(cached);
  const Grammar::Element cont = Grammar::bytes(ByteSet::range(0x80, 0xBF));
  auto b = [](uint8_t lo, uint8_t hi) { return Grammar::bytes(ByteSet::range(lo, hi)); };
  // Well-formed UTF-8 (Unicode 15, table 3-7): no overlongs, no surrogates, nothing past U+10FFFF.
  std::vector<Seq> alts = {{b(0xC2, 0xDF), cont},
                           {b(0xE0, 0xE0), b(0xA0, 0xBF), cont},
                           {b(0xED, 0xED), b(0x80, 0x9F), cont},
                           {b(0xEE, 0xEF), cont, cont},
                           {b(0xF0, 0xF0), b(0x90, 0xBF), cont, cont},
                           {b(0xF1, 0xF3), cont, cont, cont},
                           {b(0xF4, 0xF4), b(0x80, 0x8F), cont, cont}};
  if (!no_line_terminators) {
    alts.push_back({b(0xE1, 0xEC), cont, cont});
  } else {  // U+2028 and U+2029 (E2 80 A8/A9) end a line for `.`
    ByteSet after80 = ByteSet::range(0x80, 0xBF);
    after80.remove(0xA8);
    after80.remove(0xA9);
    alts.push_back({b(0xE1, 0xE1), cont, cont});
    alts.push_back({b(0xE3, 0xEC), cont, cont});
    alts.push_back({b(0xE2, 0xE2), b(0x81, 0xBF), cont});
    alts.push_back({b(0xE2, 0xE2), b(0x80, 0x80), Grammar::bytes(after80)});
  }
  cached = g_.rule(alts);
  return uint32_t(cached);
}

int64_t TextRules::one_of(const CharClass& c) {
  std::vector<Seq> alts;
  ByteSet plain;
  for (int b = 0; b < 128; ++b) {
    if (!c.ascii.has(uint8_t(b))) continue;
    const char ch = char(b);
    if (!mode_.json) {
      if (mode_.exclude.find(ch) != std::string::npos) continue;
      if (b >= 0x20 || ch == '\n' || ch == '\t') plain.add(uint8_t(b));
      continue;
    }
    if (b >= 0x20 && ch != '"' && ch != '\\') {
      plain.add(uint8_t(b));
      continue;
    }
    switch (ch) {
      case '"': alts.push_back(Grammar::literal("\\\"")); break;
      case '\\': alts.push_back(Grammar::literal("\\\\")); break;
      case '\n': alts.push_back(Grammar::literal("\\n")); break;
      case '\t': alts.push_back(Grammar::literal("\\t")); break;
      case '\r': alts.push_back(Grammar::literal("\\r")); break;
      case '\b': alts.push_back(Grammar::literal("\\b")); break;
      case '\f': alts.push_back(Grammar::literal("\\f")); break;
      default: alts.push_back(Grammar::literal(fmt::format("\\u{:04x}", b))); break;
    }
  }
  bool any_plain = false;
  for (uint64_t w : plain.bits) any_plain |= w != 0;
  if (any_plain) alts.push_back({Grammar::bytes(plain)});
  if (c.non_ascii) alts.push_back(ref(multibyte(c.no_line_terminators)));
  if (alts.empty()) return -1;
  return g_.rule(alts);
}

uint32_t TextRules::any_char() {
  if (any_ >= 0) return uint32_t(any_);
  CharClass all;
  all.ascii = ByteSet::range(0, 0x7F);
  all.non_ascii = true;
  any_ = one_of(all);
  return uint32_t(any_);
}

namespace {

int64_t build(Grammar& g, TextRules& t, const Node& n) {
  switch (n.kind) {
    case Node::Kind::Chars: return t.one_of(n.chars);
    case Node::Kind::Text: return g.rule({Grammar::literal(n.text)});
    case Node::Kind::Seq: {
      Seq s;
      for (const Node& k : n.kids) {
        const int64_t r = build(g, t, k);
        if (r < 0) return -1;
        s.push_back(Grammar::ref(uint32_t(r)));
      }
      return g.rule({s});
    }
    case Node::Kind::Alt: {
      std::vector<Seq> alts;
      for (const Node& k : n.kids)
        if (const int64_t r = build(g, t, k); r >= 0) alts.push_back(ref(uint32_t(r)));
      if (alts.empty()) return -1;
      return g.rule(alts);
    }
    case Node::Kind::Repeat: {
      const int64_t r = build(g, t, n.kids[0]);
      if (r < 0) return n.min == 0 ? int64_t(g.rule({{}})) : -1;
      return g.repeat(ref(uint32_t(r)), n.min, n.max);
    }
  }
  return -1;
}

}  // namespace

int64_t TextRules::pattern(std::string_view regex, std::string& why) {
  std::vector<Branch> branches;
  try {
    branches = Parser(regex).parse();
  } catch (const Unsupported& u) {
    why = u.why;
    return -1;
  }
  const uint32_t any = g_.repeat(ref(any_char()), 0, -1);
  std::vector<Seq> alts;
  for (const Branch& b : branches) {
    const int64_t body = build(g_, *this, b.body);
    if (body < 0) continue;
    Seq s;
    if (!b.start) s.push_back(Grammar::ref(any));
    s.push_back(Grammar::ref(uint32_t(body)));
    if (!b.end) s.push_back(Grammar::ref(any));
    alts.push_back(s);
  }
  if (alts.empty()) {
    why = "no string this server can write matches it";
    return -1;
  }
  return g_.rule(alts);
}

int64_t TextRules::format(std::string_view name, int& min_len, int& max_len) {
  // RFC 3339 full-date with days per month (February to 28: leap years are not worked out).
  static const std::string date =
      "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))";
  // RFC 3339 full-time (no leap second), with an offset.
  static const std::string time = "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
  static const std::string octet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
  static const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,30}[A-Za-z0-9])?";
  std::string re;
  if (name == "date") re = date, min_len = max_len = 10;
  else if (name == "time") re = time, min_len = 9, max_len = 21;
  else if (name == "date-time") re = date + "T" + time, min_len = 20, max_len = 32;
  else if (name == "uuid") re = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", min_len = max_len = 36;
  else if (name == "ipv4") re = octet + "(?:\\." + octet + "){3}", min_len = 7, max_len = 15;
  else if (name == "ipv6") re = "[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7}", min_len = 15, max_len = 39;
  else if (name == "email") re = "[A-Za-z0-9_+-]{1,32}(?:\\.[A-Za-z0-9_+-]{1,32}){0,3}@(?:" + label + "\\.){1,3}[A-Za-z]{2,12}", min_len = 6, max_len = -1;
  else if (name == "uri")
    re = "(?:https?|ftp)://(?:" + label + "\\.){0,3}" + label + "(?::\\d{1,4})?(?:/[A-Za-z0-9._~-]{0,32}){0,8}",
    min_len = 7, max_len = -1;
  else return -1;
  std::string why;
  return pattern("^" + re + "$", why);
}

}  // namespace swiftlet::schema_parts
