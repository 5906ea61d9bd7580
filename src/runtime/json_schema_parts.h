// Pieces of the JSON Schema compiler (json_schema.h): the keyword table and types, and builders
// of one kind of text as grammar rules: numbers in a range (json_schema_numbers.cpp) and string contents under a pattern or a
// format (json_schema_text.cpp). Each returns a rule, or -1 when no text fits (the caller then
// reports the keyword as not enforced and generates without it).
#pragma once

#include "runtime/grammar.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace swiftlet::schema_parts {

// Keywords that constrain a value (the rest, annotations and unknown keywords, are ignored), and
// those of them no grammar here writes.
bool is_constraint(std::string_view key);
bool is_unenforced(std::string_view key);

// JSON types as bits; "number" is integer | fraction.
namespace types {
enum : unsigned { kNull = 1, kBool = 2, kObject = 4, kArray = 8, kString = 16, kInteger = 32, kFraction = 64, kAll = 127 };
}
unsigned type_bit(std::string_view type);
unsigned value_bits(const nlohmann::ordered_json& v);  // the type of a value
unsigned declared_types(const nlohmann::ordered_json& schema);  // its "type" (kAll without one)

// Integers (and integer parts) are written with at most 16 digits.
constexpr int64_t kMaxMagnitude = 9'999'999'999'999'999;

// A decimal bound read exactly from the JSON number's text: |value| = whole.frac.
struct Decimal {
  bool negative = false;
  uint64_t whole = 0;  // saturated at kMaxMagnitude + 1 ("beyond what is written")
  std::string frac;    // digits after the point, no trailing zeros
  bool huge() const { return whole > uint64_t(kMaxMagnitude); }
  bool is_zero() const { return whole == 0 && frac.empty(); }
};
// Parses JSON number text ("12", "-0.5", "1e-05", "2.5E+3"). False for anything else.
bool parse_decimal(std::string_view text, Decimal& out);

struct Bound {
  Decimal value;
  bool exclusive = false;
};

// Integers in [lo, hi] (either side may be open), as JSON text. -1 when the range is empty.
int64_t integer_range(Grammar& g, std::optional<int64_t> lo, std::optional<int64_t> hi);
// Numbers (optional minus, integer part, optional fraction, no exponent) within the bounds. -1
// when no such text exists.
int64_t number_range(Grammar& g, const std::optional<Bound>& lo, const std::optional<Bound>& hi);
// Integers of at most 16 digits divisible by m (1 < m <= 100).
uint32_t integer_multiple(Grammar& g, int64_t m);

// How a string's characters are written: JSON string contents (escaped), or raw text (Qwen3.5's
// XML parameter values: no escapes, `exclude` never written).
struct TextMode {
  bool json = true;
  std::string exclude;
};

// A set of characters: ASCII ones by byte, and optionally every non-ASCII character (minus the
// line terminators U+2028 and U+2029 for the regex `.`).
struct CharClass {
  ByteSet ascii;
  bool non_ascii = false;
  bool no_line_terminators = false;
};

class TextRules {
 public:
  TextRules(Grammar& g, TextMode mode);
  // One character of the class, written as the mode writes it. -1 if none can be written.
  int64_t one_of(const CharClass& c);
  // Any one character the mode can write.
  uint32_t any_char();
  // The contents (no quotes) of strings the ECMA-262 pattern matches somewhere. -1 with `why`
  // set when the pattern is outside the supported subset.
  int64_t pattern(std::string_view regex, std::string& why);
  // The contents of strings of a format (date, time, date-time, uuid, email, uri, ipv4, ipv6);
  // -1 for any other format. `min_len`/`max_len`: the length range of those strings.
  int64_t format(std::string_view name, int& min_len, int& max_len);

 private:
  uint32_t multibyte(bool no_line_terminators);

  Grammar& g_;
  TextMode mode_;
  int64_t any_ = -1, utf8_[2] = {-1, -1};
};

}  // namespace swiftlet::schema_parts
