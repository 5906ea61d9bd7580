// The Anthropic Messages API over the same queue and engine: POST /v1/messages and
// /v1/messages/count_tokens. A request becomes the same CompletionRequest an OpenAI chat
// request does (system -> a system message, tool_use blocks -> tool_calls, tool_result blocks ->
// tool messages, tool_choice any -> required); the answer comes back as content blocks
// (thinking, text, tool_use), streamed as Anthropic's event sequence:
//   message_start, then per block content_block_start / content_block_delta... /
//   content_block_stop, then message_delta (stop_reason, usage) and message_stop.
// Errors have Anthropic's shape {"type": "error", "error": {"type", "message"}}, the message
// starting with the parameter's path ("messages.1.content.0.type: ...").
#pragma once

#include "server/routes.h"

#include <nlohmann/json.hpp>

namespace swiftlet::server {

// Type-checks a Messages body (count_only: /count_tokens, where max_tokens is not required).
// Throws ApiError (400) naming the parameter.
CompletionRequest parse_messages_request(const nlohmann::ordered_json& body, bool count_only);

std::string anthropic_error_json(const ApiError& e);
Reply anthropic_error_reply(const ApiError& e);

class AnthropicStream : public ReplyStream {
 public:
  AnthropicStream(std::shared_ptr<Job> job, Context ctx) : ReplyStream(std::move(job), std::move(ctx)) {}

 protected:
  void on_start(std::string& out) override;
  void on_text(std::string& out, std::string_view text) override;
  void on_flush(std::string& out) override;
  void on_done(std::string& out, const JobEvent& ev) override;
  void on_failed(std::string& out, const JobEvent& ev) override;

 private:
  enum class Block { None, Thinking, Text, ToolUse };
  void emit(std::string& out, Block kind, std::string_view text);
  void on_tool_event(std::string& out, ToolEvent ev);
  void close_block(std::string& out);
  void event(std::string& out, const char* name, const nlohmann::ordered_json& data) const;

  Block open_ = Block::None;
  int index_ = -1;             // of the open (or last) block
  bool called_ = false;        // a tool_use block was produced
  bool skip_call_ = false;     // streamed: a call dropped (disable_parallel_tool_use) is going by
  std::string delta_;          // streamed: text of the open block for the next delta
  nlohmann::ordered_json blocks_ = nlohmann::ordered_json::array();  // non-streamed: the content so far
};

}  // namespace swiftlet::server
