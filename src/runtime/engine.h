// A loaded model with everything that comes with it: the tokenizer, the chat template kind,
// the sampling defaults of generation_config.json and the stop tokens.
#pragma once

#include "runtime/grammar_cache.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace swiftlet {

struct EngineOptions {
  std::string model;      // checkpoint directory or .qpack
  std::string tokenizer;  // a tokenizer.json to use instead of the model's own
  Backend backend = Backend::Cpu;
  std::optional<Isa> isa;  // the CPU kernels' instruction set (set_cpu_isa); none: the best there is
  LoadOptions load;
  int threads = 0;        // 0: default_thread_count() (physical cores allowed, cgroup quota)
  int predict_next = 1;  // see SessionOptions::predict_next
  MissPolicy on_miss;    // see SessionOptions::on_miss; a lossy one is refused with --gpu
  bool chunked_prefill = false;  // see SessionOptions::chunked_prefill
  // Decode on the GPU (CUDA builds; without a usable GPU a line says so and the CPU runs).
  bool gpu = false;
  size_t gpu_cache_bytes = 0;  // VRAM for routed experts; 0: what is free less 2 GiB
};

class Engine {
 public:
  explicit Engine(const EngineOptions& opts);  // throws Error

  const Model& model() const { return loaded_->model; }
  const ModelConfig& config() const { return loaded_->model.config; }
  const LoadedModel& loaded() const { return *loaded_; }
  Backend backend() const { return opts_.backend; }
  // --on-miss: what sessions and batches of this engine do with a routed expert not in memory.
  const MissPolicy& on_miss() const { return opts_.on_miss; }
  // Null when the model ships no tokenizer (then only token ids can be used).
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  // Throws Error saying how to get one when there is none.
  const Tokenizer& require_tokenizer() const;
  TemplateKind template_kind() const { return template_kind_; }
  // generation_config.json's values, else the model card's defaults.
  const SamplingParams& default_sampling() const { return sampling_; }
  // Ids that end an answer: the config's eos ids, <|im_end|> and <|endoftext|>.
  const std::vector<int32_t>& stop_tokens() const { return stop_tokens_; }

  // The vocabulary as a byte trie for constrained decoding (token_constraint.h), built on first
  // use from any thread. Throws Error when there is no tokenizer.
  std::shared_ptr<const VocabTrie> vocab_trie() const;
  // The grammars of constrained answers with their matcher states and token masks, shared by
  // every request of this engine (grammar_cache.h); made on first use from any thread. Throws
  // Error when there is no tokenizer.
  std::shared_ptr<GrammarCache> grammar_cache() const;
  // Its counters; none before the first constrained request.
  std::optional<GrammarCacheStats> grammar_cache_stats() const;

  std::unique_ptr<Session> new_session(SessionOptions opts = {}) const;
  // The GPU model sessions run on; null on the CPU (no --gpu, or no usable GPU).
  const GpuModel* gpu() const { return gpu_.get(); }
  std::shared_ptr<GpuModel> gpu_model() const { return gpu_; }

 private:
  EngineOptions opts_;
  std::unique_ptr<LoadedModel> loaded_;
  std::shared_ptr<GpuModel> gpu_;
  std::optional<Tokenizer> tokenizer_;
  TemplateKind template_kind_ = TemplateKind::Qwen3NextInstruct;
  SamplingParams sampling_;
  std::vector<int32_t> stop_tokens_;
  mutable std::once_flag trie_once_;
  mutable std::shared_ptr<const VocabTrie> trie_;
  mutable std::mutex grammar_cache_mu_;
  mutable std::shared_ptr<GrammarCache> grammar_cache_;  // guarded by grammar_cache_mu_
};

}  // namespace swiftlet
