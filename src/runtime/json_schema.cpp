#include "runtime/json_schema.h"

#include "core/error.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace swiftlet {

using ojson = nlohmann::ordered_json;
using Seq = Grammar::Sequence;
namespace sp = schema_parts;
using namespace schema_parts::types;
using sp::declared_types;
using sp::value_bits;

namespace {

constexpr int kMaxUnrolled = 4096;     // largest maxLength / maxItems / maxProperties made into rules
constexpr int kMaxEnumerated = 256;    // multiples of multipleOf in a bounded range, listed one by one
constexpr int64_t kMaxModulus = 100;  // multipleOf of an unbounded integer: rules per remainder and length
constexpr int kMaxUniqueValues = 8;    // uniqueItems over items of at most this many values

const char* const kObjectWords[] = {"properties", "required", "additionalProperties", "unevaluatedProperties",
                                    "minProperties", "maxProperties"};
const char* const kArrayWords[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"};
const char* const kStringWords[] = {"minLength", "maxLength", "pattern", "format"};
const char* const kNumberWords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};

std::string dump(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }


Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Seq lit(std::string_view s) { return Grammar::literal(s); }
Seq ref(uint32_t r) { return {Grammar::ref(r)}; }

bool has_any(const ojson& s, const auto& words) {
  for (const char* w : words)
    if (s.contains(w)) return true;
  return false;
}

// A count keyword (checked by check_json_schema: a non-negative integer), or `fallback`.
int64_t count(const ojson& s, const char* key, int64_t fallback) {
  auto it = s.find(key);
  if (it == s.end()) return fallback;
  if (it->is_number_float()) return int64_t(std::min(it->get<double>(), 9e18));
  return it->is_number_unsigned() ? int64_t(std::min<uint64_t>(it->get<uint64_t>(), uint64_t(INT64_MAX))) : it->get<int64_t>();
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(uint8_t(s[i + 1])) && std::isxdigit(uint8_t(s[i + 2]))) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

const ojson* find_anchor(const ojson& s, std::string_view name, int depth) {
  if (depth > 64) return nullptr;
  if (s.is_object()) {
    if (auto a = s.find("$anchor"); a != s.end() && *a == name) return &s;
    for (const auto& [k, v] : s.items())
      if (const ojson* hit = find_anchor(v, name, depth + 1)) return hit;
  } else if (s.is_array()) {
    for (const auto& v : s)
      if (const ojson* hit = find_anchor(v, name, depth + 1)) return hit;
  }
  return nullptr;
}

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(Grammar& g, const ojson& root) : g_(g), root_(root), json_text_(g, {}) {
  check_json_schema(root);
}

void JsonSchemaCompiler::report(std::string_view keyword, const std::string& path) {
  std::string entry = std::string(keyword) + "@" + path;
  if (reported_.insert(entry).second) unenforced_.push_back(std::move(entry));
}

uint32_t JsonSchemaCompiler::utf8_multibyte() {
  if (utf8_ >= 0) return uint32_t(utf8_);
  sp::CharClass c;
  c.non_ascii = true;
  utf8_ = json_text_.one_of(c);
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
  if (min_chars == 0 && max_chars < 0 && string_ >= 0) return uint32_t(string_);
  const uint32_t r = g_.rule({lit("\"") + ref(g_.repeat(ref(json_char()), min_chars, max_chars)) + lit("\"")});
  if (min_chars == 0 && max_chars < 0) string_ = r;
  return r;
}

uint32_t JsonSchemaCompiler::raw_text(std::string_view exclude, int min_chars, int max_chars) {
  sp::TextRules raw(g_, {false, std::string(exclude)});
  return g_.repeat(ref(raw.any_char()), min_chars, max_chars);
}

uint32_t JsonSchemaCompiler::raw_string(const ojson& schema, const std::string& path, std::string_view exclude) {
  return string_schema(schema, path, {false, std::string(exclude)});
}

uint32_t JsonSchemaCompiler::any_value() {
  if (any_value_ >= 0) return uint32_t(any_value_);
  const uint32_t v = g_.add_rule();
  any_value_ = v;
  const uint32_t items = g_.repeat(lit(", ") + ref(v), 0, -1);
  const uint32_t arr = g_.rule({lit("[]"), lit("[") + ref(v) + ref(items) + lit("]")});
  for (const Seq& alt : {ref(any_object()), ref(arr), ref(string()), ref(number(ojson::object(), false, "")), lit("true"),
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

// ------------------------------------------------------------------------------ references

const ojson* JsonSchemaCompiler::ref_target(const std::string& target_in, const std::string& path) {
  std::string target = target_in;
  if (auto id = root_.is_object() ? root_.find("$id") : root_.end();
      root_.is_object() && id != root_.end() && id->is_string()) {
    const std::string base = id->get<std::string>();
    if (!base.empty() && target.starts_with(base)) target = target.substr(base.size());
  }
  if (target.empty() || target == "#") return &root_;
  if (!target.starts_with("#")) return nullptr;  // another document: not fetched
  if (target[1] != '/') {
    if (const ojson* a = find_anchor(root_, percent_decode(target.substr(1)), 0)) return a;
    fail("the JSON schema is not valid at {}: '$ref': '{}' names an anchor the schema does not have", path, target_in);
  }
  try {
    const ojson::json_pointer ptr(percent_decode(target.substr(1)));
    if (!root_.contains(ptr)) fail("the JSON schema is not valid at {}: '$ref': '{}' points to nothing in the schema", path, target_in);
    return &root_.at(ptr);
  } catch (const nlohmann::json::exception&) {
    fail("the JSON schema is not valid at {}: '$ref': '{}' is not a JSON pointer ('#/$defs/name')", path, target_in);
  }
}

uint32_t JsonSchemaCompiler::resolve_ref(const std::string& target, const std::string& path) {
  if (auto it = refs_.find(target); it != refs_.end()) return it->second;
  const ojson* schema = ref_target(target, path);
  if (!schema) {
    report("$ref", path);
    return any_value();
  }
  const uint32_t r = g_.add_rule();
  refs_[target] = r;  // before compiling the target, which may refer back to it
  g_.add_alternative(r, ref(value(*schema, target)));
  return r;
}

// ------------------------------------------------------------------------------- schemas

uint32_t JsonSchemaCompiler::value(const ojson& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) report("false", path);  // nothing is valid: written as any value
    return any_value();
  }
  if (!schema.is_object()) check_json_schema(schema, path);  // throws
  for (const auto& [key, v] : schema.items())
    if (sp::is_unenforced(key)) report(key, path);
  if (auto r = schema.find("$ref"); r != schema.end()) {
    bool siblings = false;
    for (const auto& [key, v] : schema.items()) siblings |= key != "$ref" && sp::is_constraint(key) && !sp::is_unenforced(key);
    if (!siblings) return resolve_ref(r->get<std::string>(), path);
    return value(merge_all(schema, path, 0), path);
  }
  if (schema.contains("allOf")) return value(merge_all(schema, path, 0), path);
  if (schema.contains("anyOf")) return alternatives(schema, "anyOf", path);
  if (schema.contains("oneOf")) return alternatives(schema, "oneOf", path);
  if (schema.contains("const") || schema.contains("enum")) return literals(schema, path);
  if (auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) return typed(schema, type->get<std::string>(), path);
    std::vector<Seq> alts;
    for (const auto& t : *type) alts.push_back(ref(typed(schema, t.get<std::string>(), path)));
    return g_.rule(alts);
  }
  // No type: the kinds of value the keywords speak of (any value when none).
  std::vector<Seq> alts;
  if (has_any(schema, kObjectWords)) alts.push_back(ref(object(schema, path)));
  if (has_any(schema, kArrayWords)) alts.push_back(ref(array(schema, path)));
  if (has_any(schema, kStringWords)) alts.push_back(ref(typed(schema, "string", path)));
  if (has_any(schema, kNumberWords)) alts.push_back(ref(number(schema, false, path)));
  if (alts.empty()) return any_value();
  return g_.rule(alts);
}

uint32_t JsonSchemaCompiler::alternatives(const ojson& schema, const char* key, const std::string& path) {
  const ojson& list = schema[key];
  ojson rest = ojson::object();
  for (const auto& [k, v] : schema.items())
    if (k != key && sp::is_constraint(k) && !sp::is_unenforced(k)) rest[k] = v;
  std::vector<ojson> branches;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = path + "/" + key + "/" + std::to_string(i);
    if (rest.empty() && !(list[i].is_boolean() && !list[i].get<bool>())) {
      branches.push_back(list[i]);
      continue;
    }
    if (list[i].is_boolean() && !list[i].get<bool>()) continue;  // matches nothing: never chosen
    ojson merged = rest;
    merge_into(merged, list[i], at, 0);
    branches.push_back(std::move(merged));
  }
  if (branches.empty()) {
    report(key, path);
    return any_value();
  }
  if (std::string_view(key) == "oneOf" && branches.size() > 1) {
    // Enforced when no value can match two alternatives: their types, their values, or a
    // required property's constants tell them apart.
    struct Sig {
      unsigned types = kAll;
      std::optional<ojson> values;
      std::map<std::string, ojson> tags;
    };
    auto sig = [&](const ojson& b0) {
      Sig s;
      const ojson b = b0.is_object() && (b0.contains("$ref") || b0.contains("allOf")) ? merge_all(b0, path, 0) : b0;
      if (!b.is_object()) return s;
      s.types = declared_types(b);
      if (b.contains("const")) s.values = ojson::array({b["const"]});
      else if (b.contains("enum")) s.values = b["enum"];
      if (s.values) {
        unsigned bits = 0;
        for (const auto& v : *s.values) bits |= value_bits(v);
        s.types &= bits;
      }
      if (b.contains("properties") && b.contains("required"))
        for (const auto& r : b["required"]) {
          const ojson& p = b["properties"].contains(r.get<std::string>()) ? b["properties"][r.get<std::string>()] : ojson();
          if (!p.is_object()) continue;
          if (p.contains("const")) s.tags[r.get<std::string>()] = ojson::array({p["const"]});
          else if (p.contains("enum")) s.tags[r.get<std::string>()] = p["enum"];
        }
      return s;
    };
    auto disjoint_values = [](const ojson& a, const ojson& b) {
      for (const auto& x : a)
        if (std::find(b.begin(), b.end(), x) != b.end()) return false;
      return true;
    };
    std::vector<Sig> sigs;
    for (const ojson& b : branches) sigs.push_back(sig(b));
    bool disjoint = true;
    for (size_t i = 0; i < sigs.size() && disjoint; ++i)
      for (size_t j = i + 1; j < sigs.size() && disjoint; ++j) {
        const Sig &a = sigs[i], &b = sigs[j];
        bool apart = (a.types & b.types) == 0 || (a.values && b.values && disjoint_values(*a.values, *b.values));
        for (const auto& [name, vals] : a.tags)
          if (auto t = b.tags.find(name); t != b.tags.end() && disjoint_values(vals, t->second)) apart = true;
        disjoint = apart;
      }
    if (!disjoint) report("oneOf", path);
  }
  std::vector<Seq> alts;
  for (size_t i = 0; i < branches.size(); ++i)
    alts.push_back(ref(value(branches[i], path + "/" + key + "/" + std::to_string(i))));
  return g_.rule(alts);
}

