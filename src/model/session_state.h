// Everything a conversation carries between forward calls: the KV cache of the attention
// layers and the conv + recurrent states of the DeltaNet layers (model-math.md 7).
// A plain value: copy it to snapshot a conversation, assign it back to restore.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace swiftlet {

struct ModelConfig;

struct LayerState {
  // Full attention: post-norm, post-rope keys and values, fp32.
  std::vector<float> k;  // [positions][num_kv_heads * head_dim]
  std::vector<float> v;  // [positions][num_kv_heads * head_dim]
  // Gated DeltaNet.
  std::vector<float> conv;  // [kernel - 1][conv_dim]: the last raw (pre-conv) q,k,v rows
  std::vector<float> ssm;   // [value_heads][key_head_dim][value_head_dim]
};

// The recurrent (DeltaNet) part of a state at one position. The attention part needs no copy:
// the KV cache of a later state, cut back to `pos`, is the KV cache at `pos`.
struct StateSnapshot {
  int64_t pos = 0;
  std::vector<std::vector<float>> conv, ssm;  // [layer] (empty for attention layers)
  size_t bytes() const;
};

struct SessionState {
  int64_t pos = 0;                // tokens consumed so far
  std::vector<int32_t> tokens;    // the tokens consumed, in order
  std::vector<LayerState> layers;

  static SessionState create(const ModelConfig& cfg);
  void reset();  // back to an empty conversation, keeping allocations
  StateSnapshot snapshot() const;
  // Rewinds to a snapshot taken earlier on this conversation (snap.pos <= pos, same tokens up
  // to snap.pos): restores the DeltaNet states and cuts the KV cache and token list back.
  void restore(const StateSnapshot& snap);
  size_t bytes() const;
  // Whether this state has the shape `create(cfg)` gives, its KV cache holding pos positions
  // (false for a state of another model's shape, or one whose caches live elsewhere).
  bool fits(const ModelConfig& cfg) const;
};

}  // namespace swiftlet
