#include "server/tool_calls.h"

#include "tokenizer/utf8.h"

#include <algorithm>
#include <cstdlib>

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

// ------------------------------------------------------------------------ streamed arguments

namespace {

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  size_t keep = std::min(s.size(), tag.size() - 1);
  while (keep > 0 && !tag.starts_with(s.substr(s.size() - keep))) --keep;
  return keep;
}

// How much of a JSON string's raw text, from `from`, is whole characters: an escape (a high
// surrogate's \uD8xx together with its low half) or a UTF-8 sequence cut by the end of `raw`
// waits for more. one: only the first character.
size_t whole_string_units(std::string_view raw, size_t from, bool one = false) {
  size_t i = from, end = from;
  while (i < raw.size()) {
    const auto c = static_cast<unsigned char>(raw[i]);
    size_t n = 1;
    if (c == '\\') {
      if (i + 1 >= raw.size()) break;
      n = 2;
      if (raw[i + 1] == 'u') {
        n = 6;
        if (i + n > raw.size()) break;
        const unsigned long v = std::strtoul(std::string(raw.substr(i + 2, 4)).c_str(), nullptr, 16);
        if (v >= 0xD800 && v <= 0xDBFF) n = 12;
      }
    } else if (c >= 0x80) {
      n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    }
    if (i + n > raw.size()) break;
    i += n;
    end = i;
    if (one) break;
  }
  return end;
}

// A string's text as it appears inside the quotes of its compact JSON form.
std::string json_string_body(std::string_view text) {
  const std::string d = dump(ojson(std::string(text)));
  return d.substr(1, d.size() - 2);
}

bool is_scalar_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '+' || c == '-' || c == '.';
}

}  // namespace

// Reads a call's body as it arrives and writes its arguments in the form parse_tool_call gives
// them (compact JSON, keys in the model's order), as far as later text cannot change them. It
// gives up (off_) on anything it does not expect; the caller then settles the call from its
// whole text.
class ToolCallParser::ArgumentStreamer {
 public:
  // `tools`: the tools offered (their schemas type the values of the XML form).
  void feed(std::string_view bytes, const std::vector<ToolSpec>& tools, std::string& out) {
    tools_ = &tools;
    for (const char c : bytes) {
      if (off_) return;
      switch (format_) {
        case Format::Unknown:
          if (is_ws(c)) break;
          format_ = c == '{' ? Format::Json : c == '<' ? Format::Xml : Format::Unknown;
          if (format_ == Format::Unknown) off_ = true;
          else if (format_ == Format::Json) json_char(c, out);
          else xml_char(c, out);
          break;
        case Format::Json: json_char(c, out); break;
        case Format::Xml: xml_char(c, out); break;
      }
    }
    if (off_) return;
    if (format_ == Format::Json && lex_ == Lex::String && !key_ && in_arguments()) flush_json_string(out, false);
    if (format_ == Format::Xml && xml_ == Xml::Value && string_value_) flush_xml_value(out, false);
  }

  // The arguments have begun: the name is known.
  bool started() const { return started_; }
  const std::string& name() const { return name_; }

 private:
  enum class Format { Unknown, Json, Xml };

  // ---- {"name": "NAME", "arguments": {...}}
  enum class Lex { Between, String, Scalar };
  enum class Expect { KeyOrEnd, Key, Colon, Value, ValueOrEnd, CommaOrEnd };
  struct Frame {
    bool object;
    Expect expect;
    std::vector<std::string> keys;  // an object's keys so far (inside the arguments)
  };

  bool in_arguments() const { return args_depth_ > 0 && stack_.size() >= args_depth_; }
  bool call_member() const { return stack_.size() == 1; }  // a value of the call object

  bool expects_value() const {
    if (stack_.empty()) return !top_done_;
    const Expect e = stack_.back().expect;
    return e == Expect::Value || e == Expect::ValueOrEnd;
  }
  void value_end() {
    if (stack_.empty()) top_done_ = true;
    else stack_.back().expect = Expect::CommaOrEnd;
  }

