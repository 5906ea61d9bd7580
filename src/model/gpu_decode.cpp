// One token through the model on the GPU (GpuForward's decode): the embedding, each layer's token
// mixer and sparse MoE, the final norm and lm_head, in forward order as qwen3_hybrid.cpp. Which
// kernel runs an operation is the CUDA layer's choice (kernels/cuda/dispatch.cpp).
#include "model/gpu_forward_pass.h"

#if SWIFTLET_HAVE_CUDA

#include <cmath>
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
    layers();
    return;
  }
  if (!graph_ || graph_kv_cap_ != kv_cap_) {
    cu::graph_destroy(graph_);
    cu::graph_capture_begin(s_);
    layers();
    graph_ = cu::graph_capture_end(s_);
    graph_kv_cap_ = kv_cap_;
  }
  cu::graph_launch(graph_, s_);
  g_->count_resident_hits(c_.num_layers * c_.num_experts_per_tok);
}

// Each block reads the residual stream h_ (its first product RMSNorms it on the fly) and adds its
// output back into h_ (the last product of the block accumulates into it).
void GpuForward::layers() {
  cu::dequant_row_at(g_->embed, d_tok_, h_, s_);
  mark("embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      gated_delta_net(l);
    else
      gated_attention(l);
    sparse_moe(l);
  }
}

void GpuForward::gated_attention(int l) {
  const GpuModel::Attn& w = g_->layers[size_t(l)].attn;
  const int nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
  LayerDev& d = dev_[size_t(l)];
  project({{w.q, p1_}, {w.k, p2_}, {w.v, p3_}}, h_, g_->layers[size_t(l)].in_norm);
  mark("attn: norm + q, k, v");
  // q/k norms, RoPE, the cache write at *d_pos_ and attention over the cache, one launch.
  cu::attention_step(p1_, p2_, p3_, w.q_norm, w.k_norm, nh, nkv, hd, c_.attn_output_gate, c_.rotary_dim(), 0, d_pos_,
                     c_.rope_theta, c_.rms_norm_eps, 1.0f / std::sqrt(float(hd)), d.k, d.v, core_, s_);
  mark("attn: q/k norm, rope, kv write, attention");
  project({{w.o, h_, true}}, core_, nullptr);  // h += o_proj(attention)
  mark("attn: h += o_proj");
}

void GpuForward::gated_delta_net(int l) {
  const GpuModel::Gdn& w = g_->layers[size_t(l)].gdn;
  const int hk = c_.linear_num_key_heads, hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
  LayerDev& d = dev_[size_t(l)];
  float* b = ba_;
  float* a = ba_ + hv;
  const float* in_norm = g_->layers[size_t(l)].in_norm;
  project({{w.qkv, mixed_}, {w.z, z_}, {w.b, b}, {w.a, a}}, h_, in_norm);
  mark("gdn: norm + projections");
  // The conv, the q/k L2 norms, the delta rule and the gated norm.
  const cu::DeltaNetIn in{mixed_, z_, b, a};
  cu::deltanet_decode(in, w.conv, d.conv, w.A_log, w.dt_bias, d.ssm, w.norm, 1e-6f, 1.0f / std::sqrt(float(dk)),
                      c_.rms_norm_eps, hk, hv, dk, dv, c_.linear_conv_kernel_dim, {u_}, core_, s_,
                      /*state_early=*/true);  // the predecessor: the projections above
  mark("gdn: conv, l2, delta rule + gated norm");
  project({{w.out, h_, true}}, core_, nullptr);  // h += out_proj(core)
  mark("gdn: h += out_proj");
}

// x = norm(h); the router's softmax, top-k and renormalisation (3.10); the routed experts and the
// shared expert with its sigmoid gate added into h.
void GpuForward::sparse_moe(int l) {
  const GpuModel::Layer& w = g_->layers[size_t(l)];
  project({{w.router, router_}, {w.sh_expert_gate, sg_}}, h_, w.post_norm);
  mark("moe: norm + router, shared gate");
  if (!g_->all_resident()) {
    streamed_experts(l);
    return;
  }
  // Everything on the device: hits are counted per step (this may be a graph capture).
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  const cu::SharedExpert* sh = shared_fused_ ? &shared_[size_t(l)] : nullptr;
  if (!sh) shared_expert(l);
  cu::route_experts_act(g_->layout(), g_->table(l), router_, E, k, c_.norm_topk_prob, sh, x_, ids_, w_,
                        experts_scratch(), s_);
  mark("moe: top-k + experts gate, up, SiLU");
  cu::routed_experts_down_add(g_->layout(), g_->table(l), E, k, ids_, w_, sh, experts_scratch(), h_, s_);
  mark("moe: h += experts down");
}

// h += sigmoid(g x) * down(SiLU(gate x) * up x).
void GpuForward::shared_expert(int l) {
  const GpuModel::Layer& w = g_->layers[size_t(l)];
  project({{w.sh_gate, sh_}, {w.sh_up, su_}}, x_, nullptr);
  cu::silu_mul(sh_, su_, c_.shared_expert_intermediate_size, sh_, s_);
  project({{w.sh_down, sy_}}, sh_, nullptr);
  cu::add_sigmoid_scaled(h_, sy_, sg_, c_.hidden_size, s_);
}

// The routed experts when the VRAM cache does not hold them all: the top-k ids go to the host,
// the shared expert runs while they travel, then the chosen experts in groups of what the cache
// holds at once, each group's misses uploaded before it runs.
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
