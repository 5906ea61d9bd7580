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
  auto q3 = answer_grammar(forced(nullptr), TemplateKind::Qwen3, false);
  auto q35 = answer_grammar(forced(nullptr), TemplateKind::Qwen35, false);
  EXPECT_TRUE(matches(*q3, json_call));
  EXPECT_TRUE(matches(*q35, xml_call));
  EXPECT_FALSE(matches(*q3, xml_call));
  EXPECT_FALSE(matches(*q35, json_call));
  // A tool without a schema takes an object; required parameters cannot be left out.
  EXPECT_TRUE(matches(*q3, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(*q3, "<tool_call>\n{\"name\": \"now\", \"arguments\": 1}\n</tool_call>"));
  EXPECT_FALSE(matches(*q35, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));
  // A named choice allows that tool only.
  auto named = answer_grammar(forced("now"), TemplateKind::Qwen3, false);
  EXPECT_FALSE(matches(*named, json_call));
  // An opened think block comes first.
  auto think = answer_grammar(forced(nullptr), TemplateKind::Qwen3NextThinking, true);
  EXPECT_TRUE(matches(*think, "Let me see.\n</think>\n\n" + json_call));
  EXPECT_FALSE(matches(*think, json_call));
}

TEST(OutputGrammar, TextIsUnconstrainedAndBadSchemasAre400) {
  CompletionRequest text;
  EXPECT_EQ(answer_grammar(text, TemplateKind::Qwen3, false), nullptr);
  CompletionRequest bad;
  bad.format = CompletionRequest::Format::JsonSchema;
  bad.json_schema = ojson::parse(R"({"type":"string","format":"date"})");
  try {
    answer_grammar(bad, TemplateKind::Qwen3, false);
    ADD_FAILURE() << "format was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "response_format.json_schema.schema");
    EXPECT_NE(std::string(e.what()).find("'format'"), std::string::npos);
  }
}

}  // namespace
}  // namespace swiftlet::server
