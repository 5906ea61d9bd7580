// swiftlet public C++ API: load a model, chat or generate with a streaming callback, cancel,
// read statistics. Everything else in the tree is internal and may change.
//
//   auto engine = swiftlet::api::Engine::open({.model = "model.qpack"});
//   swiftlet::api::Chat chat(*engine, {.system = "Be brief."});
//   chat.send("Hello!", [](std::string_view piece) { std::cout << piece << std::flush; return true; });
//
// Several answers at once (continuous batching):
//
//   swiftlet::api::Batch batch(*engine);
//   auto a = batch.add("Once upon a time", {.greedy = true}, print_a);
//   auto b = batch.add(chat, "And then?", {}, print_b);   // the next turn of a Chat
//   batch.run();                                          // or step() in your own loop
//   std::string text_a = batch.result(a).text;
//
// Errors (a missing file, a corrupt container, bad options) are thrown as std::runtime_error
// with a message that says what to do.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet::api {

struct EngineOptions {
  std::string model;             // checkpoint directory or .qpack container
  std::string tokenizer;         // tokenizer.json instead of the model's own ("": the model's)
  std::string backend = "cpu";   // "cpu" or "reference" (scalar fp32)
  int threads = 0;               // 0: all cores
  bool verify_experts = true;    // check expert checksums as they are read
  // .qpack expert cache: its size ("1.5G", "800M", "all"; "": what the machine can spare less a
  // margin, as the command line's default), or a whole-process RAM budget to size it from ("4G";
  // refused with the numbers if unmeetable).
  std::string cache_size;
  std::string ram_budget;
  int predict_next = 1;          // layers ahead whose guessed experts are read early (0: off)
  // A routed expert not in memory: "exact" (wait for its read), "skip:W" (lossy: left out when
  // its router weight is below W, never a token's top-1; the others renormalised) or
  // "low-bit" / "low-bit:W" (lossy: its low-bit copy read instead, below W; a container with copies).
  std::string on_miss = "exact";
};

// Unset fields (negative / NaN-free sentinels below) take the model's generation_config.json.
struct GenerationOptions {
  int max_new_tokens = 512;
  bool greedy = false;
  float temperature = -1;        // < 0: model default
  int top_k = -1;                // < 0: model default; 0: off
  float top_p = -1;              // < 0: model default
  float min_p = -1;              // < 0: model default
  float repetition_penalty = -1; // < 0: model default
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint64_t seed = 0;             // 0: random
  std::vector<std::string> stop; // stop strings
};

struct Stats {
  int64_t prompt_tokens = 0, reused_tokens = 0, prefilled_tokens = 0, generated_tokens = 0;
  double ttft_seconds = 0, prefill_tok_s = 0, decode_tok_s = 0;
  uint64_t expert_hits = 0, expert_misses = 0, bytes_read = 0;
  uint64_t experts_skipped = 0;  // left out instead of read (on_miss "skip:W")
  uint64_t experts_low_bit = 0;  // read from their low-bit copies (on_miss "low-bit[:W]")
  double expert_hit_rate = 0;
  uint64_t peak_rss_bytes = 0;
  std::string finish_reason;     // "stop", "length" or "cancelled"
};

// Receives each piece of generated text as soon as it is complete UTF-8. Return false to stop.
using TextCallback = std::function<bool(std::string_view piece)>;

class Engine {
 public:
  static std::unique_ptr<Engine> open(const EngineOptions& opts);
  ~Engine();
  std::string describe() const;  // family, layers, experts, quantisation
  // One-shot generation from raw text (no chat template).
  std::string generate(const std::string& prompt, const GenerationOptions& opts = {},
                       const TextCallback& on_text = {}, Stats* stats = nullptr);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ChatOptions {
  std::string system;
  bool thinking = false;  // let Qwen3.5/3.6 think first
};

// A conversation: each send() prefills only the new turn. cancel() may be called from any
// thread (e.g. a signal handler's helper) to stop the answer being generated.
class Batch;

class Chat {
 public:
  Chat(Engine& engine, const ChatOptions& opts = {});
  ~Chat();
  std::string send(const std::string& user_text, const TextCallback& on_text = {},
                   const GenerationOptions& opts = {});
  void cancel();
  void reset();
  // The conversation (messages and the model's state) into one file, and back: after load()
  // the next send() prefills only its own turn. The file must come from the same model; a
  // missing, corrupt or foreign file is refused with the reason. CPU only.
  void save(const std::string& path) const;
  void load(const std::string& path);
  const Stats& last_stats() const;

 private:
  friend class Batch;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct BatchOptions {
  int max_sequences = 8;   // members at once; add() refuses more
  int prefill_chunk = 256; // prompt tokens a newcomer feeds between two steps of the others
};

// Several generations advanced together, one token each per step: the dense weights are read
// once per step for all of them and each routed expert once for those that chose it, so N
// answers cost much less than N times one. A newcomer's prompt is fed in chunks between steps.
// Each answer is exactly what Engine::generate / Chat::send gives alone (greedy: the same text;
// sampled: the same draws for the same seed). Not thread-safe, except cancel().
class Batch {
 public:
  using Id = uint64_t;
  explicit Batch(Engine& engine, const BatchOptions& opts = {});
  ~Batch();
  // A one-shot generation from raw text (no chat template), as Engine::generate.
  Id add(const std::string& prompt, const GenerationOptions& opts = {}, TextCallback on_text = {});
  // The next turn of `chat`, as chat.send() (the answer joins its history when finished; the
  // chat must outlive it and not be sent to meanwhile; chat.cancel() stops it).
  Id add(Chat& chat, const std::string& user_text, const GenerationOptions& opts = {}, TextCallback on_text = {});
  // One step; returns the ids that finished in it (their results wait in result()).
  std::vector<Id> step();
  void run();  // steps until every member has finished
  // Stops a member at its next step (finish reason "cancelled"). Any thread; unknown ids are ignored.
  void cancel(Id id);
  size_t active() const;  // members not finished

  struct Result {
    std::string text;
    Stats stats;
  };
  // A finished member's answer, handed over once. Throws if the id is unknown, not finished
  // yet, or its generation failed (the message says why).
  Result result(Id id);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace swiftlet::api
