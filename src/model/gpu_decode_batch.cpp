// Several sessions' decode steps together on the GPU (GpuForward::decode_batch, issue 26).
//
// Every expert resident (and the fused expert kernels taking the model): the N tokens go through
// the layers together through the one-token step's own body (gpu_decode.cpp's decode_layers over
// the batch's rows: fused_matvec_rows and the experts' rows forms launch the one-token kernel with
// a grid row a token, its blocks shared out
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

GpuForward::DecodeRows GpuForward::batch_rows(int64_t n) const {
  const Batch& B = batch_;
  DecodeRows r;
  r.step = {n, d_seq_pos_, d_state_table_, h_state_table_};
  r.states_stride = rows_cap_ * 2;
  r.tok = B.tok;
  r.h = B.h;
  r.x = B.x;
  r.p1 = B.p1;
  r.p2 = B.p2;
  r.p3 = B.p3;
  r.mixed = B.mixed;
  r.u = B.u;
  r.z = B.z;
  r.b = B.b;
  r.a = B.a;
  r.core = B.core;
  r.router = B.router;
  r.sg = B.sg;
  r.w = B.w;
  r.act = B.act;
  r.eu = B.eu;
  r.ey = B.ey;
  r.ids = B.ids;
  return r;
}

// The rows through the layers on the prompt's products (each weight read once for the rows, on
// the fp32 tiles), each layer uploading the union of the rows' experts; the mixers on each row's
// states as a decode step's.
void GpuForward::batch_layers(const DecodeRows& r) {
  const int64_t T = r.step.n, H = c_.hidden_size;
  Batch& B = batch_;
  quantise_rows_ = false;
  cu::dequant_rows(g_->embed, B.tok, T, B.h, s_);
  mark("embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      prefill_delta_net(l, T, &r);
    else
      prefill_attention(l, T, 0, &r);
    prefill_moe(l, T);
  }
  cu::rms_norm(B.h, g_->final_norm, T, H, c_.rms_norm_eps, B.x, s_);
  cu::matmul_rows(g_->lm_head, rows_in(B.x, T, H, B.qx), T, d_rows_logits_, false, s_);
  mark("final norm + lm_head");
  quantise_rows_ = true;
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
  const DecodeRows r = batch_rows(n);
  if (rows) {
    decode_layers(r);
    g_->count_resident_hits(c_.num_layers * c_.num_experts_per_tok * int(n));
    project(r, {{g_->lm_head, d_rows_logits_, false, c_.vocab_size}}, r.h, c_.hidden_size, g_->final_norm);
    mark("final norm + lm_head");
  } else {
    batch_layers(r);
  }
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
