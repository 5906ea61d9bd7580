// What the MoE does with a routed expert that is not in memory when its layer routes.
// Exact (the default): wait for it to be read. Lossy, opt-in:
// - skip:W: a token leaves the expert out when its normalised router weight is below W, unless it
//   is the token's top-1 choice, and its other experts are renormalised to the sum the top-k had;
//   an expert that no token of the call keeps is neither read nor prefetched;
// - low-bit:W: an expert that no token of the call gives a normalised weight of W or more is read
//   from its low-bit copy (format/miss_copy.h) instead; "low-bit" alone: every missed expert.
// skip:0 and low-bit:0 change nothing and are the exact path.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

struct MissPolicy {
  enum class Mode : uint8_t { Exact, Skip, LowBit };
  Mode mode = Mode::Exact;
  float below = 0;  // W: skip in [0, 1), low-bit in [0, 1]; kEveryMiss for plain "low-bit"
  static constexpr float kEveryMiss = 2;  // above any normalised router weight

  static MissPolicy skip(float w) { return {Mode::Skip, w}; }
  static MissPolicy low_bit(float w = kEveryMiss) { return {Mode::LowBit, w}; }
  bool lossy() const { return mode != Mode::Exact && below > 0; }
  bool skips() const { return mode == Mode::Skip && below > 0; }
  bool reads_low_bit() const { return mode == Mode::LowBit && below > 0; }
  // "exact", "skip:0.05", "low-bit", "low-bit:0.1": the flag's spelling (what /props and the
  // tables show).
  std::string name() const;
  // "exact" or "lossy (skip:0.05)": what a printed figure says about itself.
  std::string label() const;
};

// Parses an --on-miss value: "exact", "skip:W" with W a number in [0, 1), "low-bit" or
// "low-bit:W" with W in [0, 1]. Throws Error naming the accepted forms for anything else
// ("skip:abc", "skip:1.5", "bogus").
MissPolicy parse_miss_policy(std::string_view text);

// One call's routing, as the MoE applies it: token t's choices are experts[t * top_k + i] in router
// order (i = 0 its top-1) with weights[t * top_k + i]. `normalised`: the weights already sum to 1
// per token (norm_topk_prob); else a weight is compared with W after dividing it by its token's
// top-k sum. `in_memory(e)` says whether the source holds expert e now (ExpertSource::ready).
//
// Leaves out every expert that is not in memory and that no token keeps (a token keeps an expert
// it chose as top-1 or with a normalised weight >= W): its entries get expert -1 and weight 0,
// and each token that lost one has its remaining weights scaled so they sum (in double) to what
// its top-k summed to before. An expert read anyway for some token serves every token that chose
// it (the bytes are spent; using it costs only its products). A token that lost nothing keeps its
// weights bit for bit. Returns the number of distinct experts left out. num_experts bounds the ids.
int skip_missed_experts(const MissPolicy& policy, int num_experts, int top_k, bool normalised,
                        std::span<int32_t> experts, std::span<float> weights,
                        const std::function<bool(int32_t)>& in_memory);

// low-bit:W on one call's routing (as above; nothing is changed): the distinct experts, ascending,
// that `held(e)` says the source neither holds nor is reading and that no token gives a
// normalised weight >= W. They are read from their low-bit copies. Empty unless reads_low_bit().
std::vector<int32_t> low_bit_experts(const MissPolicy& policy, int num_experts, int top_k, bool normalised,
                                     std::span<const int32_t> experts, std::span<const float> weights,
                                     const std::function<bool(int32_t)>& held);

}  // namespace swiftlet
