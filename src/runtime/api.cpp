// The public API (include/swiftlet/swiftlet.h and swiftlet_c.h) over the runtime.
#include <swiftlet/swiftlet.h>
#include <swiftlet/swiftlet_c.h>

#include "core/error.h"
#include "runtime/batch.h"
#include "runtime/conversation.h"
#include "runtime/engine.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

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

// The batched pass runs as the engine's sessions do (the same miss policy).
swiftlet::BatchOptions batch_options(const swiftlet::Engine& e, const BatchOptions& o) {
  swiftlet::BatchOptions b;
  b.backend = e.backend();
  b.prefill_chunk = o.prefill_chunk;
  b.gpu = e.gpu_model();
  b.on_miss = e.on_miss();
  return b;
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
  o.experts_skipped = s.experts.skipped;
  o.experts_low_bit = s.experts.low_bit;
  o.expert_hit_rate = s.experts.hit_rate();
  o.peak_rss_bytes = s.peak_rss;
  o.finish_reason = finish_reason_name(r.finish);
  return o;
}

TokenCallback wrap(const TextCallback& cb) {
  if (!cb) return {};
  return [cb](std::string_view text, int32_t) { return text.empty() || cb(text); };
}

// A request for raw text (no chat template): special tokens in the text are parsed.
GenerateRequest raw_request(const swiftlet::Engine& e, const std::string& prompt, const GenerationOptions& opts) {
  GenerateRequest req;
  req.prompt = e.require_tokenizer().encode(prompt, /*parse_special=*/true);
  req.sampling = sampling_for(e, opts);
  req.max_new_tokens = opts.max_new_tokens;
  req.stop = opts.stop;
  req.stop_tokens = e.stop_tokens();
  return req;
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
  eo.on_miss = parse_miss_policy(opts.on_miss);
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
  GenerateRequest req = raw_request(e, prompt, opts);
  GenerateResult r = e.new_session()->generate(req, wrap(on_text));
  if (stats) *stats = to_stats(r);
  return r.text;
}

struct Chat::Impl {
  swiftlet::Engine& engine;
  Conversation conv;
  std::atomic<bool> cancel{false};
  Stats last;
  bool in_batch = false;  // a Batch is generating its turn
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
  if (impl_->in_batch) fail("this chat's turn is being generated in a Batch: wait until it finishes");
  impl_->cancel.store(false);
  GenerateResult r = impl_->conv.send(user_text, t, wrap(on_text), &impl_->cancel);
  impl_->last = to_stats(r);
  return r.text;
}

void Chat::cancel() { impl_->cancel.store(true); }
void Chat::reset() {
  if (impl_->in_batch) fail("this chat's turn is being generated in a Batch: wait until it finishes");
  impl_->conv.reset();
}
void Chat::save(const std::string& path) const {
  if (impl_->in_batch) fail("this chat's turn is being generated in a Batch: wait until it finishes");
  impl_->conv.save(path);
}
void Chat::load(const std::string& path) {
  if (impl_->in_batch) fail("this chat's turn is being generated in a Batch: wait until it finishes");
  impl_->conv.load(path);
}
const Stats& Chat::last_stats() const { return impl_->last; }

// ---- Batch ----

struct Batch::Impl {
  struct Member {
    std::unique_ptr<Session> own;  // a raw-text member's session
    Chat::Impl* chat = nullptr;    // a chat member's chat
    std::optional<Conversation::Turn> turn;
    std::shared_ptr<std::atomic<bool>> cancel;
    bool finished = false;
    Result result;
    std::string error;
  };
  swiftlet::Engine& engine;
  BatchOptions opts;
  swiftlet::Batch batch;
  std::map<Id, Member> members;  // engine-side ids; results wait here until taken
  mutable std::mutex cancel_mu;  // guards the cancel flags' lookup (cancel() is any thread's)
  Impl(swiftlet::Engine& e, const BatchOptions& o)
      : engine(e), opts(o), batch(e.model(), batch_options(e, o)) {}

