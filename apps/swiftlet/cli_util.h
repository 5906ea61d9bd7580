// Small helpers shared by the subcommands: id lists, the model and sampling flags, statistics.
#pragma once

#include "experts/routing_trace.h"
#include "model_flags.h"
#include "runtime/engine.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace swiftlet::cli {

// "5,17,42" -> {5, 17, 42}. Throws Error naming the bad entry.
std::vector<int32_t> parse_id_list(const std::string& s, const char* flag);

// --temperature, --top-k, --top-p, --min-p, --repeat-penalty, --presence-penalty,
// --frequency-penalty, --seed, --greedy: each overrides the model's generation_config.json.
struct SamplingFlags {
  float temperature = 0, top_p = 0, min_p = 0, repeat_penalty = 0, presence = 0, frequency = 0;
  int top_k = 0;
  uint64_t seed = 0;
  bool greedy = false;
  CLI::Option *o_temperature = nullptr, *o_top_p = nullptr, *o_min_p = nullptr, *o_repeat = nullptr,
              *o_presence = nullptr, *o_frequency = nullptr, *o_top_k = nullptr, *o_seed = nullptr;
  void add(CLI::App* cmd);
  SamplingParams apply(SamplingParams base) const;
};

// --trace-experts FILE (generate, chat, perplexity): records the routing of every token the
// session runs (experts/routing_trace.h); the next-layer guesses too when the run predicts.
struct TraceFlag {
  std::string path;
  void add(CLI::App* cmd);
  // Null without the flag. Throws Error if the file cannot be created. decode: the run decodes
  // (next-layer guesses are recorded when it predicts); a prompt-only run has none.
  std::unique_ptr<RoutingTraceWriter> open(const Engine& engine, const ModelFlags& model, bool decode = true) const;
  // Closes the file and says on stderr what was written.
  static void finish(RoutingTraceWriter* w, const std::string& path);
};

// Human-readable statistics (several lines) and the same as one JSON object.
std::string stats_text(const GenerateStats& s);
nlohmann::json stats_json(const GenerateStats& s, const GenerateResult* r = nullptr);

}  // namespace swiftlet::cli
