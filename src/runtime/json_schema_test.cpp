// The JSON Schema compiler against brute force and independent oracles: integer ranges over
// every integer of a window, number bounds over every two-digit decimal, patterns against
// std::regex (ECMAScript), formats on valid and invalid examples; and the schema corpus of
// tests/data/schemas: every schema compiles, hand-written ones report what they expect.
#include "runtime/json_schema.h"

#include "core/error.h"
#include "support/test_paths.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

namespace swiftlet {
namespace {

using ojson = nlohmann::ordered_json;

class Doc {
 public:
  explicit Doc(const ojson& schema) : g_(json_schema_grammar(schema, &unenforced_)), m_(g_) {}
  bool matches(std::string_view text) {
    const int32_t s = m_.step(m_.start(), text);
    return s != GrammarMatcher::kDead && m_.accepting(s);
  }
  const std::vector<std::string>& unenforced() const { return unenforced_; }

 private:
  std::vector<std::string> unenforced_;
  Grammar g_;
  GrammarMatcher m_;
};

std::string error_of(const ojson& schema) {
  try {
    json_schema_grammar(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchemaNumbers, IntegerRangesMatchBruteForce) {
  const std::vector<std::optional<int>> bounds = {std::nullopt, -120, -100, -99, -10, -9, -1, 0, 1, 9, 10, 11, 99, 100, 120};
  for (const auto& lo : bounds)
    for (const auto& hi : bounds)
      for (int excl = 0; excl < 2; ++excl) {
        ojson s = {{"type", "integer"}};
        if (lo) s[excl ? "exclusiveMinimum" : "minimum"] = *lo;
        if (hi) s[excl ? "exclusiveMaximum" : "maximum"] = *hi;
        if (lo && hi && *lo + 2 * excl > *hi) continue;  // empty: tested below
        Doc d(s);
        ASSERT_TRUE(d.unenforced().empty()) << s.dump();
        for (int v = -200; v <= 200; ++v) {
          const bool in = (!lo || (excl ? v > *lo : v >= *lo)) && (!hi || (excl ? v < *hi : v <= *hi));
          ASSERT_EQ(d.matches(std::to_string(v)), in) << s.dump() << " " << v;
        }
        EXPECT_FALSE(d.matches("-0"));
        EXPECT_FALSE(d.matches("007"));
        EXPECT_FALSE(d.matches("1.0"));
      }
  // Fractional bounds round inwards; an empty range is reported, not refused.
  Doc frac(ojson::parse(R"({"type":"integer","minimum":-2.5,"exclusiveMaximum":3.5})"));
  for (int v = -5; v <= 5; ++v) EXPECT_EQ(frac.matches(std::to_string(v)), v >= -2 && v <= 3) << v;
  Doc empty(ojson::parse(R"({"type":"integer","minimum":5,"maximum":4})"));
  EXPECT_EQ(empty.unenforced(), (std::vector<std::string>{"minimum@#", "maximum@#"}));
  // Past 16 digits: an open side is no bound; a closed one cannot be written.
  EXPECT_TRUE(Doc(ojson::parse(R"({"type":"integer","minimum":-1e300})")).unenforced().empty());
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"integer","minimum":1e20})")).unenforced(), std::vector<std::string>{"minimum@#"});
}

// Every decimal with up to two fraction digits in [-3, 3], written several ways, against the
// bounds compared in hundredths.
TEST(JsonSchemaNumbers, NumberBoundsAreExact) {
  const std::vector<std::pair<std::string, int>> bounds = {{"-1.5", -150}, {"-1", -100}, {"-0.25", -25}, {"0", 0},
                                                           {"0.1", 10},   {"0.5", 50},  {"1", 100},      {"2.75", 275}};
  auto texts = [](int h) {  // h hundredths as JSON numbers
    const std::string sign = h < 0 ? "-" : "";
    const int a = std::abs(h);
    std::vector<std::string> out = {sign + std::to_string(a / 100) + "." + fmt::format("{:02d}", a % 100)};
    if (a % 10 == 0) out.push_back(sign + std::to_string(a / 100) + "." + std::to_string(a % 100 / 10));
    if (a % 100 == 0 && h != 0) out.push_back(sign + std::to_string(a / 100));
    if (h == 0) out.push_back("0");
    return out;
  };
  for (size_t i = 0; i <= bounds.size(); ++i)
    for (size_t j = 0; j <= bounds.size(); ++j)
      for (int excl = 0; excl < 4; ++excl) {
        const bool lo_x = excl & 1, hi_x = excl & 2;
        ojson s = {{"type", "number"}};
        if (i < bounds.size()) s[lo_x ? "exclusiveMinimum" : "minimum"] = ojson::parse(bounds[i].first);
        if (j < bounds.size()) s[hi_x ? "exclusiveMaximum" : "maximum"] = ojson::parse(bounds[j].first);
        if (i < bounds.size() && j < bounds.size() && bounds[i].second >= bounds[j].second) continue;
        Doc d(s);
        ASSERT_TRUE(d.unenforced().empty()) << s.dump();
        for (int h = -300; h <= 300; ++h) {
          const bool in = (i == bounds.size() || (lo_x ? h > bounds[i].second : h >= bounds[i].second)) &&
                          (j == bounds.size() || (hi_x ? h < bounds[j].second : h <= bounds[j].second));
          for (const std::string& t : texts(h)) ASSERT_EQ(d.matches(t), in) << s.dump() << " " << t;
        }
      }
  Doc tiny(ojson::parse(R"({"type":"number","exclusiveMinimum":0,"maximum":1e-3})"));
  EXPECT_TRUE(tiny.matches("0.001"));
  EXPECT_TRUE(tiny.matches("0.0000007"));
  EXPECT_FALSE(tiny.matches("0.0010001"));
  EXPECT_FALSE(tiny.matches("0.0"));
  EXPECT_FALSE(tiny.matches("-0.0001"));
}

TEST(JsonSchemaNumbers, MultipleOfIntegers) {
  Doc three(ojson::parse(R"({"type":"integer","multipleOf":3})"));
  for (int v = -100; v <= 100; ++v) ASSERT_EQ(three.matches(std::to_string(v)), v % 3 == 0) << v;
  EXPECT_TRUE(three.matches("3000000000000000"));
  EXPECT_FALSE(three.matches("30000000000000000"));  // 17 digits
  Doc range(ojson::parse(R"({"type":"number","minimum":10,"exclusiveMaximum":50,"multipleOf":7})"));
  for (int v = 0; v <= 60; ++v) ASSERT_EQ(range.matches(std::to_string(v)), v >= 10 && v < 50 && v % 7 == 0) << v;
  EXPECT_FALSE(range.matches("14.0"));
  EXPECT_TRUE(range.unenforced().empty());
  // Not enforced: a fraction, or a range too wide to list with a lower bound only.
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"number","multipleOf":0.01})")).unenforced(), std::vector<std::string>{"multipleOf@#"});
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"integer","minimum":0,"multipleOf":5})")).unenforced(),
            std::vector<std::string>{"multipleOf@#"});
  // allOf's multiples meet at their least common multiple; one past int64 keeps the first and says so.
  Doc both(ojson::parse(R"({"allOf":[{"type":"integer","minimum":0,"maximum":60,"multipleOf":4},{"multipleOf":6}]})"));
  for (int v = 0; v <= 60; ++v) ASSERT_EQ(both.matches(std::to_string(v)), v % 12 == 0) << v;
  EXPECT_TRUE(both.unenforced().empty());
  for (const char* huge : {"4611686018427387904", "18446744073709551615"}) {
    const ojson s =
        ojson::parse(fmt::format(R"({{"allOf":[{{"type":"integer","multipleOf":3}},{{"multipleOf":{}}}]}})", huge));
    EXPECT_EQ(Doc(s).unenforced(), std::vector<std::string>{"multipleOf@#/allOf/1"}) << huge;
  }
}

