// swiftlet generate MODEL (--prompt TEXT | --ids 5,17,42) [--chat] [--system S] [--think]
//   [--max-new N] [sampling flags] [--stop S]... [--print-ids] [--json] [--trace-experts FILE]
// Streams the answer to stdout as it is produced; statistics go to stderr.
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "runtime/engine.h"

#include <cstdio>
#include <memory>

namespace swiftlet::cli {

namespace {
struct GenerateOptions {
  ModelFlags model;
  SamplingFlags sampling;
  TraceFlag trace;
  std::string prompt, ids, system;
  std::vector<std::string> stop;
  int max_new = 256;
  bool chat = false, think = false, print_ids = false, json = false, quiet = false;
};

void run_generate(const GenerateOptions& o) {
  if (o.prompt.empty() == o.ids.empty()) fail("give the prompt as --prompt TEXT or as --ids 5,17,42 (one of them)");
  if (!o.ids.empty() && (o.chat || !o.system.empty())) fail("--chat and --system need a text --prompt");
  Engine engine(o.model.engine_options());
  GenerateRequest req;
  if (!o.ids.empty()) {
    req.prompt = parse_id_list(o.ids, "--ids");
  } else {
    const Tokenizer& tok = engine.require_tokenizer();
    std::string text = o.prompt;
    if (o.chat || !o.system.empty()) {
      std::vector<ChatMessage> msgs;
      if (!o.system.empty()) msgs.push_back({"system", o.system, ""});
      msgs.push_back({"user", o.prompt, ""});
      ChatOptions co;
      co.enable_thinking = o.think;
      text = render_chat(engine.template_kind(), msgs, co);
    }
    req.prompt = tok.encode(text, /*parse_special=*/o.chat || !o.system.empty());
  }
  req.sampling = o.sampling.apply(engine.default_sampling());
  req.max_new_tokens = o.max_new;
  req.stop = o.stop;
  req.stop_tokens = engine.stop_tokens();
  if (!o.stop.empty() && !engine.tokenizer()) fail("--stop needs a model with a tokenizer");

  std::unique_ptr<RoutingTraceWriter> trace = o.trace.open(engine, o.model);
  SessionOptions so;
  so.routing_observer = trace.get();
  auto session = engine.new_session(so);
  bool first = true;
  const bool text_out = engine.tokenizer() && !o.print_ids;
  GenerateResult res = session->generate(req, [&](std::string_view text, int32_t) {
    if (text_out) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  if (o.print_ids || !engine.tokenizer()) {
    for (int32_t id : res.tokens) {
      std::printf(first ? "%d" : " %d", id);
      first = false;
    }
  }
  std::printf("\n");
  std::fflush(stdout);
  TraceFlag::finish(trace.get(), o.trace.path);
  if (o.json) std::fprintf(stderr, "%s\n", stats_json(res.stats, &res).dump().c_str());
  else if (!o.quiet) std::fprintf(stderr, "%s[finish: %s]\n", stats_text(res.stats).c_str(), finish_reason_name(res.finish));
}
}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "generate text (or token ids) after a prompt, with statistics");
  o->model.add(cmd);
  cmd->add_option("--prompt,-p", o->prompt, "prompt text");
  cmd->add_option("--ids", o->ids, "prompt as comma-separated token ids");
  cmd->add_flag("--chat", o->chat, "wrap the prompt in the model's chat template (a user turn)");
  cmd->add_option("--system", o->system, "system prompt (implies --chat)");
  cmd->add_flag("--think", o->think, "let the model think first (Qwen3.5/3.6; off by default)");
  cmd->add_option("--max-new,-n", o->max_new, "tokens to generate at most");
  cmd->add_option("--stop", o->stop, "stop when this text is produced (repeatable)");
  o->sampling.add(cmd);
  o->trace.add(cmd);
  cmd->add_flag("--print-ids", o->print_ids, "print the new token ids on stdout instead of text");
  cmd->add_flag("--json", o->json, "print the statistics as one JSON object on stderr");
  cmd->add_flag("--quiet,-q", o->quiet, "no statistics");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace swiftlet::cli
