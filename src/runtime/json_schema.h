// JSON Schema -> byte grammar (runtime/grammar.h): the documents the constrained sampler may
// produce. Every valid schema (draft 2020-12, and draft-07 as tool schemas use it) is accepted;
// a keyword the grammar cannot enforce is left out of the grammar and reported (unenforced()),
// so the document may break that keyword and no other. Every document the grammar matches is
// valid under the enforced keywords; not every valid document is matched (one fixed layout):
//   - separators are ", " and ": " (Python's json.dumps, the layout Qwen's tool calls use), no
//     other whitespace;
//   - object properties come in the schema's order; required ones always, optional ones may be
//     left out; properties the schema does not declare are never produced, except for an object
//     schema that declares none (then any keys, with additionalProperties' schema as values);
//   - integers have at most 16 digits, numbers at most 16 digits before and after the point and
//     no exponent; strings are valid UTF-8 without lone-surrogate escapes.
//
// Enforced: type, properties, required, additionalProperties, unevaluatedProperties (objects
// that only write declared properties), minProperties, maxProperties, items, prefixItems (and
// draft-07 tuple items / additionalItems), minItems, maxItems, uniqueItems (items of at most 8
// possible values, or maxItems <= 1), enum, const, anyOf, oneOf (when its alternatives cannot
// both match: disjoint types, values, or a required property with distinct constants), allOf
// (merged into one schema), $ref (within the schema, siblings merged), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (integers and numbers, exact), multipleOf (integers: a
// bounded range of up to 256 values, or an unbounded one for a divisor up to 100), minLength,
// maxLength, pattern (the ECMA-262 subset of json_schema_parts.h), format (date, time,
// date-time, uuid, email, uri, ipv4, ipv6).
// Reported as not enforced: not, if/then/else, dependentRequired, dependentSchemas,
// dependencies, patternProperties, propertyNames, contains, unevaluatedItems, other formats,
// patterns outside the subset, a pattern or format together with a length or another pattern,
// bounds past what is unrolled, and keywords no value could satisfy.
// Ignored: annotations (title, description, default, examples, $schema, $id, $comment, ...) and
// unknown keywords.
// An invalid schema ("type": 5, "required": "x", "minimum": "a", "properties": [], a $ref to
// nothing) throws Error naming the JSON pointer of the place.
#pragma once

#include "runtime/grammar.h"
#include "runtime/json_schema_parts.h"

#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace swiftlet {

// An object key as one reference token of a JSON pointer (RFC 6901: '~' -> "~0", '/' -> "~1").
std::string json_pointer_token(std::string_view key);

// Throws Error naming the place (a JSON pointer under `path`) when `schema` is not a valid JSON
// Schema: keywords with values of the wrong kind, unknown type names, subschemas that are not
// objects or booleans.
void check_json_schema(const nlohmann::ordered_json& schema, const std::string& path = "#");

class JsonSchemaCompiler {
 public:
  // `root` is the document "#" refers to; it must outlive the compiler. Checks it
  // (check_json_schema) and throws Error if it is not a valid schema.
  JsonSchemaCompiler(Grammar& g, const nlohmann::ordered_json& root);
  JsonSchemaCompiler(Grammar& g, nlohmann::ordered_json&& root) = delete;  // a temporary would dangle

  // A rule matching the JSON text of a value valid under `schema` (at JSON pointer `path`).
  uint32_t value(const nlohmann::ordered_json& schema, const std::string& path = "#");
  // Any JSON value / any JSON object.
  uint32_t any_value();
  uint32_t any_object();
  // A JSON string literal: the quotes and min..max characters (max < 0: unbounded).
  uint32_t string(int min_chars = 0, int max_chars = -1);
  // Raw text (no quotes, no escapes) of `min..max` characters, any but the bytes in `exclude`.
  uint32_t raw_text(std::string_view exclude, int min_chars = 0, int max_chars = -1);
  // Raw text of a string schema (its lengths, pattern or format), never writing `exclude`.
  uint32_t raw_string(const nlohmann::ordered_json& schema, const std::string& path, std::string_view exclude);

  // "keyword@pointer" for each keyword left out of the grammar, in the order met.
  const std::vector<std::string>& unenforced() const { return unenforced_; }
  void report(std::string_view keyword, const std::string& path);

 private:
  using ojson = nlohmann::ordered_json;
  uint32_t typed(const ojson& schema, const std::string& type, const std::string& path);
  uint32_t object(const ojson& schema, const std::string& path);
  uint32_t array(const ojson& schema, const std::string& path);
  uint32_t number(const ojson& schema, bool integer, const std::string& path);
  uint32_t string_schema(const ojson& schema, const std::string& path, const schema_parts::TextMode& mode);
  uint32_t literals(const ojson& schema, const std::string& path);
  uint32_t alternatives(const ojson& schema, const char* key, const std::string& path);
  int64_t unique_items(const ojson& items, int min, int max, const std::string& path);
  uint32_t resolve_ref(const std::string& ref, const std::string& path);
  const ojson* ref_target(const std::string& ref, const std::string& path);
  // allOf and $ref siblings: one schema with every part's constraints.
  ojson merge_all(const ojson& schema, const std::string& path, int depth);
  void merge_into(ojson& into, const ojson& part, const std::string& path, int depth);
  uint32_t utf8_multibyte();
  uint32_t json_char();

  Grammar& g_;
  const ojson& root_;
  std::map<std::string, uint32_t> refs_;  // $ref -> its rule (made once: refs may recurse)
  int64_t any_value_ = -1, any_object_ = -1, utf8_ = -1, json_char_ = -1, integer_ = -1, number_ = -1, string_ = -1;
  std::vector<std::string> unenforced_;
  std::set<std::string, std::less<>> reported_;
  schema_parts::TextRules json_text_;
};

// A finalized grammar for documents of `schema` (json_schema) or for any JSON object
// (json_object). Throws Error for an invalid schema; the keywords left out go to `unenforced`.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, std::vector<std::string>* unenforced = nullptr);
Grammar json_object_grammar();

}  // namespace swiftlet
