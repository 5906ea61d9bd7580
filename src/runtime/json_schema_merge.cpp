// allOf, and $ref with sibling keywords, as one schema: each part's keywords combined with the
// others' (types intersected, properties and required joined, the tighter bound kept, enums
// intersected, anyOf x anyOf multiplied out). Two values of a keyword that do not combine (two
// patterns, two formats) keep the first and report the second.
#include "runtime/json_schema.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace swiftlet {

using ojson = nlohmann::ordered_json;
using namespace schema_parts::types;

namespace schema_parts {
namespace {

// Keywords that constrain a value. The rest (annotations, unknown and vendor keywords) are ignored.
static const std::set<std::string, std::less<>> kConstraints = {
    "type", "properties", "required", "additionalProperties", "unevaluatedProperties", "minProperties",
    "maxProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "enum",
    "const", "anyOf", "oneOf", "allOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "format", "not", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "dependencies", "patternProperties", "propertyNames", "contains",
    "minContains", "maxContains", "unevaluatedItems", "$dynamicRef"};
// Constraints no grammar here writes: reported wherever they appear.
static const std::set<std::string, std::less<>> kNotEnforced = {
    "not", "if", "dependentRequired", "dependentSchemas", "dependencies", "patternProperties", "propertyNames",
    "contains", "unevaluatedItems", "$dynamicRef"};

}  // namespace

bool is_constraint(std::string_view key) { return kConstraints.contains(key); }
bool is_unenforced(std::string_view key) { return kNotEnforced.contains(key); }

// JSON types as bits; "number" is integer | fraction.
unsigned type_bit(std::string_view t) {
  if (t == "null") return kNull;
  if (t == "boolean") return kBool;
  if (t == "object") return kObject;
  if (t == "array") return kArray;
  if (t == "string") return kString;
  if (t == "integer") return kInteger;
  return kInteger | kFraction;  // number
}

unsigned value_bits(const ojson& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBool;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  if (v.is_number_integer()) return kInteger;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) ? kInteger : kFraction;
}

unsigned declared_types(const ojson& s) {
  auto t = s.find("type");
  if (t == s.end()) return kAll;
  if (t->is_string()) return type_bit(t->get<std::string>());
  unsigned bits = 0;
  for (const auto& x : *t) bits |= type_bit(x.get<std::string>());
  return bits;
}

}  // namespace schema_parts

namespace {

// The least common multiple of two whole multipleOf values, or nothing where either is not a
// positive int64 or the multiple passes int64.
std::optional<int64_t> common_multiple(const ojson& a, const ojson& b) {
  const auto whole = [](const ojson& v) -> int64_t {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))) return 0;
    return v.get<int64_t>();
  };
  const int64_t x = whole(a), y = whole(b);
  if (x <= 0 || y <= 0) return std::nullopt;
  const int64_t step = x / std::gcd(x, y);
  if (step > INT64_MAX / y) return std::nullopt;
  return step * y;
}

constexpr int kMaxMergeDepth = 16;       // allOf / $ref inlined into one schema, levels deep
constexpr size_t kMaxCrossProduct = 64;  // anyOf x anyOf in an allOf, alternatives

}  // namespace

using schema_parts::declared_types;
using schema_parts::is_constraint;
using schema_parts::type_bit;

ojson JsonSchemaCompiler::merge_all(const ojson& schema, const std::string& path, int depth) {
  ojson out = ojson::object();
  for (const auto& [k, v] : schema.items())
    if (k != "allOf" && k != "$ref" && is_constraint(k)) out[k] = v;
  if (auto r = schema.find("$ref"); r != schema.end()) {
    const ojson* target = ref_target(r->get<std::string>(), path);
    if (!target) report("$ref", path);
    else merge_into(out, *target, path, depth);
  }
  if (auto all = schema.find("allOf"); all != schema.end())
    for (size_t i = 0; i < all->size(); ++i) merge_into(out, (*all)[i], path + "/allOf/" + std::to_string(i), depth);
  return out;
}

