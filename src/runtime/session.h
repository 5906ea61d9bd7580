// A conversation with the model: its state, prefix reuse, and the generation loop
// (prefill in chunks, sample, stream text, stop on tokens / strings / length / cancel).
#pragma once

#include "model/forward_pass.h"
#include "model/gpu_forward.h"
#include "model/qwen3_hybrid.h"
#include "runtime/mask_prefetcher.h"
#include "runtime/sampler.h"
#include "runtime/state_cache.h"
#include "runtime/token_constraint.h"
#include "tokenizer/tokenizer.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled"

struct GenerateRequest {
  std::vector<int32_t> prompt;       // the whole conversation so far, as tokens
  SamplingParams sampling;
  int max_new_tokens = 256;
  std::vector<std::string> stop;     // stop strings (matched on the decoded text)
  std::vector<int32_t> stop_tokens;  // e.g. <|im_end|>, <|endoftext|>
  // Set: only tokens it allows are sampled (JSON schemas, forced tool calls). One per request:
  // it follows the answer's state.
  std::shared_ptr<TokenConstraint> constraint;
  // Where the prompt's messages start (ascending; a chat's <|im_start|> positions): the prefix
  // state cache may keep checkpoints there (StateCache::checkpoints). Empty: none.
  std::vector<size_t> message_starts;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;     // prompt tokens whose state was already there (prefix reuse)
  int64_t prefilled_tokens = 0;  // prompt tokens run through the model by this request
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double ttft_seconds = 0;       // request start to the first generated token
  double decode_seconds = 0;     // first to last generated token
  double sample_seconds = 0;     // picking the generated tokens from the logits (sampler, constraint)
  ExpertStats experts;           // this request's share of the expert source's counters
  MissPolicy on_miss;            // how missed experts were treated (label() for printed figures)
  bool on_gpu = false;           // decoded on the GPU (--gpu): then `gpu` holds the VRAM cache's share
  GpuStats gpu;
  size_t peak_rss = 0;           // bytes, whole process so far
  double prefill_tok_s() const { return prefill_seconds > 0 ? double(prefilled_tokens) / prefill_seconds : 0; }
  double decode_tok_s() const {
    return decode_seconds > 0 && generated_tokens > 1 ? double(generated_tokens - 1) / decode_seconds : 0;
  }
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids; a stop token that ended generation is included
  std::string text;             // their text, without the stop token or stop string
  FinishReason finish = FinishReason::Length;
  std::string stop_string;      // the stop string that ended it, if any
  GenerateStats stats;
};

// Called with each new piece of complete UTF-8 text and the token that completed it.
// Return false to stop generating (finish reason "cancelled").
using TokenCallback = std::function<bool(std::string_view text, int32_t token)>;

struct SessionOptions {
  Backend backend = Backend::Cpu;
  int prefill_chunk = kPrefillChunk;  // prompt tokens per forward call (model/qwen3_hybrid.h)
  int max_snapshots = 2;    // DeltaNet snapshots kept for prefix reuse
  int64_t max_context = 0;  // 0: the model's limit is not enforced here
  int predict_next = 1;  // decode: layers ahead whose guessed experts are read early (0: off)
  // A routed expert missing from memory: exact (wait for its read) or skip:W (lossy; CPU only).
  MissPolicy on_miss;
  bool chunked_prefill = false;  // prompts: DeltaNet in the chunked form (model-math.md 5.5)
  // Run on this GPU model (model/gpu_forward.h) instead of the CPU; null: the CPU.
  std::shared_ptr<GpuModel> gpu;
  // Sees every routing decision / chooses the experts instead of the router (CPU only; see
  // model/qwen3_hybrid.h). Not owned.
  RoutingObserver* routing_observer = nullptr;
  RouteOverride* route_override = nullptr;
  // The prefix state cache shared by the sessions of this model (state_cache.h): a prompt starts
  // from its longest cached prefix, and the states at the prompt's checkpoints are kept there.
  // Null: none. On the GPU its states are copied between VRAM and the cache.
  std::shared_ptr<StateCache> state_cache;
  // A constrained answer's next mask made on a worker thread while the model runs
  // (mask_prefetcher.h). Unset: on the GPU only (the CPU's forward pass uses every core).
  std::optional<bool> prefetch_masks;
};

class Batch;
class Generation;

class Session {
 public:
  // tokenizer may be null: then text, stop strings and the streamed pieces are empty.
  Session(const Model& model, const Tokenizer* tokenizer, SessionOptions opts = {});

  GenerateResult generate(const GenerateRequest& req, const TokenCallback& on_token = {},
                          const std::atomic<bool>* cancel = nullptr);

  // Brings the state to `prompt` reusing what it can; returns the number of reused tokens.
  // Afterwards last_logits() holds the logits after the last prompt token.
  int64_t prepare(std::span<const int32_t> prompt, const std::atomic<bool>* cancel = nullptr,
                  std::span<const size_t> message_starts = {});
  const std::vector<float>& last_logits() const { return logits_; }

