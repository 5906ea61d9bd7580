#include "runtime/json_schema.h"

#include "core/error.h"

#include <set>

namespace swiftlet {

using ojson = nlohmann::ordered_json;
using Seq = Grammar::Sequence;

namespace {

constexpr int kMaxUnrolled = 4096;  // largest maxLength / maxItems made into rules

const std::set<std::string, std::less<>> kAnnotations = {"title",    "description", "default",  "examples",
                                                         "$schema",  "$id",         "$comment", "deprecated",
                                                         "readOnly", "writeOnly"};
const std::set<std::string, std::less<>> kSupported = {
    "type",     "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
    "const",    "anyOf",      "$ref",     "$defs", "definitions", "minLength", "maxLength"};

std::string dump(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::strict); }

Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Seq lit(std::string_view s) { return Grammar::literal(s); }
Seq ref(uint32_t r) { return {Grammar::ref(r)}; }

int count_keyword(const ojson& schema, const char* key, const std::string& path, int fallback) {
  auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
    fail("'{}' at {} must be a non-negative integer, got {}", key, path, dump(*it));
  const uint64_t n = it->get<uint64_t>();
  if (n > uint64_t(kMaxUnrolled))
    fail("'{}': {} at {} is larger than this server supports ({}); use a smaller bound or leave it out", key, n,
         path, kMaxUnrolled);
  return int(n);
}

}  // namespace

uint32_t JsonSchemaCompiler::utf8_multibyte() {
  if (utf8_ >= 0) return uint32_t(utf8_);
  const Grammar::Element cont = Grammar::bytes(ByteSet::range(0x80, 0xBF));
  auto b = [](uint8_t lo, uint8_t hi) { return Grammar::bytes(ByteSet::range(lo, hi)); };
  // Well-formed UTF-8 (Unicode 15, table 3-7): no overlongs, no surrogates, nothing past U+10FFFF.
  utf8_ = g_.rule({{b(0xC2, 0xDF), cont},
                   {b(0xE0, 0xE0), b(0xA0, 0xBF), cont},
                   {b(0xE1, 0xEC), cont, cont},
                   {b(0xED, 0xED), b(0x80, 0x9F), cont},
                   {b(0xEE, 0xEF), cont, cont},
                   {b(0xF0, 0xF0), b(0x90, 0xBF), cont, cont},
                   {b(0xF1, 0xF3), cont, cont, cont},
                   {b(0xF4, 0xF4), b(0x80, 0x8F), cont, cont}});
  return uint32_t(utf8_);
}

uint32_t JsonSchemaCompiler::json_char() {
  if (json_char_ >= 0) return uint32_t(json_char_);
  ByteSet plain = ByteSet::range(0x20, 0x7F);
  plain.remove('"');
  plain.remove('\\');
  ByteSet simple_escape;
  for (char c : std::string_view("\"\\/bfnrt")) simple_escape.add(uint8_t(c));
  ByteSet hex = ByteSet::range('0', '9');
  hex.add_range('a', 'f');
  hex.add_range('A', 'F');
  ByteSet hex_not_d = hex;  // \uD800-\uDFFF (lone surrogates) are not text
  hex_not_d.remove('d');
  hex_not_d.remove('D');
  ByteSet d;
  d.add('d');
  d.add('D');
  const auto H = Grammar::bytes(hex);
  json_char_ = g_.rule({{Grammar::bytes(plain)},
                        {Grammar::byte('\\'), Grammar::bytes(simple_escape)},
                        {Grammar::byte('\\'), Grammar::byte('u'), Grammar::bytes(hex_not_d), H, H, H},
                        {Grammar::byte('\\'), Grammar::byte('u'), Grammar::bytes(d), Grammar::bytes(ByteSet::range('0', '7')), H, H},
                        ref(utf8_multibyte())});
  return uint32_t(json_char_);
}

uint32_t JsonSchemaCompiler::string(int min_chars, int max_chars) {
  return g_.rule({lit("\"") + ref(g_.repeat(ref(json_char()), min_chars, max_chars)) + lit("\"")});
}

uint32_t JsonSchemaCompiler::raw_text(std::string_view exclude, int min_chars, int max_chars) {
  ByteSet plain = ByteSet::range(0x20, 0x7F);
  plain.add('\n');
  plain.add('\t');
  for (char c : exclude) plain.remove(uint8_t(c));
  const uint32_t ch = g_.rule({{Grammar::bytes(plain)}, ref(utf8_multibyte())});
  return g_.repeat(ref(ch), min_chars, max_chars);
}

uint32_t JsonSchemaCompiler::any_value() {
  if (any_value_ >= 0) return uint32_t(any_value_);
  const uint32_t v = g_.add_rule();
  any_value_ = v;
  const uint32_t items = g_.repeat(lit(", ") + ref(v), 0, -1);
  const uint32_t arr = g_.rule({lit("[]"), lit("[") + ref(v) + ref(items) + lit("]")});
  for (const Seq& alt : {ref(any_object()), ref(arr), ref(string()), ref(typed({}, "number", "")), lit("true"),
                         lit("false"), lit("null")})
    g_.add_alternative(v, alt);
  return v;
}

