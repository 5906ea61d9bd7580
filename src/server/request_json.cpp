#include "server/request_json.h"

#include <fmt/format.h>

#include <climits>
#include <cmath>

namespace swiftlet::server {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "something else";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
  throw invalid_request(fmt::format("Invalid type for '{}': expected {}, but got {} instead.", param, expected, type_name(v)),
                        param, "invalid_type");
}

[[noreturn]] void missing(const std::string& param) {
  throw invalid_request(fmt::format("Missing required parameter: '{}'.", param), param, "missing_required_parameter");
}
[[noreturn]] void bad_value(const std::string& param, const std::string& why) {
  throw invalid_request(fmt::format("Invalid value for '{}': {}", param, why), param, "invalid_value");
}

// A present, non-null field, or nullptr.
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> get_number(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  return v->get<double>();
}

namespace {
// JSON does not tell 3 from 3.0, so a float with no fractional part is a whole number too; the
// parser keeps an integer literal past 64 bits as a float.
bool is_whole(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::trunc(d) == d;
}

}  // namespace

bool integer_within(const json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_unsigned()) return v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  const uint64_t u = v.get<uint64_t>();
  return hi >= 0 && u <= uint64_t(hi) && (lo <= 0 || u >= uint64_t(lo));
}

std::optional<int64_t> get_integer(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!is_whole(*v)) wrong_type(key, "an integer", *v);
  constexpr const char* kRange = "outside the 64-bit integer range";
  if (v->is_number_integer()) {
    if (!integer_within(*v, INT64_MIN, INT64_MAX)) bad_value(key, kRange);
    return v->get<int64_t>();
  }
  // Compared before the cast: a double outside int64's range has no defined conversion.
  const double d = v->get<double>();
  if (!(d >= -0x1p63 && d < 0x1p63)) bad_value(key, kRange);
  return int64_t(d);
}

std::optional<bool> get_bool(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

std::optional<float> get_in_range(const json& obj, const char* key, double lo, double hi, bool lo_open) {
  auto v = get_number(obj, key);
  if (!v) return std::nullopt;
  if (!(lo_open ? *v > lo : *v >= lo) || !(*v <= hi))
    bad_value(key, fmt::format("{} is outside {}{}, {}]", *v, lo_open ? "(" : "[", lo, hi));
  return float(*v);
}

}  // namespace swiftlet::server
