// The routes: JSON in, native structs to the queue, JSON (or SSE events) out. This is the
// only layer that knows JSON and the OpenAI wire shapes; it also renders chat templates and
// tokenizes, so the queue receives token ids. Errors anywhere above the engine thread are
// ApiErrors, turned into OpenAI's error object by error_reply() and nowhere else.
#pragma once

#include "server/api_types.h"
#include "server/engine_worker.h"
#include "server/think_splitter.h"

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace swiftlet::server {

class Metrics;

struct RouteOptions {
  std::string model_id;              // the name /v1/models lists; requests naming another get 404
  int default_completion_tokens = 16;  // /v1/completions without max_tokens (OpenAI's default)
};

class ReplyStream;

// What the transport sends back: a complete body, or a stream that produces one.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::shared_ptr<ReplyStream> stream;
  std::vector<std::pair<std::string, std::string>> headers;  // extra response headers
};

// A response produced while the engine generates. stream=true: server-sent events (a chat
// starts with the role chunk, then content deltas, the finish chunk, the usage chunk when
// asked for, and `data: [DONE]`). stream=false: the whole JSON body once the answer is done.
class ReplyStream {
 public:
  enum class Poll { Data, Idle, Done };

  // Waits up to `timeout` for more output and appends it to `out`. Done: the last bytes are in
  // `out` and there will be no more.
  Poll poll(std::string& out, std::chrono::milliseconds timeout);
  // The client went away: stop generating.
  void cancel() { job_->cancel(); }
  bool sse() const { return sse_; }
  // Non-streamed: the status of the body, known once poll() said Done (an engine failure
  // turns the reply into an error).
  int status() const { return status_; }

  struct Context {
    Endpoint endpoint;
    bool stream, include_usage;
    bool split_thinking, think_opened;  // chat: report <think> blocks as reasoning_content
    std::string id, model, echo;        // echo: completions' echoed prompt
    int64_t created;
    // Chat with tools (tool_choice not "none"): calls in the answer become tool_calls.
    bool parse_tools = false, parallel_tool_calls = true;
    std::vector<ToolSpec> tools;
    int64_t prompt_tokens = 0;
  };
  ReplyStream(std::shared_ptr<Job> job, Context ctx);
  virtual ~ReplyStream() = default;

 protected:
  // The wire format: poll() calls these as the answer comes (another API derives, anthropic.h).
  virtual void on_start(std::string& out);
  // One piece of the answer as the engine produced it (a token's text, or a few).
  virtual void on_text(std::string& out, std::string_view text);
  // The pieces that came together are all in: the text held for one delta goes out.
  virtual void on_flush(std::string& out);
  virtual void on_done(std::string& out, const JobEvent& ev);
  virtual void on_failed(std::string& out, const JobEvent& ev);

  Context ctx_;
  bool sse_;
  int status_ = 200;
  ThinkSplitter think_;
  std::optional<ToolCallParser> tool_parser_;

 private:
  void emit_chat(std::string_view reasoning, std::string_view content);
  void on_tool_event(std::string& out, ToolEvent ev);
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;

  std::shared_ptr<Job> job_;
  bool started_ = false, done_ = false;
  std::string content_, reasoning_;  // non-streamed: the answer so far
  std::vector<std::pair<std::string, ParsedCall>> calls_;  // (id, call)
  bool skip_call_ = false;  // streamed: a call dropped (parallel_tool_calls false) is going by
  std::string delta_reasoning_, delta_content_;  // streamed: text for the next delta
  std::vector<JobEvent> events_;
};

class Routes {
 public:
  Routes(EngineWorker& worker, Metrics& metrics, RouteOptions opts);

  Reply health() const;
  Reply models() const;
  Reply model(const std::string& id) const;  // GET /v1/models/{id}
  Reply metrics() const;
  Reply chat_page() const;
  Reply chat_completions(std::string_view body);
  Reply completions(std::string_view body);

  // The one place errors become OpenAI-shaped JSON.
  static Reply error_reply(const ApiError& e);
  // The error in the shape of the API the path belongs to: Anthropic's for /v1/messages...,
  // OpenAI's for the rest.
  static Reply error_reply_for(const std::string& path, const ApiError& e);

  // The Anthropic Messages API (anthropic.cpp): errors in Anthropic's shape.
  Reply messages(std::string_view body);
  Reply count_tokens(std::string_view body);

  // Text utilities (text_routes.cpp): llama.cpp's /tokenize, /detokenize, /apply-template, /props.
  Reply tokenize(std::string_view body) const;
  Reply detokenize(std::string_view body) const;
  Reply apply_template(std::string_view body) const;
  Reply props() const;

 private:
  struct Started {
    std::shared_ptr<Job> job;
    ReplyStream::Context ctx;
    std::vector<std::string> unenforced;  // schema keywords not enforced: a header and a log line
  };
  // The header naming the unenforced keywords, when there are any.
  static void add_unenforced_header(Reply& r, const std::vector<std::string>& unenforced);
  // Plans and queues a request; throws ApiError.
  Started start(const CompletionRequest& req, const char* id_prefix);
  Reply generate(const CompletionRequest& req);
  nlohmann::ordered_json model_json() const;
  const Engine& ready_engine() const;  // throws 503 while loading

  EngineWorker& worker_;
  Metrics& metrics_;
  RouteOptions opts_;
  int64_t started_at_;
};

// ---- Exposed for the unit tests ---------------------------------------------------------------

// Type-checks a request body. Throws ApiError (400) naming the offending field.
CompletionRequest parse_chat_request(const nlohmann::ordered_json& body);
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body);
nlohmann::ordered_json parse_json_body(std::string_view body);

// A chat request's prompt text, rendered by the model's template. Throws ApiError (400) for
// messages the template rejects.
std::string render_prompt(const CompletionRequest& req, const Engine& engine);

struct PlannedJob {
  JobSpec spec;
  bool think_opened = false;  // chat: the rendered prompt ends inside an opened <think> block
  std::string prompt_text;    // the prompt as text (for completions' echo)
  std::vector<std::string> unenforced;  // schema keywords the answer's grammar leaves out
};

// The job for a request: template rendered, prompt tokenized, sampling resolved against the
// model's defaults, generation capped by the context. Throws ApiError (400) for a prompt that
// does not fit the context or options the model rejects.
PlannedJob plan_job(const CompletionRequest& req, const Engine& engine, int64_t max_context,
                 int default_completion_tokens = 16);

std::string error_json(const ApiError& e);
// A random id: the prefix and 24 letters or digits.
std::string random_id(const char* prefix);

}  // namespace swiftlet::server
