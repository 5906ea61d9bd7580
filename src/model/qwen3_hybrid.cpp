#include "model/qwen3_hybrid.h"

#include "core/error.h"
#include "kernels/cpu/ops_ref.h"
#include "model/moe_routing.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

namespace swiftlet {

namespace {
using ProfileClock = std::chrono::steady_clock;
double seconds_between(ProfileClock::time_point a, ProfileClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
}  // namespace

Forward::Forward(const Model& m, Backend backend)
    : m_(m), c_(m.config), k_(kernels_for(backend)), mix_(mixers_for(backend)),
      router_(c_.num_layers, c_.num_experts, c_.num_experts_per_tok, c_.norm_topk_prob, m.experts) {}

void Forward::run(SessionState& st, std::span<const int32_t> tokens, LogitsMode mode,
                  std::vector<float>& logits, int64_t from) {
  const int64_t T = int64_t(tokens.size());
  const int64_t H = c_.hidden_size;
  SWIFTLET_CHECK(st.layers.size() == size_t(c_.num_layers), "session state of another model");
  logits.clear();
  if (T == 0) return;
  for (int32_t id : tokens)
    if (id < 0 || id >= c_.vocab_size)
      fail("token id {} is outside the vocabulary (0..{})", id, c_.vocab_size - 1);

  const SeqRows seq{&st, 0, st.pos, T};
  layers(std::span(&seq, 1), tokens);
  st.pos += T;
  st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());

  if (mode == LogitsMode::None) return;
  const int64_t first = mode == LogitsMode::All ? std::clamp<int64_t>(from, 0, T) : T - 1;
  const int64_t rows = T - first;
  logits.resize(size_t(rows * c_.vocab_size));
  if (rows == 0) return;
  for (int64_t t = first; t < T; ++t)
    ref::rms_norm(h_.data() + t * H, m_.weights.norm.data(), H, c_.rms_norm_eps, x_.data() + (t - first) * H);
  const auto t0 = ProfileClock::now();
  k_.matmul(m_.weights.lm_head, x_.data(), rows, logits.data());
  profile_.lm_head += seconds_between(t0, ProfileClock::now());
}

void Forward::decode_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens,
                           std::vector<float>& logits) {
  const int64_t N = int64_t(states.size());
  const int64_t H = c_.hidden_size;
  if (N == 0) fail("decode_batch: the batch is empty: give at least one session state and its token");
  if (tokens.size() != states.size())
    fail("decode_batch: {} session states but {} tokens: give one token per state", states.size(), tokens.size());
  if (router_.observer())
    fail("decode_batch: a routing observer follows one sequence: decode those sessions alone");
  for (int64_t i = 0; i < N; ++i) {
    const SessionState* st = states[size_t(i)];
    if (!st) fail("decode_batch: session state {} is null", i);
    for (int64_t j = 0; j < i; ++j)
      if (states[size_t(j)] == st)
        fail("decode_batch: the same session state is at places {} and {}: a sequence takes one token per step", j, i);
    if (!st->fits(c_)) fail("decode_batch: session state {} was made for another model: create it for this one", i);
    const int32_t id = tokens[size_t(i)];
    if (id < 0 || id >= c_.vocab_size)
      fail("decode_batch: token id {} (place {}) is outside the vocabulary (0..{})", id, i, c_.vocab_size - 1);
  }

  std::vector<SeqRows>& seqs = batch_seqs_;
  seqs.clear();
  for (int64_t i = 0; i < N; ++i) seqs.push_back({states[size_t(i)], i, states[size_t(i)]->pos, 1});
  layers(seqs, tokens);
  for (int64_t i = 0; i < N; ++i) {
    SessionState& st = *states[size_t(i)];
    st.pos += 1;
    st.tokens.push_back(tokens[size_t(i)]);
  }

  logits.resize(size_t(N * c_.vocab_size));
  for (int64_t t = 0; t < N; ++t)
    ref::rms_norm(h_.data() + t * H, m_.weights.norm.data(), H, c_.rms_norm_eps, x_.data() + t * H);
  const auto t0 = ProfileClock::now();
  k_.matmul(m_.weights.lm_head, x_.data(), N, logits.data());
  profile_.lm_head += seconds_between(t0, ProfileClock::now());
}