TEST(JsonSchemaText, PatternsMatchStdRegex) {
  const std::vector<std::string> patterns = {
      "^[a-z]+$", "^\\d{3}-\\d{4}$", "abc", "^(foo|bar)+$", "^a?b*c{2,3}$", "x$", "^\\w+@\\w+\\.com$",
      "^[^0-9]*$", "^\\s*\\S+\\s*$", "^[A-Z]{2}\\d{2,}$", "^(?:[01]\\d|2[0-3]):[0-5]\\d$", "^a.c$",
      "^\\$\\d+(\\.\\d\\d)?$", "^[-+]?\\d+$", "cat|^dog", "^[\\w.-]+$", "^\\D\\W$", "^(a|)b$", "^\\x41\\u0042$",
      "^[a\\-z]$", "^\"q\\\\\"$"};
  const std::vector<std::string> strings = {
      "", "abc", "ABC", "a", "123-4567", "12-34567", "xabcx", "foobar", "foofoo", "fob", "bcc", "abbbccc", "acc",
      "ac", "ax", "x", "john@mail.com", "john@mail.org", "abc1", "  word  ", "two words", "AB12", "AB123", "A12",
      "23:59", "24:00", "09:5", "a\nc", "abc", "$12", "$12.50", "$12.5", "-7", "+", "cat food", "hotdog", "dog",
      "a.b-c_d", "a b", "x!", "1!", "b", "ab", "AB", "-", "a-", "\"q\\\"", "\"q\\\\\"", "tab\there"};
  for (const std::string& p : patterns) {
    const std::regex re(p, std::regex::ECMAScript);
    Doc d({{"type", "string"}, {"pattern", p}});
    ASSERT_TRUE(d.unenforced().empty()) << p;
    for (const std::string& s : strings)
      EXPECT_EQ(d.matches(ojson(s).dump()), std::regex_search(s, re)) << "pattern " << p << " string " << ojson(s).dump();
  }
  // std::regex works on bytes: non-ASCII text is checked by hand. `.` and negated classes take
  // any character but line terminators; \S only ASCII ones (U+00A0 and others are spaces).
  Doc dot(ojson::parse(R"({"type":"string","pattern":"^.[^a]$"})"));
  EXPECT_TRUE(dot.matches("\"éü\""));
  EXPECT_TRUE(dot.matches("\"日本\""));
  EXPECT_FALSE(dot.matches("\"é\""));
  EXPECT_FALSE(dot.matches("\"\u2028x\""));
  EXPECT_FALSE(dot.matches("\"\xe2\x80\xa8x\""));
  Doc literal(ojson::parse(R"({"type":"string","pattern":"^ü+$"})"));
  EXPECT_TRUE(literal.matches("\"üü\""));
  EXPECT_FALSE(literal.matches("\"u\""));
  // Named groups and lazy quantifiers are in the subset; lookaround, backreferences and \b are not.
  Doc named(ojson::parse(R"({"type":"string","pattern":"^(?<year>\\d{4})-(?<n>\\d+?)$"})"));
  EXPECT_TRUE(named.matches("\"2024-7\""));
  EXPECT_FALSE(named.matches("\"2024-\""));
  for (const char* p : {"^(?=a)", "(a)\\1", "\\bword\\b", "(?<!x)y", "^[à-ü]$", "a**", "(a*)*", "^(a$)"}) {
    Doc d({{"type", "string"}, {"pattern", p}});
    EXPECT_EQ(d.unenforced(), std::vector<std::string>{"pattern@#"}) << p;
    EXPECT_TRUE(d.matches("\"anything\"")) << p;
  }
  // With a pattern the lengths are not enforced (both at once are not worked out).
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"string","pattern":"^a+$","maxLength":3})")).unenforced(),
            std::vector<std::string>{"maxLength@#"});
}

