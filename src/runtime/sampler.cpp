#include "runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cpu/matmul_avx2.h"

namespace swiftlet {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Top-p histogram: 16 buckets per nat of -log(p / p_max) cover 64 nats (p >= 1.6e-28 * p_max).
constexpr size_t kTopPBuckets = 1024;
constexpr float kTopPBucketsPerNat = 16;

// Reads config[key] into `out` when present and not null.
void read_float(const nlohmann::json& config, const char* key, float& out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return;
  if (!it->is_number())
    fail("generation_config.json: '{}' must be a number, got {}; fix or remove it", key, it->dump());
  out = it->get<float>();
}

// NaN -> -inf in place; returns the maximum and, with ARG, the id of its first occurrence (lowest
// id on ties) in *arg, so greedy decoding needs no second pass over the vocabulary. Eight
// independent lanes: one running maximum would serialise on the compare latency (this pass
// touches the whole 248k vocabulary). Each lane keeps where its maximum first appeared (strict >);
// the lowest id among the lanes holding the maximum wins, and the tail after them only by a larger
// value. Compiled twice, for the baseline and for AVX2 (the lanes become one vector: 58 -> 11 us
// over 152k logits without ARG).
template <bool ARG>
[[gnu::always_inline]] inline float sanitize_max_body(std::span<float> logits, uint32_t* arg) {
  float lane[8];
  uint32_t at[8] = {};
  std::fill(std::begin(lane), std::end(lane), kNegInf);
  float* p = logits.data();
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) {
      const float x = p[i + j] == p[i + j] ? p[i + j] : kNegInf;
      p[i + j] = x;
      const bool up = x > lane[j];
      lane[j] = up ? x : lane[j];
      if constexpr (ARG) at[j] = up ? static_cast<uint32_t>(i) : at[j];
    }
  }
  float best = *std::max_element(std::begin(lane), std::end(lane));
  uint32_t first = UINT32_MAX;
  if constexpr (ARG)
    for (size_t j = 0; j < 8; ++j)
      if (lane[j] == best && lane[j] != kNegInf) first = std::min(first, at[j] + static_cast<uint32_t>(j));
  for (; i < n; ++i) {
    const float x = p[i] == p[i] ? p[i] : kNegInf;
    p[i] = x;
    if (x > best || (ARG && first == UINT32_MAX && x == best)) {
      best = x;
      first = static_cast<uint32_t>(i);
    }
  }
  if constexpr (ARG) *arg = first == UINT32_MAX ? 0 : first;
  return best;
}
template <bool ARG>
float sanitize_max_base(std::span<float> logits, uint32_t* arg) {
  return sanitize_max_body<ARG>(logits, arg);
}
#if defined(__x86_64__)
template <bool ARG>
[[gnu::target("avx2")]] float sanitize_max_avx2(std::span<float> logits, uint32_t* arg) {
  return sanitize_max_body<ARG>(logits, arg);
}
#endif
// sanitize_max_body, for the CPU at hand; with arg non-null also the first maximum's id.
float sanitize_and_max(std::span<float> logits, uint32_t* arg = nullptr) {
#if defined(__x86_64__)
  static const bool avx2 = avx2::cpu_has_avx2();
  if (avx2) return arg ? sanitize_max_avx2<true>(logits, arg) : sanitize_max_avx2<false>(logits, nullptr);
#endif
  return arg ? sanitize_max_base<true>(logits, arg) : sanitize_max_base<false>(logits, nullptr);
}

}  // namespace

