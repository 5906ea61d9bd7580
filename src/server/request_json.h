// Type checking of request JSON: each helper reads one field and throws ApiError (400) naming
// the parameter's path when it has the wrong type or value. Shared by the OpenAI routes and
// the Anthropic ones (anthropic.cpp), which name paths in their own style.
#pragma once

#include "server/api_types.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace swiftlet::server {

using json = nlohmann::ordered_json;

const char* type_name(const json& v);
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v);
[[noreturn]] void missing(const std::string& param);
[[noreturn]] void bad_value(const std::string& param, const std::string& why);

// A present, non-null field, or nullptr.
const json* field(const json& obj, const char* key);
std::optional<double> get_number(const json& obj, const char* key);
std::optional<int64_t> get_integer(const json& obj, const char* key);
// Whether an integer value (is_number_integer) lies in [lo, hi]; one past INT64_MAX, which the
// parser keeps unsigned, is compared as the number it is rather than wrapped to a negative one.
bool integer_within(const json& v, int64_t lo, int64_t hi);
std::optional<bool> get_bool(const json& obj, const char* key);
std::optional<std::string> get_string(const json& obj, const char* key);
std::optional<float> get_in_range(const json& obj, const char* key, double lo, double hi, bool lo_open = false);

}  // namespace swiftlet::server
