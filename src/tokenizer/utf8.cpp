#include "tokenizer/utf8.h"

namespace swiftlet::utf8 {
namespace {

// How far the sequence starting at s[i] is well formed: `need` bytes make the character,
// `have` of them are present and valid (0 when s[i] cannot start a character at all).
// Second-byte ranges exclude overlongs, surrogates and code points above U+10FFFF
// (Unicode 15 table 3-7).
struct Sequence {
  int need;
  int have;
};

Sequence scan(std::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return {1, 1};
  int need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return {1, 0};
  }
  int have = 1;
  while (have < need && i + have < s.size()) {
    const auto c = static_cast<uint8_t>(s[i + have]);
    if (c < lo || c > hi) break;
    lo = 0x80;
    hi = 0xBF;
    ++have;
  }
  return {need, have};
}

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

bool is_valid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs dominate real text: test 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Sequence q = scan(s, i);
    if (q.have != q.need) return false;
    i += q.need;
  }
  return true;
}

void append_lossy(std::string& out, std::string_view bytes) {
  out.reserve(out.size() + bytes.size());
  size_t i = 0;
  size_t run = 0;  // start of the pending run of valid bytes, copied in one go
  const size_t n = bytes.size();
  while (i < n) {
    const Sequence q = scan(bytes, i);
    if (q.have == q.need) {
      i += q.need;
      continue;
    }
    out.append(bytes.data() + run, i - run);
    out.append(kReplacement);
    i += q.have == 0 ? 1 : q.have;
    run = i;
  }
  out.append(bytes.data() + run, n - run);
}

size_t stable_prefix_length(std::string_view bytes) {
  const size_t n = bytes.size();
  // A non-continuation byte always starts a new unit in maximal-subpart conversion, so the
  // only place a cut is unsafe is inside a trailing, still-completable sequence.
  size_t i = n;
  for (int back = 0; back < 4 && i > 0; ++back) {
    --i;
    if (!is_continuation(static_cast<uint8_t>(bytes[i]))) {
      const Sequence q = scan(bytes, i);
      const bool completable = q.have > 0 && q.have < q.need && i + q.have == n;
      return completable ? i : n;
    }
  }
  return n;
}

char32_t next(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + k]) & 0x3F);
  pos += len;
  return cp;
}

char32_t prev(std::string_view s, size_t& end) {
  size_t start = end - 1;
  while (start > 0 && is_continuation(static_cast<uint8_t>(s[start]))) --start;
  size_t p = start;
  const char32_t cp = next(s, p);
  end = start;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t shifted = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? static_cast<char32_t>(b) : shifted++;
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  // The alphabet lives in [0, 0x144): invert it with a small table.
  static const std::array<int16_t, 0x144> inverse = [] {
    std::array<int16_t, 0x144> t{};
    t.fill(-1);
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace swiftlet::utf8
