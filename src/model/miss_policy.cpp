#include "model/miss_policy.h"

#include "core/error.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace swiftlet {

std::string MissPolicy::name() const {
  switch (mode) {
    case Mode::Exact: break;
    case Mode::Skip: return fmt::format("skip:{:g}", below);
    case Mode::LowBit: return below > 1 ? "low-bit" : fmt::format("low-bit:{:g}", below);
  }
  return "exact";
}

std::string MissPolicy::label() const { return lossy() ? fmt::format("lossy ({})", name()) : "exact"; }

MissPolicy parse_miss_policy(std::string_view text) {
  constexpr const char* kForms =
      "'exact' (the default), 'skip:W' with W a router weight in [0, 1) (e.g. skip:0.05), or 'low-bit' / "
      "'low-bit:W' with W in [0, 1] (a container with low-bit copies)";
  if (text == "exact") return {};
  if (text == "low-bit") return MissPolicy::low_bit();
  const bool skip = text.starts_with("skip:"), low = text.starts_with("low-bit:");
  if (!skip && !low) fail("--on-miss '{}' is not understood: give {}", text, kForms);
  const std::string w(text.substr(skip ? 5 : 8));
  char* end = nullptr;
  errno = 0;
  const double v = w.empty() ? NAN : std::strtod(w.c_str(), &end);
  const bool in_range = v >= 0 && (skip ? v < 1 : v <= 1);  // skip: [0, 1); low-bit: [0, 1]
  if (w.empty() || end != w.c_str() + w.size() || errno != 0 || !std::isfinite(v) || !in_range)
    fail("--on-miss '{}': W must be a number in [0, {}; give {}", text, skip ? "1)" : "1]", kForms);
  return skip ? MissPolicy::skip(float(v)) : MissPolicy::low_bit(float(v));
}

namespace {

enum : uint8_t { kUnseen, kUnkeptMiss, kKept };

// Per expert of one call: kUnseen (not chosen), kKept (in memory, or some token keeps it: a weight
// >= W, or its top-1 when top1_keeps) or kUnkeptMiss (missing, and no token keeps it).
std::vector<uint8_t> classify(float below, bool top1_keeps, int num_experts, int top_k, bool normalised,
                              std::span<const int32_t> experts, std::span<const float> weights,
                              const std::function<bool(int32_t)>& in_memory) {
  const size_t n = experts.size();
  const size_t T = n / size_t(top_k);
  SWIFTLET_CHECK(weights.size() == n && T * size_t(top_k) == n, "miss policy: {} experts, {} weights, top-k {}", n,
                 weights.size(), top_k);
  std::vector<uint8_t> state(size_t(num_experts), kUnseen);
  for (size_t t = 0; t < T; ++t) {
    double sum = 0;
    if (!normalised)
      for (int i = 0; i < top_k; ++i) sum += weights[t * size_t(top_k) + size_t(i)];
    for (int i = 0; i < top_k; ++i) {
      const size_t j = t * size_t(top_k) + size_t(i);
      const int32_t e = experts[j];
      SWIFTLET_CHECK(e >= 0 && e < num_experts, "miss policy: expert {} of {}", e, num_experts);
      if (state[size_t(e)] == kUnseen) state[size_t(e)] = in_memory(e) ? kKept : kUnkeptMiss;
      const double w = normalised ? double(weights[j]) : (sum > 0 ? weights[j] / sum : 1.0);
      if ((top1_keeps && i == 0) || w >= double(below)) state[size_t(e)] = kKept;
    }
  }
  return state;
}

}  // namespace

std::vector<int32_t> low_bit_experts(const MissPolicy& policy, int num_experts, int top_k, bool normalised,
                                     std::span<const int32_t> experts, std::span<const float> weights,
                                     const std::function<bool(int32_t)>& held) {
  std::vector<int32_t> low;
  if (!policy.reads_low_bit() || top_k < 1) return low;
  const std::vector<uint8_t> state =
      classify(policy.below, false, num_experts, top_k, normalised, experts, weights, held);
  for (int e = 0; e < num_experts; ++e)
    if (state[size_t(e)] == kUnkeptMiss) low.push_back(e);
  return low;
}

int skip_missed_experts(const MissPolicy& policy, int num_experts, int top_k, bool normalised,
                        std::span<int32_t> experts, std::span<float> weights,
                        const std::function<bool(int32_t)>& in_memory) {
  if (!policy.skips() || top_k < 2) return 0;
  const size_t T = experts.size() / size_t(top_k);
  std::vector<uint8_t> state = classify(policy.below, true, num_experts, top_k, normalised, experts, weights, in_memory);
  int skipped = 0;
  for (uint8_t s : state) skipped += s == kUnkeptMiss ? 1 : 0;
  if (skipped == 0) return 0;
  for (size_t t = 0; t < T; ++t) {
    const std::span<int32_t> te = experts.subspan(t * size_t(top_k), size_t(top_k));
    const std::span<float> tw = weights.subspan(t * size_t(top_k), size_t(top_k));
    double before = 0, kept = 0;
    bool lost = false;
    for (int i = 0; i < top_k; ++i) {
      before += tw[size_t(i)];
      if (state[size_t(te[size_t(i)])] == kUnkeptMiss)
        lost = true;
      else
        kept += tw[size_t(i)];
    }
    if (!lost) continue;
    const double scale = kept > 0 ? before / kept : 1.0;  // kept > 0 unless the top-1's weight is 0
    for (int i = 0; i < top_k; ++i) {
      if (state[size_t(te[size_t(i)])] == kUnkeptMiss) {
        te[size_t(i)] = -1;
        tw[size_t(i)] = 0;
      } else {
        tw[size_t(i)] = float(double(tw[size_t(i)]) * scale);
      }
    }
  }
  return skipped;
}

}  // namespace swiftlet
