// Chat template rendering of arbitrary message lists (roles, contents, reasoning, tools, options)
// for every template kind, and the multi-turn continuation planner: Error or a prompt, nothing
// else.
#include "core/error.h"
#include "tokenizer/chat_template.h"

#include <fuzzer/FuzzedDataProvider.h>

using swiftlet::ChatMessage;
using swiftlet::TemplateKind;

namespace {

std::vector<ChatMessage> messages(FuzzedDataProvider& in, size_t max) {
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  std::vector<ChatMessage> out;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, max);
  for (size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    ChatMessage m;
    m.role = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? in.ConsumeRandomLengthString(8)
                                                        : kRoles[in.ConsumeIntegralInRange<int>(0, 3)];
    m.content = in.ConsumeRandomLengthString(64);
    if (in.ConsumeBool()) m.reasoning_content = in.ConsumeRandomLengthString(32);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const TemplateKind kind = static_cast<TemplateKind>(in.ConsumeIntegralInRange<int>(0, 3));
  swiftlet::ChatOptions o;
  o.add_generation_prompt = in.ConsumeBool();
  o.enable_thinking = in.ConsumeBool();
  o.preserve_thinking = in.ConsumeBool();
  if (in.ConsumeBool()) o.tools_json.push_back(in.ConsumeRandomLengthString(48));
  const std::vector<ChatMessage> history = messages(in, 6), next = messages(in, 3);
  try {
    (void)swiftlet::render_chat(kind, history, o);
  } catch (const swiftlet::Error&) {
  }
  try {
    (void)swiftlet::plan_continuation(kind, history, next, o);
    (void)swiftlet::render_continuation(kind, history, next, o);
  } catch (const swiftlet::Error&) {
  }
  try {
    (void)swiftlet::detect_template(in.ConsumeRandomLengthString(128), in.ConsumeRandomLengthString(16));
  } catch (const swiftlet::Error&) {
  }
  return 0;
}