  void json_char(char c, std::string& out) {
    if (lex_ == Lex::String) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        end_string(out);
        return;
      }
      tok_ += c;
      return;
    }
    if (lex_ == Lex::Scalar) {
      if (is_scalar_char(c)) {
        tok_ += c;
        return;
      }
      end_scalar(out);
      if (off_) return;
    }
    structure(c, out);
  }

  void structure(char c, std::string& out) {
    if (is_ws(c)) return;
    Frame* f = stack_.empty() ? nullptr : &stack_.back();
    switch (c) {
      case '"':
        key_ = f && f->object && (f->expect == Expect::KeyOrEnd || f->expect == Expect::Key);
        if (!key_ && (!expects_value() || stack_.empty())) return give_up();
        if (!key_ && call_member() && member_ == "arguments") return give_up();  // a string of JSON
        lex_ = Lex::String;
        tok_.clear();
        tok_sent_ = 0;
        if (!key_ && in_arguments()) out += '"';
        return;
      case '{':
      case '[':
        if (!expects_value() || (stack_.empty() && c != '{')) return give_up();
        if (call_member() && member_ == "arguments") {
          if (c != '{' || name_.empty() || started_) return give_up();
          started_ = true;
          args_depth_ = stack_.size() + 1;
        }
        stack_.push_back({c == '{', c == '{' ? Expect::KeyOrEnd : Expect::ValueOrEnd, {}});
        if (in_arguments()) out += c;
        return;
      case '}':
      case ']':
        if (!f || f->object != (c == '}')) return give_up();
        if (f->expect != Expect::CommaOrEnd && f->expect != (f->object ? Expect::KeyOrEnd : Expect::ValueOrEnd))
          return give_up();
        if (in_arguments()) out += c;
        stack_.pop_back();
        value_end();
        return;
      case ',':
        if (!f || f->expect != Expect::CommaOrEnd) return give_up();
        f->expect = f->object ? Expect::Key : Expect::Value;
        if (in_arguments()) out += c;
        return;
      case ':':
        if (!f || f->expect != Expect::Colon) return give_up();
        f->expect = Expect::Value;
        if (in_arguments()) out += c;
        return;
      default:
        if (!expects_value() || stack_.empty() || !(c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n'))
          return give_up();
        if (call_member() && member_ == "arguments") return give_up();
        lex_ = Lex::Scalar;
        tok_.assign(1, c);
        return;
    }
  }

  std::optional<std::string> decode(std::string_view raw) const {
    auto j = parse_json("\"" + std::string(raw) + "\"");
    if (!j || !j->is_string()) return std::nullopt;
    return j->get<std::string>();
  }

  void end_string(std::string& out) {
    lex_ = Lex::Between;
    if (key_) {
      auto key = decode(tok_);
      if (!key) return give_up();
      Frame& f = stack_.back();
      f.expect = Expect::Colon;
      if (call_member()) member_ = *key;
      if (!in_arguments()) return;
      // A repeated key replaces the earlier value where it stands: nothing to stream.
      if (std::find(f.keys.begin(), f.keys.end(), *key) != f.keys.end()) return give_up();
      f.keys.push_back(*key);
      out += dump(ojson(*key));
      return;
    }
    if (in_arguments()) {
      flush_json_string(out, true);
      if (off_) return;
      out += '"';
    } else if (call_member() && member_ == "name") {
      auto name = decode(tok_);
      if (!name || started_) return give_up();
      name_ = *name;
    }
    value_end();
  }

  void flush_json_string(std::string& out, bool all) {
    const size_t end = all ? tok_.size() : whole_string_units(tok_, tok_sent_);
    if (end == tok_sent_) return;
    if (auto text = decode(std::string_view(tok_).substr(tok_sent_, end - tok_sent_))) {
      out += json_string_body(*text);
      tok_sent_ = end;
      return;
    }
    // Something in it is not JSON: what comes before it goes out, whatever the cuts were.
    while (tok_sent_ < end) {
      const size_t unit = whole_string_units(std::string_view(tok_).substr(0, end), tok_sent_, /*one=*/true);
      auto text = unit > tok_sent_ ? decode(std::string_view(tok_).substr(tok_sent_, unit - tok_sent_)) : std::nullopt;
      if (!text) break;
      out += json_string_body(*text);
      tok_sent_ = unit;
    }
    give_up();
  }

  void end_scalar(std::string& out) {
    lex_ = Lex::Between;
    auto j = parse_json(tok_);
    if (!j || !j->is_primitive() || j->is_string()) return give_up();
    if (in_arguments()) out += dump(*j);
    value_end();
  }

  // ---- <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>
  enum class Xml { Function, Name, Between, ParamName, Value, Done };
  static constexpr std::string_view kFunction = "<function=";
  static constexpr std::string_view kParameter = "<parameter=";
  static constexpr std::string_view kEndParameter = "</parameter>";
  static constexpr std::string_view kEndFunction = "</function>";

  void xml_char(char c, std::string& out) {
    switch (xml_) {
      case Xml::Function:
        tok_ += c;
        if (!kFunction.starts_with(tok_)) return give_up();
        if (tok_.size() == kFunction.size()) {
          xml_ = Xml::Name;
          tok_.clear();
        }
        return;
      case Xml::Name:
      case Xml::ParamName:
        if (c == '<' || c == '\n') return give_up();
        if (c != '>') {
          tok_ += c;
          return;
        }
        if (tok_.empty()) return give_up();
        if (xml_ == Xml::Name) {
          name_ = tok_;
          started_ = true;
          xml_ = Xml::Between;
        } else {
          begin_value(out);
        }
        tok_.clear();
        return;
      case Xml::Between:
        if (tok_.empty() && is_ws(c)) return;
        tok_ += c;
        if (tok_ == kParameter) {
          xml_ = Xml::ParamName;
          tok_.clear();
        } else if (tok_ == kEndFunction) {
          out += params_.empty() ? "{}" : "}";
          xml_ = Xml::Done;
          tok_.clear();
        } else if (!kParameter.starts_with(tok_) && !kEndFunction.starts_with(tok_)) {
          give_up();
        }
        return;
      case Xml::Value:
        tok_ += c;
        if (tok_.ends_with(kEndParameter)) end_value(out);
        return;
      case Xml::Done: return;  // whitespace; anything else fails the parse of the whole call
    }
  }

  void begin_value(std::string& out) {
    // A repeated parameter replaces the earlier value where it stands: nothing to stream.
    if (std::find(params_.begin(), params_.end(), tok_) != params_.end()) return give_up();
    out += params_.empty() ? "{" : ",";
    out += dump(ojson(tok_)) + ":";
    string_value_ = is_string_parameter(*tools_, name_, tok_);
    if (string_value_) out += '"';
    params_.push_back(tok_);
    xml_ = Xml::Value;
    value_start_ = std::string::npos;
  }

  // The template puts a newline after <parameter=P> and before </parameter>: not part of the
  // value. The leading one is known with the first character.
  void flush_xml_value(std::string& out, bool all) {
    if (tok_.empty()) return;
    if (value_start_ == std::string::npos) value_start_ = tok_sent_ = tok_[0] == '\n' ? 1 : 0;
    size_t end = tok_.size();
    if (!all) {
      end -= std::max(partial_tag_suffix(tok_, "\n</parameter>"), partial_tag_suffix(tok_, kEndParameter));
      end = std::max(end, tok_sent_);
      end = tok_sent_ + utf8::stable_prefix_length(std::string_view(tok_).substr(tok_sent_, end - tok_sent_));
    }
    out += json_string_body(std::string_view(tok_).substr(tok_sent_, end - tok_sent_));
    tok_sent_ = end;
  }

  void end_value(std::string& out) {
    tok_.resize(tok_.size() - kEndParameter.size());
    if (string_value_) {
      if (value_start_ == std::string::npos && !tok_.empty()) value_start_ = tok_sent_ = tok_[0] == '\n' ? 1 : 0;
      if (value_start_ != std::string::npos && tok_.size() > value_start_ && tok_.back() == '\n') tok_.pop_back();
      if (tok_sent_ > tok_.size()) return give_up();  // cannot happen: a held-back newline was sent
      flush_xml_value(out, true);
      out += '"';
    } else {
      std::string_view v = tok_;
      if (v.starts_with('\n')) v.remove_prefix(1);
      if (v.ends_with('\n')) v.remove_suffix(1);
      out += dump(parameter_value(v, false));
    }
    tok_.clear();
    tok_sent_ = 0;
    xml_ = Xml::Between;
  }

  void give_up() { off_ = true; }

  const std::vector<ToolSpec>* tools_ = nullptr;
  Format format_ = Format::Unknown;
  bool off_ = false;
  bool started_ = false;
  std::string name_;
  std::string tok_;      // the token being read: a string's raw text, a scalar, a tag, a value
  size_t tok_sent_ = 0;  // of tok_: the bytes already written out
  // JSON
  Lex lex_ = Lex::Between;
  bool escape_ = false, key_ = false, top_done_ = false;
  std::vector<Frame> stack_;
  std::string member_;     // the call object's key being read
  size_t args_depth_ = 0;  // stack_ size inside the arguments object; 0 before
  // XML
  Xml xml_ = Xml::Function;
  std::vector<std::string> params_;
  bool string_value_ = false;
  size_t value_start_ = std::string::npos;  // of tok_: where the value starts; npos: not known yet
};

// ------------------------------------------------------------------------------- the parser

ToolCallParser::ToolCallParser(std::vector<ToolSpec> tools, bool stream_arguments)
    : tools_(std::move(tools)), stream_arguments_(stream_arguments) {}
ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

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
  held_ws_ = all.substr(end);
  all.resize(end);
  if (all.empty()) return;
  if (!out.empty() && out.back().kind == ToolEvent::Kind::Content) out.back().text += all;
  else out.push_back({ToolEvent::Kind::Content, std::move(all), {}});
}