uint32_t JsonSchemaCompiler::literals(const ojson& schema, const std::string& path) {
  ojson values = schema.contains("enum") ? schema["enum"] : ojson::array();
  if (auto c = schema.find("const"); c != schema.end()) {
    const bool listed = !schema.contains("enum") || std::find(values.begin(), values.end(), *c) != values.end();
    if (!listed) report("enum", path);
    values = ojson::array({*c});
  }
  // The other keywords beside enum / const: each value is checked against them.
  ojson rest = ojson::object();
  for (const auto& [k, v] : schema.items())
    if (k != "enum" && k != "const" && k != "type" && sp::is_constraint(k) && !sp::is_unenforced(k)) rest[k] = v;
  const unsigned types = declared_types(schema);
  std::optional<Grammar> check;
  std::unique_ptr<GrammarMatcher> matcher;
  if (!rest.empty()) {
    check.emplace();
    JsonSchemaCompiler sub(*check, root_);
    try {
      check->set_root(sub.value(rest, path));
      check->finalize();
      matcher = std::make_unique<GrammarMatcher>(*check);
      for (const std::string& u : sub.unenforced()) report(u.substr(0, u.find('@')), u.substr(u.find('@') + 1));
    } catch (const Error&) {
      for (const auto& [k, v] : rest.items()) report(k, path);
    }
  }
  std::vector<Seq> alts;
  for (const auto& v : values) {
    if (!(value_bits(v) & types)) continue;
    if (matcher) {
      if (v.is_object() || v.is_array()) {
        for (const auto& [k, x] : rest.items()) report(k, path);  // compared as scalars only
      } else {
        const int32_t s = matcher->step(matcher->start(), dump(v));
        if (s == GrammarMatcher::kDead || !matcher->accepting(s)) continue;
      }
    }
    alts.push_back(lit(dump(v)));
  }
  if (alts.empty()) {  // nothing listed is valid (or nothing is listed): the list is written as is
    report(schema.contains("const") ? "const" : "enum", path);
    for (const auto& v : values) alts.push_back(lit(dump(v)));
    if (alts.empty()) return any_value();
  }
  return g_.rule(alts);
}