void validate(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    fail("sampling: temperature must be >= 0 (0 = greedy), got {}", p.temperature);
  if (p.top_k < 0) fail("sampling: top_k must be >= 0 (0 = off), got {}", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("sampling: top_p must be in (0, 1] (1 = off), got {}", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("sampling: min_p must be in [0, 1] (0 = off), got {}", p.min_p);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0)
    fail("sampling: repetition_penalty must be > 0 (1 = off), got {}", p.repetition_penalty);
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
    fail("sampling: presence_penalty and frequency_penalty must be finite, got {} and {}", p.presence_penalty,
         p.frequency_penalty);
}

SamplingParams sampling_params_from_generation_config(const nlohmann::json& config, SamplingParams p) {
  if (!config.is_object()) fail("generation_config.json must hold a JSON object, got {}", config.type_name());
  read_float(config, "temperature", p.temperature);
  read_float(config, "top_p", p.top_p);
  read_float(config, "min_p", p.min_p);
  read_float(config, "repetition_penalty", p.repetition_penalty);
  if (auto it = config.find("top_k"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer())
      fail("generation_config.json: 'top_k' must be an integer, got {}; fix or remove it", it->dump());
    p.top_k = it->get<int>();
  }
  if (auto it = config.find("do_sample"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean())
      fail("generation_config.json: 'do_sample' must be true or false, got {}; fix or remove it", it->dump());
    p.greedy = !it->get<bool>();
  }
  validate(p);
  return p;
}

void mask_outside(std::span<float> logits, const TokenSet& allowed, std::vector<float>& held) {
  const size_t vocab = logits.size();
  const auto has_logit = [vocab](int32_t id) { return id >= 0 && static_cast<size_t>(id) < vocab; };
  held.clear();
  for (int32_t id : allowed.ids) held.push_back(has_logit(id) ? logits[size_t(id)] : kNegInf);
  for (size_t w = 0; w * 64 < vocab; ++w) {
    const uint64_t word = w < allowed.bits.size() ? allowed.bits[w] : 0;
    if (word == ~uint64_t{0}) continue;
    const size_t end = std::min(vocab, (w + 1) * 64);
    if (word == 0) {  // most words of a structural state's mask
      std::fill(logits.begin() + static_cast<ptrdiff_t>(w * 64), logits.begin() + static_cast<ptrdiff_t>(end), kNegInf);
      continue;
    }
    for (size_t t = w * 64; t < end; ++t)
      if (!((word >> (t & 63)) & 1)) logits[t] = kNegInf;
  }
  for (size_t i = 0; i < allowed.ids.size(); ++i)
    if (has_logit(allowed.ids[i])) logits[size_t(allowed.ids[i])] = held[i];
}

// ---- Sampler -----------------------------------------------------------------------------------

Sampler::Sampler(SamplingParams params, int vocab_size) : params_(params), vocab_(vocab_size) {
  SWIFTLET_CHECK(vocab_size > 0, "sampler vocab_size {}", vocab_size);
  validate(params_);
  ids_.resize(vocab_);
  probs_.resize(vocab_);
  counts_.assign(vocab_, 0);
  touched_.reserve(vocab_);
  bucket_mass_.resize(kTopPBuckets);
  reset(params_.seed);
}

void Sampler::reset(uint64_t seed) {
  if (seed == 0) {
    std::random_device rd;
    seed = (uint64_t{rd()} << 32) ^ rd();
    if (seed == 0) seed = 1;
  }
  seed_ = seed;
  rng_.seed(seed);
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::penalize(std::span<float> logits, std::span<const int32_t> history) {
  SWIFTLET_CHECK(logits.size() == static_cast<size_t>(vocab_), "sampler got {} logits for a vocabulary of {}",
                 logits.size(), vocab_);
  if (!penalizes()) return;
  const float rep = params_.repetition_penalty;
  const float presence = params_.presence_penalty;
  const float frequency = params_.frequency_penalty;
  touched_.clear();
  for (int32_t t : history) {
    SWIFTLET_CHECK(t >= 0 && t < vocab_, "history token {} is outside the vocabulary of {}", t, vocab_);
    if (counts_[t]++ == 0) touched_.push_back(t);
  }
  for (int32_t t : touched_) {
    float& l = logits[t];
    if (rep != 1) l = l < 0 ? l * rep : l / rep;  // HF RepetitionPenaltyLogitsProcessor
    l -= presence + frequency * static_cast<float>(counts_[t]);
    counts_[t] = 0;
  }
}

// Orders candidate ids by logit, descending, ties towards the lower id: a strict total order, so
// nth_element/sort give the same result on every standard library.
namespace {
struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Calls f(id) for each id of the set that has a logit (a tokenizer may name more ids than the
// model scores: those can never be picked).
template <typename F>
void for_each_id(const TokenSet& set, size_t vocab, F&& f) {
  const size_t words = std::min(set.bits.size(), (vocab + 63) / 64);
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t word = set.bits[w]; word; word &= word - 1) {
      const size_t id = w * 64 + static_cast<size_t>(std::countr_zero(word));
      if (id < vocab) f(static_cast<int32_t>(id));
    }
  }
  for (int32_t id : set.ids)
    if (id >= 0 && static_cast<size_t>(id) < vocab) f(id);
}

float sanitized(float& x) { return x = x == x ? x : kNegInf; }
}  // namespace

// Top-k into ids_[0, k), best first. Small k (the usual 20): one contiguous pass that keeps the
// k best in a heap whose top is the worst of them; a later id only enters with a strictly larger
// logit, which is the lower-id tie rule. Large k: nth_element over all ids.
size_t Sampler::keep_top_k(std::span<const float> logits, size_t k) {
  const ByLogitDesc cmp{logits.data()};
  const auto first = ids_.begin();
  const auto last = first + static_cast<ptrdiff_t>(k);
  if (k <= 1024) {
    std::iota(first, last, 0);
    std::make_heap(first, last, cmp);
    float worst = logits[ids_[0]];
    for (size_t i = k; i < logits.size(); ++i) {
      if (logits[i] > worst) {
        std::pop_heap(first, last, cmp);
        *(last - 1) = static_cast<int32_t>(i);
        std::push_heap(first, last, cmp);
        worst = logits[ids_[0]];
      }
    }
  } else {
    std::iota(ids_.begin(), ids_.end(), 0);
    std::nth_element(first, last, ids_.end(), cmp);
  }
  std::sort(first, last, cmp);
  return k;
}

// keep_top_k over the allowed tokens alone (NaN among them becomes -inf): the same ids as
// keep_top_k over logits with the others at -inf, but for -inf ids, which have no probability.
// Any order of the set gives them: a token enters the heap only if it ranks above its worst.
size_t Sampler::keep_top_k_among(std::span<float> logits, const TokenSet& allowed, size_t k) {
  const ByLogitDesc cmp{logits.data()};
  size_t n = 0;
  for_each_id(allowed, logits.size(), [&](int32_t id) {
    sanitized(logits[size_t(id)]);
    if (n < k) {
      ids_[n++] = id;
      std::push_heap(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(n), cmp);
    } else if (cmp(id, ids_[0])) {
      std::pop_heap(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(n), cmp);
      ids_[n - 1] = id;
      std::push_heap(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(n), cmp);
    }
  });
  std::sort(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(n), cmp);
  return n;
}

// Top-p over the whole vocabulary without sorting it. Tokens fall into buckets of
// d = -log(p / p_max) (kTopPBucketsPerNat per nat, the last bucket takes everything beyond);
// bucket order is logit order, so whole buckets before the one where the cumulative mass
// reaches top_p are kept, and only that bucket is sorted to find the exact cut. Survivors
// land in ids_/probs_ (not sorted); returns their count.
size_t Sampler::keep_top_p_of_all(std::span<const float> logits, float max_logit, float inv_temp) {
  const auto bucket_of = [](float d) {
    return d < kTopPBuckets / kTopPBucketsPerNat ? static_cast<size_t>(d * kTopPBucketsPerNat) : kTopPBuckets - 1;
  };
  std::fill(bucket_mass_.begin(), bucket_mass_.end(), 0.0);
  double total = 0;
  for (float l : logits) {
    const float d = (max_logit - l) * inv_temp;
    const double p = std::exp(-d);
    bucket_mass_[bucket_of(d)] += p;
    total += p;
  }
  const double target = static_cast<double>(params_.top_p) * total;
  double before = 0;  // mass of the buckets kept whole
  size_t cut = 0;
  while (cut < kTopPBuckets && before + bucket_mass_[cut] < target) before += bucket_mass_[cut++];

  // Whole buckets to the front of ids_, the cut bucket to the back (n never passes the back).
  const size_t vocab = logits.size();
  size_t n = 0, back = vocab;
  for (size_t i = 0; i < vocab; ++i) {
    const float d = (max_logit - logits[i]) * inv_temp;
    const size_t b = bucket_of(d);
    if (b < cut) {
      ids_[n] = static_cast<int32_t>(i);
      probs_[n++] = std::exp(-d);
    } else if (b == cut) {
      ids_[--back] = static_cast<int32_t>(i);
    }
  }
  std::sort(ids_.begin() + static_cast<ptrdiff_t>(back), ids_.end(), ByLogitDesc{logits.data()});
  for (size_t j = back; j < vocab && before < target; ++j) {  // keep while the mass before is < top_p
    const int32_t id = ids_[j];  // n <= j: reading before writing is safe
    ids_[n] = id;
    probs_[n] = std::exp((logits[id] - max_logit) * inv_temp);
    before += probs_[n++];
  }
  return n;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  penalize(logits, history);
  return pick(logits);
}

int32_t Sampler::pick(std::span<float> logits) {
  SWIFTLET_CHECK(logits.size() == static_cast<size_t>(vocab_), "sampler got {} logits for a vocabulary of {}",
                 logits.size(), vocab_);
  uint32_t first_max = 0;  // greedy: the first maximum, lowest id on ties
  const float max_logit = sanitize_and_max(logits, greedy() ? &first_max : nullptr);
  if (!std::isfinite(max_logit)) fail("sampling: all {} logits are -inf or NaN; the model's output is broken", vocab_);
  if (greedy()) return static_cast<int32_t>(first_max);

  const size_t vocab = logits.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab)
    return draw_top_k(logits, keep_top_k(logits, static_cast<size_t>(params_.top_k)));
  const float inv_temp = 1.0f / params_.temperature;
  size_t n = 0;  // survivors: ids_[0, n) with unnormalised probabilities probs_[0, n)
  if (params_.top_p < 1) {
    n = keep_top_p_of_all(logits, max_logit, inv_temp);
  } else {
    n = vocab;
    for (size_t i = 0; i < n; ++i) {
      ids_[i] = static_cast<int32_t>(i);
      probs_[i] = std::exp((logits[i] - max_logit) * inv_temp);
    }
  }
  return draw(n);
}

