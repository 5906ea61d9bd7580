// The forward pass of the Qwen3-Next / Qwen3.5-MoE hybrid decoder (model-math.md section 2):
// per layer  a = RMSNorm1p(h); h += Mixer(a); b = RMSNorm1p(h); h += MoE(b)
// where Mixer is gated attention (every 4th layer) or a Gated DeltaNet.
// Both families run this same code: they differ only in tensor names, Qwen3-Next's fused DeltaNet
// inputs being reordered into Qwen3.5's split layout when they are loaded (load_dense_weights).
#pragma once

#include "format/hf_config.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/mixers.h"
#include "model/expert_source.h"
#include "model/miss_policy.h"
#include "model/moe_routing.h"
#include "model/forward_pass.h"
#include "model/session_state.h"
#include "model/weights.h"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace swiftlet {

// Prompt tokens per Forward::run call (Session splits longer prompts). Each call routes all of
// its tokens at once, layer by layer, so a routed expert is acquired once per layer per call:
// with experts streamed from disk, a prompt of up to this many tokens reads each expert it
// needs once. Inside a call the token mixers (attention, DeltaNet) run kMixerChunk tokens at a
// time, which bounds their buffers; only the MoE's buffers grow with the whole call.
inline constexpr int kPrefillChunk = 1024;
inline constexpr int64_t kMixerChunk = 256;

// Routing decisions of one MoE layer for one token, for statistics and tests.
struct RouteRecord {
  int layer;
  int64_t position;
  std::vector<int32_t> experts;
};

// Runs tokens through the model on the CPU. Holds the activation buffers, so one Forward serves
// many calls without allocating once its buffers have grown to the largest batch seen. Its state
// is the host SessionState itself, so snapshot/restore/reset are ForwardPass's defaults.
class Forward final : public ForwardPass {
 public:
  Forward(const Model& m, Backend backend);

  void run(SessionState& state, std::span<const int32_t> tokens, LogitsMode mode,
           std::vector<float>& logits, int64_t from = 0) override;