uint32_t JsonSchemaCompiler::typed(const ojson& schema, const std::string& type, const std::string& path) {
  if (type == "string") return string_schema(schema, path, {});
  if (type == "integer" || type == "number") return number(schema, type == "integer", path);
  if (type == "boolean") return g_.rule({lit("true"), lit("false")});
  if (type == "null") return g_.rule({lit("null")});
  if (type == "object") return object(schema, path);
  return array(schema, path);
}

uint32_t JsonSchemaCompiler::string_schema(const ojson& schema, const std::string& path, const sp::TextMode& mode) {
  int64_t min = count(schema, "minLength", 0), max = count(schema, "maxLength", -1);
  if (min > kMaxUnrolled) {
    report("minLength", path);
    min = 0;
  }
  if (max > kMaxUnrolled) max = -1;  // longer than any answer: the same as no bound
  if (max >= 0 && max < min) {
    report("maxLength", path);
    max = -1;
  }
  sp::TextRules raw(g_, mode);
  sp::TextRules& text = mode.json ? json_text_ : raw;
  int64_t content = -1;
  bool checks_lengths = false;
  if (auto f = schema.find("format"); f != schema.end()) {
    int fmin = 0, fmax = -1;
    content = text.format(f->get<std::string>(), fmin, fmax);
    if (content < 0) report("format", path);
    checks_lengths = content >= 0 && fmin >= min && (max < 0 || (fmax >= 0 && fmax <= max));
  }
  if (auto p = schema.find("pattern"); p != schema.end()) {
    std::string why;
    if (content >= 0) {
      report("pattern", path);  // the format is written; both at once is not worked out
    } else {
      content = text.pattern(p->get<std::string>(), why);
      if (content < 0) report("pattern", path);
    }
  }
  if (content >= 0) {
    if (!checks_lengths) {
      if (schema.contains("minLength")) report("minLength", path);
      if (schema.contains("maxLength")) report("maxLength", path);
    }
  } else if (mode.json) {
    return string(int(min), int(max));
  } else {
    content = g_.repeat(ref(text.any_char()), int(min), int(max));
  }
  if (!mode.json) return uint32_t(content);
  return g_.rule({lit("\"") + ref(uint32_t(content)) + lit("\"")});
}