int32_t Sampler::pick_among(std::span<float> logits, const TokenSet& allowed) {
  SWIFTLET_CHECK(logits.size() == static_cast<size_t>(vocab_), "sampler got {} logits for a vocabulary of {}",
                 logits.size(), vocab_);
  const size_t vocab = logits.size();
  if (greedy()) {
    float best = kNegInf;
    int32_t best_id = -1;
    for_each_id(allowed, vocab, [&](int32_t id) {
      const float x = sanitized(logits[size_t(id)]);
      if (x > best || (x == best && id < best_id)) {
        best = x;
        best_id = id;
      }
    });
    if (!std::isfinite(best)) fail("sampling: the logits of every allowed token are -inf or NaN");
    return best_id;
  }
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab) {
    const size_t n = keep_top_k_among(logits, allowed, static_cast<size_t>(params_.top_k));
    if (n == 0 || !std::isfinite(logits[size_t(ids_[0])]))
      fail("sampling: the logits of every allowed token are -inf or NaN");
    return draw_top_k(logits, n);
  }
  // Without top-k every token is read anyway: mask the others, then the plain pick.
  mask_outside(logits, allowed, held_);
  return pick(logits);
}

// The draw from the top-k survivors ids_[0, n), best first: top-p on the renormalised top-k
// distribution, then draw().
int32_t Sampler::draw_top_k(std::span<const float> logits, size_t n) {
  const float max_logit = logits[size_t(ids_[0])];
  const float inv_temp = 1.0f / params_.temperature;
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += probs_[i] = std::exp((logits[size_t(ids_[i])] - max_logit) * inv_temp);
  if (params_.top_p < 1) {
    const double target = static_cast<double>(params_.top_p) * total;
    double mass = 0;
    size_t keep = 0;
    while (keep < n && mass < target) mass += probs_[keep++];
    n = keep;
  }
  return draw(n);
}

