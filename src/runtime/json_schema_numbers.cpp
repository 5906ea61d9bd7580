// Numbers in a range as grammar rules. Integer ranges are split by digit count and then by
// leading digit (each fixed-width range [lo, hi] is lo's first digit + the rest up to 9..9, the
// digits between + anything, hi's first digit + 0..0 up to the rest). A number's fraction is
// compared with a bound's digits one position at a time, as strings of equal padded length
// compare: the fraction is a path through (position, still equal to the lower bound's digits,
// still equal to the upper bound's digits).
#include "runtime/json_schema_parts.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

namespace swiftlet::schema_parts {
namespace {

using Seq = Grammar::Sequence;

Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Seq ref(uint32_t r) { return {Grammar::ref(r)}; }
Seq digits(char lo, char hi) { return {Grammar::bytes(ByteSet::range(uint8_t(lo), uint8_t(hi)))}; }

uint32_t any_digits(Grammar& g, int n) { return g.repeat(digits('0', '9'), n, n); }

// Digit strings of lo's width between lo and hi (same width, lo <= hi), leading zeros allowed.
uint32_t fixed_width(Grammar& g, std::string_view lo, std::string_view hi) {
  if (lo.empty()) return g.rule({{}});
  if (lo[0] == hi[0]) return g.rule({digits(lo[0], lo[0]) + ref(fixed_width(g, lo.substr(1), hi.substr(1)))});
  const std::string nines(lo.size() - 1, '9'), zeros(lo.size() - 1, '0');
  if (lo.substr(1) == zeros && hi.substr(1) == nines)
    return g.rule({digits(lo[0], hi[0]) + ref(any_digits(g, int(lo.size()) - 1))});
  std::vector<Seq> alts = {digits(lo[0], lo[0]) + ref(fixed_width(g, lo.substr(1), nines))};
  if (hi[0] - lo[0] > 1) alts.push_back(digits(char(lo[0] + 1), char(hi[0] - 1)) + ref(any_digits(g, int(lo.size()) - 1)));
  alts.push_back(digits(hi[0], hi[0]) + ref(fixed_width(g, zeros, hi.substr(1))));
  return g.rule(alts);
}

// Non-negative integers in [lo, hi] without leading zeros.
uint32_t unsigned_range(Grammar& g, uint64_t lo, uint64_t hi) {
  const std::string a = std::to_string(lo), b = std::to_string(hi);
  std::vector<Seq> alts;
  for (size_t n = a.size(); n <= b.size(); ++n) {
    const std::string from = n == a.size() ? a : "1" + std::string(n - 1, '0');
    const std::string to = n == b.size() ? b : std::string(n, '9');
    alts.push_back(ref(fixed_width(g, from, to)));
  }
  return g.rule(alts);
}

// The fraction of a number whose integer part equals a bound's: "" or "." digits, compared with
// the lower bound's fraction `a` (when lo_on) and the upper bound's `b` (when hi_on).
class Fraction {
 public:
  Fraction(Grammar& g, const Bound* lo, const Bound* hi) : g_(g), lo_(lo), hi_(hi) {
    len_ = std::max(lo ? lo->value.frac.size() : 0, hi ? hi->value.frac.size() : 0);
  }

  int64_t rule() {
    std::vector<Seq> alts;
    if (end_ok(0, lo_ != nullptr, hi_ != nullptr)) alts.push_back({});
    if (const int64_t d = digits_from(0, lo_ != nullptr, hi_ != nullptr); d >= 0)
      alts.push_back(Grammar::literal(".") + ref(uint32_t(d)));
    if (alts.empty()) return -1;
    return g_.rule(alts);
  }

 private:
  char lo_digit(size_t k) const { return k < lo_->value.frac.size() ? lo_->value.frac[k] : '0'; }
  char hi_digit(size_t k) const { return k < hi_->value.frac.size() ? hi_->value.frac[k] : '0'; }

  // Whether the fraction may stop at position k (the rest is zeros) in state (tl, th).
  bool end_ok(size_t k, bool tl, bool th) const {
    if (tl && (k < lo_->value.frac.size() || lo_->exclusive)) return false;  // still below, or equal to an exclusive bound
    if (th && k >= hi_->value.frac.size() && hi_->exclusive) return false;   // equal to an exclusive upper bound
    return true;
  }

