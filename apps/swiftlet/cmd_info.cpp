// swiftlet info MODEL [--cache-experts N] [--context T] [--prompt P]
// What a .qpack or checkpoint directory holds and the RAM it needs with a given expert cache.
#include "commands.h"

#include "runtime/model_info.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

namespace swiftlet::cli {

namespace {
struct InfoOptions {
  std::string model;
  int64_t cache_experts = -1;  // default: one token's worth (top-k x layers)
  int64_t context = 4096;
  int64_t prompt = 512;
};

std::string gib(uint64_t b) {
  if (b >= 1000000000ull) return fmt::format("{:.2f} GiB ({:.2f} GB)", double(b) / (1ull << 30), double(b) / 1e9);
  if (b >= 1000000ull) return fmt::format("{:.1f} MiB ({:.1f} MB)", double(b) / (1ull << 20), double(b) / 1e6);
  return fmt::format("{:.1f} KiB", double(b) / 1024);
}

void run_info(const InfoOptions& o) {
  const ModelSummary s = summarize_model(o.model);
  const ModelConfig& c = s.config;
  const int64_t cache = o.cache_experts >= 0 ? o.cache_experts : int64_t(c.num_experts_per_tok) * c.num_layers;
  std::printf("model          %s\n", s.path.c_str());
  if (s.qpack)
    std::printf("container      .qpack version 1, from %s, %s\n", s.source.c_str(),
                s.checksums ? "xxh3-64 checksums per expert" : "no checksums");
  else
    std::printf("container      checkpoint directory (safetensors)\n");
  std::printf("family         %s (%s)\n", c.family_name(), c.model_type.c_str());
  std::printf("layers         %d: %d Gated DeltaNet + %d full attention; hidden %lld, vocab %lld\n", c.num_layers,
              c.num_linear_layers(), c.num_full_layers(), (long long)c.hidden_size, (long long)c.vocab_size);
  std::printf("experts        %d per layer, top-%d, intermediate %lld; shared expert %lld\n", c.num_experts,
              c.num_experts_per_tok, (long long)c.moe_intermediate_size, (long long)c.shared_expert_intermediate_size);
  std::printf("quantisation   %s", s.quantization.c_str());
  if (s.eight_bit_modules) std::printf("; %d modules at 8 bits (router, shared_expert_gate)", s.eight_bit_modules);
  std::printf("; experts %s\n", s.expert_format.c_str());
  std::printf("resident       %s\n", gib(s.resident_bytes).c_str());
  std::printf("streamed       %s (%d x %d experts)\n", gib(s.streamed_bytes).c_str(), c.num_layers, c.num_experts);
  std::printf("per expert     %llu bytes of weights; %llu bytes per read; %s read per token without a cache\n",
              (unsigned long long)s.expert_bytes, (unsigned long long)s.expert_stride,
              gib(uint64_t(c.num_experts_per_tok) * c.num_layers * s.expert_stride).c_str());
  const RamEstimate r = estimate_peak_ram(s, cache, o.context, o.prompt);
  std::printf("peak RAM       ~%s with a cache of %lld experts, %lld-token context, %lld-token prompt:\n",
              gib(r.total()).c_str(), (long long)cache, (long long)o.context, (long long)o.prompt);
  std::printf("                 resident %s, expert cache %s,\n", gib(r.resident).c_str(),
              gib(r.expert_cache).c_str());
  std::printf("                 KV cache %s, DeltaNet state %s, activations %s\n", gib(r.kv_cache).c_str(),
              gib(r.linear_state).c_str(), gib(r.activations).c_str());
}
}  // namespace

void add_info_command(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  auto* cmd = app.add_subcommand("info", "describe a .qpack or checkpoint directory and its RAM needs");
  cmd->add_option("model", o->model, "a .qpack container or checkpoint directory")->required();
  cmd->add_option("--cache-experts", o->cache_experts, "expert cache size in experts (default: top-k x layers)");
  cmd->add_option("--context", o->context, "context length for the KV cache estimate");
  cmd->add_option("--prompt", o->prompt, "prompt tokens processed at once (activation estimate)");
  cmd->callback([o] { run_info(*o); });
}

}  // namespace swiftlet::cli
