#include "server/tool_calls.h"

namespace swiftlet::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string dump(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::optional<ojson> parse_json(std::string_view text) {
  ojson j = ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// `{"name": "NAME", "arguments": {...}}`; arguments may also come as a string holding the object.
std::optional<ParsedCall> parse_json_call(std::string_view body) {
  auto j = parse_json(body);
  if (!j || !j->is_object()) return std::nullopt;
  auto name = j->find("name");
  if (name == j->end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  ParsedCall call{name->get<std::string>(), "{}"};
  auto args = j->find("arguments");
  if (args == j->end() || args->is_null()) return call;
  if (args->is_string()) {
    auto inner = parse_json(args->get<std::string>());
    if (!inner || !inner->is_object()) return std::nullopt;
    call.arguments = dump(*inner);
  } else if (args->is_object()) {
    call.arguments = dump(*args);
  } else {
    return std::nullopt;
  }
  return call;
}

// Whether the schema of parameter `param` of tool `tool` says it is a string.
bool is_string_parameter(const std::vector<ToolSpec>& tools, std::string_view tool, std::string_view param) {
  for (const ToolSpec& t : tools) {
    if (t.name != tool || !t.parameters.is_object()) continue;
    auto props = t.parameters.find("properties");
    if (props == t.parameters.end() || !props->is_object()) return false;
    auto p = props->find(std::string(param));
    if (p == props->end() || !p->is_object()) return false;
    auto type = p->find("type");
    if (type == p->end()) return false;
    if (type->is_string()) return type->get<std::string>() == "string";
    if (type->is_array())
      for (const auto& ty : *type)
        if (ty == "string") return true;
    return false;
  }
  return false;
}

ojson parameter_value(std::string_view text, bool is_string) {
  if (is_string) return std::string(text);
  if (auto j = parse_json(text)) return *j;
  if (text == "True") return true;
  if (text == "False") return false;
  if (text == "None") return nullptr;
  return std::string(text);
}

bool consume(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// Reads up to `end`, which is consumed; nullopt when it never comes.
std::optional<std::string_view> read_until(std::string_view& s, std::string_view end) {
  const size_t pos = s.find(end);
  if (pos == std::string_view::npos) return std::nullopt;
  std::string_view out = s.substr(0, pos);
  s.remove_prefix(pos + end.size());
  return out;
}

// `<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>`
std::optional<ParsedCall> parse_xml_call(std::string_view s, const std::vector<ToolSpec>& tools) {
  if (!consume(s, "<function=")) return std::nullopt;
  auto name = read_until(s, ">");
  if (!name || name->empty() || name->find_first_of("<\n") != std::string_view::npos) return std::nullopt;
  ojson args = ojson::object();
  for (;;) {
    s = trim_ws(s);
    if (consume(s, "</function>")) break;
    if (!consume(s, "<parameter=")) return std::nullopt;
    auto pname = read_until(s, ">");
    if (!pname || pname->empty() || pname->find_first_of("<\n") != std::string_view::npos) return std::nullopt;
    auto value = read_until(s, "</parameter>");
    if (!value) return std::nullopt;
    std::string_view v = *value;
    if (v.starts_with('\n')) v.remove_prefix(1);  // the template's newlines around the value
    if (v.ends_with('\n')) v.remove_suffix(1);
    args[std::string(*pname)] = parameter_value(v, is_string_parameter(tools, *name, *pname));
  }
  if (!trim_ws(s).empty()) return std::nullopt;
  return ParsedCall{std::string(*name), dump(args)};
}

}  // namespace

std::string py_json(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        out += py_json(v[i]);
      }
      return out + "]";
    }
    case ojson::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += dump(ojson(k)) + ": " + py_json(x);
      }
      return out + "}";
    }
    default: return dump(v);  // scalars print as Python's json.dumps prints them
  }
}

std::string py_str(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return py_json(v);  // numbers; containers are printed with tojson by every template
}

ToolCall template_tool_call(const std::string& name, const ojson& arguments) {
  ToolCall call{name, py_json(arguments), {}};
  for (const auto& [k, v] : arguments.items())
    call.arguments.push_back({k, py_json(v), py_str(v), v.is_string(), v.is_structured()});
  return call;
}

std::optional<ParsedCall> parse_tool_call(std::string_view body, const std::vector<ToolSpec>& tools) {
  const std::string_view s = trim_ws(body);
  if (s.starts_with('{')) return parse_json_call(s);
  if (s.starts_with("<function=")) return parse_xml_call(s, tools);
  return std::nullopt;
}

void ToolCallParser::emit_content(Out& out, std::string_view text) {
  if (after_call_) {  // leading whitespace is the separator the model put after the call
    while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
  }
  if (text.empty()) return;
  after_call_ = false;
  std::string all = held_ws_ + std::string(text);
  held_ws_.clear();
  size_t end = all.size();
  while (end > 0 && is_ws(all[end - 1])) --end;
  out.content.append(all, 0, end);
  held_ws_ = all.substr(end);
}

void ToolCallParser::close_call(Out& out, bool closed) {
  in_call_ = false;
  if (auto call = parse_tool_call(pending_, tools_)) {
    held_ws_.clear();  // whitespace between content and a call, or between calls
    out.calls.push_back(std::move(*call));
    ++calls_made_;
    after_call_ = true;
  } else {
    std::string raw = std::string(kOpen) + pending_;
    if (closed) raw += kClose;
    emit_content(out, raw);
  }
  pending_.clear();
}

ToolCallParser::Out ToolCallParser::feed(std::string_view piece) {
  Out out;
  pending_ += piece;
  for (;;) {
    if (in_call_) {
      const size_t pos = pending_.find(kClose);
      if (pos == std::string::npos) break;
      std::string rest = pending_.substr(pos + kClose.size());
      pending_.resize(pos);
      close_call(out, /*closed=*/true);
      pending_ = std::move(rest);
      continue;
    }
    const size_t pos = pending_.find(kOpen);
    if (pos != std::string::npos) {
      emit_content(out, std::string_view(pending_).substr(0, pos));
      held_ws_.clear();
      pending_.erase(0, pos + kOpen.size());
      in_call_ = true;
      continue;
    }
    // Hold back a tail that could still grow into <tool_call>.
    size_t keep = std::min(pending_.size(), kOpen.size() - 1);
    while (keep > 0 && !kOpen.starts_with(std::string_view(pending_).substr(pending_.size() - keep))) --keep;
    emit_content(out, std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    break;
  }
  return out;
}

ToolCallParser::Out ToolCallParser::finish() {
  Out out;
  if (in_call_) {
    close_call(out, /*closed=*/false);
  } else {
    emit_content(out, pending_);
    pending_.clear();
  }
  if (calls_made_ == 0) out.content += held_ws_;
  held_ws_.clear();
  return out;
}

}  // namespace swiftlet::server