  size_t active() const {
    return size_t(std::count_if(members.begin(), members.end(), [](const auto& kv) { return !kv.second.finished; }));
  }
  void check_room() const {
    if (int(active()) >= opts.max_sequences)
      fail("the batch is full ({} members, max_sequences {}): step it until one finishes, or raise max_sequences",
           active(), opts.max_sequences);
  }
  Id join(Member m, Session& session, GenerateRequest req, const TextCallback& on_text,
          const std::atomic<bool>* cancel) {
    const Id id = batch.add(session, std::move(req), wrap(on_text), cancel);
    std::lock_guard lock(cancel_mu);
    members.emplace(id, std::move(m));
    return id;
  }
};

Batch::Batch(Engine& engine, const BatchOptions& opts) {
  if (opts.max_sequences < 1) fail("max_sequences must be at least 1, got {}", opts.max_sequences);
  if (opts.prefill_chunk < 1) fail("prefill_chunk must be at least 1 token, got {}", opts.prefill_chunk);
  impl_ = std::make_unique<Impl>(*engine.impl().engine, opts);
}

Batch::~Batch() {
  // Members still generating hold chats: give them back unfinished.
  for (auto& [id, m] : impl_->members)
    if (m.chat && !m.finished) m.chat->in_batch = false;
}

Batch::Id Batch::add(const std::string& prompt, const GenerationOptions& opts, TextCallback on_text) {
  impl_->check_room();
  swiftlet::Engine& e = impl_->engine;
  GenerateRequest req = raw_request(e, prompt, opts);
  Impl::Member m;
  m.own = e.new_session();
  m.cancel = std::make_shared<std::atomic<bool>>(false);
  Session& session = *m.own;
  const std::atomic<bool>* flag = m.cancel.get();
  return impl_->join(std::move(m), session, std::move(req), on_text, flag);
}

Batch::Id Batch::add(Chat& chat, const std::string& user_text, const GenerationOptions& opts, TextCallback on_text) {
  impl_->check_room();
  Chat::Impl& c = *chat.impl_;
  if (&c.engine != &impl_->engine) fail("this chat belongs to another engine than the batch's");
  if (c.in_batch) fail("this chat's previous turn is still being generated in a Batch: wait until it finishes");
  TurnOptions t;
  t.sampling = sampling_for(c.engine, opts);
  t.max_new_tokens = opts.max_new_tokens;
  t.stop = opts.stop;
  Impl::Member m;
  m.chat = &c;
  m.turn = c.conv.begin_turn(user_text, t);
  m.cancel = std::make_shared<std::atomic<bool>>(false);
  c.cancel.store(false);
  GenerateRequest req = m.turn->req;
  const Id id = impl_->join(std::move(m), c.conv.session(), std::move(req), on_text, &c.cancel);
  c.in_batch = true;
  return id;
}

std::vector<Batch::Id> Batch::step() {
  std::vector<Id> ids;
  // Batch::cancel's flags are read here, so chat members (whose flag is the chat's) see both.
  {
    std::lock_guard lock(impl_->cancel_mu);
    for (auto& [id, m] : impl_->members)
      if (m.chat && !m.finished && m.cancel->load()) m.chat->cancel.store(true);
  }
  for (swiftlet::Batch::Finished& f : impl_->batch.step()) {
    Impl::Member& m = impl_->members.at(f.id);
    m.finished = true;
    ids.push_back(f.id);
    if (f.error) {
      try {
        std::rethrow_exception(f.error);
      } catch (const std::exception& e) {
        m.error = e.what();
      }
    } else {
      m.result = {f.result.text, to_stats(f.result)};
    }
    m.own.reset();
    if (m.chat) {
      if (!f.error) m.chat->conv.end_turn(std::move(*m.turn), f.result);
      m.chat->last = m.result.stats;
      m.chat->in_batch = false;
    }
  }
  return ids;
}

void Batch::run() {
  while (impl_->active() > 0) step();
}

void Batch::cancel(Id id) {
  std::lock_guard lock(impl_->cancel_mu);
  auto it = impl_->members.find(id);
  if (it != impl_->members.end()) it->second.cancel->store(true);
}

size_t Batch::active() const { return impl_->active(); }

