// Several sessions' decode steps together on the GPU (GpuForward::decode_batch, issue 26).
//
// Every expert resident (and the fused expert kernels taking the model): the N tokens go through
// the layers together on the one-token kernels' rows forms (rows_layers: fused_matvec_rows and the
// experts' rows forms launch the one-token kernel with a grid row a token, its blocks shared out
// among the rows, so a step is as many dependent launches as one token's and a weight tile the
// rows share comes from HBM about once, the L2 serving the other rows); the token mixers take each
// row on its own session's KV cache or DeltaNet states at its own position, all rows in one launch.
// Each row's logits equal its own one-token step's. (Each member's own CUDA graph on its own
// stream, all at once, is what runs where the fused expert kernels do not apply: those steps
// overlapped only in part, 1.2-1.3x one stream's tokens at 2-16 streams: docs/log/batching.md.)
//
// A VRAM cache that holds a layer's experts but not the model's: the N tokens go through the layers
// together as a prompt chunk of N rows does (gpu_prefill.cpp: every product reads its weights once
// for the N rows, on the fp32 tiles, see quantise_rows_; each layer uploads the union of the N
// tokens' experts once), the token mixers as above. Otherwise each member steps alone.
#include "model/gpu_forward_pass.h"

#if SWIFTLET_HAVE_CUDA

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace swiftlet {

void GpuForward::free_rows() {
  cu::gpu_free(d_seq_pos_);
  cu::gpu_free(d_rows_logits_);
  cu::gpu_free(d_state_table_);
  if (h_seq_pos_) cu::gpu_free_pinned(h_seq_pos_);
  if (h_rows_logits_) cu::gpu_free_pinned(h_rows_logits_);
  if (h_state_table_) cu::gpu_free_pinned(h_state_table_);
  d_seq_pos_ = h_seq_pos_ = nullptr;
  d_rows_logits_ = h_rows_logits_ = nullptr;
  d_state_table_ = h_state_table_ = nullptr;
  rows_cap_ = 0;
}

bool GpuForward::grow_rows(int64_t n) {
  if (!grow_batch(n) || batch_.cap < n) return false;
  if (n <= rows_cap_) return true;
  cu::gpu_sync(s_);
  free_rows();
  const size_t V = size_t(c_.vocab_size), table = size_t(c_.num_layers) * size_t(n) * 2;
  d_seq_pos_ = static_cast<int64_t*>(cu::gpu_alloc(size_t(n) * sizeof(int64_t)));
  d_rows_logits_ = static_cast<float*>(cu::gpu_alloc(size_t(n) * V * sizeof(float)));
  d_state_table_ = static_cast<float**>(cu::gpu_alloc(table * sizeof(float*)));
  h_seq_pos_ = static_cast<int64_t*>(cu::gpu_alloc_pinned(size_t(n) * sizeof(int64_t)));
  h_rows_logits_ = static_cast<float*>(cu::gpu_alloc_pinned(size_t(n) * V * sizeof(float)));
  h_state_table_ = static_cast<float**>(cu::gpu_alloc_pinned(table * sizeof(float*)));
  rows_cap_ = n;
  return true;
}

void GpuForward::batch_layers(std::span<GpuForward* const> seqs) {
  const int64_t T = int64_t(seqs.size()), H = c_.hidden_size;
  Batch& B = batch_;
  quantise_rows_ = false;
  cu::dequant_rows(g_->embed, B.tok, T, B.h, s_);
  mark("batch: embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      prefill_delta_net(l, T, seqs);
    else
      prefill_attention(l, T, 0, seqs);
    prefill_moe(l, T);
  }
  cu::rms_norm(B.h, g_->final_norm, T, H, c_.rms_norm_eps, B.x, s_);
  cu::matmul_rows(g_->lm_head, rows_in(B.x, T, H, B.qx), T, d_rows_logits_, false, s_);
  mark("batch: final norm + lm_head");
  quantise_rows_ = true;
}

// Row i's DeltaNet (after its projections, B.mixed / z / b / a) on seqs[i]'s states, all rows in
// one launch where deltanet_step_rows applies, else row by row.
void GpuForward::batch_delta_net_mixer(int l, int64_t T, std::span<GpuForward* const> seqs) {
  const GpuModel::Gdn& w = g_->layers[size_t(l)].gdn;
  const int hk = c_.linear_num_key_heads, hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim, K = c_.linear_conv_kernel_dim;
  const int64_t C = c_.conv_dim(), vd = c_.linear_value_dim();
  const float q_scale = 1.0f / std::sqrt(float(dk));
  Batch& B = batch_;
  const cu::DeltaNetIn rows{B.mixed, B.z, B.b, B.a};
  if (!cu::deltanet_step_rows(rows, T, C, vd, hv, w.conv, d_state_table_ + int64_t(l) * rows_cap_ * 2, w.A_log,
                              w.dt_bias, w.norm, 1e-6f, q_scale, c_.rms_norm_eps, hk, hv, dk, dv, K, B.core, vd, s_)) {
    for (int64_t i = 0; i < T; ++i) {
      LayerDev& di = seqs[size_t(i)]->dev_[size_t(l)];
      const cu::DeltaNetIn in{B.mixed + i * C, B.z + i * vd, B.b + i * hv, B.a + i * hv};
      cu::deltanet_decode(in, w.conv, di.conv, w.A_log, w.dt_bias, di.ssm, w.norm, 1e-6f, q_scale, c_.rms_norm_eps,
                          hk, hv, dk, dv, K, {B.u + i * C}, B.core + i * vd, s_, /*state_early=*/true);
    }
  }
  mark("batch gdn: conv, l2, delta rule + norm");
}

// Row i's attention (after its q / k / v projections) against its own KV cache at its position
// d_seq_pos_[i], all rows in one launch.
void GpuForward::batch_attention_mixer(int l, int64_t T) {
  const GpuModel::Attn& w = g_->layers[size_t(l)].attn;
  const int nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
  Batch& B = batch_;
  cu::attention_step_rows(B.p1, w.q.rows, B.p2, w.k.rows, B.p3, w.v.rows, w.q_norm, w.k_norm, nh, nkv, hd,
                          c_.attn_output_gate, c_.rotary_dim(), d_seq_pos_, c_.rope_theta, c_.rms_norm_eps,
                          1.0f / std::sqrt(float(hd)), d_state_table_ + int64_t(l) * rows_cap_ * 2, B.core,
                          c_.attn_out_dim(), T, s_);
  mark("batch attn: q/k norm, rope, kv write, attention");
}

// Every expert resident: the one-token kernels over the N rows, a grid row each (fused_matvec_rows,
// the experts' rows forms), so a step is about as many dependent launches as one token's and each
// weight tile the rows share is read from HBM about once (the L2 serves the other rows).
void GpuForward::rows_layers(std::span<GpuForward* const> seqs) {
  const int T = int(seqs.size());
  const int64_t H = c_.hidden_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  Batch& B = batch_;
  auto rows_project = [&](std::initializer_list<cu::MatvecSegment> segs, const float* x, int64_t x_stride,
                          const float* norm_w) {
    cu::fused_matvec_rows(segs.begin(), int(segs.size()), T, x, x_stride, norm_w, c_.rms_norm_eps, B.x, s_);
  };
  cu::dequant_rows(g_->embed, B.tok, T, B.h, s_);
  mark("rows: embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    const GpuModel::Layer& lw = g_->layers[size_t(l)];
    if (lw.linear) {
      const GpuModel::Gdn& w = lw.gdn;
      const int64_t hv = c_.linear_num_value_heads, vd = c_.linear_value_dim();
      rows_project({{w.qkv, B.mixed, false, c_.conv_dim()}, {w.z, B.z, false, vd}, {w.b, B.b, false, hv},
                    {w.a, B.a, false, hv}},
                   B.h, H, lw.in_norm);
      mark("rows gdn: norm + projections");
      batch_delta_net_mixer(l, T, seqs);
      rows_project({{w.out, B.h, true, H}}, B.core, vd, nullptr);
      mark("rows gdn: h += out_proj");
    } else {
      const GpuModel::Attn& w = lw.attn;
      rows_project({{w.q, B.p1, false, w.q.rows}, {w.k, B.p2, false, w.k.rows}, {w.v, B.p3, false, w.v.rows}}, B.h,
                   H, lw.in_norm);
      mark("rows attn: norm + q, k, v");
      batch_attention_mixer(l, T);
      rows_project({{w.o, B.h, true, H}}, B.core, c_.attn_out_dim(), nullptr);
      mark("rows attn: h += o_proj");
    }
    rows_project({{lw.router, B.router, false, E}, {lw.sh_expert_gate, B.sg, false, 1}}, B.h, H, lw.post_norm);
    mark("rows moe: norm + router, shared gate");
    cu::SharedExpert sh = shared_[size_t(l)];
    sh.d_gate_logit = B.sg;
    const cu::ExpertScratch scratch{B.act, B.eu, B.ey};
    cu::route_experts_act_rows(g_->layout(), g_->table(l), B.router, E, k, c_.norm_topk_prob, &sh, B.x, T, B.ids,
                               B.w, scratch, s_);
    mark("rows moe: top-k + experts gate, up, SiLU");
    cu::routed_experts_down_add_rows(g_->layout(), g_->table(l), E, k, B.ids, B.w, &sh, scratch, T, B.h, s_);
    mark("rows moe: h += experts down");
  }
  g_->count_resident_hits(c_.num_layers * k * T);
  rows_project({{g_->lm_head, d_rows_logits_, false, c_.vocab_size}}, B.h, H, g_->final_norm);
  mark("rows: final norm + lm_head");
}

void GpuForward::decode_batch(std::span<GpuForward* const> seqs, std::span<SessionState* const> states,
                              std::span<const int32_t> tokens, std::vector<float>& logits) {
  const int64_t n = int64_t(seqs.size()), V = c_.vocab_size;
  SWIFTLET_CHECK(states.size() == seqs.size() && tokens.size() == seqs.size(),
                 "decode_batch: {} passes, {} states and {} tokens", seqs.size(), states.size(), tokens.size());
  logits.clear();
  for (int64_t i = 0; i < n; ++i) {
    GpuForward* f = seqs[size_t(i)];
    const SessionState& st = *states[size_t(i)];
    if (f == this) fail("decode_batch: the batch's own pass cannot also be one of its sequences");
    if (f->g_ != g_) fail("decode_batch: every sequence must run on the batch's GPU model");
    for (int64_t j = 0; j < i; ++j)
      if (seqs[size_t(j)] == f || states[size_t(j)] == &st)
        fail("decode_batch: a sequence is listed twice; each may take one token a step");
    f->check_state(st);
    check_token(tokens[size_t(i)]);
  }
  if (n == 0) return;
  for (int64_t i = 0; i < n; ++i)
    if (states[size_t(i)]->pos == 0 && seqs[size_t(i)]->pos_ != 0) seqs[size_t(i)]->reset(*states[size_t(i)]);
  logits.resize(size_t(n * V));

  // The forms, as the file's head says: rows where every expert is resident and the fused expert
  // kernels take the model, else each member's own graph on its own stream; layer by layer where a
  // VRAM cache holds a layer's experts; else one by one.
  const bool fused = n > 1 && c_.num_experts > 0 && experts_fused_ && shared_fused_;
  const bool rows = fused && g_->all_resident() && grow_rows(n);
  if (g_->all_resident() && !rows) {
    for (int64_t i = 0; i < n; ++i) seqs[size_t(i)]->enqueue_step(tokens[size_t(i)]);
    for (int64_t i = 0; i < n; ++i)
      seqs[size_t(i)]->finish_step(*states[size_t(i)], tokens[size_t(i)], logits.data() + i * V);
    return;
  }
  const bool layered = rows || (fused && g_->group_limit() >= c_.num_experts && grow_rows(n));
  if (!layered) {
    std::vector<float> row;
    for (int64_t i = 0; i < n; ++i) {
      seqs[size_t(i)]->run(*states[size_t(i)], tokens.subspan(size_t(i), 1), LogitsMode::Last, row);
      std::copy(row.begin(), row.end(), logits.begin() + i * V);
    }
    return;
  }

  cu::gpu_sync(s_);  // the pinned tables may still be in the last step's uploads
  for (int64_t i = 0; i < n; ++i) {
    GpuForward* f = seqs[size_t(i)];
    f->reserve_kv(f->pos_ + 1);
    cu::gpu_sync(f->s_);  // nothing of its own in flight while the batch writes its states
    batch_.h_tok[i] = tokens[size_t(i)];
    h_seq_pos_[i] = f->pos_;
    for (int l = 0; l < c_.num_layers; ++l) {
      const LayerDev& d = f->dev_[size_t(l)];
      float** row = h_state_table_ + (int64_t(l) * rows_cap_ + i) * 2;
      row[0] = d.conv ? d.conv : d.k;
      row[1] = d.conv ? d.ssm : d.v;
    }
  }
  prof_.begin(s_);
  cu::gpu_upload(batch_.tok, batch_.h_tok, size_t(n) * sizeof(int32_t), s_);
  cu::gpu_upload(d_seq_pos_, h_seq_pos_, size_t(n) * sizeof(int64_t), s_);
  cu::gpu_upload(d_state_table_, h_state_table_, size_t(c_.num_layers * rows_cap_ * 2) * sizeof(float*), s_);
  if (rows)
    rows_layers(seqs);
  else
    batch_layers(seqs);
  cu::gpu_download(h_rows_logits_, d_rows_logits_, size_t(n * V) * sizeof(float), s_);
  prof_.end(prof_.decode(), n);
  std::memcpy(logits.data(), h_rows_logits_, size_t(n * V) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) seqs[size_t(i)]->advance(*states[size_t(i)], tokens.subspan(size_t(i), 1));
}

void gpu_decode_batch(ForwardPass& runner, std::span<ForwardPass* const> passes, std::span<SessionState* const> states,
                      std::span<const int32_t> tokens, std::vector<float>& logits) {
  auto* r = dynamic_cast<GpuForward*>(&runner);
  if (!r) fail("gpu_decode_batch: the batch's pass is not a GPU pass (make_gpu_forward)");
  std::vector<GpuForward*> seqs;
  for (ForwardPass* p : passes) {
    auto* g = dynamic_cast<GpuForward*>(p);
    if (!g) fail("gpu_decode_batch: every sequence must run on the GPU (make_gpu_forward)");
    seqs.push_back(g);
  }
  r->decode_batch(seqs, states, tokens, logits);
}

}  // namespace swiftlet

#else  // no CUDA in this build

#include "core/error.h"

namespace swiftlet {

void gpu_decode_batch(ForwardPass&, std::span<ForwardPass* const>, std::span<SessionState* const>,
                      std::span<const int32_t>, std::vector<float>&) {
  fail("this swiftlet was built without CUDA (configure with -DSWIFTLET_CUDA=ON and nvcc)");
}

}  // namespace swiftlet

#endif
