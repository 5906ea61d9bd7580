// A multi-turn chat: the messages so far, the tokens the model has seen, and a Session whose
// state is kept between turns, so each new turn prefills only its own tokens. Where the chat
// template would rewrite earlier turns (Qwen3 and Qwen3.5 drop old reasoning blocks), the
// conversation keeps what the model actually saw and appends the new turn as the template
// renders a turn on its own: history is never re-read.
#pragma once

#include "runtime/engine.h"

#include <string>
#include <vector>

namespace swiftlet {

struct TurnOptions {
  SamplingParams sampling;
  int max_new_tokens = 512;
  std::vector<std::string> stop;
};

class Conversation {
 public:
  Conversation(const Engine& engine, ChatOptions chat = {}, SessionOptions session = {});

  // Adds a user turn and generates the answer, streaming it through on_token.
  GenerateResult send(const std::string& user_text, const TurnOptions& opts,
                      const TokenCallback& on_token = {}, const std::atomic<bool>* cancel = nullptr);

  // send() in two halves, for Batch: begin_turn renders the user turn into the request to
  // generate on session(); end_turn records the answer (text, tokens) as send() does. The
  // conversation must not be used otherwise in between.
  struct Turn {
    GenerateRequest req;
    std::vector<ChatMessage> added;
  };
  Turn begin_turn(const std::string& user_text, const TurnOptions& opts) const;
  void end_turn(Turn turn, const GenerateResult& res);
  Session& session() { return *session_; }

  // Starts over (keeps the system prompt unless set_system changes it).
  void reset();
  // The whole conversation into one file (Session::save: the model's state, with the messages
  // and the tokens seen as its note), and back: load() replaces this conversation with the
  // file's and the next turn prefills only its own tokens. Throw Error (a file that
  // cannot be read leaves the conversation as it was; one without a chat leaves it empty).
  void save(const std::string& path) const;
  void load(const std::string& path);
  void set_system(std::string system);
  const std::vector<ChatMessage>& history() const { return history_; }
  const std::string& system() const { return system_; }
  const std::vector<int32_t>& seen_tokens() const { return seen_; }
  const ChatOptions& chat_options() const { return chat_; }

 private:
  const Engine& engine_;
  ChatOptions chat_;
  std::unique_ptr<Session> session_;
  std::string system_;
  std::vector<ChatMessage> history_;
  std::vector<int32_t> seen_;  // prompt + answer + <|im_end|> of every turn so far
};

}  // namespace swiftlet