Batch::Result Batch::result(Id id) {
  std::lock_guard lock(impl_->cancel_mu);
  auto it = impl_->members.find(id);
  if (it == impl_->members.end()) fail("batch member {} is unknown (or its result was already taken)", id);
  if (!it->second.finished) fail("batch member {} is still generating: step() until it is returned as finished", id);
  if (!it->second.error.empty()) {
    const std::string msg = it->second.error;
    impl_->members.erase(it);
    fail("batch member {} failed: {}", id, msg);
  }
  Result r = std::move(it->second.result);
  impl_->members.erase(it);
  return r;
}

}  // namespace swiftlet::api

// ---- C API ----

struct swiftlet_engine {
  std::unique_ptr<swiftlet::api::Engine> engine;
};
struct swiftlet_chat {
  std::unique_ptr<swiftlet::api::Chat> chat;
};
struct swiftlet_batch {
  std::unique_ptr<swiftlet::api::Batch> batch;
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

swiftlet::api::TextCallback c_callback(swiftlet_text_fn fn, void* user) {
  if (!fn) return {};
  return [fn, user](std::string_view p) { return fn(p.data(), int(p.size()), user) != 0; };
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

int swiftlet_chat_save(swiftlet_chat* chat, const char* path) {
  return guarded([&] {
    if (!chat || !path) swiftlet::fail("swiftlet_chat_save: chat and path must not be NULL");
    chat->chat->save(path);
    return 0;
  }, -1);
}

int swiftlet_chat_load(swiftlet_chat* chat, const char* path) {
  return guarded([&] {
    if (!chat || !path) swiftlet::fail("swiftlet_chat_load: chat and path must not be NULL");
    chat->chat->load(path);
    return 0;
  }, -1);
}

swiftlet_batch* swiftlet_batch_new(swiftlet_engine* engine, int max_sequences) {
  return guarded([&] {
    if (!engine) swiftlet::fail("swiftlet_batch_new: engine is NULL");
    swiftlet::api::BatchOptions o;
    if (max_sequences > 0) o.max_sequences = max_sequences;
    return new swiftlet_batch{std::make_unique<swiftlet::api::Batch>(*engine->engine, o)};
  }, static_cast<swiftlet_batch*>(nullptr));
}

void swiftlet_batch_free(swiftlet_batch* batch) { delete batch; }

long long swiftlet_batch_add(swiftlet_batch* batch, const char* prompt, int max_new_tokens, int greedy,
                             swiftlet_text_fn fn, void* user) {
  return guarded([&] {
    if (!batch || !prompt) swiftlet::fail("swiftlet_batch_add: batch and prompt must not be NULL");
    swiftlet::api::GenerationOptions o;
    if (max_new_tokens > 0) o.max_new_tokens = max_new_tokens;
    o.greedy = greedy != 0;
    return static_cast<long long>(batch->batch->add(prompt, o, c_callback(fn, user)));
  }, -1LL);
}

long long swiftlet_batch_add_chat(swiftlet_batch* batch, swiftlet_chat* chat, const char* user_text,
                                  int max_new_tokens, swiftlet_text_fn fn, void* user) {
  return guarded([&] {
    if (!batch || !chat || !user_text) swiftlet::fail("swiftlet_batch_add_chat: batch, chat and user_text must not be NULL");
    swiftlet::api::GenerationOptions o;
    if (max_new_tokens > 0) o.max_new_tokens = max_new_tokens;
    return static_cast<long long>(batch->batch->add(*chat->chat, user_text, o, c_callback(fn, user)));
  }, -1LL);
}

int swiftlet_batch_step(swiftlet_batch* batch) {
  return guarded([&] {
    if (!batch) swiftlet::fail("swiftlet_batch_step: batch is NULL");
    // The text went out through the callbacks: results are not kept (a failure is reported).
    std::string failed;
    for (swiftlet::api::Batch::Id id : batch->batch->step()) {
      try {
        batch->batch->result(id);
      } catch (const std::exception& e) {
        if (failed.empty()) failed = e.what();
      }
    }
    if (!failed.empty()) swiftlet::fail("{}", failed);
    return int(batch->batch->active());
  }, -1);
}

void swiftlet_batch_cancel(swiftlet_batch* batch, long long id) {
  if (batch && id > 0) batch->batch->cancel(swiftlet::api::Batch::Id(id));
}

const char* swiftlet_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