  // One decode step of several sequences together: tokens[i] continues states[i]. Each dense
  // product reads its weights once for all the sequences, each routed expert is acquired once
  // for the sequences that chose it; attention and DeltaNet run on each sequence's own state.
  // logits: [N][vocab], row i equal to what run() on states[i] alone would give. Throws Error
  // (changing no state) on an empty batch, a state listed twice, a state of another model's
  // shape, a token outside the vocabulary, or with a routing observer set (it follows one
  // sequence). A route override is asked for each row at its own position, as run() asks it.
  // The next layers' experts are guessed (RoutingHooks::predict_next) only for a batch of one; a larger
  // batch has each layer read its union when the layer routes.
  void decode_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens, std::vector<float>& logits);

  // Debugging aids for tests: the residual stream after each layer ([layer][T][H]) of the last
  // run, and the experts chosen.
  void set_capture(bool on) { capture_ = on; }
  // Fast backends, prefill of 4+ tokens: the DeltaNet delta rule in chunks of 64 (WY/UT form)
  // instead of token by token. Off by default: a prefilled token then gives bits that depend on
  // where the chunks fell, so prefix reuse (Conversation, Session snapshots) would no longer
  // answer exactly as a fresh run; the rounding differences are ~1e-6 relative.
  void set_chunked_prefill(bool on) { chunked_prefill_ = on; }
  // Called with the residual stream ([T][H]) before each layer; tests use it to feed every
  // layer the reference backend's input (teacher forcing), so per-layer errors do not compound.
  void set_layer_hook(std::function<void(int layer, std::span<float> h)> hook) { layer_hook_ = std::move(hook); }
  void set_routing(const RoutingHooks& hooks) override { router_.set_hooks(hooks); }
  PredictionStats prediction_stats() const override { return router_.prediction_stats(); }
  const std::vector<float>& layer_outputs() const { return layer_outputs_; }
  const std::vector<RouteRecord>& routes() const { return routes_; }

  // What a routed expert missing from memory costs (MoeRouter::set_miss_policy).
  void set_miss_policy(MissPolicy p) { router_.set_miss_policy(p); }
  const MissPolicy& miss_policy() const { return router_.miss_policy(); }

  // Where the time of run() went, accumulated over calls (seconds; the rest is norms, residual
  // adds and embedding lookups).
  struct Profile {
    double attention = 0;       // gated attention layers (projections, cache, softmax)
    double delta_net = 0;       // Gated DeltaNet layers (projections, conv, recurrence)
    double router_shared = 0;   // routers, top-k, shared experts
    double expert_compute = 0;  // routed experts' products
    double expert_acquire = 0;  // waiting for routed experts (reads, checksums)
    double lm_head = 0;         // final projection to the vocabulary
    double total() const { return attention + delta_net + router_shared + expert_compute + expert_acquire + lm_head; }
  };
  const Profile& profile() const { return profile_; }
  void reset_profile() { profile_ = {}; }

  // Frees the activation buffers (the next call grows them again): a session that prefilled a
  // long prompt does not keep prompt-sized buffers while it decodes or waits. Bytes they hold:
  void release_buffers() override;
  size_t buffer_bytes() const override;

 private:
  // Rows row0 .. row0 + n - 1 of a call continue `state` at positions pos0 .. pos0 + n - 1:
  // a prompt is one such run of rows, a decode batch one per sequence.
  struct SeqRows {
    SessionState* state;
    int64_t row0, pos0, n;
  };
  // Embeds `tokens` (one per row of `seqs`) and runs every layer; h_ holds the final residual
  // stream. Advances no state's pos.
  void layers(std::span<const SeqRows> seqs, std::span<const int32_t> tokens);
  // The token mixers over consecutive rows (at most kMixerChunk) split among sequences:
  // input rows x_, output rows out_, from row seqs.front().row0 on.
  void gated_attention(int layer, std::span<const SeqRows> seqs);
  void gated_delta_net(int layer, std::span<const SeqRows> seqs);
  // One sequence's DeltaNet after the projections, on local rows r0 .. r0 + n - 1 of the buffers.
  void delta_net_core(const DeltaNetWeights& w, LayerState& st, int64_t r0, int64_t n);
  void sparse_moe(int layer, std::span<const int32_t> tokens);
  void route(int layer, std::span<const int32_t> tokens);
  void shared_expert(const MoeDenseWeights& w, int64_t T);
  void routed_experts(int layer, int64_t T);
  void rope_tables(std::span<const SeqRows> seqs, int64_t T);
  template <typename Self>
  static auto buffers_of(Self& f);

  const Model& m_;
  const ModelConfig& c_;
  const Kernels& k_;
  const MixerKernels& mix_;  // token mixers and activations: the fast forms or the scalar references
  bool chunked_prefill_ = false;
  bool capture_ = false;
  std::function<void(int, std::span<float>)> layer_hook_;
  MoeRouter router_;             // the routing hooks, the miss policy and the decode guesses
  std::vector<int32_t> chosen_;  // [T][top_k] experts in router order (-1: left out on a miss)
  std::vector<float> chosen_w_;  // [T][top_k] their weights as applied
  std::vector<float> layer_outputs_;
  std::vector<RouteRecord> routes_;

  // Activations, row-major with T rows (the mixers' with at most kMixerChunk). Shapes in comments.
  std::vector<float> h_;        // [T][H] residual stream
  std::vector<float> x_;        // [T][H] normed block input
  std::vector<float> out_;      // [T][H] block output
  std::vector<float> proj_;     // [T][q_proj_rows]
  std::vector<float> proj2_;    // [T][kv_dim or value heads]
  std::vector<float> proj3_;    // [T][kv_dim or value heads]
  std::vector<float> mixed_;    // [T][conv_dim] DeltaNet q,k,v before the conv
  std::vector<float> z_;        // [T][value_dim]
  std::vector<float> ba_;       // [T][2 * value_heads]: b then a
  std::vector<float> core_;     // [T][max(attn_out_dim, value_dim)] mixer output before out proj
  std::vector<float> gate_;     // [T][attn_out_dim] attention output gate
  std::vector<float> q_;        // [T][attn_out_dim] normed, roped queries
  std::vector<float> cos_, sin_;     // [T][rotary_dim / 2] at each row's position
  std::vector<int64_t> row_pos_;     // [T] each row's position
  std::vector<SeqRows> pieces_;      // a mixer chunk's rows, per sequence
  std::vector<SeqRows> batch_seqs_;  // decode_batch: one row per sequence
  std::vector<float> router_out_;  // [T][experts]
  std::vector<float> xe_, he_, ue_, ye_;  // expert gathers: [n][H], [n][I], [n][I]; outputs [T*top_k][H]
  std::vector<float> shared_h_, shared_u_, shared_g_;  // [T][SI], [T][SI], [T][1]
  std::vector<ExpertWeights> ews_;  // [max_batch] the experts of a group
  std::vector<MatmulJob> jobs_;      // [2 * max_batch] a group's products
  ExpertGroups groups_;               // the call's (token, choice) pairs by expert
  std::vector<int32_t> ids_;          // the chosen experts in compute order (in memory first)
  std::vector<int32_t> all_experts_;  // 0 .. E-1: a long prompt's read-ahead of the next layer
  std::vector<float> predict_x_;  // [H] a guessed layer's normed input
  Profile profile_;
};

}  // namespace swiftlet