TEST(JsonSchemaText, Formats) {
  const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {"date", {{"2024-02-28", "1999-12-31", "2025-04-30"}, {"2024-02-30", "2024-13-01", "2025-04-31", "24-01-01", "2024-1-01"}}},
      {"time", {{"23:59:59Z", "00:00:00+05:30", "12:30:00.123-01:00"}, {"24:00:00Z", "12:60:00Z", "12:00:00", "1:00:00Z"}}},
      {"date-time", {{"2024-06-01T12:00:00Z", "2024-01-31T23:59:59.5+01:00"}, {"2024-06-01 12:00:00Z", "2024-06-01T12:00Z"}}},
      {"uuid", {{"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}}},
      {"email", {{"a.b+c@example.com", "x@mail.co.uk"}, {"a@b", "@example.com", "a b@example.com", "a..b@example.com"}}},
      {"uri", {{"https://example.com/a/b", "http://localhost:8080", "ftp://files.example.org/x.txt"}, {"example.com", "https://", "http://a b"}}},
      {"ipv4", {{"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.0.0.1", "1.2.3", "01.2.3.4", "1.2.3.4.5"}}},
      {"ipv6", {{"2001:db8:0:0:0:0:2:1", "fe80:0:0:0:1:2:3:4"}, {"2001:db8::1:2:3:4:5:6:7", "12345::", "1:2:3:4:5:6:7"}}},
  };
  for (const auto& [format, examples] : cases) {
    Doc d({{"type", "string"}, {"format", format}});
    ASSERT_TRUE(d.unenforced().empty()) << format;
    for (const std::string& ok : examples.first) EXPECT_TRUE(d.matches(ojson(ok).dump())) << format << " " << ok;
    for (const std::string& bad : examples.second) EXPECT_FALSE(d.matches(ojson(bad).dump())) << format << " " << bad;
  }
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"string","format":"hostname"})")).unenforced(), std::vector<std::string>{"format@#"});
  EXPECT_TRUE(Doc(ojson::parse(R"({"type":"string","format":"date","maxLength":10})")).unenforced().empty());
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"string","format":"date","maxLength":8})")).unenforced(),
            std::vector<std::string>{"maxLength@#"});
}

