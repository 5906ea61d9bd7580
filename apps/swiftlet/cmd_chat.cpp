// swiftlet chat MODEL ["turn 1" "turn 2" ...] [--system S] [--think] [sampling flags]
//   [--trace-experts FILE] [--session FILE]
// With turns as arguments it answers each in order; without, an interactive prompt with line
// editing and history. Each turn prefills only its own tokens (the conversation state is kept).
// Ctrl-C stops the current answer, not the program; Ctrl-D or /exit leaves. --session FILE
// resumes the conversation saved there (messages and the model's state: nothing is prefilled
// again) and saves it there on leaving.
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "runtime/conversation.h"

#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>

namespace swiftlet::cli {

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_generating{false};

void on_sigint(int) {
  if (g_generating.load()) {
    g_cancel.store(true);
    return;
  }
  // At the prompt: drop the line being typed and show a fresh prompt.
  const char nl = '\n';
  (void)!::write(STDOUT_FILENO, &nl, 1);
  rl_replace_line("", 0);
  rl_on_new_line();
  rl_redisplay();
}

struct ChatCmdOptions {
  ModelFlags model;
  SamplingFlags sampling;
  TraceFlag trace;
  std::vector<std::string> turns;
  std::string system;
  std::string session;  // --session FILE
  int max_new = 1024;
  bool think = false, quiet = false;
};

void print_turn_stats(const GenerateResult& r) {
  const GenerateStats& s = r.stats;
  std::fprintf(stderr, "[%lld prompt tokens: %lld reused, %lld prefilled at %.1f tok/s | %lld generated at %.2f tok/s | %s",
               (long long)s.prompt_tokens, (long long)s.reused_tokens, (long long)s.prefilled_tokens,
               s.prefill_tok_s(), (long long)s.generated_tokens, s.decode_tok_s(), finish_reason_name(r.finish));
  if (s.experts.hits + s.experts.misses)
    std::fprintf(stderr, " | expert hit rate %.1f%%, %llu skipped (%s)", 100 * s.experts.hit_rate(),
                 (unsigned long long)s.experts.skipped, s.on_miss.label().c_str());
  std::fprintf(stderr, " | peak RSS %.2f GB]\n", double(s.peak_rss) / 1e9);
}

void run_chat(const ChatCmdOptions& o) {
  Engine engine(o.model.engine_options());
  ChatOptions co;
  co.enable_thinking = o.think;
  std::unique_ptr<RoutingTraceWriter> trace = o.trace.open(engine, o.model);
  SessionOptions so;
  so.routing_observer = trace.get();
  Conversation conv(engine, co, so);
  if (!o.system.empty()) conv.set_system(o.system);
  if (!o.session.empty() && ::access(o.session.c_str(), F_OK) == 0) {
    conv.load(o.session);
    std::fprintf(stderr, "[resumed %zu messages, %zu tokens from %s]\n", conv.history().size(),
                 conv.session().state().tokens.size(), o.session.c_str());
    if (!o.system.empty() && o.system != conv.system())
      std::fprintf(stderr, "[--system ignored: the resumed conversation keeps its own]\n");
  }
  TurnOptions turn;
  turn.sampling = o.sampling.apply(engine.default_sampling());
  turn.max_new_tokens = o.max_new;
  GenerateResult last;
  bool have_last = false;

  struct sigaction sa {}, old {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);

  auto answer = [&](const std::string& text) {
    g_cancel.store(false);
    g_generating.store(true);
    last = conv.send(text, turn, [](std::string_view piece, int32_t) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    }, &g_cancel);
    g_generating.store(false);
    have_last = true;
    std::printf("\n");
    std::fflush(stdout);
    if (last.finish == FinishReason::Cancelled) std::fprintf(stderr, "[stopped]\n");
    if (!o.quiet) print_turn_stats(last);
  };

  if (!o.turns.empty()) {
    for (const auto& t : o.turns) {
      std::printf("> %s\n", t.c_str());
      answer(t);
    }
  } else {
    rl_catch_signals = 0;  // our handler decides what Ctrl-C means
    std::fprintf(stderr, "chat with %s (%s). /reset, /stats, /system TEXT, /exit; Ctrl-C stops an answer.\n",
                 o.model.model.c_str(), engine.config().family_name());
    for (;;) {
      char* line = readline("> ");
      if (!line) {  // Ctrl-D
        std::printf("\n");
        break;
      }
      std::string text(line);
      std::free(line);
      if (text.empty()) continue;
      add_history(text.c_str());
      if (text == "/exit" || text == "/quit") break;
      if (text == "/reset") {
        conv.reset();
        std::fprintf(stderr, "[conversation cleared]\n");
        continue;
      }
      if (text == "/stats") {
        if (have_last) std::fprintf(stderr, "%s", stats_text(last.stats).c_str());
        else std::fprintf(stderr, "[no answer yet]\n");
        continue;
      }
      if (text.rfind("/system", 0) == 0) {
        conv.set_system(text.size() > 8 ? text.substr(8) : "");
        std::fprintf(stderr, "[system prompt set; conversation cleared]\n");
        continue;
      }
      try {
        answer(text);
      } catch (const Error& e) {
        g_generating.store(false);
        std::fprintf(stderr, "error: %s\n", e.what());
      }
    }
  }
  sigaction(SIGINT, &old, nullptr);
  TraceFlag::finish(trace.get(), o.trace.path);
  if (!o.session.empty()) {
    conv.save(o.session);
    std::fprintf(stderr, "[conversation saved to %s]\n", o.session.c_str());
  }
}
}  // namespace

void add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatCmdOptions>();
  auto* cmd = app.add_subcommand("chat", "multi-turn chat; each turn prefills only its own tokens");
  o->model.add(cmd);
  cmd->add_option("turns", o->turns, "user turns to answer in order (none: interactive)");
  cmd->add_option("--system", o->system, "system prompt");
  cmd->add_flag("--think", o->think, "let the model think first (Qwen3.5/3.6; off by default)");
  cmd->add_option("--max-new,-n", o->max_new, "tokens per answer at most");
  cmd->add_flag("--quiet,-q", o->quiet, "no per-turn statistics");
  cmd->add_option("--session", o->session,
                  "resume the conversation saved in FILE (when it exists) and save it there on leaving");
  o->sampling.add(cmd);
  o->trace.add(cmd);
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace swiftlet::cli
