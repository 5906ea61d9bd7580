// A decode step on the GPU: one token (GpuForward's run, a CUDA graph when every expert is resident)
// or one token for each of several sessions (decode_batch's rows), through one layer body in
// forward order as qwen3_hybrid.cpp: the embedding, each layer's token mixer and sparse MoE; the
// final norm and lm_head. A step's n rows go through the one-token kernels' rows forms (a grid row
// a token), so one token is the body at n = 1. Which kernel runs an operation is the CUDA layer's
// choice (kernels/cuda/dispatch.cpp).
#include "model/gpu_forward_pass.h"

#if SWIFTLET_HAVE_CUDA

#include "core/error.h"

#include <cstring>

namespace swiftlet {

void GpuForward::logits_to(float* host_row) { logits_of(h_, host_row); }

void GpuForward::logits_of(const float* d_h_row, float* host_row) {
  enqueue_logits(d_h_row);
  cu::gpu_sync(s_);
  std::memcpy(host_row, h_logits_, size_t(c_.vocab_size) * sizeof(float));
}

void GpuForward::enqueue_logits(const float* d_h_row) {
  project({{g_->lm_head, logits_}}, d_h_row, g_->final_norm);
  mark("final norm + lm_head");
  cu::gpu_download_async(h_logits_, logits_, size_t(c_.vocab_size) * sizeof(float), s_);
}

void GpuForward::enqueue_step(int32_t token) {
  reserve_kv(pos_ + 1);
  step(token, pos_);
  enqueue_logits(h_);
}

void GpuForward::finish_step(SessionState& st, int32_t token, float* logits_row) {
  cu::gpu_sync(s_);
  std::memcpy(logits_row, h_logits_, size_t(c_.vocab_size) * sizeof(float));
  advance(st, std::span(&token, 1));
}

void GpuForward::step(int32_t token, int64_t pos) {
  prof_.begin(s_);
  cu::set_step(d_tok_, token, d_pos_, pos, s_);
  if (!g_->all_resident() || prof_.on()) {
    decode_layers(one_);
    return;
  }
  if (!graph_ || graph_kv_cap_ != kv_cap_) {
    cu::graph_destroy(graph_);
    cu::graph_capture_begin(s_);
    decode_layers(one_);
    graph_ = cu::graph_capture_end(s_);
    graph_kv_cap_ = kv_cap_;
  }
  cu::graph_launch(graph_, s_);
  g_->count_resident_hits(c_.num_layers * c_.num_experts_per_tok);
}

// Each block reads the residual stream r.h (its first product RMSNorms it on the fly) and adds its
// output back into r.h (the last product of the block accumulates into it).
void GpuForward::decode_layers(const DecodeRows& r) {
  cu::dequant_rows(g_->embed, r.tok, r.step.n, r.h, s_);
  mark("embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      gated_delta_net(l, r);
    else
      gated_attention(l, r);
    sparse_moe(l, r);
  }
}

void GpuForward::gated_attention(int l, const DecodeRows& r) {
  const GpuModel::Attn& w = g_->layers[size_t(l)].attn;
  project(r, {{w.q, r.p1, false, w.q.rows}, {w.k, r.p2, false, w.k.rows}, {w.v, r.p3, false, w.v.rows}}, r.h,
          c_.hidden_size, g_->layers[size_t(l)].in_norm);
  mark("attn: norm + q, k, v");
  attention_mixer(l, r);
  project(r, {{w.o, r.h, true, c_.hidden_size}}, r.core, c_.attn_out_dim(), nullptr);  // h += o_proj(attention)
  mark("attn: h += o_proj");
}

// q/k norms, RoPE, the cache write at each row's position and attention over its cache, one launch.
void GpuForward::attention_mixer(int l, const DecodeRows& r) {
  const GpuModel::Attn& w = g_->layers[size_t(l)].attn;
  cu::attention_step_rows(w.mixer, {r.p1, w.q.rows, r.p2, w.k.rows, r.p3, w.v.rows}, r.layer(l), r.core,
                          c_.attn_out_dim(), s_);
  mark("attn: q/k norm, rope, kv write, attention");
}

void GpuForward::gated_delta_net(int l, const DecodeRows& r) {
  const GpuModel::Gdn& w = g_->layers[size_t(l)].gdn;
  const int64_t hv = w.mixer.hv, vd = w.mixer.value_dim();
  project(r,
          {{w.qkv, r.mixed, false, w.mixer.conv_dim()},
           {w.z, r.z, false, vd},
           {w.b, r.b, false, hv},
           {w.a, r.a, false, hv}},
          r.h, c_.hidden_size, g_->layers[size_t(l)].in_norm);
  mark("gdn: norm + projections");
  delta_net_mixer(l, r);
  project(r, {{w.out, r.h, true, c_.hidden_size}}, r.core, vd, nullptr);  // h += out_proj(core)
  mark("gdn: h += out_proj");
}

// The conv, the q/k L2 norms, the delta rule and the gated norm of each row on its own states.
void GpuForward::delta_net_mixer(int l, const DecodeRows& r) {
  const GpuModel::Gdn& w = g_->layers[size_t(l)].gdn;
  cu::deltanet_decode(w.mixer, {r.mixed, r.z, r.b, r.a}, r.layer(l), {r.u}, r.core, s_);
  mark("gdn: conv, l2, delta rule + gated norm");
}

// x = norm(h); the router's softmax, top-k and renormalisation (3.10); the routed experts and the
// shared expert with its sigmoid gate added into h.
void GpuForward::sparse_moe(int l, const DecodeRows& r) {
  const GpuModel::Layer& w = g_->layers[size_t(l)];
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  project(r, {{w.router, r.router, false, E}, {w.sh_expert_gate, r.sg, false, 1}}, r.h, c_.hidden_size, w.post_norm);
  mark("moe: norm + router, shared gate");
  // One token alone from here where the experts are streamed or the shared expert runs apart
  // (decode_batch takes rows only with every expert resident and the shared expert fused).
  if (!g_->all_resident()) {
    SWIFTLET_CHECK(r.step.n == 1, "streamed experts take one token a step");
    streamed_experts(l);
    return;
  }
  // Everything on the device: hits are counted per step (this may be a graph capture).
  cu::SharedExpert sh;
  if (shared_fused_) {
    sh = shared_[size_t(l)];
    sh.d_gate_logit = r.sg;
  } else {
    SWIFTLET_CHECK(r.step.n == 1, "the shared expert apart takes one token a step");
    shared_expert(l);
  }
  const cu::RoutedExperts ex{g_->layout(), g_->table(l), E, k, c_.norm_topk_prob};
  const cu::SharedExpert* fused = shared_fused_ ? &sh : nullptr;
  const cu::ExpertScratch scratch{r.act, r.eu, r.ey};
  const int n = int(r.step.n);
  cu::route_experts_act(ex, r.router, fused, r.x, n, r.ids, r.w, scratch, s_);
  mark("moe: top-k + experts gate, up, SiLU");
  cu::routed_experts_down_add(ex, r.ids, r.w, fused, scratch, n, r.h, s_);
  mark("moe: h += experts down");
}

// h += sigmoid(g x) * down(SiLU(gate x) * up x), one token.
void GpuForward::shared_expert(int l) {
  const GpuModel::Layer& w = g_->layers[size_t(l)];
  project({{w.sh_gate, sh_}, {w.sh_up, su_}}, x_, nullptr);
  cu::silu_mul(sh_, su_, c_.shared_expert_intermediate_size, sh_, s_);
  project({{w.sh_down, sy_}}, sh_, nullptr);
  cu::add_sigmoid_scaled(h_, sy_, sg_, c_.hidden_size, s_);
}

// The routed experts of one token when the VRAM cache does not hold them all: the top-k ids go to
// the host, the shared expert runs while they travel, then the chosen experts in groups of what
// the cache holds at once, each group's misses uploaded before it runs.
void GpuForward::streamed_experts(int l) {
  const int64_t H = c_.hidden_size, I = c_.moe_intermediate_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  const cu::ExpertLayout& lay = g_->layout();
  const void* const* table = g_->table(l);
  const cu::SharedExpert* sh = shared_fused_ ? &shared_[size_t(l)] : nullptr;
  cu::router_topk(router_, 1, E, k, c_.norm_topk_prob, ids_, w_, s_);
  mark("moe: top-k");
  cu::gpu_download_async(h_ids_, ids_, size_t(k) * sizeof(int32_t), s_);
  cu::event_record(ids_ready_, s_);
  if (sh) {  // the shared expert alone in the experts' kernels while the ids travel
    cu::experts_act(lay, table, ids_, 0, sh, x_, experts_scratch(), s_);
    cu::experts_down_add(lay, table, ids_, w_, 0, sh, experts_scratch(), h_, s_);
  } else {
    shared_expert(l);
  }

  // Routed experts: h += sum_i w_i down_i(SiLU(gate_i x) * up_i x).
  auto compute = [&](int g0, int n) {
    if (g_->grouped()) {
      cu::experts_act(lay, table, ids_ + g0, n, nullptr, x_, experts_scratch(), s_);
      cu::experts_down_add(lay, table, ids_ + g0, w_ + g0, n, nullptr, experts_scratch(), h_, s_);
      return;
    }
    for (int i = 0; i < n; ++i) {  // matrices the grouped kernels do not take (float experts)
      const void* base = g_->slot_of(l, h_ids_[g0 + i]);
      cu::matmul(at_base(lay.gate, base), x_, 1, act_, s_);
      cu::matmul(at_base(lay.up, base), x_, 1, eu_, s_);
      cu::silu_mul(act_, eu_, I, act_, s_);
      cu::matmul(at_base(lay.down, base), act_, 1, ey_, s_);
      cu::axpy(h_, ey_, H, 0.0f, w_ + g0 + i, s_);
    }
  };
  cu::event_sync(ids_ready_);
  const int group = int(std::min<int64_t>(k, g_->group_limit() > 0 ? g_->group_limit() : k));
  for (int g0 = 0; g0 < k; g0 += group) {
    const int n = std::min(group, k - g0);
    g_->ensure(l, h_ids_ + g0, n, s_, g0 > 0 ? group_done_ : nullptr);
    compute(g0, n);
    cu::event_record(group_done_, s_);
  }
}

}  // namespace swiftlet

#endif