  // At least one digit from position k on, then any allowed end: -1 if there is none.
  int64_t digits_from(size_t k, bool tl, bool th) {
    if (!tl && !th) return free_tail(1);
    const auto key = std::make_tuple(std::min(k, len_), tl, th);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    if (k >= len_) {
      // Past both bounds' digits the padded bounds are zeros: only '0' keeps a tight state.
      int64_t r = -1;
      if (tl && !th) {  // '0' stays equal to the bound, any other digit is above it
        const uint32_t self = g_.add_rule();
        memo_[key] = self;
        g_.add_alternative(self, digits('0', '0') + ref(self));
        if (end_ok(k + 1, true, false)) g_.add_alternative(self, digits('0', '0'));
        g_.add_alternative(self, digits('1', '9') + ref(free_tail(0)));
        r = self;
      } else if (end_ok(k + 1, tl, th)) {  // th: only zeros stay <= the bound
        r = g_.repeat(digits('0', '0'), 1, 16);
      }
      memo_[key] = r;
      return r;
    }
    const char la = tl ? lo_digit(k) : '0', ub = th ? hi_digit(k) : '9';
    std::vector<Seq> alts;
    auto add = [&](char from, char to, bool ntl, bool nth) {
      if (from > to) return;
      const bool end = end_ok(k + 1, ntl, nth);
      std::vector<Seq> tails;
      if (end) tails.push_back({});
      if (const int64_t more = digits_from(k + 1, ntl, nth); more >= 0) tails.push_back(ref(uint32_t(more)));
      if (tails.empty()) return;
      const uint32_t tail = g_.rule(tails);
      alts.push_back(digits(from, to) + ref(tail));
    };
    if (la > ub) {
      // the bounds' digits cross (lower above upper): nothing fits
    } else if (la == ub) {
      add(la, la, tl, th);
    } else {
      add(la, la, tl, false);
      add(char(la + 1), char(ub - 1), false, false);
      add(ub, ub, false, th);
    }
    const int64_t r = alts.empty() ? -1 : int64_t(g_.rule(alts));
    memo_[key] = r;
    return r;
  }

  uint32_t free_tail(int min) {
    int64_t& t = free_[min];
    if (t < 0) t = g_.repeat(digits('0', '9'), min, 16);
    return uint32_t(t);
  }

  Grammar& g_;
  const Bound *lo_, *hi_;
  size_t len_;
  std::map<std::tuple<size_t, bool, bool>, int64_t> memo_;
  int64_t free_[2] = {-1, -1};
};

// Non-negative decimals (integer part, optional fraction) within the bounds (both >= 0).
int64_t unsigned_number(Grammar& g, const Bound* lo, const Bound* hi) {
  const uint64_t li = lo ? lo->value.whole : 0;
  const uint64_t hi_i = hi ? std::min(hi->value.whole, uint64_t(kMaxMagnitude)) : uint64_t(kMaxMagnitude);
  if (li > hi_i || li > uint64_t(kMaxMagnitude)) return -1;
  std::vector<Seq> alts;
  auto part = [&](uint64_t whole, const Bound* l, const Bound* h) {
    Fraction f(g, l, h);
    if (const int64_t frac = f.rule(); frac >= 0)
      alts.push_back(Grammar::literal(std::to_string(whole)) + ref(uint32_t(frac)));
  };
  const Bound* upper = hi && hi->value.whole <= uint64_t(kMaxMagnitude) ? hi : nullptr;
  if (li == hi_i) {
    part(li, lo, upper);
  } else {
    part(li, lo, nullptr);
    const uint64_t mid_hi = upper ? hi_i - 1 : hi_i;
    if (li + 1 <= mid_hi) {
      Fraction any(g, nullptr, nullptr);
      alts.push_back(ref(unsigned_range(g, li + 1, mid_hi)) + ref(uint32_t(any.rule())));
    }
    if (upper) part(hi_i, nullptr, upper);
  }
  if (alts.empty()) return -1;
  return g.rule(alts);
}

}  // namespace

bool parse_decimal(std::string_view s, Decimal& out) {
  out = {};
  size_t i = 0;
  if (i < s.size() && s[i] == '-') {
    out.negative = true;
    ++i;
  }
  std::string mant;
  int point = -1;
  for (; i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.'); ++i) {
    if (s[i] == '.') {
      if (point >= 0) return false;
      point = int(mant.size());
    } else {
      mant += s[i];
    }
  }
  if (mant.empty()) return false;
  if (point < 0) point = int(mant.size());
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i == s.size()) return false;
    long e = 0;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) e = std::min(e * 10 + (s[i] - '0'), 100000L);
    point += int(neg ? -e : e);
  }
  if (i != s.size()) return false;
  // The digits are mant with the point before mant[point] (point may be outside 0..size).
  std::string whole, frac;
  if (point <= 0) {
    frac = std::string(size_t(-point), '0') + mant;
  } else if (size_t(point) >= mant.size()) {
    whole = mant + std::string(size_t(point) - mant.size(), '0');
  } else {
    whole = mant.substr(0, size_t(point));
    frac = mant.substr(size_t(point));
  }
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  whole.erase(0, std::min(whole.find_first_not_of('0'), whole.size()));
  if (whole.size() > 16) {
    out.whole = uint64_t(kMaxMagnitude) + 1;
  } else {
    for (char c : whole) out.whole = out.whole * 10 + uint64_t(c - '0');
  }
  out.frac = frac;
  if (out.is_zero()) out.negative = false;
  return true;
}