namespace {

// The integers an integer schema's bounds leave: [ceil(lo), floor(hi)], exclusive ends moved in.
void integer_bounds(const std::optional<sp::Bound>& lo, const std::optional<sp::Bound>& hi, std::optional<int64_t>& il,
                    std::optional<int64_t>& ih) {
  if (lo) {
    const auto w = int64_t(lo->value.whole);
    il = lo->value.negative ? -w : w + (lo->value.frac.empty() ? 0 : 1);
    if (lo->value.frac.empty() && lo->exclusive) ++*il;
  }
  if (hi) {
    const auto w = int64_t(hi->value.whole);
    ih = hi->value.negative ? -w - (hi->value.frac.empty() ? 0 : 1) : w;
    if (hi->value.frac.empty() && hi->exclusive) --*ih;
  }
}

}  // namespace

uint32_t JsonSchemaCompiler::number(const ojson& schema, bool integer, const std::string& path) {
  std::optional<sp::Bound> lo, hi;
  std::optional<double> lo_v, hi_v;
  std::vector<const char*> bound_words;
  auto bound = [&](const char* key, bool lower, bool exclusive) {
    auto it = schema.find(key);
    if (it == schema.end() || !it->is_number()) return;
    sp::Bound b;
    if (!sp::parse_decimal(dump(*it), b.value)) return;
    // draft-04: a boolean exclusiveMinimum / exclusiveMaximum makes minimum / maximum exclusive
    const char* flag = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    b.exclusive = exclusive || (schema.contains(flag) && schema[flag].is_boolean() && schema[flag].get<bool>());
    bound_words.push_back(key);
    std::optional<sp::Bound>& slot = lower ? lo : hi;
    std::optional<double>& cur = lower ? lo_v : hi_v;
    const double v = it->get<double>();
    if (!cur || (lower ? v > *cur : v < *cur) || (v == *cur && b.exclusive)) {
      slot = b;
      cur = v;
    }
  };
  bound("minimum", true, false);
  bound("exclusiveMinimum", true, true);
  bound("maximum", false, false);
  bound("exclusiveMaximum", false, true);
  auto unbounded = [&] {
    for (const char* w : bound_words) report(w, path);
    return number(ojson::object(), integer, path);
  };
  // Bounds past 16 digits: one beyond what is written on the open side is no bound at all.
  if (lo && lo->value.huge()) {
    if (!lo->value.negative) return unbounded();
    lo.reset();
  }
  if (hi && hi->value.huge()) {
    if (hi->value.negative) return unbounded();
    hi.reset();
  }
  if (auto m = schema.find("multipleOf"); m != schema.end()) {
    sp::Decimal d;
    if (!sp::parse_decimal(dump(*m), d) || !d.frac.empty() || d.huge() || d.whole == 0) {
      report("multipleOf", path);  // a fraction: JSON Schema validators divide in floating point
    } else {
      integer = true;  // a multiple of a whole number is an integer
      const auto mult = int64_t(d.whole);
      std::optional<int64_t> il, ih;
      integer_bounds(lo, hi, il, ih);
      auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); };
      auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
      if (mult == 1) {
      } else if (il && ih) {
        const int64_t first = ceil_div(*il, mult), last = floor_div(*ih, mult);
        if (last >= first && last - first < kMaxEnumerated) {
          std::vector<Seq> alts;
          for (int64_t k = first; k <= last; ++k) alts.push_back(lit(std::to_string(k * mult)));
          return g_.rule(alts);
        }
        report("multipleOf", path);
      } else if (!il && !ih && mult <= kMaxModulus) {
        return sp::integer_multiple(g_, mult);
      } else {
        report("multipleOf", path);
      }
    }
  }
  if (integer) {
    if (!lo && !hi) {
      if (integer_ < 0) integer_ = sp::integer_range(g_, std::nullopt, std::nullopt);
      return uint32_t(integer_);
    }
    std::optional<int64_t> il, ih;
    integer_bounds(lo, hi, il, ih);
    if (const int64_t r = sp::integer_range(g_, il, ih); r >= 0) return uint32_t(r);
    return unbounded();
  }
  if (!lo && !hi) {
    if (number_ < 0) number_ = sp::number_range(g_, std::nullopt, std::nullopt);
    return uint32_t(number_);
  }
  if (const int64_t r = sp::number_range(g_, lo, hi); r >= 0) return uint32_t(r);
  return unbounded();
}

