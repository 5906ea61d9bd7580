// A forward pass a Session can run instead of the CPU Forward (model/qwen3_hybrid.h): the CUDA one
// (model/gpu_forward.h). A pass whose state lives elsewhere (the GPU's KV cache and DeltaNet
// states) keeps the host SessionState's pos and tokens exact and brings its recurrent part to the
// host only when asked for a snapshot; snapshot/restore/reset therefore go through the pass.
#pragma once

#include "model/qwen3_hybrid.h"

namespace swiftlet {

class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // As Forward::run: consumes `tokens` on top of `state`, writes the logits `mode` asks for
  // (All: the rows of tokens from `from` on).
  virtual void run(SessionState& state, std::span<const int32_t> tokens, LogitsMode mode,
                   std::vector<float>& logits, int64_t from = 0) = 0;
  // The DeltaNet states at state.pos (SessionState::snapshot for the CPU pass).
  virtual StateSnapshot snapshot(const SessionState& state) { return state.snapshot(); }
  // Rewinds state to a snapshot taken earlier on it (SessionState::restore).
  virtual void restore(SessionState& state, const StateSnapshot& snap) { state.restore(snap); }
  virtual void reset(SessionState& state) { state.reset(); }
  // As Forward's: bytes held in buffers sized by a prompt (the GPU pass: its batched prefill's
  // device activations), and letting them go once the prompt is in.
  virtual size_t buffer_bytes() const { return 0; }
  virtual void release_buffers() {}
};

}  // namespace swiftlet