  // A prompt in pieces (Batch feeds newcomers a chunk at a time between decode steps):
  // begin_prompt validates the prompt and rewinds the state as prepare() does, returning the
  // reused tokens; feed_prompt then runs up to `max_tokens` of the rest, stopping at
  // `snapshot_at` (a turn boundary, 0: none) to keep a DeltaNet snapshot there, and passing
  // the state cache's checkpoints (StateCache::checkpoints) to keep the state there. When
  // prompt_pending() is 0 the logits are ready and a snapshot of the prompt's end is kept.
  // Chunk boundaries never change a result (the token-by-token DeltaNet form).
  int64_t begin_prompt(std::span<const int32_t> prompt, size_t snapshot_at = 0,
                       std::span<const size_t> message_starts = {});
  size_t prompt_pending() const { return pending_.size() - pending_done_; }
  void feed_prompt(size_t max_tokens);

  // Runs `tokens` from a fresh state (nothing reused, no snapshot kept) as one prompt and returns
  // the logits of the positions from `from` on ([T - from][vocab]: row j predicts token
  // from + j + 1). For perplexity, which scores the second half of a window.
  const std::vector<float>& score(std::span<const int32_t> tokens, int64_t from = 0);

  void reset();
  // The conversation's whole state (tokens, K/V, DeltaNet states, the logits when at hand) and
  // `note` (the caller's bytes: a chat keeps its messages there) into one file, written
  // atomically (docs/state-cache.md); on the GPU copied from VRAM first. Throws Error.
  void save(const std::string& path, const std::string& note = {}) const;
  // Restores a state saved by save() on the same model and returns its note. Throws Error,
  // leaving the session as it was, for a missing, corrupt, truncated or foreign file.
  std::string load(const std::string& path);
  const SessionState& state() const { return state_; }
  const Model& model() const { return model_; }
  // The pass that runs (the CPU Forward, or the GPU's when SessionOptions::gpu is set).
  const ForwardPass& pass() const { return *forward_; }
  // The CPU pass, for its profile; null on the GPU.
  const Forward* cpu_forward() const { return dynamic_cast<const Forward*>(forward_.get()); }
  // The pass's guesses of the next layers' experts so far (zeros where it makes none).
  PredictionStats prediction_stats() const { return forward_->prediction_stats(); }
  bool on_gpu() const { return opts_.gpu != nullptr; }
  // Bytes of prompt-sized activation buffers held by the pass that runs (CPU or GPU memory).
  size_t buffer_bytes() const { return forward_->buffer_bytes(); }
  // The worker that makes masks ahead in generate(); null when prefetching is off.
  MaskPrefetcher* mask_prefetcher() { return prefetcher_.get(); }

 private:
  friend class Batch;
  friend class Generation;
  void check_prompt(std::span<const int32_t> prompt) const;
  int64_t rewind_for(std::span<const int32_t> prompt);
  void remember_snapshot();
  StateCache* cache() const { return opts_.state_cache.get(); }

  const Model& model_;
  const Tokenizer* tokenizer_;
  SessionOptions opts_;
  std::unique_ptr<ForwardPass> forward_;
  SessionState state_;
  std::vector<float> logits_;     // after consuming state_.pos tokens, when logits_pos_ == pos
  int64_t logits_pos_ = -1;
  std::vector<StateSnapshot> snapshots_;  // oldest first
  std::vector<int32_t> pending_;  // begin_prompt: the prompt tokens left to feed
  size_t pending_done_ = 0;       // of pending_, those fed
  size_t pending_mark_ = 0;       // of pending_, where a snapshot is due (0: none)
  std::vector<size_t> pending_saves_;  // of pending_, where the state cache keeps a checkpoint, ascending
  std::unique_ptr<MaskPrefetcher> prefetcher_;  // SessionOptions::prefetch_masks
};

// One answer being generated on a session: samples each token from the session's logits,
// streams its text and applies the stops (tokens, strings, length, cancel). Session::generate
// runs one from prompt to end; Batch interleaves several, running their tokens together.
class Generation {
 public:
  // Throws Error for a bad request (max_new_tokens < 0, invalid sampling). `req` must outlive
  // this object. The clock of the stats starts here.
  Generation(Session& session, const GenerateRequest& req, TokenCallback on_token,
             const std::atomic<bool>* cancel);
  // The prompt is in (or was cancelled: the session's logits are not ready): `reused` of its
  // tokens came from the state already there.
  void prompt_done(int64_t reused);
  // Samples the next token and streams its text. Returns the token to run through the model
  // (after which the session's logits must follow it), or nothing once the answer is complete.
  std::optional<int32_t> next();
  bool finished() const { return finished_; }
  // Flushes the text still held back and completes the stats. Call once, when finished().
  GenerateResult finish();

 private:
  bool emit(const std::string& text, int32_t token);

  Session& s_;
  const GenerateRequest& req_;
  TokenCallback on_token_;
  const std::atomic<bool>* cancel_;
  GenerateResult res_;
  ExpertStats experts_before_;
  GpuStats gpu_before_;
  std::chrono::steady_clock::time_point t0_, t_first_;
  Sampler sampler_;
  std::optional<StreamDecoder> decoder_;
  StopMatcher stops_;
  std::vector<int32_t> history_;
  int i_ = 0;
  bool finished_ = false;
};

}  // namespace swiftlet
