// A forward pass as a Session runs it: the CPU one (Forward, model/qwen3_hybrid.h) or the CUDA one
// (model/gpu_forward.h). A pass whose state lives elsewhere (the GPU's KV cache and DeltaNet
// states) keeps the host SessionState's pos and tokens exact and brings its recurrent part to the
// host only when asked for a snapshot or a whole state; snapshot/restore/reset and whole states
// (the prefix state cache, saved sessions) therefore go through the pass.
#pragma once

#include "core/error.h"
#include "format/hf_config.h"
#include "model/expert_source.h"
#include "model/moe_routing.h"
#include "model/session_state.h"
#include "model/weights.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace swiftlet {

// A loaded model: its configuration, its resident weights and where its routed experts come from.
struct Model {
  ModelConfig config;
  ModelWeights weights;
  ExpertSource* experts = nullptr;
};

// Which logits rows a run writes: none, the last token's, or every token's.
enum class LogitsMode { None, Last, All };

class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // Consumes `tokens` on top of `state` (positions state.pos ...). Writes logits rows into
  // `logits`: every token's from the `from`-th on (All, (T - from) x vocab), the last one's
  // (Last, 1 x vocab) or none.
  virtual void run(SessionState& state, std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>& logits,
                   int64_t from = 0) = 0;
  // The DeltaNet states at state.pos (SessionState::snapshot for the CPU pass).
  virtual StateSnapshot snapshot(const SessionState& state) { return state.snapshot(); }
  // Rewinds state to a snapshot taken earlier on it (SessionState::restore).
  virtual void restore(SessionState& state, const StateSnapshot& snap) { state.restore(snap); }
  virtual void reset(SessionState& state) { state.reset(); }
  // The whole state at state.pos on the host (K/V of every position, the DeltaNet states): the
  // state itself for the CPU pass, else a copy made in `scratch`.
  virtual const SessionState& whole_state(const SessionState& state, SessionState& scratch) { return state; }
  // Replaces state with a whole state (of this model's shape, as whole_state gives).
  virtual void load_state(SessionState& state, const SessionState& whole) { state = whole; }
  // Bytes held in buffers sized by a prompt (the CPU pass: its activations; the GPU pass: its
  // batched prefill's device activations), and letting them go once the prompt is in.
  virtual size_t buffer_bytes() const { return 0; }
  virtual void release_buffers() {}
  // What the pass does around its routers (moe_routing.h): a routing observer, a route override,
  // the decode guesses of the next layers' experts. A pass that takes none of them refuses an
  // observer or an override (it would not see or change the routing) and makes no guesses.
  virtual void set_routing(const RoutingHooks& hooks) {
    if (hooks.observer || hooks.route_override)
      fail("this forward pass takes no expert trace or routing override: run on the CPU (drop --gpu)");
  }
  virtual PredictionStats prediction_stats() const { return {}; }
};

}  // namespace swiftlet
