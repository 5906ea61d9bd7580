#include "cli_util.h"

#include "core/error.h"

#include <fmt/format.h>

#include <charconv>

namespace swiftlet::cli {

std::vector<int32_t> parse_id_list(const std::string& s, const char* flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0)
      fail("{}: '{}' is not a non-negative token id (expected a list like 5,17,42)", flag, item);
    ids.push_back(v);
    i = j + 1;
  }
  if (ids.empty()) fail("{}: no token ids given", flag);
  return ids;
}

void SamplingFlags::add(CLI::App* cmd) {
  o_temperature = cmd->add_option("--temperature", temperature, "sampling temperature (0: greedy)");
  o_top_k = cmd->add_option("--top-k", top_k, "keep the k most likely tokens (0: off)");
  o_top_p = cmd->add_option("--top-p", top_p, "nucleus sampling mass (1: off)");
  o_min_p = cmd->add_option("--min-p", min_p, "drop tokens below min-p x the best one's probability");
  o_repeat = cmd->add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1: off)");
  o_presence = cmd->add_option("--presence-penalty", presence, "OpenAI presence penalty");
  o_frequency = cmd->add_option("--frequency-penalty", frequency, "OpenAI frequency penalty");
  o_seed = cmd->add_option("--seed", seed, "random seed (reproducible sampling)");
  cmd->add_flag("--greedy", greedy, "always take the most likely token");
}

SamplingParams SamplingFlags::apply(SamplingParams p) const {
  if (o_temperature->count()) p.temperature = temperature;
  if (o_top_k->count()) p.top_k = top_k;
  if (o_top_p->count()) p.top_p = top_p;
  if (o_min_p->count()) p.min_p = min_p;
  if (o_repeat->count()) p.repetition_penalty = repeat_penalty;
  if (o_presence->count()) p.presence_penalty = presence;
  if (o_frequency->count()) p.frequency_penalty = frequency;
  if (o_seed->count()) p.seed = seed;
  if (greedy) p.greedy = true;
  validate(p);
  return p;
}

void TraceFlag::add(CLI::App* cmd) {
  cmd->add_option("--trace-experts", path,
                  "write the experts every token was routed to (and next-layer guesses) to this file "
                  "(docs/routing-trace.md)");
}

std::unique_ptr<RoutingTraceWriter> TraceFlag::open(const Engine& engine, const ModelFlags& model, bool decode) const {
  if (path.empty()) return nullptr;
  if (engine.gpu()) fail("--trace-experts runs on the CPU only: drop --gpu");
  const bool predictions = decode && model.predict_next > 0 && engine.model().experts->wants_predictions();
  return std::make_unique<RoutingTraceWriter>(path, engine.config(), predictions);
}

void TraceFlag::finish(RoutingTraceWriter* w, const std::string& path) {
  if (!w) return;
  w->finish();
  std::fprintf(stderr, "expert trace: %llu tokens written to %s\n", (unsigned long long)w->tokens_written(),
               path.c_str());
}

std::string stats_text(const GenerateStats& s) {
  const ExpertStats& e = s.experts;
  std::string out = fmt::format(
      "prompt {} tokens ({} reused, {} prefilled) | time to first token {:.2f} s | prefill {:.2f} tok/s\n"
      "generated {} tokens | decode {:.2f} tok/s | peak RSS {:.2f} GB\n",
      s.prompt_tokens, s.reused_tokens, s.prefilled_tokens, s.ttft_seconds, s.prefill_tok_s(),
      s.generated_tokens, s.decode_tok_s(), double(s.peak_rss) / 1e9);
  if (e.hits + e.misses > 0)
    out += fmt::format(
        "experts, {}: {} hits, {} misses ({} low-bit), {} skipped, {} evictions, hit rate {:.1f}% | read {:.2f} GB at {:.2f} GB/s "
        "| waited {:.2f} s | cache {:.2f} of {:.2f} MB\n",
        s.on_miss.label(), e.hits, e.misses, e.low_bit, e.skipped, e.evictions, 100 * e.hit_rate(), double(e.bytes_read) / 1e9,
        e.read_seconds > 0 ? double(e.bytes_read) / 1e9 / e.read_seconds : 0.0, e.wait_seconds,
        double(e.cache_bytes) / 1e6, double(e.cache_budget) / 1e6);
  if (e.predicted > 0)
    out += fmt::format("next-layer prediction: {} experts read ahead, {} of them used ({:.1f}%)\n", e.predicted,
                       e.predicted_used, 100.0 * double(e.predicted_used) / double(e.predicted));
  if (s.on_gpu) {  // --gpu: the VRAM expert cache's share of the request
    const GpuStats& g = s.gpu;
    out += fmt::format("GPU experts: {} hits, {} misses, {} evictions, hit rate {:.1f}% | uploaded {:.2f} GB at "
                       "{:.2f} GB/s\n",
                       g.hits, g.misses, g.evictions, 100 * g.hit_rate(), double(g.bytes_uploaded) / 1e9,
                       g.upload_gb_s());
  }
  return out;
}

nlohmann::json stats_json(const GenerateStats& s, const GenerateResult* r) {
  const ExpertStats& e = s.experts;
  nlohmann::json j = {
      {"prompt_tokens", s.prompt_tokens},       {"reused_tokens", s.reused_tokens},
      {"prefilled_tokens", s.prefilled_tokens}, {"generated_tokens", s.generated_tokens},
      {"ttft_s", s.ttft_seconds},               {"prefill_s", s.prefill_seconds},
      {"prefill_tok_s", s.prefill_tok_s()},     {"decode_s", s.decode_seconds},
      {"decode_tok_s", s.decode_tok_s()},       {"peak_rss_bytes", s.peak_rss},
      {"expert_hits", e.hits},                  {"expert_misses", e.misses},
      {"expert_hit_rate", e.hit_rate()},        {"bytes_read", e.bytes_read},
      {"read_s", e.read_seconds},               {"io_wait_s", e.wait_seconds},
      {"read_gb_s", e.read_seconds > 0 ? double(e.bytes_read) / 1e9 / e.read_seconds : 0.0},
      {"expert_evictions", e.evictions},        {"cache_bytes", e.cache_bytes},
      {"cache_budget_bytes", e.cache_budget},   {"predicted", e.predicted},
      {"predicted_used", e.predicted_used},     {"experts_skipped", e.skipped}, {"experts_low_bit", e.low_bit},
      {"on_miss", s.on_miss.name()},            {"lossy", s.on_miss.lossy()}};
  if (r) j["finish_reason"] = finish_reason_name(r->finish);
  return j;
}

}  // namespace swiftlet::cli