// Reads the call's body up to `certain` (what cannot be part of </tool_call>).
void ToolCallParser::stream_call(Out& out, size_t certain) {
  if (!streamer_) streamer_ = std::make_unique<ArgumentStreamer>();
  if (certain <= streamed_bytes_) return;
  std::string fragment;
  streamer_->feed(std::string_view(pending_).substr(streamed_bytes_, certain - streamed_bytes_), tools_, fragment);
  streamed_bytes_ = certain;
  if (!begun_ && streamer_->started()) {
    begun_ = true;
    out.push_back({ToolEvent::Kind::CallBegin, {}, {streamer_->name(), {}}});
  }
  if (begun_ && !fragment.empty()) {
    sent_ += fragment;
    out.push_back({ToolEvent::Kind::Arguments, std::move(fragment), {}});
  }
}

void ToolCallParser::close_call(Out& out, bool closed) {
  in_call_ = false;
  std::optional<ParsedCall> call = parse_tool_call(pending_, tools_);
  if (begun_) {
    // The client has the call's start: it ends as a call, with the rest of its arguments when
    // the whole text confirms what was sent, else with what was sent.
    ParsedCall end{streamer_->name(), sent_};
    if (call && call->name == end.name && call->arguments.starts_with(sent_)) {
      if (call->arguments.size() > sent_.size())
        out.push_back({ToolEvent::Kind::Arguments, call->arguments.substr(sent_.size()), {}});
      end.arguments = std::move(call->arguments);
    }
    call = std::move(end);
  } else if (call && stream_arguments_) {
    out.push_back({ToolEvent::Kind::CallBegin, {}, {call->name, {}}});
    out.push_back({ToolEvent::Kind::Arguments, call->arguments, {}});
  }
  if (call) {
    held_ws_.clear();  // whitespace between content and a call, or between calls
    out.push_back({ToolEvent::Kind::CallEnd, {}, std::move(*call)});
    ++calls_made_;
    after_call_ = true;
  } else {
    std::string raw = std::string(kOpen) + pending_;
    if (closed) raw += kClose;
    emit_content(out, raw);
  }
  pending_.clear();
  streamer_.reset();
  streamed_bytes_ = 0;
  begun_ = false;
  sent_.clear();
}