uint32_t JsonSchemaCompiler::object(const ojson& schema, const std::string& path) {
  struct Prop {
    std::string name;
    const ojson* schema;
    bool required;
  };
  static const ojson kAny = ojson::object();
  std::vector<Prop> props;
  if (auto it = schema.find("properties"); it != schema.end())
    for (const auto& [k, v] : it->items()) props.push_back({k, &v, false});
  if (auto it = schema.find("required"); it != schema.end())
    for (const auto& r : *it) {
      auto p = std::find_if(props.begin(), props.end(), [&](const Prop& x) { return x.name == r.get<std::string>(); });
      if (p == props.end()) props.push_back({r.get<std::string>(), &kAny, true});
      else p->required = true;
    }
  // A property whose schema is false is never written (if required, nothing satisfies it).
  std::erase_if(props, [](const Prop& p) { return !p.required && p.schema->is_boolean() && !p.schema->get<bool>(); });
  const ojson* additional = &kAny;
  if (auto it = schema.find("additionalProperties"); it != schema.end()) additional = &*it;
  else if (auto u = schema.find("unevaluatedProperties"); u != schema.end()) additional = &*u;
  int64_t min = count(schema, "minProperties", 0), max = count(schema, "maxProperties", -1);
  if (max >= 0 && max < min) {
    report("maxProperties", path);
    max = -1;
  }
  if (props.empty()) {
    if (additional->is_boolean() && !additional->get<bool>()) {
      if (min > 0) report("minProperties", path);
      return g_.rule({lit("{}")});
    }
    if (min > kMaxUnrolled) {
      report("minProperties", path);
      min = 0;
    }
    if (max > kMaxUnrolled) max = -1;
    if (max == 0) return g_.rule({lit("{}")});
    // Keys are written freely; the same key twice is possible, so counts are not exact.
    const Seq member = ref(string()) + lit(": ") + ref(value(*additional, path + "/additionalProperties"));
    std::vector<Seq> alts = {lit("{") + member +
                             ref(g_.repeat(lit(", ") + member, int(std::max<int64_t>(min, 1) - 1), max < 0 ? -1 : int(max - 1))) +
                             lit("}")};
    if (min == 0) alts.insert(alts.begin(), lit("{}"));
    return g_.rule(alts);
  }
  const int64_t n = int64_t(props.size());
  const int64_t required = std::count_if(props.begin(), props.end(), [](const Prop& p) { return p.required; });
  if (min > n) {  // would need properties the schema does not declare
    report("minProperties", path);
    min = 0;
  }
  if (max >= 0 && max < required) {
    report("maxProperties", path);
    max = -1;
  }
  std::vector<Seq> members;
  for (const Prop& p : props)
    members.push_back(lit(dump(ojson(p.name)) + ": ") + ref(value(*p.schema, path + "/properties/" + json_pointer_token(p.name))));
  const bool counted = min > required || (max >= 0 && max < n);
  // rest[c]: properties i.. of the object after c were written (counted: c is how many; else
  // c is 0 or 1, whether a comma comes first). -1: no way to finish.
  const int64_t cap = counted ? (max < 0 ? n : std::min(max, n)) : 1;
  std::vector<int64_t> next(size_t(cap + 1));
  for (int64_t c = 0; c <= cap; ++c) next[size_t(c)] = !counted || c >= min ? int64_t(g_.rule({{}})) : -1;
  for (int64_t i = n; i-- > 0;) {
    std::vector<int64_t> cur(size_t(cap + 1), -1);
    for (int64_t c = 0; c <= cap; ++c) {
      std::vector<Seq> alts;
      const int64_t after = counted ? c + 1 : 1;
      if (after <= cap && next[size_t(after)] >= 0)
        alts.push_back((c ? lit(", ") : Seq{}) + members[size_t(i)] + ref(uint32_t(next[size_t(after)])));
      if (!props[size_t(i)].required && next[size_t(c)] >= 0) alts.push_back(ref(uint32_t(next[size_t(c)])));
      if (!alts.empty()) cur[size_t(c)] = g_.rule(alts);
    }
    next = std::move(cur);
  }
  if (next[0] < 0) {  // cannot happen after the checks above; written without the counts
    report("minProperties", path);
    return object(ojson{{"properties", schema.value("properties", ojson::object())}, {"required", schema.value("required", ojson::array())}},
                  path);
  }
  return g_.rule({lit("{") + ref(uint32_t(next[0])) + lit("}")});
}

