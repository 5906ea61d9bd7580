// The public API (include/swiftlet/swiftlet.h and swiftlet_c.h) over the runtime.
#include <swiftlet/swiftlet.h>
#include <swiftlet/swiftlet_c.h>

#include "core/error.h"
#include "runtime/conversation.h"
#include "runtime/engine.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>

namespace swiftlet::api {

struct Engine::Impl {
  std::unique_ptr<swiftlet::Engine> engine;
};

namespace {

SamplingParams sampling_for(const swiftlet::Engine& e, const GenerationOptions& o) {
  SamplingParams p = e.default_sampling();
  if (o.temperature >= 0) p.temperature = o.temperature;
  if (o.top_k >= 0) p.top_k = o.top_k;
  if (o.top_p >= 0) p.top_p = o.top_p;
  if (o.min_p >= 0) p.min_p = o.min_p;
  if (o.repetition_penalty >= 0) p.repetition_penalty = o.repetition_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = o.seed;
  p.greedy = o.greedy;
  validate(p);
  return p;
}

Stats to_stats(const GenerateResult& r) {
  const GenerateStats& s = r.stats;
  Stats o;
  o.prompt_tokens = s.prompt_tokens;
  o.reused_tokens = s.reused_tokens;
  o.prefilled_tokens = s.prefilled_tokens;
  o.generated_tokens = s.generated_tokens;
  o.ttft_seconds = s.ttft_seconds;
  o.prefill_tok_s = s.prefill_tok_s();
  o.decode_tok_s = s.decode_tok_s();
  o.expert_hits = s.experts.hits;
  o.expert_misses = s.experts.misses;
  o.bytes_read = s.experts.bytes_read;
  o.expert_hit_rate = s.experts.hit_rate();
  o.peak_rss_bytes = s.peak_rss;
  o.finish_reason = finish_reason_name(r.finish);
  return o;
}

TokenCallback wrap(const TextCallback& cb) {
  if (!cb) return {};
  return [cb](std::string_view text, int32_t) { return text.empty() || cb(text); };
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const EngineOptions& opts) {
  swiftlet::EngineOptions eo;
  eo.model = opts.model;
  eo.tokenizer = opts.tokenizer;
  eo.backend = parse_backend(opts.backend);
  eo.threads = opts.threads;
  eo.load.verify_experts = opts.verify_experts;
  if (!opts.cache_size.empty() && !opts.ram_budget.empty()) fail("give cache_size or ram_budget, not both");
  if (opts.cache_size == "all") eo.load.cache_bytes = 0;
  else if (!opts.cache_size.empty()) eo.load.cache_bytes = std::max<uint64_t>(1, parse_bytes(opts.cache_size, "cache_size"));
  if (!opts.ram_budget.empty()) eo.load.ram_budget = parse_bytes(opts.ram_budget, "ram_budget");
  eo.predict_next = opts.predict_next;
  auto impl = std::make_unique<Impl>();
  impl->engine = std::make_unique<swiftlet::Engine>(eo);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::string Engine::describe() const {
  const ModelConfig& c = impl_->engine->config();
  return fmt::format("{} ({}): {} layers ({} attention, {} DeltaNet), {} experts ({} per token), hidden {}, vocab {}, {}",
                     c.family_name(), c.model_type, c.num_layers, c.num_full_layers(), c.num_linear_layers(),
                     c.num_experts, c.num_experts_per_tok, c.hidden_size, c.vocab_size,
                     c.quant.quantized() ? fmt::format("{}-bit", c.quant.default_spec.bits) : "not quantised");
}

std::string Engine::generate(const std::string& prompt, const GenerationOptions& opts,
                             const TextCallback& on_text, Stats* stats) {
  swiftlet::Engine& e = *impl_->engine;
  GenerateRequest req;
  req.prompt = e.require_tokenizer().encode(prompt, /*parse_special=*/true);
  req.sampling = sampling_for(e, opts);
  req.max_new_tokens = opts.max_new_tokens;
  req.stop = opts.stop;
  req.stop_tokens = e.stop_tokens();
  GenerateResult r = e.new_session()->generate(req, wrap(on_text));
  if (stats) *stats = to_stats(r);
  return r.text;
}

struct Chat::Impl {
  swiftlet::Engine& engine;
  Conversation conv;
  std::atomic<bool> cancel{false};
  Stats last;
  Impl(swiftlet::Engine& e, swiftlet::ChatOptions co) : engine(e), conv(e, co) {}
};

Chat::Chat(Engine& engine, const ChatOptions& opts) {
  swiftlet::ChatOptions co;
  co.enable_thinking = opts.thinking;
  impl_ = std::make_unique<Impl>(*engine.impl().engine, co);
  if (!opts.system.empty()) impl_->conv.set_system(opts.system);
}

Chat::~Chat() = default;

std::string Chat::send(const std::string& user_text, const TextCallback& on_text, const GenerationOptions& opts) {
  TurnOptions t;
  t.sampling = sampling_for(impl_->engine, opts);
  t.max_new_tokens = opts.max_new_tokens;
  t.stop = opts.stop;
  impl_->cancel.store(false);
  GenerateResult r = impl_->conv.send(user_text, t, wrap(on_text), &impl_->cancel);
  impl_->last = to_stats(r);
  return r.text;
}

void Chat::cancel() { impl_->cancel.store(true); }
void Chat::reset() { impl_->conv.reset(); }
const Stats& Chat::last_stats() const { return impl_->last; }

}  // namespace swiftlet::api

// ---- C API ----

struct swiftlet_engine {
  std::unique_ptr<swiftlet::api::Engine> engine;
};
struct swiftlet_chat {
  std::unique_ptr<swiftlet::api::Chat> chat;
};

namespace {
thread_local std::string g_last_error;

template <typename F>
auto guarded(F&& f, decltype(f()) on_error) -> decltype(f()) {
  try {
    g_last_error.clear();
    return f();
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return on_error;
  }
}
}  // namespace

extern "C" {

swiftlet_engine* swiftlet_open(const char* model_path, const char* backend) {
  return guarded([&] {
    swiftlet::api::EngineOptions o;
    o.model = model_path ? model_path : "";
    if (backend) o.backend = backend;
    return new swiftlet_engine{swiftlet::api::Engine::open(o)};
  }, static_cast<swiftlet_engine*>(nullptr));
}

void swiftlet_close(swiftlet_engine* engine) { delete engine; }

swiftlet_chat* swiftlet_chat_new(swiftlet_engine* engine, const char* system_prompt) {
  return guarded([&] {
    if (!engine) swiftlet::fail("swiftlet_chat_new: engine is NULL");
    swiftlet::api::ChatOptions o;
    if (system_prompt) o.system = system_prompt;
    return new swiftlet_chat{std::make_unique<swiftlet::api::Chat>(*engine->engine, o)};
  }, static_cast<swiftlet_chat*>(nullptr));
}

void swiftlet_chat_free(swiftlet_chat* chat) { delete chat; }

int swiftlet_chat_send(swiftlet_chat* chat, const char* user_text, int max_new_tokens,
                       swiftlet_text_fn fn, void* user) {
  return guarded([&] {
    if (!chat || !user_text) swiftlet::fail("swiftlet_chat_send: chat and user_text must not be NULL");
    swiftlet::api::GenerationOptions o;
    if (max_new_tokens > 0) o.max_new_tokens = max_new_tokens;
    swiftlet::api::TextCallback cb;
    if (fn) cb = [&](std::string_view p) { return fn(p.data(), int(p.size()), user) != 0; };
    chat->chat->send(user_text, cb, o);
    return int(chat->chat->last_stats().generated_tokens);
  }, -1);
}

void swiftlet_chat_cancel(swiftlet_chat* chat) {
  if (chat) chat->chat->cancel();
}

const char* swiftlet_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
