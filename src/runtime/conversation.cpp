#include "runtime/conversation.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

namespace swiftlet {

Conversation::Conversation(const Engine& engine, ChatOptions chat, SessionOptions session)
    : engine_(engine), chat_(chat), session_(engine.new_session(session)) {
  engine.require_tokenizer();
}

void Conversation::reset() {
  history_.clear();
  seen_.clear();
  session_->reset();
}

void Conversation::set_system(std::string system) {
  system_ = std::move(system);
  reset();
}

Conversation::Turn Conversation::begin_turn(const std::string& user_text, const TurnOptions& opts) const {
  const Tokenizer& tok = engine_.require_tokenizer();
  Turn turn;
  std::vector<ChatMessage>& added = turn.added;
  if (history_.empty() && !system_.empty()) added.push_back({"system", system_, ""});
  added.push_back({"user", user_text, ""});
  ChatContinuation plan = plan_continuation(engine_.template_kind(), history_, added, chat_);
  if (!plan.pure_append && !history_.empty()) {
    // The template would rewrite earlier turns (Qwen3 / Qwen3.5 drop old reasoning blocks).
    // A chat never re-reads its history: the model keeps what it saw, and the new turn is
    // appended as the template renders a turn on its own.
    plan.pure_append = true;
    plan.text = "\n" + render_chat(engine_.template_kind(), added, chat_);
  }

  GenerateRequest& req = turn.req;
  if (plan.pure_append) req.prompt = seen_;
  const std::vector<int32_t> more = tok.encode(plan.text, /*parse_special=*/true);
  req.prompt.insert(req.prompt.end(), more.begin(), more.end());
  req.sampling = opts.sampling;
  req.max_new_tokens = opts.max_new_tokens;
  req.stop = opts.stop;
  req.stop_tokens = engine_.stop_tokens();
  return turn;
}

void Conversation::end_turn(Turn turn, const GenerateResult& res) {
  const Tokenizer& tok = engine_.require_tokenizer();
  // What the model has now seen, as the template will render it next time: the prompt, the
  // raw answer and <|im_end|> (fed with the next turn when generation ended another way).
  seen_ = std::move(turn.req.prompt);
  seen_.insert(seen_.end(), res.tokens.begin(), res.tokens.end());
  const int32_t im_end = tok.token_id("<|im_end|>");
  if (im_end >= 0 && (seen_.empty() || seen_.back() != im_end)) {
    if (!res.tokens.empty() && res.finish == FinishReason::Stop && res.tokens.back() != im_end)
      seen_.back() = im_end;  // another stop token (e.g. <|endoftext|>) stands in its place
    else
      seen_.push_back(im_end);
  }
  for (auto& m : turn.added) history_.push_back(std::move(m));
  history_.push_back({"assistant", res.text, ""});
}

GenerateResult Conversation::send(const std::string& user_text, const TurnOptions& opts,
                                  const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  Turn turn = begin_turn(user_text, opts);
  GenerateResult res = session_->generate(turn.req, on_token, cancel);
  end_turn(std::move(turn), res);
  return res;
}

void Conversation::save(const std::string& path) const {
  nlohmann::json messages = nlohmann::json::array();
  for (const ChatMessage& m : history_) {
    if (!m.tool_calls.empty()) fail("a conversation with tool calls cannot be saved yet");
    messages.push_back({{"role", m.role}, {"content", m.content}, {"reasoning_content", m.reasoning_content}});
  }
  const nlohmann::json note = {{"kind", "swiftlet-chat"}, {"system", system_}, {"messages", messages}, {"seen", seen_}};
  session_->save(path, note.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void Conversation::load(const std::string& path) {
  const std::string text = session_->load(path);  // throws, leaving everything as it was
  std::vector<ChatMessage> history;
  std::vector<int32_t> seen;
  std::string system;
  try {
    const nlohmann::json note = nlohmann::json::parse(text);
    if (note.value("kind", "") != "swiftlet-chat") throw std::runtime_error("no chat in its note");
    system = note.at("system").get<std::string>();
    for (const auto& m : note.at("messages"))
      history.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>(),
                         m.value("reasoning_content", "")});
    seen = note.at("seen").get<std::vector<int32_t>>();
    const std::vector<int32_t>& fed = session_->state().tokens;
    if (seen.size() < fed.size() || !std::equal(fed.begin(), fed.end(), seen.begin()))
      throw std::runtime_error("its state's tokens are not the conversation's");
  } catch (const std::exception& e) {
    reset();
    fail("{} holds a model state but not a chat swiftlet chat --session saved ({}): delete it to start anew", path,
         e.what());
  }
  system_ = std::move(system);
  history_ = std::move(history);
  seen_ = std::move(seen);
}

}  // namespace swiftlet