int64_t JsonSchemaCompiler::unique_items(const ojson& items, int min, int max, const std::string& path) {
  // The values the items can take, when there are few: then the arrays are the orders of
  // distinct subsets.
  ojson values = ojson::array();
  if (items.is_object() && items.contains("const")) values.push_back(items["const"]);
  else if (items.is_object() && items.contains("enum")) values = items["enum"];
  else if (items.is_object() && items.value("type", ojson()) == "boolean") values = {true, false};
  else if (items.is_object() && items.value("type", ojson()) == "null") values = {nullptr};
  else return -1;
  for (const auto& [k, v] : items.items())
    if (k != "const" && k != "enum" && k != "type" && sp::is_constraint(k)) return -1;
  ojson distinct = ojson::array();
  const unsigned types = declared_types(items);
  for (const auto& v : values)
    if ((value_bits(v) & types) && std::find(distinct.begin(), distinct.end(), v) == distinct.end()) distinct.push_back(v);
  const int k = int(distinct.size());
  if (k == 0 || k > kMaxUniqueValues) return -1;
  if (min > k) {
    report("minItems", path);
    min = k;
  }
  const int cap = max < 0 ? k : std::min(max, k);
  // set[mask]: the rest of the array when the values in mask were written.
  std::vector<int64_t> set(size_t(1) << k, -1);
  for (uint32_t mask = (1u << k); mask-- > 0;) {
    const int used = std::popcount(mask);
    std::vector<Seq> alts;
    if (used >= min) alts.push_back(lit("]"));
    if (used < cap)
      for (int j = 0; j < k; ++j)
        if (!(mask & (1u << j)) && set[mask | (1u << j)] >= 0)
          alts.push_back((used ? lit(", ") : Seq{}) + lit(dump(distinct[size_t(j)])) + ref(uint32_t(set[mask | (1u << j)])));
    if (!alts.empty()) set[mask] = g_.rule(alts);
  }
  if (set[0] < 0) return -1;
  return g_.rule({lit("[") + ref(uint32_t(set[0]))});
}