void Forward::layers(std::span<const SeqRows> seqs, std::span<const int32_t> tokens) {
  const int64_t T = int64_t(tokens.size());
  const int64_t H = c_.hidden_size;
  float* h = grow(h_, size_t(T * H));
  grow(x_, size_t(T * H));
  grow(out_, size_t(T * H));
  for (int64_t t = 0; t < T; ++t) k_.dequant_row(m_.weights.embed_tokens, tokens[size_t(t)], h + t * H);
  if (capture_) {
    layer_outputs_.assign(size_t(c_.num_layers * T * H), 0.0f);
    routes_.clear();
  }
  rope_tables(seqs, T);

  for (int l = 0; l < c_.num_layers; ++l) {
    const LayerWeights& lw = m_.weights.layers[size_t(l)];
    if (layer_hook_) layer_hook_(l, std::span<float>(h, size_t(T * H)));
    for (int64_t t = 0; t < T; ++t)
      ref::rms_norm(h + t * H, lw.input_layernorm.data(), H, c_.rms_norm_eps, x_.data() + t * H);
    auto t0 = ProfileClock::now();
    // Mixer chunks of at most kMixerChunk rows, each sequence's rows in order: the KV cache and
    // DeltaNet state advance.
    std::vector<SeqRows>& piece = pieces_;
    int64_t rows = 0;
    auto flush = [&] {
      if (piece.empty()) return;
      if (lw.linear)
        gated_delta_net(l, piece);
      else
        gated_attention(l, piece);
      piece.clear();
      rows = 0;
    };
    piece.clear();
    for (const SeqRows& s : seqs)
      for (int64_t o = 0; o < s.n;) {
        if (rows == kMixerChunk) flush();
        const int64_t n = std::min(s.n - o, kMixerChunk - rows);
        piece.push_back({s.state, s.row0 + o, s.pos0 + o, n});
        rows += n;
        o += n;
      }
    flush();
    auto t1 = ProfileClock::now();
    (lw.linear ? profile_.delta_net : profile_.attention) += seconds_between(t0, t1);
    for (int64_t i = 0; i < T * H; ++i) h[i] += out_[size_t(i)];
    for (int64_t t = 0; t < T; ++t)
      ref::rms_norm(h + t * H, lw.post_attention_layernorm.data(), H, c_.rms_norm_eps, x_.data() + t * H);
    sparse_moe(l, tokens);
    // A prompt of many tokens routes to nearly every expert of every layer (each is missed with
    // probability ~e^-(T k / E)): start reading the next layer's now, so the reads overlap its
    // token mixer instead of waiting for its router. Only when the cache holds a whole layer:
    // else those reads would push out one another before they are used.
    const int cap = m_.experts->capacity();
    if (l + 1 < c_.num_layers && T * c_.num_experts_per_tok >= 4 * int64_t(c_.num_experts) &&
        m_.experts->wants_predictions() && (cap == 0 || cap >= c_.num_experts)) {
      if (all_experts_.size() != size_t(c_.num_experts)) {
        all_experts_.resize(size_t(c_.num_experts));
        std::iota(all_experts_.begin(), all_experts_.end(), 0);
      }
      m_.experts->predict(l + 1, all_experts_);
    }
    for (int64_t i = 0; i < T * H; ++i) h[i] += out_[size_t(i)];
    if (capture_) std::copy(h, h + T * H, layer_outputs_.begin() + l * T * H);
  }
}

// Every activation buffer run() grows with the number of tokens (const or not).
template <typename Self>
auto Forward::buffers_of(Self& f) {
  return std::array{&f.h_, &f.x_, &f.out_, &f.proj_, &f.proj2_, &f.proj3_, &f.mixed_, &f.z_, &f.ba_,
                    &f.core_, &f.gate_, &f.q_, &f.cos_, &f.sin_, &f.router_out_,
                    &f.xe_, &f.he_, &f.ue_, &f.ye_, &f.shared_h_, &f.shared_u_, &f.shared_g_};
}

void Forward::release_buffers() {
  for (std::vector<float>* v : buffers_of(*this)) std::vector<float>().swap(*v);
}

