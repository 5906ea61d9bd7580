// swiftlet generate MODEL --ids 5,17,42 --max-new N --greedy --print-ids
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "runtime/model_loader.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

namespace swiftlet::cli {

namespace {
struct GenerateOptions {
  std::string model, ids, backend = "cpu";
  int max_new = 32;
  bool greedy = false, print_ids = false;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

void run_generate(const GenerateOptions& o) {
  const Backend backend = parse_backend(o.backend);
  if (o.ids.empty()) fail("generate needs a prompt: --ids 5,17,42");
  if (!o.greedy) fail("only --greedy decoding is available with --ids so far");
  if (o.max_new < 0) fail("--max-new must be >= 0, got {}", o.max_new);
  const std::vector<int32_t> prompt = parse_id_list(o.ids, "--ids");
  auto lm = load_model(o.model);
  const ModelConfig& c = lm->model.config;
  SessionState st = SessionState::create(c);
  Forward fwd(lm->model, backend);
  std::vector<float> logits;

  auto t0 = Clock::now();
  fwd.run(st, prompt, LogitsMode::Last, logits);
  const double prefill_s = seconds_since(t0);
  std::vector<int32_t> out;
  auto t1 = Clock::now();
  for (int i = 0; i < o.max_new; ++i) {
    const int32_t next = argmax(logits);
    out.push_back(next);
    if (o.print_ids) {
      std::printf(i ? " %d" : "%d", next);
      std::fflush(stdout);
    }
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end()) break;
    if (i + 1 < o.max_new) fwd.run(st, std::span(&next, 1), LogitsMode::Last, logits);
  }
  const double decode_s = seconds_since(t1);
  if (o.print_ids) std::printf("\n");
  std::fprintf(stderr, "prompt %zu tokens, prefill %.2f tok/s; generated %zu tokens, decode %.2f tok/s\n",
               prompt.size(), double(prompt.size()) / std::max(prefill_s, 1e-9), out.size(),
               double(out.size()) / std::max(decode_s, 1e-9));
}
}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "generate tokens after a prompt");
  cmd->add_option("model", o->model, "checkpoint directory or .qpack")->required();
  cmd->add_option("--ids", o->ids, "prompt as comma-separated token ids");
  cmd->add_option("--max-new", o->max_new, "tokens to generate");
  cmd->add_flag("--greedy", o->greedy, "always take the most likely token");
  cmd->add_flag("--print-ids", o->print_ids, "print the new token ids on stdout");
  cmd->add_option("--backend", o->backend, "cpu (fast kernels) or reference (scalar fp32)");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace swiftlet::cli
