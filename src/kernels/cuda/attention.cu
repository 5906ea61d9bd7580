// Gated attention (model-math.md 4): RoPE, the per-token prologue (q/k RMSNorm, RoPE, the KV
// cache write), attention over the cache, for one decode token (attention_step: all of it in one
// launch) and for T prompt tokens (attn_prep_rows, attention_prefill: causal, a block per (head,
// token)). The per-head device code is shared in mixer_device.cuh; fp32 throughout.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mixer_device.cuh"

namespace swiftlet::cuda {

using detail::block_sum;
using detail::blocks_for;
using detail::sigmoidf_;
using detail::siluf_;
using detail::softplusf_;
using detail::warp_sum;

namespace {

constexpr int kAttnWarps = detail::kAttnWarps;
constexpr int kPrepThreads = 256;
constexpr int kMaxHeadDim = detail::kPrepMaxHeadDim;
constexpr int64_t kMaxGridY = 65535;  // T rides on gridDim.y

// --- one token ---------------------------------------------------------------------------------

__global__ void rope_neox_kernel(float* x, int n_heads, int64_t head_stride, int rot_dim, int64_t pos,
                                 float theta) {
  const int half = rot_dim / 2;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_heads * half) return;
  const int h = idx / half, i = idx % half;
  // As the CPU (and transformers): inverse frequency and angle in fp32.
  const float inv = 1.0f / powf(theta, float(2 * i) / float(rot_dim));
  const float angle = float(pos) * inv;
  const float c = cosf(angle), s = sinf(angle);
  float* xh = x + int64_t(h) * head_stride;
  const float a = xh[i], b = xh[i + half];
  xh[i] = a * c - b * s;
  xh[i + half] = b * c + a * s;
}

// One block per query head (detail::attention_head). With d_pos non-null, n_pos = *d_pos + 1
// (CUDA graphs).
template <int DPL>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_decode_kernel(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc, int64_t n_pos,
    const int64_t* __restrict__ d_pos, int hd, int n_heads, int n_kv, float scale, const float* __restrict__ gate,
    float* __restrict__ out) {
  if (d_pos) n_pos = *d_pos + 1;
  const int64_t j = blockIdx.x;
  detail::attention_head<DPL>(q + j * hd, kc, vc, n_pos, hd, int(j / (n_heads / n_kv)), n_kv, scale,
                              gate ? gate + j * hd : nullptr, out + j * hd);
}

// Blocks [0, nh): query heads; [nh, nh + nkv): key/value heads.
__global__ void __launch_bounds__(kPrepThreads)
    attn_prep_kernel(const float* __restrict__ P, const float* __restrict__ Kp, const float* __restrict__ Vp,
                     const float* __restrict__ qn, const float* __restrict__ kn, int nh, int nkv, int hd, bool gated,
                     int rot, int64_t pos, const int64_t* __restrict__ d_pos, float theta, float eps,
                     float* __restrict__ q, float* __restrict__ gate, float* __restrict__ kcache,
                     float* __restrict__ vcache) {
  if (d_pos) pos = *d_pos;
  detail::attn_prep_head(P, Kp, Vp, qn, kn, nh, nkv, hd, gated, rot, pos, theta, eps, q, gate, kcache, vcache,
                         int(blockIdx.x));
}

// The gated-attention step of one token in one launch, a block per query head j: attn_prep's work
// for head j and its kv head (recomputed by each of the group's blocks; the group's first block
// writes the cache row pos), then attention_head with position pos taken from shared memory, so no
// block reads a cache row another one writes. Launched with PDL: before the wait, the group's
// blocks share out the earlier positions' K and V rows (earlier tokens wrote them) into the L2.
template <int DPL>
__global__ void __launch_bounds__(detail::kAttnWarps * 32)
    attention_step_kernel(const float* __restrict__ P, const float* __restrict__ Kp, const float* __restrict__ Vp,
                          const float* __restrict__ qn, const float* __restrict__ kn, int nh, int nkv, int hd,
                          bool gated, int rot, int64_t pos, const int64_t* __restrict__ d_pos, float theta, float eps,
                          float scale, float* __restrict__ kcache, float* __restrict__ vcache,
                          float* __restrict__ out) {
  constexpr int kMaxHd = DPL * 32;
  __shared__ float y[kMaxHd], q[kMaxHd], k[kMaxHd];
  if (d_pos) pos = *d_pos;  // not the predecessor's (attention_step)
  const int j = blockIdx.x, group = nh / nkv, kh = j / group;
  {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t kvd = int64_t(nkv) * hd, first = int64_t(j % group) * detail::kAttnWarps + warp;
    for (int64_t p = first; p < pos; p += int64_t(group) * detail::kAttnWarps) {
      detail::prefetch_lines(kcache + p * kvd + int64_t(kh) * hd, int64_t(hd) * 4, lane);
      detail::prefetch_lines(vcache + p * kvd + int64_t(kh) * hd, int64_t(hd) * 4, lane);
    }
  }
  detail::pdl_wait_and_release();
  const float* qsrc = P + int64_t(j) * hd * (gated ? 2 : 1);
  const float* vsrc = Vp + int64_t(kh) * hd;
  detail::norm_rope_head(qsrc, qn, hd, rot, pos, theta, eps, y, q);
  detail::norm_rope_head(Kp + int64_t(kh) * hd, kn, hd, rot, pos, theta, eps, y, k);
  __syncthreads();
  if (j % group == 0) {
    const int64_t row = pos * int64_t(nkv) * hd + int64_t(kh) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
      kcache[row + i] = k[i];
      vcache[row + i] = vsrc[i];
    }
  }
  detail::attention_head<DPL>(q, kcache, vcache, pos + 1, hd, kh, nkv, scale, gated ? qsrc + hd : nullptr,
                              out + int64_t(j) * hd, k, vsrc);
}