size_t Forward::buffer_bytes() const {
  size_t n = 0;
  for (const std::vector<float>* v : buffers_of(*this)) n += v->capacity() * sizeof(float);
  return n;
}

void Forward::rope_tables(std::span<const SeqRows> seqs, int64_t T) {
  // As transformers: inv_freq and the angle in fp32, then cos/sin (model-math.md 4.3).
  const int rot = c_.rotary_dim(), half = rot / 2;
  int64_t* pos = grow(row_pos_, size_t(T));
  for (const SeqRows& s : seqs)
    for (int64_t t = 0; t < s.n; ++t) pos[s.row0 + t] = s.pos0 + t;
  float* cs = grow(cos_, size_t(T * half));
  float* sn = grow(sin_, size_t(T * half));
  for (int i = 0; i < half; ++i) {
    const float inv = 1.0f / std::pow(c_.rope_theta, float(2 * i) / float(rot));
    for (int64_t t = 0; t < T; ++t) {
      const float angle = float(pos[t]) * inv;
      cs[t * half + i] = std::cos(angle);
      sn[t * half + i] = std::sin(angle);
    }
  }
}

void Forward::gated_attention(int li, std::span<const SeqRows> seqs) {
  const AttentionWeights& w = m_.weights.layers[size_t(li)].attn;
  const int nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
  const int rot = c_.rotary_dim(), half = rot / 2;
  const int64_t H = c_.hidden_size, qrows = c_.q_proj_rows(), kvd = c_.kv_dim(), od = c_.attn_out_dim();
  const bool gated = c_.attn_output_gate;
  const int64_t first = seqs.front().row0, T = seqs.back().row0 + seqs.back().n - first;
  const float* x = x_.data() + first * H;
  float* out = out_.data() + first * H;

  float* P = grow(proj_, size_t(T * qrows));
  float* Kp = grow(proj2_, size_t(T * kvd));
  float* Vp = grow(proj3_, size_t(T * kvd));
  const MatmulJob qkv[] = {{&w.q_proj, x, T, P}, {&w.k_proj, x, T, Kp}, {&w.v_proj, x, T, Vp}};
  k_.matmul_group(std::span(qkv));

  float* q = grow(q_, size_t(T * od));
  float* gate = grow(gate_, size_t(T * od));
  float* o = grow(core_, size_t(T * od));
  const float scale = 1.0f / std::sqrt(float(hd));
  for (const SeqRows& s : seqs) {
    LayerState& st = s.state->layers[size_t(li)];
    const int64_t n_pos = s.pos0 + s.n;
    st.k.resize(size_t(n_pos * kvd));
    st.v.resize(size_t(n_pos * kvd));
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t t = s.row0 - first + i;  // local row
      const float* cs = cos_.data() + (s.row0 + i) * half;
      const float* sn = sin_.data() + (s.row0 + i) * half;
      // q_proj rows are per head [query (hd) | gate (hd)] when gated (model-math.md 4.1).
      for (int j = 0; j < nh; ++j) {
        const float* src = P + t * qrows + int64_t(j) * hd * (gated ? 2 : 1);
        float* qj = q + t * od + int64_t(j) * hd;
        ref::rms_norm(src, w.q_norm.data(), hd, c_.rms_norm_eps, qj);
        ref::rope_neox(qj, rot, cs, sn);
        if (gated) std::copy(src + hd, src + 2 * hd, gate + t * od + int64_t(j) * hd);
      }
      float* kdst = st.k.data() + (s.pos0 + i) * kvd;
      for (int j = 0; j < nkv; ++j) {
        ref::rms_norm(Kp + t * kvd + int64_t(j) * hd, w.k_norm.data(), hd, c_.rms_norm_eps, kdst + int64_t(j) * hd);
        ref::rope_neox(kdst + int64_t(j) * hd, rot, cs, sn);
      }
      std::copy(Vp + t * kvd, Vp + (t + 1) * kvd, st.v.data() + (s.pos0 + i) * kvd);
    }
    // Causal softmax attention over this sequence's cache, GQA: query head j reads kv head j / (nh / nkv).
    const int64_t r0 = s.row0 - first;
    mix_.attend({nh, nkv, hd}, {s.n, s.pos0, q + r0 * od, od, st.k.data(), st.v.data(), kvd, scale, o + r0 * od, od});
  }
  if (gated) mix_.sigmoid_gate(o, gate, T * od);
  k_.matmul(w.o_proj, o, T, out);
}