void JsonSchemaCompiler::merge_into(ojson& into, const ojson& part_in, const std::string& path, int depth) {
  if (part_in.is_boolean()) {
    if (!part_in.get<bool>()) report("false", path);
    return;
  }
  if (depth >= kMaxMergeDepth) {
    report("allOf", path);
    return;
  }
  const ojson part = part_in.contains("allOf") || part_in.contains("$ref") ? merge_all(part_in, path, depth + 1) : part_in;
  // additionalProperties applies to the properties its own schema declares: a property only the
  // other side declares must satisfy it too.
  auto cross_additional = [&](const ojson& a, const ojson& b) {  // b's new properties under a's additionalProperties
    auto ap = a.find("additionalProperties");
    auto bp = b.find("properties");
    if (ap == a.end() || bp == b.end()) return;
    const ojson* ap_props = a.contains("properties") ? &a["properties"] : nullptr;
    for (const auto& [name, sub] : bp->items()) {
      if (ap_props && ap_props->contains(name)) continue;
      ojson& target = into["properties"][name];
      if (ap->is_boolean() && !ap->get<bool>()) {
        target = false;  // never written; if required, nothing can satisfy it
      } else if (!ap->is_boolean()) {
        target = target.is_null() ? *ap : ojson{{"allOf", {target, *ap}}};
      }
    }
  };
  const ojson before = into;
  for (const auto& [k, v] : part.items()) {
    if (!is_constraint(k)) continue;
    if (!into.contains(k)) {
      into[k] = v;
      continue;
    }
    ojson& cur = into[k];
    if (cur == v) continue;
    if (k == "type") {
      const unsigned a = declared_types(ojson{{"type", cur}}), b = declared_types(ojson{{"type", v}});
      unsigned both = a & b;
      ojson types = ojson::array();
      for (const char* t : {"null", "boolean", "object", "array", "string"})
        if (both & type_bit(t)) types.push_back(t);
      if ((both & kFraction) && (both & kInteger)) types.push_back("number");
      else if (both & kInteger) types.push_back("integer");
      if (types.empty()) report("type", path);
      else cur = types.size() == 1 ? types[0] : types;
    } else if (k == "properties") {
      for (const auto& [name, sub] : v.items()) {
        if (cur.contains(name)) cur[name] = ojson{{"allOf", {cur[name], sub}}};
        else cur[name] = sub;
      }
    } else if (k == "required") {
      for (const auto& r : v)
        if (std::find(cur.begin(), cur.end(), r) == cur.end()) cur.push_back(r);
    } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "minProperties") {
      if (v.get<double>() > cur.get<double>()) cur = v;
    } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "maxProperties") {
      if (v.get<double>() < cur.get<double>()) cur = v;
    } else if ((k == "exclusiveMinimum" || k == "exclusiveMaximum") && v.is_number() && cur.is_number()) {
      if ((k == "exclusiveMinimum") == (v.get<double>() > cur.get<double>())) cur = v;
    } else if (k == "uniqueItems") {
      cur = cur.get<bool>() || v.get<bool>();
    } else if (k == "enum") {
      ojson both = ojson::array();
      for (const auto& x : cur)
        if (std::find(v.begin(), v.end(), x) != v.end()) both.push_back(x);
      if (both.empty()) report("enum", path);
      else cur = both;
    } else if (k == "items" && !v.is_array() && !cur.is_array()) {
      cur = ojson{{"allOf", {cur, v}}};
    } else if (k == "additionalProperties" || k == "unevaluatedProperties") {
      if ((cur.is_boolean() && !cur.get<bool>()) || (v.is_boolean() && v.get<bool>())) continue;
      if ((v.is_boolean() && !v.get<bool>()) || (cur.is_boolean() && cur.get<bool>())) cur = v;
      else cur = ojson{{"allOf", {cur, v}}};
    } else if ((k == "anyOf" || k == "oneOf") && cur.size() * v.size() <= kMaxCrossProduct) {
      // (a1 | a2) & (b1 | b2) = a1&b1 | a1&b2 | ...; for oneOf, exactly one pair matches exactly
      // when exactly one of each side does.
      ojson pairs = ojson::array();
      for (const auto& a : cur)
        for (const auto& b : v) pairs.push_back(ojson{{"allOf", {a, b}}});
      cur = pairs;
    } else if (auto m = k == "multipleOf" ? common_multiple(cur, v) : std::nullopt) {
      cur = *m;
    } else {
      report(k, path);  // two values of a keyword that do not combine: the first one is kept
    }
  }
  cross_additional(before, part);
  cross_additional(part, before);
}

}  // namespace swiftlet