// min-p over the survivors ids_[0, n) with probabilities probs_[0, n), then one draw.
int32_t Sampler::draw(size_t n) {
  if (params_.min_p > 0) {  // keep p >= min_p * p_max (normalisation cancels out)
    const float p_max = *std::max_element(probs_.begin(), probs_.begin() + static_cast<ptrdiff_t>(n));
    const float threshold = params_.min_p * p_max;
    size_t keep = 0;
    for (size_t i = 0; i < n; ++i) {
      if (probs_[i] >= threshold) {
        ids_[keep] = ids_[i];
        probs_[keep++] = probs_[i];
      }
    }
    n = keep;
  }

  double total = 0;
  for (size_t i = 0; i < n; ++i) total += probs_[i];
  const double u = uniform() * total;
  double acc = 0;
  int32_t last = ids_[0];  // the best survivor; every filter keeps it
  for (size_t i = 0; i < n; ++i) {
    if (probs_[i] <= 0) continue;
    acc += probs_[i];
    last = ids_[i];
    if (u < acc) return last;
  }
  return last;  // rounding left u at the very top: the last token with any mass
}

// ---- StopMatcher -------------------------------------------------------------------------------

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_)
    if (s.empty()) fail("stop strings must not be empty; remove the empty one");
}

StopMatcher::Result StopMatcher::feed(std::string_view piece) {
  if (stopped_) return {{}, true};
  pending_.append(piece);
  // The earliest complete stop string wins.
  size_t at = std::string::npos;
  const std::string* hit = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = pending_.find(s);
    if (pos < at) {
      at = pos;
      hit = &s;
    }
  }
  if (hit) {
    Result r{pending_.substr(0, at), true};
    matched_ = *hit;
    stopped_ = true;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  const std::string_view text = pending_;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.ends_with(std::string_view(s).substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  Result r{pending_.substr(0, pending_.size() - hold), false};
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

void StopMatcher::reset() {
  pending_.clear();
  matched_.clear();
  stopped_ = false;
}

}  // namespace swiftlet
