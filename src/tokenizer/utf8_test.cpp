#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <set>

namespace swiftlet::utf8 {
namespace {

const std::string kFffd(kReplacement);

TEST(TokenizerUtf8, Validity) {
  EXPECT_TRUE(is_valid(""));
  EXPECT_TRUE(is_valid("plain ascii text, long enough for the 8-byte fast path"));
  EXPECT_TRUE(is_valid("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(is_valid("\x80"));
  EXPECT_FALSE(is_valid("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(is_valid("\xE0\x9F\xBF"));      // overlong 3-byte
  EXPECT_FALSE(is_valid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid("\xF0\x9F\x98"));      // truncated
  EXPECT_FALSE(is_valid("abcdefgh\xFF"));
}

// Expected values follow Rust's String::from_utf8_lossy (maximal subparts).
TEST(TokenizerUtf8, LossyRepairReplacesMaximalSubparts) {
  EXPECT_EQ(to_valid("ok"), "ok");
  EXPECT_EQ(to_valid("\xF0\x9F\x98"), kFffd);
  EXPECT_EQ(to_valid("\xF0\x9F\x98" "A"), kFffd + "A");
  EXPECT_EQ(to_valid("\xE2\x82\xE2\x82\xAC"), kFffd + "\xE2\x82\xAC");
  EXPECT_EQ(to_valid("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(to_valid("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(to_valid("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(to_valid("\x80\xBF"), kFffd + kFffd);
  EXPECT_EQ(to_valid("\xF5\xFF"), kFffd + kFffd);
  EXPECT_EQ(to_valid("a\xE0\xA0"), "a" + kFffd);
}

TEST(TokenizerUtf8, StablePrefixHoldsOnlyCompletableTails) {
  EXPECT_EQ(stable_prefix_length(""), 0u);
  EXPECT_EQ(stable_prefix_length("abc"), 3u);
  EXPECT_EQ(stable_prefix_length("ab\xF0"), 2u);
  EXPECT_EQ(stable_prefix_length("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(stable_prefix_length("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(stable_prefix_length("ab\xE0\x80"), 4u);  // E0 80 can never complete
  EXPECT_EQ(stable_prefix_length("ab\x80\x80"), 4u);  // stray continuations
  EXPECT_EQ(stable_prefix_length("\xFF"), 1u);
}

// Cutting a byte stream anywhere and converting the parts with stable_prefix_length must give
// the same text as converting it whole.
TEST(TokenizerUtf8, StreamingConversionEqualsWholeConversion) {
  const std::string samples[] = {"h\xC3\xA9llo \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
                                 "\xE2\x82\xE2\x82\xAC\xF0\x9F\x98\xED\xA0\x80\xC3", "\xF4\x8F\xBF\xBF\xF4\x90\x80"};
  for (const std::string& s : samples) {
    for (size_t step = 1; step <= 3; ++step) {
      std::string pending, out;
      for (size_t i = 0; i < s.size(); i += step) {
        pending += s.substr(i, step);
        const size_t ready = stable_prefix_length(pending);
        append_lossy(out, std::string_view(pending).substr(0, ready));
        pending.erase(0, ready);
      }
      append_lossy(out, pending);
      EXPECT_EQ(out, to_valid(s));
    }
  }
}

TEST(TokenizerUtf8, CodePointIteration) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
  size_t pos = 0;
  EXPECT_EQ(next(s, pos), U'a');
  EXPECT_EQ(next(s, pos), U'\u00E9');
  EXPECT_EQ(next(s, pos), U'\u20AC');
  EXPECT_EQ(next(s, pos), U'\U0001F600');
  EXPECT_EQ(pos, s.size());
  size_t end = s.size();
  EXPECT_EQ(prev(s, end), U'\U0001F600');
  EXPECT_EQ(prev(s, end), U'\u20AC');
  std::string out;
  for (char32_t cp : {U'a', U'\u00E9', U'\u20AC', U'\U0001F600'}) append(out, cp);
  EXPECT_EQ(out, s);
}

TEST(TokenizerUtf8, ByteLevelAlphabetIsABijection) {
  const auto& table = byte_to_unicode();
  std::set<char32_t> seen(table.begin(), table.end());
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(table[' '], U'\u0120');   // 'Ġ'
  EXPECT_EQ(table['\n'], U'\u010A');  // 'Ċ'
  EXPECT_EQ(table['a'], U'a');
  EXPECT_EQ(table[0xAD], U'\u0143');  // soft hyphen is the last remapped byte
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(table[b]), b);
  EXPECT_EQ(unicode_to_byte(U' '), -1);
  EXPECT_EQ(unicode_to_byte(U'\u4E2D'), -1);
}

}  // namespace
}  // namespace swiftlet::utf8
