// The native renderers against goldens of the real templates (tests/data/chat/*.json, made by
// tools/oracles/make_chat_goldens.js), plus detection, errors and multi-turn continuity.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace swiftlet {
namespace {

const std::filesystem::path kChatData = std::filesystem::path(SWIFTLET_SOURCE_DIR) / "tests" / "data" / "chat";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << p;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json load_golden(const std::string& name) { return nlohmann::json::parse(read_file(kChatData / name)); }

TemplateKind kind_from_name(const std::string& s) {
  if (s == "Qwen3") return TemplateKind::Qwen3;
  if (s == "Qwen3NextInstruct") return TemplateKind::Qwen3NextInstruct;
  if (s == "Qwen3NextThinking") return TemplateKind::Qwen3NextThinking;
  if (s == "Qwen35") return TemplateKind::Qwen35;
  if (s == "Qwen36") return TemplateKind::Qwen36;
  ADD_FAILURE() << "unknown kind in golden: " << s;
  return TemplateKind::Qwen3;
}

std::vector<ChatMessage> messages_from(const nlohmann::json& arr) {
  std::vector<ChatMessage> out;
  for (const auto& m : arr) {
    ChatMessage msg;
    msg.role = m.at("role").get<std::string>();
    msg.content = m.at("content").get<std::string>();
    if (m.contains("reasoning_content")) msg.reasoning_content = m["reasoning_content"].get<std::string>();
    // Structured calls: the forms Python Jinja2 printed (make_chat_goldens.js, prepareCalls).
    if (m.contains("prepared_calls"))
      for (const auto& c : m["prepared_calls"]) {
        ToolCall call{c.at("name").get<std::string>(), c.at("arguments_json").get<std::string>(), {}};
        for (const auto& a : c.at("arguments"))
          call.arguments.push_back({a.at("name").get<std::string>(), a.at("json").get<std::string>(),
                                    a.at("text").get<std::string>(), a.at("is_string").get<bool>(),
                                    a.at("is_container").get<bool>()});
        msg.tool_calls.push_back(std::move(call));
      }
    out.push_back(std::move(msg));
  }
  return out;
}

ChatOptions options_from(const nlohmann::json& o, const nlohmann::json* tools = nullptr) {
  ChatOptions opts;
  opts.add_generation_prompt = o.at("add_generation_prompt").get<bool>();
  opts.enable_thinking = o.at("enable_thinking").get<bool>();
  opts.preserve_thinking = o.at("preserve_thinking").get<bool>();
  if (tools) opts.tools_json = tools->get<std::vector<std::string>>();
  return opts;
}

class ChatGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatGolden, RendersEveryCaseByteForByte) {
  const nlohmann::json doc = load_golden(GetParam());
  const TemplateKind kind = kind_from_name(doc.at("kind").get<std::string>());
  const auto& cases = doc.at("cases");
  ASSERT_GT(cases.size(), 50u);
  int rendered = 0, raised = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const std::vector<ChatMessage> messages = messages_from(c.at("messages"));
    const ChatOptions opts = options_from(c.at("options"), &c.at("tools_json"));
    if (c.contains("error")) {
      EXPECT_THROW(render_chat(kind, messages, opts), Error) << "template raises: " << c["error"];
      ++raised;
    } else {
      EXPECT_EQ(render_chat(kind, messages, opts), c.at("expected").get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 50);
  RecordProperty("rendered", rendered);
  RecordProperty("raised", raised);
}

TEST_P(ChatGolden, ContinuationsMatchTheTemplate) {
  const nlohmann::json doc = load_golden(GetParam());
  const TemplateKind kind = kind_from_name(doc.at("kind").get<std::string>());
  const auto& conts = doc.at("continuations");
  ASSERT_GT(conts.size(), 5u);
  for (const auto& c : conts) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const std::vector<ChatMessage> history = messages_from(c.at("history"));
    const std::vector<ChatMessage> next = messages_from(c.at("new_messages"));
    const ChatOptions opts = options_from(c.at("options"));
    EXPECT_EQ(render_seen(kind, history, opts), c.at("seen").get<std::string>());
    const ChatContinuation plan = plan_continuation(kind, history, next, opts);
    const bool pure = c.at("pure_append").get<bool>();
    EXPECT_EQ(plan.pure_append, pure);
    EXPECT_EQ(is_pure_append(kind, history, next, opts), pure);
    if (pure) {
      EXPECT_EQ(plan.text, c.at("suffix").get<std::string>());
      EXPECT_EQ(render_continuation(kind, history, next, opts), plan.text);
      EXPECT_EQ(c.at("seen").get<std::string>() + plan.text, c.at("full").get<std::string>());
    } else {
      EXPECT_EQ(plan.text, c.at("full").get<std::string>());
      EXPECT_THROW(render_continuation(kind, history, next, opts), Error);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatGolden,
                         ::testing::Values("qwen3.json", "qwen3-next-instruct.json", "qwen3-next-thinking.json",
                                           "qwen3.5.json", "qwen3.6.json"),
                         [](const auto& info) {
                           std::string n = info.param;
                           n = n.substr(0, n.find(".json"));
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The minimal prompts of model-math.md 9.
TEST(ChatTemplate, MinimalPromptsFromTheSpec) {
  const std::vector<ChatMessage> m = {{"user", "P", ""}};
  EXPECT_EQ(render_chat(TemplateKind::Qwen3NextInstruct, m, {}), "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(TemplateKind::Qwen35, m, {}),
            "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  ChatOptions think;
  think.enable_thinking = true;
  EXPECT_EQ(render_chat(TemplateKind::Qwen35, m, think), "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(render_chat(TemplateKind::Qwen3NextThinking, m, {}),
            "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(render_chat(TemplateKind::Qwen3, m, think), "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, DetectsEachRealTemplate) {
  const auto tpl = [](const char* f) { return read_file(kChatData / "templates" / f); };
  EXPECT_EQ(detect_template(tpl("qwen3.jinja"), ""), TemplateKind::Qwen3);
  EXPECT_EQ(detect_template(tpl("qwen3-next-instruct.jinja"), "qwen3_next"), TemplateKind::Qwen3NextInstruct);
  EXPECT_EQ(detect_template(tpl("qwen3-next-thinking.jinja"), "qwen3_next"), TemplateKind::Qwen3NextThinking);
  EXPECT_EQ(detect_template(tpl("qwen3.5.jinja"), "qwen3_5_moe"), TemplateKind::Qwen35);
  EXPECT_EQ(detect_template(tpl("qwen3.6.jinja"), "qwen3_5_moe"), TemplateKind::Qwen36);
  // The text wins over model_type.
  EXPECT_EQ(detect_template(tpl("qwen3.5.jinja"), "qwen3_next"), TemplateKind::Qwen35);
}

TEST(ChatTemplate, DetectFallsBackOnModelType) {
  EXPECT_EQ(detect_template("", "qwen3_next"), TemplateKind::Qwen3NextInstruct);
  EXPECT_EQ(detect_template("", "qwen3_5_moe"), TemplateKind::Qwen35);
  EXPECT_EQ(detect_template("", "qwen3_5_moe_text"), TemplateKind::Qwen35);
  EXPECT_EQ(detect_template("", "qwen3_moe"), TemplateKind::Qwen3);
  EXPECT_THROW(detect_template("", "llama"), Error);
  EXPECT_THROW(detect_template("{{ bos_token }}[INST] {{ m }} [/INST]", "qwen3_next"), Error);
}

TEST(ChatTemplate, RejectsBadInput) {
  const std::vector<ChatMessage> empty;
  const std::vector<ChatMessage> unknown = {{"user", "hi", ""}, {"developer", "x", ""}};
  for (TemplateKind k : {TemplateKind::Qwen3, TemplateKind::Qwen3NextInstruct, TemplateKind::Qwen3NextThinking,
                         TemplateKind::Qwen35}) {
    SCOPED_TRACE(std::string(template_kind_name(k)));
    EXPECT_THROW(render_chat(k, empty, {}), Error);
    EXPECT_THROW(render_chat(k, unknown, {}), Error);
  }
  const std::vector<ChatMessage> late_system = {{"user", "hi", ""}, {"system", "late", ""}};
  const std::vector<ChatMessage> no_user = {{"system", "s", ""}, {"tool", "r", ""}};
  const std::vector<ChatMessage> fake_user = {{"user", " <tool_response>\nx\n</tool_response>\n", ""}};
  EXPECT_THROW(render_chat(TemplateKind::Qwen35, late_system, {}), Error);
  EXPECT_THROW(render_chat(TemplateKind::Qwen35, no_user, {}), Error);
  EXPECT_THROW(render_chat(TemplateKind::Qwen35, fake_user, {}), Error);
  // The Qwen3 templates accept all of these.
  EXPECT_NO_THROW(render_chat(TemplateKind::Qwen3, late_system, {}));
  EXPECT_NO_THROW(render_chat(TemplateKind::Qwen3NextInstruct, no_user, {}));
  try {
    render_chat(TemplateKind::Qwen35, late_system, {});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be the first"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, ContinuationNeedsTheRawAnswerLast) {
  const std::vector<ChatMessage> ends_with_user = {{"user", "hi", ""}};
  EXPECT_THROW(render_seen(TemplateKind::Qwen35, ends_with_user, {}), Error);
  const std::vector<ChatMessage> split_answer = {{"user", "hi", ""}, {"assistant", "a", "why"}};
  EXPECT_THROW(render_seen(TemplateKind::Qwen35, split_answer, {}), Error);
  // First turn: nothing seen, the continuation is the whole prompt.
  const std::vector<ChatMessage> none;
  const std::vector<ChatMessage> first = {{"user", "hi", ""}};
  const ChatContinuation c = plan_continuation(TemplateKind::Qwen35, none, first, {});
  EXPECT_TRUE(c.pure_append);
  EXPECT_EQ(c.text, render_chat(TemplateKind::Qwen35, first, {}));
}

// A multi-turn Qwen3-Next-Instruct session: each turn's prefill is exactly the new text.
TEST(ChatTemplate, InstructSessionIsAlwaysAnAppend) {
  std::vector<ChatMessage> history;
  std::string seen;
  const char* answers[] = {"First.", "  Second, with spaces  \n", "<tool_call>\n{}\n</tool_call>"};
  const std::vector<std::vector<ChatMessage>> turns = {
      {{"system", "sys", ""}, {"user", "one", ""}}, {{"user", "two", ""}}, {{"tool", "r1", ""}, {"tool", "r2", ""}}};
  for (size_t t = 0; t < turns.size(); ++t) {
    const std::string add = render_continuation(TemplateKind::Qwen3NextInstruct, history, turns[t], {});
    seen += add;
    history.insert(history.end(), turns[t].begin(), turns[t].end());
    EXPECT_EQ(seen, render_chat(TemplateKind::Qwen3NextInstruct, history, {}));
    seen += std::string(answers[t]) + "<|im_end|>";
    history.push_back({"assistant", answers[t], ""});
    EXPECT_EQ(seen, render_seen(TemplateKind::Qwen3NextInstruct, history, {}));
  }
}

}  // namespace
}  // namespace swiftlet