int64_t integer_range(Grammar& g, std::optional<int64_t> lo, std::optional<int64_t> hi) {
  const int64_t a = std::max(lo.value_or(-kMaxMagnitude), -kMaxMagnitude);
  const int64_t b = std::min(hi.value_or(kMaxMagnitude), kMaxMagnitude);
  if (a > b) return -1;
  std::vector<Seq> alts;
  if (b >= 0) alts.push_back(ref(unsigned_range(g, uint64_t(std::max<int64_t>(a, 0)), uint64_t(b))));
  if (a < 0) alts.push_back(Grammar::literal("-") + ref(unsigned_range(g, uint64_t(std::max<int64_t>(-b, 1)), uint64_t(-a))));
  return g.rule(alts);
}

int64_t number_range(Grammar& g, const std::optional<Bound>& lo, const std::optional<Bound>& hi) {
  std::vector<Seq> alts;
  // x >= 0: the bounds clipped to the non-negative side.
  const bool hi_negative = hi && hi->value.negative;
  if (!hi_negative) {
    std::optional<Bound> l;
    if (lo && !lo->value.negative) l = lo;
    const Bound* h = hi ? &*hi : nullptr;
    if (const int64_t r = unsigned_number(g, l ? &*l : nullptr, h); r >= 0) alts.push_back(ref(uint32_t(r)));
  }
  // x < 0: -y with y > 0 between -hi and -lo.
  if (!lo || lo->value.negative) {
    Bound l;  // y > 0, or y >= -hi (or y > -hi) when hi < 0
    l.exclusive = true;
    if (hi_negative) {
      l = *hi;
      l.value.negative = false;
    }
    std::optional<Bound> h;
    if (lo) {
      h = *lo;
      h->value.negative = false;
    }
    if (const int64_t r = unsigned_number(g, &l, h ? &*h : nullptr); r >= 0)
      alts.push_back(Grammar::literal("-") + ref(uint32_t(r)));
  }
  if (alts.empty()) return -1;
  return g.rule(alts);
}

uint32_t integer_multiple(Grammar& g, int64_t m) {
  // rem[k][r]: at most k more digits after a number that is r mod m; done when r == 0. (At most
  // 16 digits: a longer number is not exact in a double, where validators divide.)
  std::vector<std::vector<int64_t>> rem(16, std::vector<int64_t>(static_cast<size_t>(m), -1));
  for (int k = 0; k < 16; ++k)
    for (int64_t r = 0; r < m; ++r) {
      std::vector<Seq> alts;
      if (r == 0) alts.push_back({});
      if (k > 0)
        for (int d = 0; d < 10; ++d)
          if (const int64_t next = rem[size_t(k - 1)][size_t((r * 10 + d) % m)]; next >= 0)
            alts.push_back(digits(char('0' + d), char('0' + d)) + ref(uint32_t(next)));
      if (!alts.empty()) rem[size_t(k)][size_t(r)] = g.rule(alts);
    }
  std::vector<Seq> first;  // a non-zero leading digit, then up to 15 more
  for (int d = 1; d < 10; ++d)
    if (const int64_t next = rem[15][size_t(d % m)]; next >= 0) first.push_back(digits(char('0' + d), char('0' + d)) + ref(uint32_t(next)));
  const uint32_t positive = g.rule(first);
  return g.rule({Grammar::literal("0"), ref(positive), Grammar::literal("-") + ref(positive)});
}

}  // namespace swiftlet::schema_parts