void Forward::gated_delta_net(int li, std::span<const SeqRows> seqs) {
  const DeltaNetWeights& w = m_.weights.layers[size_t(li)].gdn;
  const int hv = c_.linear_num_value_heads;
  const int64_t H = c_.hidden_size, C = c_.conv_dim(), vd = c_.linear_value_dim();
  const int64_t first = seqs.front().row0, T = seqs.back().row0 + seqs.back().n - first;
  const float* x = x_.data() + first * H;

  float* mixed = grow(mixed_, size_t(T * C));
  float* z = grow(z_, size_t(T * vd));
  float* ba = grow(ba_, size_t(T * 2 * hv));  // per token: b[hv] then a[hv]
  float* B = grow(proj2_, size_t(T * hv));
  float* A = grow(proj3_, size_t(T * hv));
  k_.matmul(w.in_proj_qkv, x, T, mixed);
  k_.matmul(w.in_proj_z, x, T, z);
  k_.matmul(w.in_proj_b, x, T, B);
  k_.matmul(w.in_proj_a, x, T, A);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(B + t * hv, B + (t + 1) * hv, ba + t * 2 * hv);
    std::copy(A + t * hv, A + (t + 1) * hv, ba + t * 2 * hv + hv);
  }

  float* core = grow(core_, size_t(T * vd));
  for (const SeqRows& s : seqs) {
    LayerState& st = s.state->layers[size_t(li)];
    delta_net_core(w, st, s.row0 - first, s.n);
  }
  k_.matmul(w.out_proj, core, T, out_.data() + first * H);
}

// One sequence's DeltaNet after the input projections (model-math.md 5.2-5.6): conv + SiLU, the
// q / k norms, decay and write strength, the delta rule (token by token; in chunks of 64, the
// WY/UT form of 5.5, for prompts with --chunked-prefill), the gated norm.
void Forward::delta_net_core(const DeltaNetWeights& w, LayerState& st, int64_t r0, int64_t T) {
  const int hk = c_.linear_num_key_heads, hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
  const int64_t C = c_.conv_dim(), kd = c_.linear_key_dim(), vd = c_.linear_value_dim();
  float* mixed = mixed_.data() + r0 * C;  // [T][C] q, k, v; after the conv (in place) u
  float* ba = ba_.data() + r0 * 2 * hv;   // [T][2 hv] b, a; in place -> beta, g (model-math.md 5.3)
  mix_.conv_silu(mixed, T, C, w.conv1d.data(), c_.linear_conv_kernel_dim, st.conv.data());
  const float q_scale = 1.0f / std::sqrt(float(dk));
  for (int64_t t = 0; t < T; ++t) {
    mix_.l2_norm_heads(mixed + t * C, hk, dk, ModelConfig::kQkL2NormEps, q_scale);
    mix_.l2_norm_heads(mixed + t * C + kd, hk, dk, ModelConfig::kQkL2NormEps, 1.0f);
    float* b = ba + t * 2 * hv;
    float* a = b + hv;
    for (int h = 0; h < hv; ++h) {
      a[h] = -std::exp(w.A_log[size_t(h)]) * ref::softplus(a[h] + w.dt_bias[size_t(h)]);
      b[h] = ref::sigmoid(b[h]);
    }
  }
  float* core = core_.data() + r0 * vd;
  gdn::DeltaBatch db;
  db.T = T;
  db.q = mixed;
  db.k = mixed + kd;
  db.v = mixed + 2 * kd;
  db.qkv_stride = C;
  db.beta = ba;
  db.g = ba + hv;
  db.gate_stride = 2 * hv;
  db.out = core;
  db.out_stride = vd;
  const gdn::DeltaShape shape{hk, hv, dk, dv};
  // The chunked form's fixed cost per chunk (K K^T, Q K^T, the triangular solve) pays off from
  // about 4 tokens (bench/mixer_bench.cpp); below that the fused recurrence is faster.
  if (chunked_prefill_ && T >= 4) mix_.delta_rule_chunked(shape, db, st.ssm.data());
  else mix_.delta_rule(shape, db, st.ssm.data());
  for (int64_t t = 0; t < T; ++t)
    mix_.gated_rms_norm(core + t * vd, z_.data() + (r0 + t) * vd, w.norm.data(), hv, dv, c_.rms_norm_eps);
}

