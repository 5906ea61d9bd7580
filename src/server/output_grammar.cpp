#include "server/output_grammar.h"

#include "core/error.h"
#include "runtime/json_schema.h"

#include <fmt/format.h>

namespace swiftlet::server {
namespace {

using Seq = Grammar::Sequence;

Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Seq lit(std::string_view s) { return Grammar::literal(s); }
Seq ref(uint32_t r) { return {Grammar::ref(r)}; }

bool is_string_typed(const ojson& schema) {
  if (!schema.is_object()) return false;
  auto t = schema.find("type");
  if (t == schema.end()) return false;
  if (t->is_string()) return *t == "string";
  if (t->is_array())
    for (const auto& x : *t)
      if (x == "string") return true;
  return false;
}

// A Qwen3.5 parameter value: strings raw (as the model writes them and the parser reads them),
// anything else as JSON.
uint32_t xml_value(Grammar& g, JsonSchemaCompiler& c, const ojson& schema, const std::string& path) {
  if (!is_string_typed(schema)) return c.value(schema, path);
  for (const char* key : {"enum", "const"})
    if (auto it = schema.find(key); it != schema.end()) {
      std::vector<Seq> alts;
      for (const auto& v : it->is_array() ? *it : ojson::array({*it}))
        if (v.is_string() && v.get<std::string>().find('<') == std::string::npos) alts.push_back(lit(v.get<std::string>()));
      if (alts.empty()) return c.value(schema, path);
      return g.rule(alts);
    }
  const bool only_string = schema["type"] == "string";
  if (!only_string) return c.raw_text("<");  // string or something else: any text
  return c.raw_string(schema, path, "<");
}

// `<tool_call>\n<function=NAME>\n` + `<parameter=P>\nVALUE\n</parameter>\n`... + `</function>\n</tool_call>`
Seq xml_call(Grammar& g, JsonSchemaCompiler& c, const ToolSpec& tool, const std::string& path) {
  struct Param {
    std::string name;
    ojson schema;
    bool required;
  };
  std::vector<Param> params;
  const ojson& p = tool.parameters;
  if (p.is_object()) {
    // The call lists parameters one by one: keywords about the object as a whole are not written.
    for (const auto& [k, v] : p.items())
      if (k != "type" && k != "properties" && k != "required" && k != "additionalProperties" &&
          schema_parts::is_constraint(k))
        c.report(k, path);
    if (auto props = p.find("properties"); props != p.end() && props->is_object())
      for (const auto& [k, v] : props->items()) params.push_back({k, v, false});
    if (auto req = p.find("required"); req != p.end() && req->is_array())
      for (const auto& r : *req) {
        if (!r.is_string()) continue;
        auto it = std::find_if(params.begin(), params.end(), [&](const Param& x) { return x.name == r.get<std::string>(); });
        if (it == params.end()) params.push_back({r.get<std::string>(), ojson::object(), true});
        else it->required = true;
      }
  }
  uint32_t next = g.rule({{}});
  for (size_t i = params.size(); i-- > 0;) {
    const Param& q = params[i];
    const Seq one = lit("<parameter=" + q.name + ">\n") +
                    ref(xml_value(g, c, q.schema, path + "/properties/" + json_pointer_token(q.name))) +
                    lit("\n</parameter>\n");
    std::vector<Seq> alts = {one + ref(next)};
    if (!q.required) alts.push_back(ref(next));
    next = g.rule(alts);
  }
  return lit("<tool_call>\n<function=" + tool.name + ">\n") + ref(next) + lit("</function>\n</tool_call>");
}

// `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`
Seq json_call(Grammar& g, JsonSchemaCompiler& c, const ToolSpec& tool, const std::string& path) {
  // Arguments are an object whatever the schema leaves open (no parameters, or an empty schema).
  const bool open = tool.parameters.is_null() || tool.parameters.empty();
  const uint32_t args = open ? c.any_object() : c.value(tool.parameters, path);
  return lit("<tool_call>\n{\"name\": " + ojson(tool.name).dump() + ", \"arguments\": ") + ref(args) + lit("}\n</tool_call>");
}

// "keyword@#/x" -> "keyword@BASE/x"
void rebase(const std::vector<std::string>& in, const std::string& base, std::vector<std::string>& out) {
  for (const std::string& u : in) {
    const size_t at = u.find('@');
    out.push_back(u.substr(0, at + 1) + base + u.substr(at + 2));
  }
}

}  // namespace

AnswerGrammar answer_grammar(const CompletionRequest& req, TemplateKind kind, bool think_opened) {
  using TC = CompletionRequest::ToolChoice;
  using F = CompletionRequest::Format;
  const bool forced = !req.tools.empty() && (req.tool_choice == TC::Required || req.tool_choice == TC::Named);
  if (!forced && req.format == F::Text) return {};
  auto g = std::make_shared<Grammar>();
  AnswerGrammar out;
  std::string param;
  try {
    std::vector<Seq> body;
    if (forced) {
      const bool xml = kind == TemplateKind::Qwen35 || kind == TemplateKind::Qwen36;
      std::string field = req.tool_schema_at;
      std::replace(field.begin(), field.end(), '/', '.');
      for (size_t i = 0; i < req.tools.size(); ++i) {
        const ToolSpec& t = req.tools[i];
        if (req.tool_choice == TC::Named && t.name != req.tool_choice_name) continue;
        param = fmt::format("tools[{}].{}", i, field);
        static const ojson kNoParameters = ojson::object();
        const ojson& schema = t.parameters.is_null() ? kNoParameters : t.parameters;  // the compiler keeps a reference
        JsonSchemaCompiler c(*g, schema);
        body.push_back(xml ? xml_call(*g, c, t, "#") : json_call(*g, c, t, "#"));
        rebase(c.unenforced(), fmt::format("/tools/{}/{}", i, req.tool_schema_at), out.unenforced);
      }
    } else {
      param = "response_format.json_schema.schema";
      static const ojson kAnyObject = ojson::object();
      JsonSchemaCompiler c(*g, req.format == F::JsonObject ? kAnyObject : req.json_schema);
      body.push_back(ref(req.format == F::JsonObject ? c.any_object() : c.value(req.json_schema)));
      rebase(c.unenforced(), "/response_format/json_schema/schema", out.unenforced);
    }
    Seq root = ref(g->rule(body));
    if (think_opened) {
      const ojson empty = ojson::object();  // the compiler keeps a reference to its root
      JsonSchemaCompiler c(*g, empty);
      root = ref(c.raw_text("<")) + lit("</think>\n\n") + root;
    }
    g->set_root(g->rule({root}));
    g->finalize();
  } catch (const Error& e) {
    throw invalid_request(e.what(), param, "invalid_schema");
  }
  out.grammar = std::move(g);
  return out;
}

std::string unenforced_header(const std::vector<std::string>& unenforced) {
  constexpr size_t kMaxBytes = 4000;
  std::string out;
  size_t written = 0;
  for (const std::string& u : unenforced) {
    std::string item;
    for (unsigned char ch : u) {
      if (ch == ',' || ch == '%' || ch < 0x21 || ch > 0x7E) item += fmt::format("%{:02X}", ch);
      else item += char(ch);
    }
    if (out.size() + item.size() + 2 > kMaxBytes) break;
    if (!out.empty()) out += ", ";
    out += item;
    ++written;
  }
  if (written < unenforced.size()) out += fmt::format(", +{} more", unenforced.size() - written);
  return out;
}

}  // namespace swiftlet::server
