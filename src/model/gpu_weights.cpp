// GpuModel's dense weights: every resident tensor of the model uploaded once at load, in the
// layout of its QMatrix (cu::upload_matrix), and the expert cache's table and first slot layout.
#include "model/gpu_model.h"

#if SWIFTLET_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <span>

namespace swiftlet {

cu::GpuMatrix GpuModel::up(const QMatrix& w) {
  if (w.empty() || w.rows == 0) return {};
  void* owner = nullptr;
  cu::GpuMatrix g = cu::upload_matrix(w, &owner, nullptr);
  owned_.push_back(owner);
  dense_bytes_ += cu::matrix_device_bytes(w);
  return g;
}

float* GpuModel::up(const std::vector<float>& v) {
  if (v.empty()) return nullptr;
  auto* d = static_cast<float*>(cu::gpu_alloc(v.size() * 4));
  cu::gpu_upload(d, v.data(), v.size() * 4);
  owned_.push_back(d);
  dense_bytes_ += v.size() * 4;
  return d;
}

GpuModel::GpuModel(const Model& model, const GpuOptions& o) : m(model), c(model.config), opts(o) {
  const ModelWeights& w = m.weights;
  embed = up(w.embed_tokens);
  lm_head = c.tie_word_embeddings ? embed : up(w.lm_head);
  final_norm = up(w.norm);
  layers.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& lw = w.layers[size_t(i)];
    Layer& l = layers[size_t(i)];
    l.linear = lw.linear;
    l.in_norm = up(lw.input_layernorm);
    l.post_norm = up(lw.post_attention_layernorm);
    if (lw.linear) {
      const DeltaNetWeights& g = lw.gdn;
      cu::DeltaNetSpec mixer{up(g.conv1d),
                             up(g.A_log),
                             up(g.dt_bias),
                             up(g.norm),
                             c.linear_num_key_heads,
                             c.linear_num_value_heads,
                             c.linear_key_head_dim,
                             c.linear_value_head_dim,
                             c.linear_conv_kernel_dim,
                             ModelConfig::kQkL2NormEps,
                             1.0f / std::sqrt(float(c.linear_key_head_dim)),
                             c.rms_norm_eps};
      l.gdn = {up(g.in_proj_qkv), up(g.in_proj_z), up(g.in_proj_b), up(g.in_proj_a), up(g.out_proj), mixer};
    } else {
      const AttentionWeights& a = lw.attn;
      const cu::AttentionSpec mixer{
          up(a.q_norm),   up(a.k_norm),       c.num_heads,  c.num_kv_heads, c.head_dim,
          c.rotary_dim(), c.attn_output_gate, c.rope_theta, c.rms_norm_eps, 1.0f / std::sqrt(float(c.head_dim))};
      l.attn = {up(a.q_proj), up(a.k_proj), up(a.v_proj), up(a.o_proj), mixer};
    }
    l.router = up(lw.moe.router);
    l.sh_gate = up(lw.moe.shared_gate_proj);
    l.sh_up = up(lw.moe.shared_up_proj);
    l.sh_down = up(lw.moe.shared_down_proj);
    l.sh_expert_gate = up(lw.moe.shared_expert_gate);
  }
  const size_t n_keys = size_t(c.num_layers) * size_t(c.num_experts);
  d_table_ = static_cast<const void**>(cu::gpu_alloc(std::max<size_t>(n_keys, 1) * sizeof(void*)));
  owned_.push_back(d_table_);
  cu::gpu_memset(d_table_, 0, n_keys * sizeof(void*));
  h_table_.assign(n_keys, nullptr);
  copy_ = cu::stream_create();
  copied_ = cu::event_create();
  cu::gpu_sync();
  if (c.num_experts > 0 && m.experts) {
    // The slot layout comes from one expert, so the cache is sized before the first token.
    const int32_t first = 0;
    host_.resize(1);
    m.experts->acquire(0, std::span(&first, 1), std::span(host_).first(1));
    learn_layout(host_[0]);
    m.experts->release(0);
    if (opts.preload && slots_ == int64_t(n_keys)) preload();
  }
}

GpuModel::~GpuModel() {
  cu::gpu_sync();
  for (void* p : owned_) cu::gpu_free(p);
  cu::gpu_free(arena_);
  cu::event_destroy(copied_);
  cu::stream_destroy(copy_);
}

}  // namespace swiftlet

#endif