// The MoE block (model-math.md 6): the router picks each token's experts, the shared expert
// with its sigmoid gate is written first, the routed experts' outputs are added with their
// weights.
void Forward::sparse_moe(int li, std::span<const int32_t> tokens) {
  const int64_t T = int64_t(tokens.size());
  const auto t_start = ProfileClock::now();
  route(li, tokens);
  const int E = c_.num_experts, top_k = c_.num_experts_per_tok;
  const std::span chosen(chosen_.data(), size_t(T * top_k));
  // --on-miss (lossy): misses left out or read as low-bit copies before anything asks for them.
  router_.apply_miss_policy(li, chosen, std::span(chosen_w_.data(), size_t(T * top_k)));
  groups_.build(chosen, E);
  // The experts the call needs, known now: the source starts reading the missing ones, which
  // overlaps the shared expert and the cached experts computed meanwhile.
  m_.experts->prefetch(li, groups_.chosen());
  // Decode: the next layers' experts guessed from the residual stream as it is now (before this
  // layer's MoE output is added: later layers' MoE inputs stay close to it), their reads started.
  if (T == 1 && router_.predicts())
    router_.predict(li, row_pos_[0], groups_.chosen(), [&](int target, float* logits) {
      const LayerWeights& lw = m_.weights.layers[size_t(target)];
      float* xn = grow(predict_x_, size_t(c_.hidden_size));
      ref::rms_norm(h_.data(), lw.post_attention_layernorm.data(), c_.hidden_size, c_.rms_norm_eps, xn);
      k_.matmul(lw.moe.router, xn, 1, logits);
    });
  shared_expert(m_.weights.layers[size_t(li)].moe, T);
  profile_.router_shared += seconds_between(t_start, ProfileClock::now());
  routed_experts(li, T);
}

// Router: softmax over all experts, top-k (or the override's choice), weights renormalised over
// the chosen (model-math.md 6.1) into chosen_ / chosen_w_; the capture and the observer see them.
void Forward::route(int li, std::span<const int32_t> tokens) {
  const int64_t T = int64_t(tokens.size());
  const int top_k = c_.num_experts_per_tok;
  float* probs = grow(router_out_, size_t(T * c_.num_experts));
  k_.matmul(m_.weights.layers[size_t(li)].moe.router, x_.data(), T, probs);
  int32_t* chosen = grow(chosen_, size_t(T * top_k));
  float* chosen_w = grow(chosen_w_, size_t(T * top_k));
  router_.choose(li, row_pos_.data(), T, probs, chosen, chosen_w);
  const std::span ids(chosen, size_t(T * top_k));
  if (capture_)
    for (int64_t t = 0; t < T; ++t)
      routes_.push_back(
          {li, row_pos_[size_t(t)], std::vector<int32_t>(ids.begin() + t * top_k, ids.begin() + (t + 1) * top_k)});
  router_.observe(li, row_pos_[0], tokens, ids, std::span(chosen_w, size_t(T * top_k)));
}

// out_ = sigmoid(shared_expert_gate x) * down(SiLU(gate x) * up x) for the T rows of x_.
void Forward::shared_expert(const MoeDenseWeights& w, int64_t T) {
  const int64_t H = c_.hidden_size, SI = c_.shared_expert_intermediate_size;
  const float* x = x_.data();
  float* out = out_.data();
  float* sh = grow(shared_h_, size_t(T * SI));
  float* su = grow(shared_u_, size_t(T * SI));
  float* sg = grow(shared_g_, size_t(T));
  const MatmulJob jobs[] = {
      {&w.shared_gate_proj, x, T, sh}, {&w.shared_up_proj, x, T, su}, {&w.shared_expert_gate, x, T, sg}};
  k_.matmul_group(std::span(jobs));
  mix_.silu_mul(sh, su, T * SI);
  k_.matmul(w.shared_down_proj, sh, T, out);
  for (int64_t t = 0; t < T; ++t) {
    const float s = ref::sigmoid(sg[t]);
    for (int64_t d = 0; d < H; ++d) out[t * H + d] *= s;
  }
}