TEST(JsonSchemaCombinators, OneOfIsEnforcedWhenTheAlternativesAreDisjoint) {
  Doc types(ojson::parse(R"({"oneOf":[{"type":"string","maxLength":2},{"type":"integer","minimum":0},{"type":"null"}]})"));
  EXPECT_TRUE(types.unenforced().empty());
  EXPECT_TRUE(types.matches("\"ab\""));
  EXPECT_TRUE(types.matches("7"));
  EXPECT_FALSE(types.matches("-7"));
  Doc tagged(ojson::parse(R"({"oneOf":[
      {"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"]},
      {"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"number"}},"required":["kind","side"]}]})"));
  EXPECT_TRUE(tagged.unenforced().empty());
  EXPECT_TRUE(tagged.matches(R"({"kind": "circle", "r": 1.5})"));
  EXPECT_FALSE(tagged.matches(R"({"kind": "circle", "side": 1})"));
  Doc overlap(ojson::parse(R"({"oneOf":[{"type":"number"},{"type":"integer"}]})"));
  EXPECT_EQ(overlap.unenforced(), std::vector<std::string>{"oneOf@#"});
  // Siblings of anyOf / oneOf apply to every alternative.
  Doc siblings(ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
      "anyOf":[{"required":["a"]},{"required":["b"]}],"additionalProperties":false})"));
  EXPECT_TRUE(siblings.matches(R"({"a": 1})"));
  EXPECT_TRUE(siblings.matches(R"({"b": 1})"));
  EXPECT_FALSE(siblings.matches("{}"));
}