// --- T tokens ----------------------------------------------------------------------------------

// attn_prep_kernel for token blockIdx.y at position pos0 + blockIdx.y.
__global__ void __launch_bounds__(256)
    attn_prep_rows_kernel(const float* __restrict__ P, int64_t p_stride, const float* __restrict__ Kp,
                          int64_t k_stride, const float* __restrict__ Vp, int64_t v_stride,
                          const float* __restrict__ qn, const float* __restrict__ kn, int nh, int nkv, int hd,
                          bool gated, int rot, int64_t pos0, float theta, float eps, float* __restrict__ q,
                          float* __restrict__ gate, float* __restrict__ kcache, float* __restrict__ vcache) {
  const int64_t t = blockIdx.y, row = int64_t(nh) * hd;
  detail::attn_prep_head(P + t * p_stride, Kp + t * k_stride, Vp + t * v_stride, qn, kn, nh, nkv, hd, gated, rot,
                         pos0 + t, theta, eps, q + t * row, gate ? gate + t * row : nullptr, kcache, vcache,
                         int(blockIdx.x));
}

// attention_decode_kernel for query token blockIdx.y (position pos0 + t: sees positions
// [0, pos0 + t]).
template <int DPL>
__global__ void __launch_bounds__(detail::kAttnWarps * 32) attention_prefill_kernel(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc, int64_t pos0, int hd,
    int n_heads, int n_kv, float scale, const float* __restrict__ gate, float* __restrict__ out) {
  const int64_t t = blockIdx.y, j = blockIdx.x, at = t * int64_t(n_heads) * hd + j * hd;
  detail::attention_head<DPL>(q + at, kc, vc, pos0 + t + 1, hd, int(j / (n_heads / n_kv)), n_kv, scale,
                              gate ? gate + at : nullptr, out + at);
}

}  // namespace

void rope_neox(float* d_x, int n_heads, int64_t head_stride, int rot_dim, int64_t pos, float theta, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(rot_dim % 2 == 0);
  const int n = n_heads * (rot_dim / 2);
  if (n == 0) return;
  rope_neox_kernel<<<blocks_for(n, 128), 128, 0, s>>>(d_x, n_heads, head_stride, rot_dim, pos, theta);
  SWIFTLET_CUDA_LAUNCHED();
}

void attention_decode(const float* d_q, const float* d_k_cache, const float* d_v_cache, int64_t n_pos,
                      int n_heads, int n_kv_heads, int head_dim, float scale, const float* d_gate, float* d_out,
                      GpuStream s) {
  attention_decode_at(d_q, d_k_cache, d_v_cache, n_pos, nullptr, n_heads, n_kv_heads, head_dim, scale, d_gate, d_out,
                      s);
}

void attention_decode_at(const float* d_q, const float* d_k_cache, const float* d_v_cache, int64_t n_pos,
                         const int64_t* d_pos, int n_heads, int n_kv_heads, int head_dim, float scale,
                         const float* d_gate, float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(d_pos || n_pos >= 1);
  SWIFTLET_CUDA_REQUIRE(n_kv_heads >= 1 && n_heads % n_kv_heads == 0);
  SWIFTLET_CUDA_REQUIRE(head_dim >= 1 && head_dim <= 256);
  const dim3 grid{unsigned(n_heads)}, block{kAttnWarps * 32};
  detail::with_dims_per_lane(head_dim, [&](auto dpl) {
    attention_decode_kernel<decltype(dpl)::value><<<grid, block, 0, s>>>(
        d_q, d_k_cache, d_v_cache, n_pos, d_pos, head_dim, n_heads, n_kv_heads, scale, d_gate, d_out);
  });
  SWIFTLET_CUDA_LAUNCHED();
}

