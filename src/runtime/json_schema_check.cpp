// Whether a schema is a JSON Schema at all: the keyword values the 2020-12 and draft-07
// meta-schemas require (and draft-04's boolean exclusiveMinimum / exclusiveMaximum, which tool
// schemas still carry). Annotations and unknown keywords are not looked at.
#include "runtime/json_schema.h"

#include "core/error.h"

namespace swiftlet {
namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }


[[noreturn]] void invalid(const std::string& path, std::string_view what, const ojson& got) {
  fail("the JSON schema is not valid at {}: {}, got {}", path, what, dump(got));
}

bool is_type_name(const ojson& t) {
  static const char* names[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
  if (!t.is_string()) return false;
  for (const char* n : names)
    if (t == n) return true;
  return false;
}

bool is_count(const ojson& v) {
  if (v.is_number_unsigned()) return true;
  if (v.is_number_integer()) return v.get<int64_t>() >= 0;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return d >= 0 && d == double(int64_t(d < 9e18 ? d : 0)) && d < 9e18;
  }
  return false;
}

void check(const ojson& s, const std::string& path, int depth);

void check_schema_map(const ojson& v, const std::string& path, const char* key, int depth) {
  if (!v.is_object()) invalid(path, fmt::format("'{}' must be an object of schemas", key), v);
  for (const auto& [k, sub] : v.items()) check(sub, path + "/" + json_pointer_token(k), depth + 1);
}

void check_schema_list(const ojson& v, const std::string& path, const char* key, int depth) {
  if (!v.is_array() || v.empty()) invalid(path, fmt::format("'{}' must be a non-empty array of schemas", key), v);
  for (size_t i = 0; i < v.size(); ++i) check(v[i], path + "/" + std::to_string(i), depth + 1);
}

void check_strings(const ojson& v, const std::string& path, const char* key) {
  if (!v.is_array()) invalid(path, fmt::format("'{}' must be an array of strings", key), v);
  for (size_t i = 0; i < v.size(); ++i)
    if (!v[i].is_string()) invalid(path + "/" + std::to_string(i), fmt::format("'{}' lists a non-string", key), v[i]);
}

void check(const ojson& s, const std::string& path, int depth) {
  if (depth > 256) fail("the JSON schema nests deeper than 256 levels at {}", path);
  if (s.is_boolean()) return;
  if (!s.is_object()) invalid(path, "a schema must be an object or a boolean", s);
  for (const auto& [key, v] : s.items()) {
    const std::string at = path + "/" + json_pointer_token(key);
    if (key == "type") {
      if (v.is_array()) {
        if (v.empty()) invalid(at, "'type' must be a type name or a non-empty array of them", v);
        for (size_t i = 0; i < v.size(); ++i)
          if (!is_type_name(v[i]))
            invalid(at + "/" + std::to_string(i),
                    "'type' lists something that is not a type (string, number, integer, boolean, null, object, array)", v[i]);
      } else if (!is_type_name(v)) {
        invalid(at, "'type' must be one of string, number, integer, boolean, null, object, array (or an array of them)", v);
      }
    } else if (key == "properties" || key == "patternProperties" || key == "$defs" || key == "definitions" ||
               key == "dependentSchemas") {
      check_schema_map(v, at, key.c_str(), depth);
    } else if (key == "additionalProperties" || key == "additionalItems" || key == "contains" ||
               key == "propertyNames" || key == "not" || key == "if" || key == "then" || key == "else" ||
               key == "unevaluatedItems" || key == "unevaluatedProperties") {
      check(v, at, depth + 1);
    } else if (key == "items") {
      if (v.is_array()) {  // draft-07 tuple form
        for (size_t i = 0; i < v.size(); ++i) check(v[i], at + "/" + std::to_string(i), depth + 1);
      } else {
        check(v, at, depth + 1);
      }
    } else if (key == "prefixItems" || key == "allOf" || key == "anyOf" || key == "oneOf") {
      check_schema_list(v, at, key.c_str(), depth);
    } else if (key == "required") {
      check_strings(v, at, "required");
    } else if (key == "dependentRequired") {
      if (!v.is_object()) invalid(at, "'dependentRequired' must be an object of string arrays", v);
      for (const auto& [k, list] : v.items()) check_strings(list, at + "/" + json_pointer_token(k), "dependentRequired");
    } else if (key == "dependencies") {
      if (!v.is_object()) invalid(at, "'dependencies' must be an object", v);
      for (const auto& [k, d] : v.items()) {
        if (d.is_array()) check_strings(d, at + "/" + json_pointer_token(k), "dependencies");
        else check(d, at + "/" + json_pointer_token(k), depth + 1);
      }
    } else if (key == "minLength" || key == "maxLength" || key == "minItems" || key == "maxItems" ||
               key == "minProperties" || key == "maxProperties" || key == "minContains" || key == "maxContains") {
      if (!is_count(v)) invalid(at, fmt::format("'{}' must be a non-negative integer", key), v);
    } else if (key == "minimum" || key == "maximum") {
      if (!v.is_number()) invalid(at, fmt::format("'{}' must be a number", key), v);
    } else if (key == "exclusiveMinimum" || key == "exclusiveMaximum") {
      if (!v.is_number() && !v.is_boolean()) invalid(at, fmt::format("'{}' must be a number", key), v);
    } else if (key == "multipleOf") {
      if (!v.is_number() || !(v.get<double>() > 0)) invalid(at, "'multipleOf' must be a number greater than 0", v);
    } else if (key == "pattern" || key == "format" || key == "$ref" || key == "$dynamicRef" || key == "$anchor") {
      if (!v.is_string()) invalid(at, fmt::format("'{}' must be a string", key), v);
    } else if (key == "enum") {
      if (!v.is_array()) invalid(at, "'enum' must be an array of values", v);
    } else if (key == "uniqueItems") {
      if (!v.is_boolean()) invalid(at, "'uniqueItems' must be true or false", v);
    }
  }
}

}  // namespace

std::string json_pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

void check_json_schema(const ojson& schema, const std::string& path) { check(schema, path, 0); }

}  // namespace swiftlet
