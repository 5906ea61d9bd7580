// One session's CUDA forward pass (make_gpu_forward): its device state and activations over a
// shared GpuModel. Its rooms: gpu_forward.cpp (state, run, snapshots), gpu_decode.cpp (the layer
// body of a decode step, one token or one each for several sessions: embed, per layer
// gated_attention / gated_delta_net and sparse_moe; the logits; a CUDA graph when every expert is
// resident), gpu_prefill.cpp (a prompt batched layer by layer over chunks of its tokens),
// gpu_decode_batch.cpp (which form a step of several sessions takes), gpu_profile.h (timing).
// Internal to model/ (CUDA builds only).
#pragma once

#include "model/gpu_model.h"
#include "model/gpu_profile.h"

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace swiftlet {

// The smallest prefill chunk worth batching (GpuOptions::prefill_chunk is the largest).
constexpr int64_t kMinPrefillChunk = 16;

class GpuForward final : public ForwardPass {
 public:
  GpuForward(std::shared_ptr<GpuModel> g, bool profile);
  ~GpuForward() override;

  void run(SessionState& st, std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>& logits,
           int64_t from = 0) override;
  // One token for each of several sessions together (gpu_decode_batch.cpp): seqs[i] holds
  // states[i] on the device; this pass lends the layer-by-layer form its buffers and stream (its
  // own session state is not touched). logits: [N][vocab].
  void decode_batch(std::span<GpuForward* const> seqs, std::span<SessionState* const> states,
                    std::span<const int32_t> tokens, std::vector<float>& logits);
  StateSnapshot snapshot(const SessionState& st) override;
  // What run() and decode_batch check before a session's state moves (aborting on a broken
  // invariant, failing on a token outside the vocabulary), and the move itself once its tokens
  // are in.
  void check_state(const SessionState& st) const;
  void check_token(int32_t id) const;
  void advance(SessionState& st, std::span<const int32_t> tokens);
  void restore(SessionState& st, const StateSnapshot& snap) override;
  void reset(SessionState& st) override;
  const SessionState& whole_state(const SessionState& st, SessionState& scratch) override;
  void load_state(SessionState& st, const SessionState& whole) override;
  std::string profile_report() const { return prof_.report(); }
  std::string host_timing_report() const { return host_.report(); }
  size_t buffer_bytes() const override { return batch_.bytes; }
  void release_buffers() override {
    cu::gpu_sync(s_);
    free_batch();
  }

 private:
  // A decode step's rows (decode_layers): n tokens, each a row of these buffers at its natural
  // width (one token: the one-token buffers, one_; a batch: the batch's), row i at position
  // step.d_pos[i] with its token mixers' states in the tables of `step` (layer l's at l *
  // states_stride pointers from their starts).
  struct DecodeRows {
    cu::StepRows step;
    int64_t states_stride = 0;
    const int32_t* tok = nullptr;
    float *h, *x, *p1, *p2, *p3, *mixed, *u, *z, *b, *a, *core, *router, *sg, *w, *act, *eu, *ey;
    int32_t* ids;
    cu::StepRows layer(int l) const {
      cu::StepRows r = step;
      r.d_states += int64_t(l) * states_stride;
      r.h_states += int64_t(l) * states_stride;
      return r;
    }
  };

  // Decode (gpu_decode.cpp).
  void step(int32_t token, int64_t pos);
  // A decode batch with every expert resident where the rows forms do not apply (one member, or
  // the unfused expert kernels): each member's one-token step (its graph) and logits enqueued on
  // its own stream, the members' streams running together; then each waited for.
  void enqueue_step(int32_t token);
  void finish_step(SessionState& st, int32_t token, float* logits_row);
  // The rows through every layer (graph-capturable where every expert is resident: the tokens,
  // positions and states are read on the device). One token: decode_layers(one_).
  void decode_layers(const DecodeRows& r);
  void gated_attention(int l, const DecodeRows& r);
  void gated_delta_net(int l, const DecodeRows& r);
  // The token mixers after their projections, each row on its own states (a decode batch's
  // layer-by-layer form uses them too).
  void attention_mixer(int l, const DecodeRows& r);
  void delta_net_mixer(int l, const DecodeRows& r);
  void sparse_moe(int l, const DecodeRows& r);
  // One token: h += the gated shared expert, where it does not ride in the experts' kernels; the
  // routed experts when the VRAM cache does not hold them all.
  void shared_expert(int l);
  void streamed_experts(int l);
  void logits_to(float* host_row);
  void logits_of(const float* d_h_row, float* host_row);
  // The lm_head of the row and its download into h_logits_, enqueued on s_ (not waited for).
  void enqueue_logits(const float* d_h_row);

  // A prompt of T >= 2 tokens (gpu_prefill.cpp), in chunks of up to GpuOptions::prefill_chunk
  // tokens, each chunk layer by layer with every product batched over its tokens: the affine
  // projections and the routed experts (grouped per expert) on the tensor cores from quantised
  // rows (cu::matmul_rows; other weights as 8-token tiles), the DeltaNet conv / delta rule and attention
  // over the chunk's tokens in order. With a VRAM cache smaller than the model, each layer uploads
  // the union of the chunk's experts once. False (nothing done) where it does not apply: the
  // unfused expert kernels (float experts), no shared expert, or a cache that cannot hold one
  // layer's experts.
  bool prefill(std::span<const int32_t> tokens, LogitsMode mode, int64_t from, std::vector<float>& logits);
  void prefill_chunk(const int32_t* d_tokens, int64_t T, int64_t pos0);
  // A layer's parts over T rows. With `step` (a decode batch over the batch's buffers), row i is one
  // token of its own session: the token mixers run as a decode step's (attention_mixer,
  // delta_net_mixer).
  void prefill_delta_net(int l, int64_t T, const DecodeRows* step = nullptr);
  void prefill_attention(int l, int64_t T, int64_t pos0, const DecodeRows* step = nullptr);
  void prefill_moe(int l, int64_t T);
  // The chunk's x = RMSNorm(h) with norm_w (in batch_.x), as the products take it.
  cu::RowsIn norm_rows(const float* norm_w, int64_t T);
  // y = W x over the T rows for each product.
  struct Product {
    const cu::GpuMatrix& w;
    float* y;
  };
  void products(const cu::RowsIn& x, int64_t T, std::initializer_list<Product> ps);

  // A decode batch layer by layer (gpu_decode_batch.cpp): the layers over one row per session, on
  // the one-token kernels' rows forms (decode_layers over batch_rows) or on the prompt's products
  // (batch_layers); the token mixers of both on each row's own states.
  void batch_layers(const DecodeRows& r);
  DecodeRows batch_rows(int64_t n) const;
  bool grow_rows(int64_t n);
  void free_rows();
  // The rows x[T][cols] as products over tokens take them (quantised into q where they can).
  cu::RowsIn rows_in(const float* x, int64_t T, int64_t cols, void* q) {
    if (!quantise_rows_) return {x, nullptr, 0};
    return cu::prepare_rows(x, T, cols, q_group_, q, s_);
  }
  // Off for a decode batch: its few rows go through the fp32 tiles (cu::matmul, a warp streaming
  // each weight row once for 8 tokens), which at a few rows take about half the time of the
  // tensor-core tiles (64-token tiles: 19.6 ms a step of one row on the 80B, 10.0 ms of two).
  bool quantise_rows_ = true;
  // Buffers for a chunk of up to T tokens, or fewer when VRAM is short (halving down to
  // kMinPrefillChunk); false when not even that fits.
  bool grow_batch(int64_t T);
  void free_batch();

  void reserve_kv(int64_t positions);
  // The one-token rows' state tables (one_) from dev_, after its buffers move.
  void publish_states();
  // y_i (+)= W_i x for the segments in one launch; with norm_w, x is RMSNorm'd first and the normed
  // x is left in x_.
  void project(std::initializer_list<cu::MatvecSegment> segs, const float* x, const float* norm_w) {
    cu::fused_matvec(segs.begin(), int(segs.size()), x, norm_w, c_.rms_norm_eps, x_, s_);
  }
  // The same for each of r's rows: row t's x at x + t x_stride, its y_i at the segment's d_y + t
  // y_stride, its normed x in r.x.
  void project(const DecodeRows& r, std::initializer_list<cu::MatvecSegment> segs, const float* x, int64_t x_stride,
               const float* norm_w) {
    cu::fused_matvec_rows(segs.begin(), int(segs.size()), int(r.step.n), x, x_stride, norm_w, c_.rms_norm_eps, r.x, s_);
  }
  float* buf(size_t n) {
    auto* p = static_cast<float*>(cu::gpu_alloc(std::max<size_t>(n, 1) * 4));
    bufs_.push_back(p);
    return p;
  }
  void mark(const char* part) { prof_.mark(part, s_); }

  std::shared_ptr<GpuModel> g_;
  const ModelConfig& c_;
  cu::GpuStream s_ = nullptr;
  cu::GpuEvent ids_ready_ = nullptr, group_done_ = nullptr;
  int64_t pos_ = 0;  // positions the device state holds

  // Device state, per layer (empty for the other kind).
  struct LayerDev {
    float *k = nullptr, *v = nullptr;  // [kv_cap][kv_dim]
    float *conv = nullptr, *ssm = nullptr;
  };
  std::vector<LayerDev> dev_;
  int64_t kv_cap_ = 0;
  // dev_ as a decode step's state tables, [layer][2] (on the device and the host).
  float** d_own_states_ = nullptr;
  std::vector<float*> h_own_states_;

  // Activations (device), one token. Shapes in comments.
  std::vector<void*> bufs_;
  float* h_;                     // [H] residual stream
  float* x_;                     // [H] normed block input
  float* p1_;                    // [q_proj_rows]
  float* p2_;                    // [kv_dim]
  float* p3_;                    // [kv_dim]
  float* mixed_;                 // [conv_dim]
  float* u_;                     // [conv_dim]
  float* z_;                     // [value_dim]
  float* ba_;                    // [2 hv]: b then a
  float* core_;                  // [max(attn_out_dim, value_dim)]
  float* router_;                // [E]
  int32_t* ids_;                 // [k]
  float* w_;                     // [k]
  float *eu_, *ey_;              // [k][I], [k][H]
  float *sh_, *su_, *sg_, *sy_;  // [SI], [SI], [1], [H]
  float* act_;                   // [k + 1][I]: SiLU(gate x) * up x of the chosen experts, then the shared one
  cu::ExpertScratch experts_scratch() const { return {act_, eu_, ey_}; }
  // The fused expert kernels (expert_act / expert_down_add) take this model's experts, and the
  // shared expert (shared_[l]) rides along as one more expert.
  bool experts_fused_ = false, shared_fused_ = false;
  std::vector<cu::SharedExpert> shared_;
  DecodeRows one_;             // the buffers above as the one row of a step
  float* logits_;              // [vocab]
  int32_t* h_ids_ = nullptr;   // pinned [k]
  float* h_logits_ = nullptr;  // pinned [vocab]: the logits' download (pageable copies are slower)
  HostTiming host_;
  // prefill's activations for up to `cap` tokens, rows per token (shapes as the one-token buffers
  // above); the experts' rows are per (token, choice) pair. Host side (pinned): the chosen ids, the
  // per-expert work list (group experts [E], group starts [E + 1], pairs [cap k]; uploaded to
  // d_groups in one copy) and the chunk's tokens.
  struct Batch {
    void* arena = nullptr;
    float *h, *x, *p1, *p2, *p3, *mixed, *u, *z, *b, *a, *q, *gate, *core, *router, *w, *sg;
    float *eg, *eu, *ey, *shg, *shu, *shy;
    float* act;  // [k + 1][I] a token: the rows forms' activations (the shared expert's last)
    int32_t *tok, *ids, *d_groups;
    void *qx, *qa;  // quantised rows (cu::quantize_rows): of x; of a product's other inputs
    float* delta_work;  // the chunked delta rule's (cu::delta_rule_chunked_work_floats)
    int32_t *h_ids = nullptr, *h_groups = nullptr, *h_tok = nullptr;
    int64_t cap = 0;
    size_t bytes = 0;  // device bytes of the arena
  } batch_;
  int q_group_ = 0;  // the group size prompt rows are quantised for (the experts'; 0: none)
  // A decode batch layer by layer: each row's position (device and pinned), its logits rows
  // [rows_cap_][vocab], and each layer's rows' states for the batched mixer kernels,
  // [layer][row][2] (conv state and S, or the K and V caches), written before every step.
  int64_t rows_cap_ = 0;
  int64_t *d_seq_pos_ = nullptr, *h_seq_pos_ = nullptr;
  float **d_state_table_ = nullptr, **h_state_table_ = nullptr;
  float *d_rows_logits_ = nullptr, *h_rows_logits_ = nullptr;
  int32_t* d_tok_ = nullptr;     // [1] this step's token
  int64_t* d_pos_ = nullptr;     // [1] this step's position
  // With every expert resident a token needs no host round trip: its whole forward is one CUDA
  // graph, captured at the first step and again whenever the KV caches move (grow). A profiled
  // pass launches kernel by kernel (its timing events sit between them).
  cu::GpuGraph graph_ = nullptr;
  int64_t graph_kv_cap_ = -1;
  GpuProfile prof_;
};

}  // namespace swiftlet
