// A prompt through the model on the GPU (GpuForward::prefill): chunks of its tokens, each layer
// by layer with every product batched over the chunk, the routed experts grouped per expert
// (cu::ExpertBatch). The same math as the decode in gpu_decode.cpp, T tokens per launch.
#include "model/gpu_forward_pass.h"
#include "model/moe_routing.h"

#if SWIFTLET_HAVE_CUDA

#include <algorithm>
#include <utility>

namespace swiftlet {

void GpuForward::free_batch() {
  if (batch_.arena) cu::gpu_free(batch_.arena);
  if (batch_.h_ids) cu::gpu_free_pinned(batch_.h_ids);
  batch_ = {};
}

bool GpuForward::grow_batch(int64_t T) {
  if (T <= batch_.cap) return true;
  cu::gpu_sync(s_);
  free_batch();
  const ModelConfig& c = c_;
  const size_t n = size_t(T), H = size_t(c.hidden_size), E = size_t(c.num_experts);
  const size_t k = size_t(c.num_experts_per_tok), I = size_t(c.moe_intermediate_size);
  const size_t SI = size_t(c.shared_expert_intermediate_size), C = size_t(c.conv_dim());
  const size_t vd = size_t(c.linear_value_dim()), hv = size_t(c.linear_num_value_heads), kvd = size_t(c.kv_dim());
  const size_t ao = size_t(c.attn_out_dim());
  // Carve one allocation: (pointer, floats per token) in order, each part 256-byte aligned.
  std::vector<std::pair<float**, size_t>> parts = {
      {&batch_.h, H},   {&batch_.x, H},      {&batch_.p1, size_t(c.q_proj_rows())}, {&batch_.p2, kvd},
      {&batch_.p3, kvd}, {&batch_.mixed, C}, {&batch_.u, C},     {&batch_.z, vd},
      {&batch_.b, hv},  {&batch_.a, hv},     {&batch_.q, ao},    {&batch_.gate, ao},
      {&batch_.core, std::max(ao, vd)},      {&batch_.router, E}, {&batch_.w, k},
      {&batch_.sg, 1},  {&batch_.eg, k * I}, {&batch_.eu, k * I}, {&batch_.ey, k * H},
      {&batch_.shg, SI}, {&batch_.shu, SI},  {&batch_.shy, H},  {&batch_.act, (k + 1) * I}};
  float *tok = nullptr, *ids = nullptr, *groups = nullptr, *qx = nullptr, *qa = nullptr;
  parts.push_back({&tok, 1});
  parts.push_back({&ids, k});
  // Quantised rows: x's (H wide), and the widest other product input a token has (out_proj's,
  // o_proj's, the shared expert's down, its k experts' down).
  const auto q_floats = [&](int64_t cols, int64_t rows_per_token) -> size_t {
    if (q_group_ <= 0 || cols % q_group_ != 0) return 0;
    return (cu::quantized_rows_bytes(rows_per_token, cols, q_group_) + 3) / 4;
  };
  parts.push_back({&qx, q_floats(int64_t(H), 1)});
  parts.push_back({&qa, std::max({q_floats(int64_t(vd), 1), q_floats(int64_t(ao), 1), q_floats(int64_t(SI), 1),
                                  q_floats(int64_t(I), int64_t(k))})});
  const size_t group_ints = E + (E + 1) + n * k;
  const size_t delta_floats =
      hv > 0 ? size_t(cu::delta_rule_chunked_work_floats(T, int(hv), c.linear_key_head_dim, c.linear_value_head_dim))
             : 0;
  size_t bytes = 0;
  for (auto& [ptr, per] : parts) bytes += align256(std::max<size_t>(per * n, 1) * 4);
  bytes += align256(group_ints * 4) + align256(delta_floats * 4);
  auto* base = static_cast<uint8_t*>(cu::gpu_try_alloc(bytes));
  if (!base) {
    if (T / 2 < kMinPrefillChunk) return false;
    return grow_batch(T / 2);
  }
  batch_.arena = base;
  batch_.bytes = bytes;
  size_t at = 0;
  for (auto& [ptr, per] : parts) {
    *ptr = reinterpret_cast<float*>(base + at);
    at += align256(std::max<size_t>(per * n, 1) * 4);
  }
  groups = reinterpret_cast<float*>(base + at);
  at += align256(group_ints * 4);
  batch_.delta_work = delta_floats ? reinterpret_cast<float*>(base + at) : nullptr;
  batch_.tok = reinterpret_cast<int32_t*>(tok);
  batch_.ids = reinterpret_cast<int32_t*>(ids);
  batch_.d_groups = reinterpret_cast<int32_t*>(groups);
  batch_.qx = qx;
  batch_.qa = qa;
  // Pinned: the ids, the work list, the chunk's tokens (gpu_alloc_pinned aborts when it cannot).
  batch_.h_ids = static_cast<int32_t*>(cu::gpu_alloc_pinned((n * k + group_ints + n) * sizeof(int32_t)));
  batch_.h_groups = batch_.h_ids + n * k;
  batch_.h_tok = batch_.h_groups + group_ints;
  batch_.cap = T;
  return true;
}

bool GpuForward::prefill(std::span<const int32_t> tokens, LogitsMode mode, int64_t from, std::vector<float>& logits) {
  const int64_t T = int64_t(tokens.size());
  const int E = c_.num_experts;
  if (T < 2 || E == 0 || !experts_fused_ || !shared_fused_ || !(g_->all_resident() || g_->group_limit() >= E))
    return false;
  const int64_t V = c_.vocab_size;
  const int64_t first = mode == LogitsMode::All ? from : mode == LogitsMode::Last ? T - 1 : T;
  if (!grow_batch(std::min<int64_t>(T, std::max<int64_t>(g_->opts.prefill_chunk, kMinPrefillChunk)))) return false;
  logits.resize(size_t((T - first) * V));
  prof_.begin(s_);
  for (int64_t t0 = 0; t0 < T; t0 += batch_.cap) {
    const int64_t n = std::min(batch_.cap, T - t0);
    cu::gpu_sync(s_);  // h_tok may still be in an earlier chunk's upload
    std::copy_n(tokens.begin() + t0, n, batch_.h_tok);
    cu::gpu_upload(batch_.tok, batch_.h_tok, size_t(n) * sizeof(int32_t), s_);
    prefill_chunk(batch_.tok, n, pos_ + t0);
    for (int64_t t = std::max(first, t0); t < t0 + n; ++t)
      logits_of(batch_.h + (t - t0) * c_.hidden_size, logits.data() + (t - first) * V);
  }
  prof_.end(prof_.prefill(), T);
  return true;
}

void GpuForward::prefill_chunk(const int32_t* d_tokens, int64_t T, int64_t pos0) {
  cu::dequant_rows(g_->embed, d_tokens, T, batch_.h, s_);
  mark("prompt: tokens up + embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      prefill_delta_net(l, T);
    else
      prefill_attention(l, T, pos0);
    prefill_moe(l, T);
  }
}

cu::RowsIn GpuForward::norm_rows(const float* norm_w, int64_t T) {
  cu::rms_norm(batch_.h, norm_w, T, c_.hidden_size, c_.rms_norm_eps, batch_.x, s_);
  return rows_in(batch_.x, T, c_.hidden_size, batch_.qx);
}

void GpuForward::products(const cu::RowsIn& x, int64_t T, std::initializer_list<Product> ps) {
  for (const Product& p : ps) cu::matmul_rows(p.w, x, T, p.y, false, s_);
}

void GpuForward::prefill_delta_net(int l, int64_t T, const DecodeRows* step) {
  const GpuModel::Layer& lw = g_->layers[size_t(l)];
  const GpuModel::Gdn& w = lw.gdn;
  const cu::DeltaNetSpec& m = w.mixer;
  const int64_t C = m.conv_dim();
  LayerDev& d = dev_[size_t(l)];
  Batch& B = batch_;
  products(norm_rows(lw.in_norm, T), T, {{w.qkv, B.mixed}, {w.z, B.z}, {w.b, B.b}, {w.a, B.a}});
  mark("prompt gdn: norm + qkv, z, b, a");
  if (!step) {
    cu::conv1d_silu_scan(B.mixed, C, m.d_conv_w, d.conv, C, m.K, T, B.u, C, s_);
    cu::l2_norm_qk_rows(B.u, T, C, m.hk, m.dk, m.l2_eps, m.q_scale, s_);  // q then k: the front of each row
    mark("prompt gdn: conv, l2");
    // The delta rule (in chunks of 64 where the shapes allow, else scanned in order); the gated norm.
    cu::delta_rule_norm_scan(m, B.u, C, B.b, B.a, m.hv, d.ssm, B.z, T, B.core, B.delta_work, s_);
    mark("prompt gdn: delta rule scan + norm");
  } else {
    delta_net_mixer(l, *step);
  }
  cu::matmul_rows(w.out, rows_in(B.core, T, w.out.cols, B.qa), T, B.h, true, s_);  // h += out_proj(core)
  mark("prompt gdn: h += out_proj");
}

void GpuForward::prefill_attention(int l, int64_t T, int64_t pos0, const DecodeRows* step) {
  const GpuModel::Layer& lw = g_->layers[size_t(l)];
  const GpuModel::Attn& w = lw.attn;
  LayerDev& d = dev_[size_t(l)];
  Batch& B = batch_;
  products(norm_rows(lw.in_norm, T), T, {{w.q, B.p1}, {w.k, B.p2}, {w.v, B.p3}});
  mark("prompt attn: norm + q, k, v");
  if (!step) {
    cu::attn_prep_rows(w.mixer, {B.p1, w.q.rows, B.p2, w.k.rows, B.p3, w.v.rows}, pos0, T, B.q, B.gate, d.k, d.v, s_);
    cu::attention_prefill(w.mixer, B.q, B.gate, d.k, d.v, pos0, T, B.core, s_);
    mark("prompt attn: prep + causal attention");
  } else {
    attention_mixer(l, *step);
  }
  cu::matmul_rows(w.o, rows_in(B.core, T, w.o.cols, B.qa), T, B.h, true, s_);  // h += o_proj(attention)
  mark("prompt attn: h += o_proj");
}

void GpuForward::prefill_moe(int l, int64_t T) {
  const GpuModel::Layer& lw = g_->layers[size_t(l)];
  const int64_t H = c_.hidden_size, I = c_.moe_intermediate_size, SI = c_.shared_expert_intermediate_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  Batch& B = batch_;
  const cu::RowsIn x = norm_rows(lw.post_norm, T);
  products(x, T, {{lw.router, B.router}, {lw.sh_expert_gate, B.sg}});
  cu::router_topk(B.router, T, E, k, c_.norm_topk_prob, B.ids, B.w, s_);
  mark("prompt moe: norm + router, gate, top-k");
  cu::gpu_download_async(B.h_ids, B.ids, size_t(T * k) * sizeof(int32_t), s_);
  cu::event_record(ids_ready_, s_);
  // The shared expert while the ids travel.
  products(x, T, {{lw.sh_gate, B.shg}, {lw.sh_up, B.shu}});
  cu::silu_mul(B.shg, B.shu, T * SI, B.shg, s_);
  cu::matmul_rows(lw.sh_down, rows_in(B.shg, T, SI, B.qa), T, B.shy, false, s_);
  mark("prompt moe: shared expert");
  cu::event_sync(ids_ready_);

  // The work list: the pairs p = t k + j grouped by expert, in p order within a group.
  int32_t* gexp = B.h_groups;
  int32_t* gstart = gexp + E;
  const int groups = group_pairs_by_expert(std::span(B.h_ids, size_t(T * k)), E, gexp, gstart, gstart + (E + 1));
  const int32_t n_pairs = gstart[groups];
  // One upload: the layout on the device matches (experts, starts, pairs at the same offsets).
  cu::gpu_upload(B.d_groups, B.h_groups, (size_t(E) + size_t(E + 1) + size_t(n_pairs)) * sizeof(int32_t), s_);
  if (g_->all_resident())
    g_->count_resident_hits(int(T * k));
  else
    g_->ensure(l, gexp, groups, s_, nullptr);
  cu::ExpertBatch eb;
  eb.d_expert = B.d_groups;
  eb.d_start = B.d_groups + E;
  eb.d_pairs = B.d_groups + E + (E + 1);
  eb.groups = groups;
  eb.pairs = n_pairs;
  eb.k = k;
  const cu::ExpertLayout& lay = g_->layout();
  const void* const* table = g_->table(l);
  mark("prompt moe: work list (host) + uploads");
  cu::expert_gate_up_pairs(lay, table, eb, x, B.eg, B.eu, s_);
  cu::silu_mul(B.eg, B.eu, T * k * I, B.eg, s_);
  mark("prompt moe: experts gate, up, SiLU");
  cu::expert_down_pairs(lay, table, eb, rows_in(B.eg, T * k, I, B.qa), B.ey, s_);
  cu::moe_finish_rows(B.h, B.shy, B.sg, B.ey, B.w, T, k, H, s_);
  mark("prompt moe: experts down + finish");
}

}  // namespace swiftlet

#endif
