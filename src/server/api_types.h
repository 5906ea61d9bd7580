// The native side of the OpenAI-compatible API: what a request asks for and what an error
// says, as plain structs. routes.cpp is the only place that turns them into / out of JSON; the
// queue and the engine thread below it only ever see these.
#pragma once

#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace swiftlet::server {

// An error the client receives as OpenAI's error object
//   {"error": {"message", "type", "param", "code"}}
// with `status` as the HTTP status. Thrown anywhere above the engine thread and turned into a
// response in one place (Routes::error_reply).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }  // "" -> null
  const std::string& code() const { return code_; }    // "" -> null

 private:
  int status_;
  std::string type_, param_, code_;
};

// The common kinds, with OpenAI's type names.
ApiError invalid_request(std::string message, std::string param = "", std::string code = "");  // 400
ApiError not_found(std::string message, std::string code = "");                                 // 404
ApiError unauthorized(std::string message);                                                      // 401
ApiError payload_too_large(std::string message);                                                 // 413
ApiError queue_full(std::string message);                                                        // 429
ApiError unavailable(std::string message, std::string code = "");                                // 503
ApiError internal_error(std::string message);                                                    // 500

enum class Endpoint { ChatCompletions, Completions };

// A /v1/chat/completions or /v1/completions request after type checking. Optional fields that
// were absent (or null) stay empty and fall back on the model's defaults.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string model;  // "" when not given

  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions, as text ...
  std::vector<int32_t> prompt_ids;    // ... or as token ids
  bool prompt_is_ids = false;

  std::optional<int64_t> max_tokens;  // max_tokens / max_completion_tokens
  std::optional<float> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking
  bool echo = false;                    // completions: prepend the prompt to the text
  std::string user;                     // accepted (OpenAI: an end-user id for abuse tracking), unused

  // Chat: tools offered to the model, each as the template prints it (tools_json) and as the
  // output parser and the forced-call grammar need it (tools).
  std::vector<std::string> tools_json;
  std::vector<ToolSpec> tools;
  // Where each tool's schema sits under tools[i], as a JSON pointer (Anthropic: "input_schema").
  std::string tool_schema_at = "function/parameters";
  enum class ToolChoice { None, Auto, Required, Named };
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;  // Named
  bool parallel_tool_calls = true;
  // Chat: the shape of the answer.
  enum class Format { Text, JsonObject, JsonSchema };
  Format format = Format::Text;
  ojson json_schema;  // JsonSchema
};

}  // namespace swiftlet::server
