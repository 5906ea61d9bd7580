// Next-token sampling and stop strings.
//
// Order as in HF transformers' logits processors/warpers (and llama.cpp's penalties first):
//   1. penalties: repetition (HF: a positive logit is divided by the penalty, a negative one
//      multiplied, once per distinct token of the history), then presence/frequency (OpenAI:
//      logit -= presence * (count > 0) + frequency * count);
//   2. temperature, 3. top-k, 4. top-p, 5. min-p (each on the distribution the previous step
//      left, renormalised), 6. one draw.
// temperature <= 0 or greedy: argmax of the penalised logits, ties to the lowest id.
//
// Reproducible for a seed on every platform: std::mt19937_64 (its output is fixed by the
// standard) and our own uniform double, never std::uniform_real_distribution. Top-k keeps
// exactly k tokens, ties broken towards lower ids (HF would keep every token tied with the
// k-th). No allocation per call: every buffer is sized to the vocabulary at construction.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace swiftlet {

// A set of token ids: the set bits of `bits` (bit t % 64 of word t / 64) and the entries of
// `ids`, which name no id of `bits` twice.
struct TokenSet {
  std::span<const uint64_t> bits;
  std::span<const int32_t> ids;
};

// Sets the logits of the tokens outside `allowed` to -inf (allowed ids beyond the logits are
// ignored). `held` is scratch: the listed ids' logits while their words are cleared.
void mask_outside(std::span<float> logits, const TokenSet& allowed, std::vector<float>& held);

struct SamplingParams {
  float temperature = 0.7f;        // <= 0: greedy
  int top_k = 20;                  // <= 0 or >= vocab: off
  float top_p = 0.8f;              // >= 1: off; else keep the smallest set with mass >= top_p
  float min_p = 0;                 // <= 0: off; else keep p >= min_p * p_max
  float repetition_penalty = 1;    // 1: off; must be > 0
  float presence_penalty = 0;
  float frequency_penalty = 0;
  uint64_t seed = 0;               // 0 = random (std::random_device)
  bool greedy = false;
};

// Reads temperature, top_k, top_p, min_p, repetition_penalty and do_sample (false -> greedy)
// from a generation_config.json object over `defaults`; absent keys keep the default (so a
// config without do_sample stays sampling, unlike HF's greedy default). Throws Error naming the
// key for a value of the wrong type or out of range.
SamplingParams sampling_params_from_generation_config(const nlohmann::json& config, SamplingParams defaults = {});

// Throws Error quoting the bad number (negative temperature, top_p outside (0, 1], ...).
void validate(const SamplingParams& params);

class Sampler {
 public:
  Sampler(SamplingParams params, int vocab_size);

  // Picks the next token. `logits` (vocab_size entries) is modified in place: penalties are
  // applied and NaN becomes -inf. `history` holds the tokens the penalties count (the generated
  // ones, the prompt too if the caller wants). Every id must be < vocab_size.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  // The two halves of sample(): the penalties, in place, then the pick from penalised logits.
  void penalize(std::span<float> logits, std::span<const int32_t> history);
  int32_t pick(std::span<float> logits);
  // pick() over logits whose tokens outside `allowed` are -inf, reading only the allowed ones
  // where it can (greedy, top-k): the same token, from the same random draw. Allowed ids without
  // a logit are ignored. `logits` may be modified (NaN becomes -inf; without top-k the others
  // are set to -inf and pick() runs). Throws Error when no allowed logit is finite.
  int32_t pick_among(std::span<float> logits, const TokenSet& allowed);

  bool greedy() const { return params_.greedy || params_.temperature <= 0; }
  bool penalizes() const {
    return params_.repetition_penalty != 1 || params_.presence_penalty != 0 || params_.frequency_penalty != 0;
  }

  // Restarts the random stream; 0 draws a fresh random seed.
  void reset(uint64_t seed);

  const SamplingParams& params() const { return params_; }
  int vocab_size() const { return vocab_; }
  uint64_t seed() const { return seed_; }  // the seed in use (the drawn one when params.seed == 0)

 private:
  size_t keep_top_k(std::span<const float> logits, size_t k);
  size_t keep_top_k_among(std::span<float> logits, const TokenSet& allowed, size_t k);
  int32_t draw_top_k(std::span<const float> logits, size_t n);
  int32_t draw(size_t n);
  size_t keep_top_p_of_all(std::span<const float> logits, float max_logit, float inv_temp);
  double uniform();  // [0, 1), 53 random bits

  SamplingParams params_;
  int vocab_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::vector<int32_t> ids_;      // [vocab] candidate token ids; the first n are the survivors
  std::vector<float> probs_;      // [vocab] unnormalised probabilities of ids_[i]
  std::vector<int32_t> counts_;   // [vocab] occurrences in the history; zero between calls
  std::vector<int32_t> touched_;  // [<= vocab] distinct history tokens of this call
  std::vector<float> held_;       // mask_outside scratch (pick_among without top-k)
  std::vector<double> bucket_mass_;  // [kTopPBuckets] probability mass per -log p bucket (top-p)
};

// Stop strings over streamed text. Feed each decoded piece; the result says which text is safe
// to show now. A suffix that could still grow into a stop string is held back until it either
// completes one (then the text before the stop is returned, and nothing after it ever is) or
// stops matching. Stop strings never straddle text already returned.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now (the text before the stop, when stopped)
    bool stopped = false;  // a stop string was completed (now or earlier)
  };
  Result feed(std::string_view piece);

  // End of generation without a stop: the text still held back.
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_; }  // "" until stopped
  size_t held_back() const { return pending_.size(); }
  void reset();

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // received, not yet emitted: always a possible start of a stop string
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace swiftlet
