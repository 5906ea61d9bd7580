#include "model/miss_policy.h"

#include "core/error.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace swiftlet {

std::string MissPolicy::name() const { return lossy() ? fmt::format("skip:{:g}", skip_below) : "exact"; }

std::string MissPolicy::label() const { return lossy() ? fmt::format("lossy ({})", name()) : "exact"; }

MissPolicy parse_miss_policy(std::string_view text) {
  constexpr const char* kForms = "'exact' (the default) or 'skip:W' with W a router weight in [0, 1), e.g. skip:0.05";
  if (text == "exact") return {};
  if (!text.starts_with("skip:")) fail("--on-miss '{}' is not understood: give {}", text, kForms);
  const std::string w(text.substr(5));
  char* end = nullptr;
  errno = 0;
  const double v = w.empty() ? NAN : std::strtod(w.c_str(), &end);
  if (w.empty() || end != w.c_str() + w.size() || errno != 0 || !std::isfinite(v) || v < 0 || v >= 1)
    fail("--on-miss '{}': W must be a number in [0, 1); give {}", text, kForms);
  return MissPolicy{float(v)};
}

int skip_missed_experts(const MissPolicy& policy, int num_experts, int top_k, bool normalised,
                        std::span<int32_t> experts, std::span<float> weights,
                        const std::function<bool(int32_t)>& in_memory) {
  if (!policy.lossy() || top_k < 2) return 0;
  const size_t n = experts.size();
  const size_t T = n / size_t(top_k);
  SWIFTLET_CHECK(weights.size() == n && T * size_t(top_k) == n, "skip_missed_experts: {} experts, {} weights, top-k {}",
                 n, weights.size(), top_k);
  // Per expert: 0 not chosen, 1 missing and nobody keeps it (so far), 2 kept or in memory.
  enum : uint8_t { kUnseen, kDroppable, kKept };
  std::vector<uint8_t> state(size_t(num_experts), kUnseen);
  for (size_t t = 0; t < T; ++t) {
    double sum = 0;
    if (!normalised)
      for (int i = 0; i < top_k; ++i) sum += weights[t * size_t(top_k) + size_t(i)];
    for (int i = 0; i < top_k; ++i) {
      const size_t j = t * size_t(top_k) + size_t(i);
      const int32_t e = experts[j];
      SWIFTLET_CHECK(e >= 0 && e < num_experts, "skip_missed_experts: expert {} of {}", e, num_experts);
      if (state[size_t(e)] == kUnseen) state[size_t(e)] = in_memory(e) ? kKept : kDroppable;
      const double w = normalised ? double(weights[j]) : (sum > 0 ? weights[j] / sum : 1.0);
      if (i == 0 || w >= double(policy.skip_below)) state[size_t(e)] = kKept;
    }
  }
  int skipped = 0;
  for (uint8_t s : state) skipped += s == kDroppable ? 1 : 0;
  if (skipped == 0) return 0;
  for (size_t t = 0; t < T; ++t) {
    const std::span<int32_t> te = experts.subspan(t * size_t(top_k), size_t(top_k));
    const std::span<float> tw = weights.subspan(t * size_t(top_k), size_t(top_k));
    double before = 0, kept = 0;
    bool lost = false;
    for (int i = 0; i < top_k; ++i) {
      before += tw[size_t(i)];
      if (state[size_t(te[size_t(i)])] == kDroppable)
        lost = true;
      else
        kept += tw[size_t(i)];
    }
    if (!lost) continue;
    const double scale = kept > 0 ? before / kept : 1.0;  // kept > 0 unless the top-1's weight is 0
    for (int i = 0; i < top_k; ++i) {
      if (state[size_t(te[size_t(i)])] == kDroppable) {
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