// out_ += the routed experts of groups_: each chosen expert is acquired once and applied to all
// its tokens; those already in memory first, so the compute runs while the others are still
// being read. Outputs are kept per expert and added in expert order, so the result does not
// depend on which experts happened to be cached (the cache size never changes the logits).
void Forward::routed_experts(int li, int64_t T) {
  const int64_t H = c_.hidden_size, I = c_.moe_intermediate_size;
  const int top_k = c_.num_experts_per_tok;
  const ExpertGroups& gr = groups_;
  const float* x = x_.data();
  float* out = out_.data();
  const int64_t rows = gr.start[size_t(gr.groups)];
  float* yall = grow(ye_, size_t(rows * H));
  std::vector<int32_t>& ids = ids_;  // compute order
  ids.assign(gr.chosen().begin(), gr.chosen().end());
  std::stable_partition(ids.begin(), ids.end(), [&](int32_t e) { return m_.experts->ready(li, e); });
  const int64_t batch = std::max(1, m_.experts->max_batch());
  const auto t_routed = ProfileClock::now();
  // Experts already in memory go in groups (up to max_batch held at once, as one at a time did):
  // their products are one matmul_group each for gate + up and for down, every thread busy
  // across the group's experts. An expert still being read goes alone, so its wait overlaps
  // the reads of the ones after it.
  float* xe = grow(xe_, size_t(rows * H));
  float* he = grow(he_, size_t(rows * I));
  float* ue = grow(ue_, size_t(rows * I));
  double acquiring = 0;
  int64_t held = 0;
  for (size_t i = 0; i < ids.size();) {
    size_t g = 1;
    if (m_.experts->ready(li, ids[i]))
      while (i + g < ids.size() && held + int64_t(g) < batch && m_.experts->ready(li, ids[i + g])) ++g;
    ExpertWeights* ew = grow(ews_, g);
    const auto ta = ProfileClock::now();
    m_.experts->acquire(li, std::span(ids).subspan(i, g), std::span(ew, g));
    acquiring += seconds_between(ta, ProfileClock::now());
    held += int64_t(g);
    jobs_.clear();
    for (size_t k = 0; k < g; ++k) {  // gather each expert's rows; gate and up products
      const int grp = gr.group_of[size_t(ids[i + k])];
      const int64_t r0 = gr.start[size_t(grp)], nt = gr.size(grp);
      for (int64_t j = 0; j < nt; ++j) {
        const float* row = x + int64_t(gr.pairs[size_t(r0 + j)] / top_k) * H;
        std::copy(row, row + H, xe + (r0 + j) * H);
      }
      jobs_.push_back({&ew[k].gate, xe + r0 * H, nt, he + r0 * I});
      jobs_.push_back({&ew[k].up, xe + r0 * H, nt, ue + r0 * I});
    }
    k_.matmul_group(jobs_);
    jobs_.clear();
    for (size_t k = 0; k < g; ++k) {
      const int grp = gr.group_of[size_t(ids[i + k])];
      const int64_t r0 = gr.start[size_t(grp)], nt = gr.size(grp);
      mix_.silu_mul(he + r0 * I, ue + r0 * I, nt * I);
      jobs_.push_back({&ew[k].down, he + r0 * I, nt, yall + r0 * H});
    }
    k_.matmul_group(jobs_);
    i += g;
    if (held == batch || i == ids.size()) {
      m_.experts->release(li);
      held = 0;
    }
  }
  profile_.expert_acquire += acquiring;
  profile_.expert_compute += seconds_between(t_routed, ProfileClock::now()) - acquiring;
  for (int64_t r = 0; r < rows; ++r) {  // expert by expert, each one's pairs in order
    const int32_t p = gr.pairs[size_t(r)];
    const float wgt = chosen_w_[size_t(p)];
    const float* ye = yall + r * H;
    float* o = out + int64_t(p / top_k) * H;
    for (int64_t d = 0; d < H; ++d) o[d] += wgt * ye[d];
  }
}

}  // namespace swiftlet
