// JSON Schema -> byte grammar (runtime/grammar.h): the documents the constrained sampler may
// produce. Every document the grammar matches is valid under the schema; not every valid
// document is matched (the output has one fixed layout):
//   - separators are ", " and ": " (Python's json.dumps, the layout Qwen's tool calls use), no
//     other whitespace;
//   - object properties come in the schema's order; required ones always, optional ones may be
//     left out; properties the schema does not declare are never produced, except for an object
//     schema that declares none (then any keys, with additionalProperties' schema as values);
//   - integers have at most 16 digits, numbers at most 16 digits before and after the point and
//     no exponent; strings are valid UTF-8 without lone-surrogate escapes.
//
// Supported keywords: type (one or a list), properties, required, additionalProperties,
// items, minItems, maxItems, enum, const, anyOf, $ref (to "#" or into $defs / definitions),
// $defs, definitions, minLength, maxLength, and the annotations title, description, default,
// examples, $schema, $id, $comment, deprecated, readOnly, writeOnly. Any other keyword (pattern,
// format, minimum, oneOf, allOf, ...) is refused: Error naming it and where it is.
#pragma once

#include "runtime/grammar.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace swiftlet {

class JsonSchemaCompiler {
 public:
  // `root` is the document "#" refers to; it must outlive the compiler.
  JsonSchemaCompiler(Grammar& g, const nlohmann::ordered_json& root) : g_(g), root_(root) {}

  // A rule matching the JSON text of a value valid under `schema` (at JSON pointer `path`, for
  // messages). Throws Error for an unsupported keyword or a malformed schema.
  uint32_t value(const nlohmann::ordered_json& schema, const std::string& path = "#");
  // Any JSON value / any JSON object.
  uint32_t any_value();
  uint32_t any_object();
  // A JSON string literal: the quotes and min..max characters (max < 0: unbounded).
  uint32_t string(int min_chars = 0, int max_chars = -1);
  // Raw text (no quotes, no escapes) of `min..max` characters, any but the bytes in `exclude`.
  uint32_t raw_text(std::string_view exclude, int min_chars = 0, int max_chars = -1);

 private:
  uint32_t typed(const nlohmann::ordered_json& schema, const std::string& type, const std::string& path);
  uint32_t object(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t array(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t resolve_ref(const std::string& ref, const std::string& path);
  uint32_t utf8_multibyte();
  uint32_t json_char();

  Grammar& g_;
  const nlohmann::ordered_json& root_;
  std::map<std::string, uint32_t> refs_;  // $ref -> its rule (made once: refs may recurse)
  int64_t any_value_ = -1, any_object_ = -1, utf8_ = -1, json_char_ = -1, integer_ = -1, number_ = -1;
};

// A finalized grammar for documents of `schema` (json_schema) or for any JSON object
// (json_object). Throws Error as JsonSchemaCompiler::value does.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
Grammar json_object_grammar();

}  // namespace swiftlet