ToolCallParser::Out ToolCallParser::feed(std::string_view piece) {
  Out out;
  pending_ += piece;
  for (;;) {
    if (in_call_) {
      const size_t pos = pending_.find(kClose);
      if (pos == std::string::npos) {
        if (stream_arguments_) stream_call(out, pending_.size() - partial_tag_suffix(pending_, kClose));
        break;
      }
      std::string rest = pending_.substr(pos + kClose.size());
      pending_.resize(pos);
      if (stream_arguments_) stream_call(out, pos);  // what the call streams never depends on the cuts
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
    const size_t keep = partial_tag_suffix(pending_, kOpen);
    emit_content(out, std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    break;
  }
  return out;
}

ToolCallParser::Out ToolCallParser::finish() {
  Out out;
  if (in_call_) {
    if (stream_arguments_) stream_call(out, pending_.size());
    close_call(out, /*closed=*/false);
  } else {
    emit_content(out, pending_);
    pending_.clear();
  }
  if (calls_made_ == 0 && !held_ws_.empty()) {
    if (!out.empty() && out.back().kind == ToolEvent::Kind::Content) out.back().text += held_ws_;
    else out.push_back({ToolEvent::Kind::Content, held_ws_, {}});
  }
  held_ws_.clear();
  return out;
}

}  // namespace swiftlet::server