TEST(JsonSchemaCombinators, AllOfAndRefSiblingsMerge) {
  Doc all(ojson::parse(R"({"$defs":{"base":{"type":"object","properties":{"id":{"type":"integer","minimum":1}},"required":["id"]}},
      "allOf":[{"$ref":"#/$defs/base"},{"properties":{"name":{"type":"string"},"id":{"maximum":9}},"required":["name"]}]})"));
  EXPECT_TRUE(all.unenforced().empty());
  EXPECT_TRUE(all.matches(R"({"id": 3, "name": "x"})"));
  EXPECT_FALSE(all.matches(R"({"id": 10, "name": "x"})"));
  EXPECT_FALSE(all.matches(R"({"id": 3})"));
  Doc ref(ojson::parse(R"({"$defs":{"n":{"type":"integer"}},"$ref":"#/$defs/n","minimum":5,"description":"x"})"));
  EXPECT_TRUE(ref.matches("5"));
  EXPECT_FALSE(ref.matches("4"));
  // additionalProperties: false in one part rules out what only the other part declares.
  Doc closed(ojson::parse(R"({"allOf":[{"properties":{"a":{"type":"integer"}},"additionalProperties":false},
      {"properties":{"b":{"type":"integer"}}}]})"));
  EXPECT_TRUE(closed.matches(R"({"a": 1})"));
  EXPECT_FALSE(closed.matches(R"({"a": 1, "b": 2})"));
  // Two patterns do not combine: the second is reported.
  EXPECT_EQ(Doc(ojson::parse(R"({"allOf":[{"pattern":"^a"},{"pattern":"b$"}]})")).unenforced(),
            std::vector<std::string>{"pattern@#/allOf/1"});
}

TEST(JsonSchemaObjects, MinAndMaxPropertiesCountWrittenProperties) {
  for (int min = 0; min <= 4; ++min)
    for (int max = std::max(min, 1); max <= 4; ++max) {  // b is required: at least one
      ojson s = ojson::parse(R"({"type":"object","properties":{"a":{"const":1},"b":{"const":2},"c":{"const":3},"d":{"const":4}},
          "required":["b"]})");
      s["minProperties"] = min;
      s["maxProperties"] = max;
      Doc d(s);
      ASSERT_TRUE(d.unenforced().empty()) << s.dump();
      for (int mask = 0; mask < 16; ++mask) {
        std::string text = "{";
        for (int k = 0; k < 4; ++k)
          if (mask & (1 << k)) text += fmt::format("{}\"{}\": {}", text.size() > 1 ? ", " : "", char('a' + k), k + 1);
        text += "}";
        const int n = std::popcount(unsigned(mask));
        ASSERT_EQ(d.matches(text), (mask & 2) && n >= min && n <= max) << s.dump() << " " << text;
      }
    }
  Doc free(ojson::parse(R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2})"));
  EXPECT_FALSE(free.matches("{}"));
  EXPECT_TRUE(free.matches(R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(free.matches(R"({"x": 1, "y": 2, "z": 3})"));
}

TEST(JsonSchemaArrays, UniqueItemsAndPrefixItems) {
  Doc unique(ojson::parse(R"({"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true,"minItems":1})"));
  EXPECT_TRUE(unique.unenforced().empty());
  EXPECT_TRUE(unique.matches(R"(["c", "a"])"));
  EXPECT_TRUE(unique.matches(R"(["a", "b", "c"])"));
  EXPECT_FALSE(unique.matches(R"(["a", "a"])"));
  EXPECT_FALSE(unique.matches("[]"));
  EXPECT_EQ(Doc(ojson::parse(R"({"type":"array","items":{"type":"string"},"uniqueItems":true})")).unenforced(),
            std::vector<std::string>{"uniqueItems@#"});
  Doc tuple(ojson::parse(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false,"minItems":1})"));
  EXPECT_TRUE(tuple.matches("[1]"));
  EXPECT_TRUE(tuple.matches(R"([1, "x"])"));
  EXPECT_FALSE(tuple.matches(R"([1, "x", 2])"));
  EXPECT_FALSE(tuple.matches(R"(["x"])"));
  EXPECT_FALSE(tuple.matches("[]"));
  Doc draft7(ojson::parse(R"({"type":"array","items":[{"type":"boolean"}],"additionalItems":{"type":"null"},"maxItems":3})"));
  EXPECT_TRUE(draft7.matches("[true, null, null]"));
  EXPECT_FALSE(draft7.matches("[true, true]"));
  EXPECT_FALSE(draft7.matches("[true, null, null, null]"));
}

TEST(JsonSchemaValidity, InvalidSchemasNameThePlace) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type":5})", "#/type"},
      {R"({"type":"strng"})", "#/type"},
      {R"({"type":["string",3]})", "#/type/1"},
      {R"({"required":"x"})", "#/required"},
      {R"({"minimum":"a"})", "#/minimum"},
      {R"({"properties":[]})", "#/properties"},
      {R"({"properties":{"a":{"items":{"maxItems":-1}}}})", "#/properties/a/items/maxItems"},
      {R"({"properties":{"a/b":{"minLength":1.5}}})", "#/properties/a~1b/minLength"},
      {R"({"anyOf":[]})", "#/anyOf"},
      {R"({"oneOf":[{"type":"string"},7]})", "#/oneOf/1"},
      {R"({"multipleOf":0})", "#/multipleOf"},
      {R"({"pattern":1})", "#/pattern"},
      {R"({"$defs":{"x":{"enum":3}}})", "#/$defs/x/enum"},
      {R"({"properties":{"a":{"$ref":"#/$defs/missing"}}})", "#/properties/a"},
      {R"(7)", "#"},
  };
  for (const auto& [text, place] : cases) {
    const std::string e = error_of(ojson::parse(text));
    EXPECT_NE(e.find(std::string(place) + ":"), std::string::npos) << text << " -> " << e;
  }
  // Valid, even if odd: no error.
  for (const char* ok : {R"({"x-vendor":{"a":1},"nullable":true,"discriminator":{"propertyName":"k"}})", R"({"enum":[]})",
                         R"({"not":{}})", R"({"exclusiveMinimum":true,"minimum":0,"type":"number"})", "false",
                         R"({"$ref":"https://example.com/other.json"})", R"({"maxLength":3,"minLength":5})"})
    EXPECT_EQ(error_of(ojson::parse(ok)), "") << ok;
}

// The corpus: one schema a line. A schema whose $comment starts "unenforced:" lists what it
// expects to be reported ("none", or keyword@pointer entries separated by ", ").
TEST(JsonSchemaCorpus, EverySchemaCompilesAndReportsWhatItExpects) {
  const std::filesystem::path dir = testing::source_path("tests/data/schemas");
  size_t schemas = 0, expectations = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jsonl") continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      const std::string where = entry.path().filename().string() + ":" + std::to_string(n);
      ojson schema;
      ASSERT_NO_THROW(schema = ojson::parse(line)) << where;
      std::vector<std::string> got;
      try {
        json_schema_grammar(schema, &got);
      } catch (const Error& e) {
        ADD_FAILURE() << where << ": " << e.what();
        continue;
      }
      ++schemas;
      if (!schema.is_object() || !schema.contains("$comment") || !schema["$comment"].is_string()) continue;
      const std::string c = schema["$comment"];
      if (!c.starts_with("unenforced: ")) continue;
      ++expectations;
      std::vector<std::string> want;
      for (size_t at = 12; at < c.size();) {
        const size_t comma = c.find(", ", at);
        want.push_back(c.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        at = comma == std::string::npos ? c.size() : comma + 2;
      }
      if (want == std::vector<std::string>{"none"}) want.clear();
      EXPECT_EQ(got, want) << where;
    }
  }
  EXPECT_GE(schemas, 300u);
  EXPECT_GE(expectations, 60u);
}

}  // namespace
}  // namespace swiftlet