uint32_t JsonSchemaCompiler::any_object() {
  if (any_object_ >= 0) return uint32_t(any_object_);
  const uint32_t o = g_.add_rule();
  any_object_ = o;
  const Seq member = ref(string()) + lit(": ") + ref(any_value());
  g_.add_alternative(o, lit("{}"));
  g_.add_alternative(o, lit("{") + member + ref(g_.repeat(lit(", ") + member, 0, -1)) + lit("}"));
  return o;
}

uint32_t JsonSchemaCompiler::resolve_ref(const std::string& target, const std::string& path) {
  if (auto it = refs_.find(target); it != refs_.end()) return it->second;
  if (!target.starts_with("#"))
    fail("'$ref': '{}' at {} points outside the schema; only references within it ('#', '#/$defs/...') are supported",
         target, path);
  const ojson* schema = &root_;
  if (target != "#") {
    try {
      const ojson::json_pointer ptr(target.substr(1));
      if (!root_.contains(ptr)) fail("'$ref': '{}' at {} points to nothing in the schema", target, path);
      schema = &root_.at(ptr);
    } catch (const nlohmann::json::exception&) {
      fail("'$ref': '{}' at {} is not a JSON pointer ('#/$defs/name')", target, path);
    }
  }
  const uint32_t r = g_.add_rule();
  refs_[target] = r;  // before compiling the target, which may refer back to it
  g_.add_alternative(r, ref(value(*schema, target)));
  return r;
}

uint32_t JsonSchemaCompiler::value(const ojson& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return any_value();
    fail("the schema at {} is false: no value is valid there", path);
  }
  if (!schema.is_object()) fail("the schema at {} must be an object or a boolean, got {}", path, dump(schema));
  int constraints = 0;
  for (const auto& [key, v] : schema.items()) {
    if (kAnnotations.contains(key)) continue;
    if (!kSupported.contains(key))
      fail("unsupported JSON-schema keyword '{}' at {}; supported are type, properties, required, "
           "additionalProperties, items, minItems, maxItems, enum, const, anyOf, $ref, $defs, minLength, maxLength",
           key, path);
    if (key != "$defs" && key != "definitions") ++constraints;
  }
  if (auto it = schema.find("$ref"); it != schema.end()) {
    if (!it->is_string()) fail("'$ref' at {} must be a string", path);
    if (constraints > 1) fail("'$ref' at {} comes with other keywords; put them in the referenced schema", path);
    return resolve_ref(it->get<std::string>(), path);
  }
  if (auto it = schema.find("const"); it != schema.end()) return g_.rule({lit(dump(*it))});
  if (auto it = schema.find("enum"); it != schema.end()) {
    if (!it->is_array() || it->empty()) fail("'enum' at {} must be a non-empty array", path);
    std::vector<Seq> alts;
    for (const auto& e : *it) alts.push_back(lit(dump(e)));
    return g_.rule(alts);
  }
  if (auto it = schema.find("anyOf"); it != schema.end()) {
    if (!it->is_array() || it->empty()) fail("'anyOf' at {} must be a non-empty array of schemas", path);
    if (constraints > 1)
      fail("'anyOf' at {} comes with other keywords; move them into each of its schemas", path);
    std::vector<Seq> alts;
    for (size_t i = 0; i < it->size(); ++i) alts.push_back(ref(value((*it)[i], path + "/anyOf/" + std::to_string(i))));
    return g_.rule(alts);
  }
  auto type = schema.find("type");
  if (type == schema.end()) {
    if (schema.contains("properties") || schema.contains("required") || schema.contains("additionalProperties"))
      return object(schema, path);
    if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems")) return array(schema, path);
    if (schema.contains("minLength") || schema.contains("maxLength")) return typed(schema, "string", path);
    return any_value();
  }
  if (type->is_string()) return typed(schema, type->get<std::string>(), path);
  if (!type->is_array() || type->empty()) fail("'type' at {} must be a type name or a non-empty array of them", path);
  std::vector<Seq> alts;
  for (const auto& t : *type) {
    if (!t.is_string()) fail("'type' at {} lists {}, which is not a type name", path, dump(t));
    alts.push_back(ref(typed(schema, t.get<std::string>(), path)));
  }
  return g_.rule(alts);
}