void attn_prep(const float* d_P, const float* d_Kp, const float* d_Vp, const float* d_q_norm, const float* d_k_norm,
               int nh, int nkv, int hd, bool gated, int rot_dim, int64_t pos, const int64_t* d_pos, float theta,
               float eps, float* d_q, float* d_gate, float* d_k_cache, float* d_v_cache, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hd > 0 && hd <= kMaxHeadDim && rot_dim % 2 == 0 && rot_dim <= hd);
  attn_prep_kernel<<<unsigned(nh + nkv), kPrepThreads, 0, s>>>(d_P, d_Kp, d_Vp, d_q_norm, d_k_norm, nh, nkv, hd, gated,
                                                               rot_dim, pos, d_pos, theta, eps, d_q, d_gate, d_k_cache,
                                                               d_v_cache);
  SWIFTLET_CUDA_LAUNCHED();
}

void attention_step(const float* d_P, const float* d_Kp, const float* d_Vp, const float* d_q_norm,
                    const float* d_k_norm, int nh, int nkv, int hd, bool gated, int rot_dim, int64_t pos,
                    const int64_t* d_pos, float theta, float eps, float scale, float* d_k_cache, float* d_v_cache,
                    float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hd > 0 && hd <= 256 && rot_dim % 2 == 0 && rot_dim <= hd);
  SWIFTLET_CUDA_REQUIRE(nkv >= 1 && nh % nkv == 0 && (d_pos || pos >= 0));
  detail::with_dims_per_lane(hd, [&](auto dpl) {
    detail::launch(attention_step_kernel<decltype(dpl)::value>, unsigned(nh), detail::kAttnWarps * 32, 0, s, d_P,
                   d_Kp, d_Vp, d_q_norm, d_k_norm, nh, nkv, hd, gated, rot_dim, pos, d_pos, theta, eps, scale,
                   d_k_cache, d_v_cache, d_out);
  });
  SWIFTLET_CUDA_LAUNCHED();
}

void attn_prep_rows(const float* d_P, int64_t p_stride, const float* d_Kp, int64_t k_stride, const float* d_Vp,
                    int64_t v_stride, const float* d_q_norm, const float* d_k_norm, int nh, int nkv, int hd,
                    bool gated, int rot_dim, int64_t pos0, int64_t T, float theta, float eps, float* d_q,
                    float* d_gate, float* d_k_cache, float* d_v_cache, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hd > 0 && hd <= detail::kPrepMaxHeadDim && rot_dim % 2 == 0 && rot_dim <= hd);
  SWIFTLET_CUDA_REQUIRE(pos0 >= 0 && T >= 0 && T <= kMaxGridY);
  SWIFTLET_CUDA_REQUIRE(p_stride >= int64_t(nh) * hd * (gated ? 2 : 1) && k_stride >= int64_t(nkv) * hd &&
                        v_stride >= int64_t(nkv) * hd);
  SWIFTLET_CUDA_REQUIRE(!gated || d_gate);
  if (T == 0 || nh + nkv == 0) return;
  attn_prep_rows_kernel<<<dim3(unsigned(nh + nkv), unsigned(T)), 256, 0, s>>>(
      d_P, p_stride, d_Kp, k_stride, d_Vp, v_stride, d_q_norm, d_k_norm, nh, nkv, hd, gated, rot_dim, pos0, theta, eps,
      d_q, d_gate, d_k_cache, d_v_cache);
  SWIFTLET_CUDA_LAUNCHED();
}

void attention_prefill(const float* d_q, const float* d_k_cache, const float* d_v_cache, int64_t pos0, int64_t T,
                       int n_heads, int n_kv_heads, int head_dim, float scale, const float* d_gate, float* d_out,
                       GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(pos0 >= 0 && T >= 0 && T <= kMaxGridY);
  SWIFTLET_CUDA_REQUIRE(n_kv_heads >= 1 && n_heads % n_kv_heads == 0);
  SWIFTLET_CUDA_REQUIRE(head_dim >= 1 && head_dim <= 256);
  if (T == 0 || n_heads == 0) return;
  const dim3 grid{unsigned(n_heads), unsigned(T)}, block{detail::kAttnWarps * 32};
  detail::with_dims_per_lane(head_dim, [&](auto dpl) {
    attention_prefill_kernel<decltype(dpl)::value><<<grid, block, 0, s>>>(
        d_q, d_k_cache, d_v_cache, pos0, head_dim, n_heads, n_kv_heads, scale, d_gate, d_out);
  });
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
