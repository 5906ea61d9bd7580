// The grammar of a forced call accepts exactly the call text the real templates render (the
// chat goldens' assistant turns), and the reasoning prefix of an opened think block.
#include "server/output_grammar.h"

#include <gtest/gtest.h>

namespace swiftlet::server {
namespace {

bool matches(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g);
  const int32_t s = m.step(m.start(), text);
  return s != GrammarMatcher::kDead && m.accepting(s);
}

CompletionRequest forced(const char* name) {
  CompletionRequest r;
  r.tools = {{"get_weather", ojson::parse(R"({"type":"object","properties":{"city":{"type":"string"},
                 "unit":{"type":"string","enum":["c","f"]}},"required":["city"]})")},
             {"now", ojson::object()}};
  r.tool_choice = name ? CompletionRequest::ToolChoice::Named : CompletionRequest::ToolChoice::Required;
  if (name) r.tool_choice_name = name;
  return r;
}

TEST(OutputGrammar, ForcedCallsHaveTheTemplatesFormat) {
  // As tests/data/chat/qwen3.json and qwen3.5.json render {"city": "Paris", "unit": "c"}.
  const std::string json_call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  const std::string xml_call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                               "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
  auto q3 = answer_grammar(forced(nullptr), TemplateKind::Qwen3, false).grammar;
  auto q35 = answer_grammar(forced(nullptr), TemplateKind::Qwen35, false).grammar;
  EXPECT_TRUE(matches(*q3, json_call));
  EXPECT_TRUE(matches(*q35, xml_call));
  EXPECT_FALSE(matches(*q3, xml_call));
  EXPECT_FALSE(matches(*q35, json_call));
  // A tool without a schema takes an object; required parameters cannot be left out.
  EXPECT_TRUE(matches(*q3, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(*q3, "<tool_call>\n{\"name\": \"now\", \"arguments\": 1}\n</tool_call>"));
  EXPECT_FALSE(matches(*q35, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));
  // A named choice allows that tool only.
  auto named = answer_grammar(forced("now"), TemplateKind::Qwen3, false).grammar;
  EXPECT_FALSE(matches(*named, json_call));
  // An opened think block comes first.
  auto think = answer_grammar(forced(nullptr), TemplateKind::Qwen3NextThinking, true).grammar;
  EXPECT_TRUE(matches(*think, "Let me see.\n</think>\n\n" + json_call));
  EXPECT_FALSE(matches(*think, json_call));
}

TEST(OutputGrammar, TextIsUnconstrainedAndInvalidSchemasAre400) {
  CompletionRequest text;
  EXPECT_EQ(answer_grammar(text, TemplateKind::Qwen3, false).grammar, nullptr);
  CompletionRequest object;  // json_object: no schema at all
  object.format = CompletionRequest::Format::JsonObject;
  const AnswerGrammar any = answer_grammar(object, TemplateKind::Qwen3, false);
  EXPECT_TRUE(matches(*any.grammar, R"({"k": [1, null]})"));
  EXPECT_FALSE(matches(*any.grammar, "[1]"));
  EXPECT_TRUE(any.unenforced.empty());
  CompletionRequest bad;
  bad.format = CompletionRequest::Format::JsonSchema;
  bad.json_schema = ojson::parse(R"({"type":"object","properties":{"n":{"type":"integer","minimum":"a"}}})");
  try {
    answer_grammar(bad, TemplateKind::Qwen3, false);
    ADD_FAILURE() << "an invalid schema was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "response_format.json_schema.schema");
    EXPECT_NE(std::string(e.what()).find("#/properties/n/minimum"), std::string::npos) << e.what();
  }
}

// Valid schemas are accepted; what the grammar leaves out is named with a pointer into the
// request body, for OpenAI's and Anthropic's tool shapes and for response_format.
TEST(OutputGrammar, UnenforcedKeywordsArePointersIntoTheRequest) {
  CompletionRequest rf;
  rf.format = CompletionRequest::Format::JsonSchema;
  rf.json_schema = ojson::parse(R"({"type":"object","properties":{"a/b":{"type":"integer","minimum":1,"not":{"const":3}}},
      "required":["a/b"]})");
  const AnswerGrammar a = answer_grammar(rf, TemplateKind::Qwen3, false);
  EXPECT_EQ(a.unenforced, std::vector<std::string>{"not@/response_format/json_schema/schema/properties/a~1b"});
  EXPECT_TRUE(matches(*a.grammar, R"({"a/b": 5})"));
  EXPECT_FALSE(matches(*a.grammar, R"({"a/b": 0})"));  // minimum is enforced

  CompletionRequest tools = forced(nullptr);
  tools.tools[0].parameters["properties"]["city"]["pattern"] = "^(?=x)";  // lookahead: outside the subset
  for (TemplateKind kind : {TemplateKind::Qwen3, TemplateKind::Qwen35})
    EXPECT_EQ(answer_grammar(tools, kind, false).unenforced,
              std::vector<std::string>{"pattern@/tools/0/function/parameters/properties/city"});
  tools.tool_schema_at = "input_schema";
  EXPECT_EQ(answer_grammar(tools, TemplateKind::Qwen3, false).unenforced,
            std::vector<std::string>{"pattern@/tools/0/input_schema/properties/city"});

  // Qwen3.5's raw parameter values follow the pattern too.
  CompletionRequest code = forced("get_weather");
  code.tools[0].parameters["properties"]["city"]["pattern"] = "^[A-Z][a-z]+$";
  const AnswerGrammar x = answer_grammar(code, TemplateKind::Qwen35, false);
  EXPECT_TRUE(x.unenforced.empty());
  const std::string call = "<tool_call>\n<function=get_weather>\n<parameter=city>\n";
  EXPECT_TRUE(matches(*x.grammar, call + "Paris\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(matches(*x.grammar, call + "paris\n</parameter>\n</function>\n</tool_call>"));
}

TEST(OutputGrammar, TheHeaderEscapesCommasAndCapsItsLength) {
  EXPECT_EQ(unenforced_header({"not@/a", "pattern@/b,c", "format@/d e%"}), "not@/a, pattern@/b%2Cc, format@/d%20e%25");
  std::vector<std::string> many(1000, "uniqueItems@/response_format/json_schema/schema/items");
  const std::string h = unenforced_header(many);
  EXPECT_LE(h.size(), 4100u);
  EXPECT_NE(h.find("more"), std::string::npos);
}

}  // namespace
}  // namespace swiftlet::server
