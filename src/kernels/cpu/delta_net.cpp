#include "kernels/cpu/delta_net.h"

#include "core/thread_pool.h"
#include "kernels/cpu/ops_ref.h"
#include "kernels/cpu/simd_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace swiftlet::gdn {

#if SWIFTLET_F8_KERNELS
// In delta_net_simd.cpp; call only when simd::cpu_runs_f8().
namespace vec {
void recurrent_head(const DeltaShape& s, const DeltaBatch& b, int h, float* S_h);
void chunked_key_head(const DeltaShape& s, const DeltaBatch& b, int kh, float* S);
void conv_silu(float* x, int64_t T, int64_t C, const float* w, int K, float* state);
void l2_norm_heads(float* x, int heads, int n, float eps, float scale);
void gated_rms_norm(float* o, const float* z, const float* w, int heads, int n, float eps);
}  // namespace vec
#endif

namespace {
// Runs fn(i) for i < n on the global pool when the work is worth waking the workers for.
template <typename F>
void for_heads(int n, int64_t work, F&& fn) {
  ThreadPool& pool = ThreadPool::global();
  if (n <= 1 || pool.size() <= 1 || work < (1 << 15)) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  pool.parallel_for(n, [&](int64_t i) { fn(int(i)); });
}
}  // namespace

void delta_rule_reference(const DeltaShape& sh, const DeltaBatch& b, float* S) {
  const int r = sh.value_heads / sh.key_heads, dk = sh.key_dim, dv = sh.value_dim;
  std::vector<float> m(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
  for (int64_t t = 0; t < b.T; ++t)
    for (int h = 0; h < sh.value_heads; ++h) {
      const float* q = b.q + t * b.qkv_stride + int64_t(h / r) * dk;
      const float* k = b.k + t * b.qkv_stride + int64_t(h / r) * dk;
      const float* v = b.v + t * b.qkv_stride + int64_t(h) * dv;
      const float beta = b.beta[t * b.gate_stride + h];
      const float alpha = std::exp(b.g[t * b.gate_stride + h]);
      float* Sh = S + int64_t(h) * dk * dv;  // [dk][dv]
      for (int64_t i = 0; i < int64_t(dk) * dv; ++i) Sh[i] *= alpha;
      std::fill(m.begin(), m.end(), 0.0f);
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) m[size_t(j)] += Sh[i * dv + j] * k[i];
      for (int j = 0; j < dv; ++j) delta[size_t(j)] = beta * (v[j] - m[size_t(j)]);
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) Sh[i * dv + j] += k[i] * delta[size_t(j)];
      float* o = b.out + t * b.out_stride + int64_t(h) * dv;
      std::fill(o, o + dv, 0.0f);
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) o[j] += Sh[i * dv + j] * q[i];
    }
}

void delta_rule_recurrent(const DeltaShape& sh, const DeltaBatch& b, float* S) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8()) {
    const int64_t per_head = int64_t(sh.key_dim) * sh.value_dim;
    for_heads(sh.value_heads, b.T * per_head * sh.value_heads,
              [&](int h) { vec::recurrent_head(sh, b, h, S + h * per_head); });
    return;
  }
#endif
  delta_rule_reference(sh, b, S);
}

void delta_rule_chunked(const DeltaShape& sh, const DeltaBatch& b, float* S) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8()) {
    const int64_t per_head = int64_t(sh.key_dim) * sh.value_dim;
    // One task per key head: its value heads share the chunk's K K^T and Q K^T.
    for_heads(sh.key_heads, b.T * per_head * sh.value_heads, [&](int kh) { vec::chunked_key_head(sh, b, kh, S); });
    return;
  }
#endif
  delta_rule_reference(sh, b, S);
}

void conv_silu(float* x, int64_t T, int64_t C, const float* w, int K, float* state) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8() && K == 4) return vec::conv_silu(x, T, C, w, K, state);
#endif
  conv_silu_reference(x, T, C, w, K, state);
}

void conv_silu_reference(float* x, int64_t T, int64_t C, const float* w, int K, float* state) {
  // Any kernel size. raw = [state (K-1 rows) | x rows], read before x is overwritten.
  std::vector<float> raw(size_t(K - 1 + T) * size_t(C));
  std::copy(state, state + (K - 1) * C, raw.begin());
  std::copy(x, x + T * C, raw.begin() + (K - 1) * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0;
      for (int j = 0; j < K; ++j) acc += w[c * K + j] * raw[size_t((t + j) * C + c)];
      x[t * C + c] = ref::silu(acc);
    }
  std::copy(raw.end() - (K - 1) * C, raw.end(), state);
}

void l2_norm_heads(float* x, int heads, int n, float eps, float scale) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8()) return vec::l2_norm_heads(x, heads, n, eps, scale);
#endif
  l2_norm_heads_reference(x, heads, n, eps, scale);
}

void l2_norm_heads_reference(float* x, int heads, int n, float eps, float scale) {
  for (int h = 0; h < heads; ++h) ref::l2_norm_scaled(x + int64_t(h) * n, n, eps, scale);
}

void gated_rms_norm(float* o, const float* z, const float* w, int heads, int n, float eps) {
#if SWIFTLET_F8_KERNELS
  if (simd::cpu_runs_f8()) return vec::gated_rms_norm(o, z, w, heads, n, eps);
#endif
  gated_rms_norm_reference(o, z, w, heads, n, eps);
}

void gated_rms_norm_reference(float* o, const float* z, const float* w, int heads, int n, float eps) {
  for (int h = 0; h < heads; ++h) {
    float* oh = o + int64_t(h) * n;
    ref::rms_norm(oh, w, n, eps, oh);
    for (int j = 0; j < n; ++j) oh[j] *= ref::silu(z[int64_t(h) * n + j]);
  }
}

}  // namespace swiftlet::gdn
