#include "runtime/engine.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "experts/expert_slots.h"
#include "io/mapped_file.h"
#include "model/gpu_forward.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::string model_dir(const std::string& model) {
  return fs::is_directory(model) ? model : fs::path(model).parent_path().string();
}

std::string chat_template_text(const std::string& dir) {
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja)) return read_text_file(jinja.string());
  const fs::path tc = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tc)) {
    json j = json::parse(read_text_file(tc.string()), nullptr, false);
    if (!j.is_discarded() && j.contains("chat_template") && j["chat_template"].is_string())
      return j["chat_template"].get<std::string>();
  }
  return "";
}
}  // namespace

Engine::Engine(const EngineOptions& opts) : opts_(opts) {
  if (opts.threads > 0) ThreadPool::set_global_threads(opts.threads);
  if (opts.isa) set_cpu_isa(*opts.isa);
  // --gpu: the host expert cache's slots come from page-locked memory, so the VRAM cache's
  // misses upload by DMA straight from them.
  std::string no_gpu;
  // SWIFTLET_GPU=1 acts as --gpu: runs any command or test suite on the GPU path.
  const char* env_gpu = std::getenv("SWIFTLET_GPU");
  const bool want_gpu = opts.gpu || (env_gpu && std::string(env_gpu) == "1");
  if (want_gpu && opts.on_miss.lossy()) fail("--on-miss {} is CPU-only for now; drop --gpu or the flag", opts.on_miss.name());
  const bool gpu = want_gpu && gpu_usable(&no_gpu);
  if (want_gpu && !gpu) std::fprintf(stderr, "swiftlet: --gpu: %s; falling back to the CPU\n", no_gpu.c_str());
  LoadOptions load = opts.load;
  load.gpu = load.gpu || gpu;
  load.miss_copies = opts.on_miss.reads_low_bit();
  if (gpu && !load.cache_alloc) {
    load.cache_alloc = gpu_host_alloc;
    load.cache_free = gpu_host_free;
  }
  loaded_ = load_model(opts.model, load);
  if (!loaded_->memory.reason.empty()) std::fprintf(stderr, "swiftlet: %s\n", loaded_->memory.reason.c_str());
  if (gpu) {
    GpuOptions go;
    go.cache_bytes = opts.gpu_cache_bytes;
    go.make_slots = make_expert_slots;
    gpu_ = make_gpu_model(loaded_->model, go, &no_gpu);
    if (!gpu_) std::fprintf(stderr, "swiftlet: --gpu: %s; falling back to the CPU\n", no_gpu.c_str());
    else std::fprintf(stderr, "swiftlet: GPU: %s\n", gpu_summary(*gpu_).c_str());
  }
  const std::string dir = model_dir(opts.model);
  const std::string tok = !opts.tokenizer.empty() ? opts.tokenizer : Tokenizer::file_in(dir);
  if (!tok.empty() && fs::exists(tok)) {
    tokenizer_ = Tokenizer::from_file(tok);
    if (tokenizer_->vocab_size() > config().vocab_size)
      fail("the tokenizer '{}' has {} tokens but the model's vocabulary has {} rows: they do not "
           "belong together", tok, tokenizer_->vocab_size(), config().vocab_size);
  } else if (!opts.tokenizer.empty()) {
    fail("tokenizer '{}' does not exist", opts.tokenizer);
  }
  template_kind_ = detect_template(chat_template_text(dir), config().model_type);

  // Model cards' defaults (model-math.md 9), then generation_config.json.
  sampling_.temperature = 0.7f;
  sampling_.top_p = 0.8f;
  sampling_.top_k = 20;
  const fs::path gc = fs::path(dir) / "generation_config.json";
  if (fs::exists(gc)) {
    json j = json::parse(read_text_file(gc.string()), nullptr, false);
    if (j.is_discarded()) fail("'{}' is not valid JSON", gc.string());
    sampling_ = sampling_params_from_generation_config(j, sampling_);
    auto add = [&](const json& v) {
      if (v.is_number_integer()) stop_tokens_.push_back(v.get<int32_t>());
    };
    if (j.contains("eos_token_id")) {
      if (j["eos_token_id"].is_array())
        for (const auto& v : j["eos_token_id"]) add(v);
      else add(j["eos_token_id"]);
    }
  }
  for (int32_t id : config().eos_token_ids) stop_tokens_.push_back(id);
  if (tokenizer_)
    for (const char* s : {"<|im_end|>", "<|endoftext|>"})
      if (int32_t id = tokenizer_->token_id(s); id >= 0) stop_tokens_.push_back(id);
  std::sort(stop_tokens_.begin(), stop_tokens_.end());
  stop_tokens_.erase(std::unique(stop_tokens_.begin(), stop_tokens_.end()), stop_tokens_.end());
  std::erase_if(stop_tokens_, [&](int32_t id) { return id < 0 || id >= config().vocab_size; });
}

const Tokenizer& Engine::require_tokenizer() const {
  if (!tokenizer_)
    fail("model '{}' has no tokenizer.json; pass --tokenizer PATH, or use token ids (--ids)", opts_.model);
  return *tokenizer_;
}

std::shared_ptr<const VocabTrie> Engine::vocab_trie() const {
  const Tokenizer& tok = require_tokenizer();
  std::call_once(trie_once_, [&] { trie_ = std::make_shared<const VocabTrie>(tok); });
  return trie_;
}

std::shared_ptr<GrammarCache> Engine::grammar_cache() const {
  std::shared_ptr<const VocabTrie> trie = vocab_trie();
  std::lock_guard lock(grammar_cache_mu_);
  if (!grammar_cache_) grammar_cache_ = std::make_shared<GrammarCache>(std::move(trie));
  return grammar_cache_;
}

std::optional<GrammarCacheStats> Engine::grammar_cache_stats() const {
  std::lock_guard lock(grammar_cache_mu_);
  if (!grammar_cache_) return std::nullopt;
  return grammar_cache_->stats();
}

std::unique_ptr<Session> Engine::new_session(SessionOptions opts) const {
  opts.backend = opts_.backend;
  opts.predict_next = opts_.predict_next;
  opts.on_miss = opts_.on_miss;
  opts.chunked_prefill = opts_.chunked_prefill;
  opts.gpu = gpu_;
  return std::make_unique<Session>(model(), tokenizer(), opts);
}

}  // namespace swiftlet