uint32_t JsonSchemaCompiler::array(const ojson& schema, const std::string& path) {
  int64_t min = count(schema, "minItems", 0), max = count(schema, "maxItems", -1);
  if (min > kMaxUnrolled) {
    report("minItems", path);
    min = 0;
  }
  if (max > kMaxUnrolled) max = -1;
  if (max >= 0 && max < min) {
    report("maxItems", path);
    max = -1;
  }
  static const ojson kAny = ojson::object();
  // prefixItems (2020-12) or a tuple `items` (draft-07), then the schema of the other items.
  const ojson* prefix = nullptr;
  const ojson* rest = &kAny;
  std::string prefix_path, rest_path = path + "/items";
  auto items = schema.find("items");
  if (auto p = schema.find("prefixItems"); p != schema.end()) {
    prefix = &*p;
    prefix_path = path + "/prefixItems/";
    if (items != schema.end()) rest = &*items;
  } else if (items != schema.end() && items->is_array()) {
    prefix = &*items;
    prefix_path = path + "/items/";
    rest_path = path + "/additionalItems";
    if (auto a = schema.find("additionalItems"); a != schema.end()) rest = &*a;
  } else if (items != schema.end()) {
    rest = &*items;
  }
  const bool no_more = rest->is_boolean() && !rest->get<bool>();
  const int64_t n = prefix ? int64_t(prefix->size()) : 0;
  if (schema.value("uniqueItems", false) && (max < 0 || max > 1)) {
    if (n == 0 && !no_more) {
      if (const int64_t r = unique_items(*rest, int(min), int(max), path); r >= 0) return uint32_t(r);
    }
    report("uniqueItems", path);
  }
  if (no_more && min > n) {
    report("minItems", path);
    min = n;
  }
  if (n == 0) {
    if (max == 0 || no_more) return g_.rule({lit("[]")});
    const uint32_t item = value(*rest, rest_path);
    const uint32_t more = g_.repeat(lit(", ") + ref(item), int(std::max<int64_t>(min, 1) - 1), max < 0 ? -1 : int(max - 1));
    std::vector<Seq> alts = {lit("[") + ref(item) + ref(more) + lit("]")};
    if (min == 0) alts.push_back(lit("[]"));
    return g_.rule(alts);
  }
  // after[k]: items k.. then "]"; item k has its prefix schema, past the prefix the rest's.
  uint32_t after;
  if (no_more || (max >= 0 && max <= n)) {
    after = g_.rule({lit("]")});
  } else {
    const uint32_t item = value(*rest, rest_path);
    after = g_.rule({ref(g_.repeat(lit(", ") + ref(item), int(std::max<int64_t>(0, min - n)), max < 0 ? -1 : int(max - n))) + lit("]")});
  }
  int64_t next = after;
  for (int64_t k = n; k-- > 0;) {
    std::vector<Seq> alts;
    if (k >= min) alts.push_back(lit("]"));
    if (max < 0 || k < max)
      alts.push_back((k ? lit(", ") : Seq{}) + ref(value((*prefix)[size_t(k)], prefix_path + std::to_string(k))) + ref(uint32_t(next)));
    next = g_.rule(alts);
  }
  return g_.rule({lit("[") + ref(uint32_t(next))});
}

Grammar json_schema_grammar(const ojson& schema, std::vector<std::string>* unenforced) {
  Grammar g;
  JsonSchemaCompiler c(g, schema);
  g.set_root(c.value(schema));
  g.finalize();
  if (unenforced) *unenforced = c.unenforced();
  return g;
}

Grammar json_object_grammar() {
  Grammar g;
  const ojson empty = ojson::object();  // the compiler keeps a reference to its root
  JsonSchemaCompiler c(g, empty);
  g.set_root(c.any_object());
  g.finalize();
  return g;
}

}  // namespace swiftlet