uint32_t JsonSchemaCompiler::typed(const ojson& schema, const std::string& type, const std::string& path) {
  if (type == "string") {
    const int min = count_keyword(schema, "minLength", path, 0);
    const int max = count_keyword(schema, "maxLength", path, -1);
    if (max >= 0 && max < min) fail("maxLength {} is less than minLength {} at {}", max, min, path);
    if (min == 0 && max < 0) return string();  // one shared rule for the common case
    return string(min, max);
  }
  if (type == "integer" || type == "number") {
    int64_t& cached = type == "integer" ? integer_ : number_;
    if (cached >= 0) return uint32_t(cached);
    const Seq digit = {Grammar::bytes(ByteSet::range('0', '9'))};
    const uint32_t whole = g_.rule({lit("0"), Seq{Grammar::bytes(ByteSet::range('1', '9'))} + ref(g_.repeat(digit, 0, 15))});
    const uint32_t sign = g_.rule({lit("-"), {}});
    if (type == "integer") {
      cached = g_.rule({ref(sign) + ref(whole)});
    } else {
      const uint32_t frac = g_.rule({lit(".") + ref(g_.repeat(digit, 1, 16)), {}});
      cached = g_.rule({ref(sign) + ref(whole) + ref(frac)});
    }
    return uint32_t(cached);
  }
  if (type == "boolean") return g_.rule({lit("true"), lit("false")});
  if (type == "null") return g_.rule({lit("null")});
  if (type == "object") return object(schema, path);
  if (type == "array") return array(schema, path);
  fail("'type': '{}' at {} is not a JSON-schema type (string, number, integer, boolean, null, object, array)", type,
       path);
}

uint32_t JsonSchemaCompiler::object(const ojson& schema, const std::string& path) {
  struct Prop {
    std::string name;
    const ojson* schema;
    bool required;
  };
  static const ojson kAny = ojson::object();
  std::vector<Prop> props;
  if (auto it = schema.find("properties"); it != schema.end()) {
    if (!it->is_object()) fail("'properties' at {} must be an object", path);
    for (const auto& [k, v] : it->items()) props.push_back({k, &v, false});
  }
  if (auto it = schema.find("required"); it != schema.end()) {
    if (!it->is_array()) fail("'required' at {} must be an array of property names", path);
    for (const auto& r : *it) {
      if (!r.is_string()) fail("'required' at {} lists {}, which is not a property name", path, dump(r));
      auto p = std::find_if(props.begin(), props.end(), [&](const Prop& x) { return x.name == r.get<std::string>(); });
      if (p == props.end()) props.push_back({r.get<std::string>(), &kAny, true});
      else p->required = true;
    }
  }
  const ojson* additional = &kAny;
  if (auto it = schema.find("additionalProperties"); it != schema.end()) additional = &*it;
  if (props.empty()) {
    if (additional->is_boolean() && !additional->get<bool>()) return g_.rule({lit("{}")});
    const Seq member = ref(string()) + lit(": ") + ref(value(*additional, path + "/additionalProperties"));
    return g_.rule({lit("{}"), lit("{") + member + ref(g_.repeat(lit(", ") + member, 0, -1)) + lit("}")});
  }
  if (!additional->is_boolean()) value(*additional, path + "/additionalProperties");  // checked, never produced
  // rest[i][c]: properties i.. of the object, c: whether one was written before (a comma first).
  const uint32_t empty = g_.rule({{}});
  uint32_t next[2] = {empty, empty};
  for (size_t i = props.size(); i-- > 0;) {
    const Prop& p = props[i];
    const Seq member = lit(dump(ojson(p.name)) + ": ") + ref(value(*p.schema, path + "/properties/" + p.name));
    uint32_t cur[2];
    for (int c = 0; c < 2; ++c) {
      std::vector<Seq> alts = {(c ? lit(", ") : Seq{}) + member + ref(next[1])};
      if (!p.required) alts.push_back(ref(next[c]));
      cur[c] = g_.rule(alts);
    }
    next[0] = cur[0];
    next[1] = cur[1];
  }
  return g_.rule({lit("{") + ref(next[0]) + lit("}")});
}

uint32_t JsonSchemaCompiler::array(const ojson& schema, const std::string& path) {
  const int min = count_keyword(schema, "minItems", path, 0);
  const int max = count_keyword(schema, "maxItems", path, -1);
  if (max >= 0 && max < min) fail("maxItems {} is less than minItems {} at {}", max, min, path);
  auto it = schema.find("items");
  if (it != schema.end() && !it->is_object() && !it->is_boolean())
    fail("'items' at {} must be one schema (tuple forms are not supported)", path);
  if (max == 0) return g_.rule({lit("[]")});
  const uint32_t item = it == schema.end() ? any_value() : value(*it, path + "/items");
  const uint32_t more = g_.repeat(lit(", ") + ref(item), std::max(min, 1) - 1, max < 0 ? -1 : max - 1);
  std::vector<Seq> alts = {lit("[") + ref(item) + ref(more) + lit("]")};
  if (min == 0) alts.push_back(lit("[]"));
  return g_.rule(alts);
}

Grammar json_schema_grammar(const ojson& schema) {
  Grammar g;
  JsonSchemaCompiler c(g, schema);
  g.set_root(c.value(schema));
  g.finalize();
  return g;
}

Grammar json_object_grammar() {
  Grammar g;
  JsonSchemaCompiler c(g, ojson::object());
  g.set_root(c.any_object());
  g.finalize();
  return g;
}

}  // namespace swiftlet
