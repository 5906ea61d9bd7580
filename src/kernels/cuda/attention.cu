// Gated attention (model-math.md 4): RoPE, the per-token prologue (q/k RMSNorm, RoPE, the KV
// cache write), attention over the cache, for one decode token (attention_step: all of it in one
// launch) and for T prompt tokens (attn_prep_rows, attention_prefill: causal, a block per (head,
// 32 query tokens) streaming the cache in tiles; under 16 tokens a block per (head, token)). The per-head device code is shared in mixer_device.cuh; fp32 throughout.
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

// Causal attention for a tile of kTileQ query tokens of one head, flash-attention style: the
// tile's queries stay in shared memory while the cache's keys and values stream through in tiles
// of kTileK positions, each key/value row read once for the whole query tile (the per-token
// kernel above reads them once per query). Scores and the online softmax in fp32, as there.
// Thread layouts: scores, thread (warp w, lane j) takes key j for queries w, w + 8, w + 16, w + 24
// (key rows padded by one float so the lanes' rows fall in distinct banks); the weighted V, thread
// t takes query t / 8 and dims t % 8 + 8 m.
constexpr int kTileQ = 32, kTileK = 32, kTileThreads = 256;
constexpr int64_t kTiledMinTokens = 16;  // shorter prompts: the per-token kernel

__host__ __device__ constexpr int tile_smem_floats(int hd) {
  return kTileQ * hd + kTileK * (hd + 1) + kTileK * hd + kTileQ * (kTileK + 1) + 3 * kTileQ;
}

template <int DPL>
__global__ void __launch_bounds__(kTileThreads) attention_prefill_tiled_kernel(
    const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc, int64_t pos0, int64_t T,
    int hd, int n_heads, int n_kv, float scale, const float* __restrict__ gate, float* __restrict__ out) {
  constexpr int kPer = 4 * DPL;  // dims a thread accumulates (hd <= 32 DPL, 8 threads a query)
  extern __shared__ float sm[];
  float* Qs = sm;                          // [kTileQ][hd]
  float* Ks = Qs + kTileQ * hd;            // [kTileK][hd + 1]
  float* Vs = Ks + kTileK * (hd + 1);      // [kTileK][hd]
  float* Ps = Vs + kTileK * hd;            // [kTileQ][kTileK + 1]
  float* Ms = Ps + kTileQ * (kTileK + 1);  // running max a query
  float* Ls = Ms + kTileQ;                 // running sum
  float* Cs = Ls + kTileQ;                 // this tile's rescale of the earlier sum and output
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = blockIdx.x, kh = head / (n_heads / n_kv);
  const int64_t t0 = int64_t(blockIdx.y) * kTileQ;
  const int nq = int(T - t0 < kTileQ ? T - t0 : kTileQ);
  const int64_t qd = int64_t(n_heads) * hd, kvd = int64_t(n_kv) * hd;

  for (int e = tid; e < kTileQ * hd; e += kTileThreads) {
    const int i = e / hd, d = e % hd;
    Qs[e] = i < nq ? q[(t0 + i) * qd + int64_t(head) * hd + d] : 0.0f;
  }
  if (tid < kTileQ) {
    Ms[tid] = -INFINITY;
    Ls[tid] = 0.0f;
  }
  const int oi = tid / 8, od = tid % 8;  // the weighted V: query oi, dims od + 8 m
  float acc[kPer];
#pragma unroll
  for (int m = 0; m < kPer; ++m) acc[m] = 0.0f;

  const int64_t last = pos0 + t0 + nq;  // positions [0, last) are seen by some query of the tile
  for (int64_t p0 = 0; p0 < last; p0 += kTileK) {
    const int nk = int(last - p0 < kTileK ? last - p0 : kTileK);
    __syncthreads();  // the previous tile's K, V and P are used up (and Qs, Ms, Ls written)
    for (int e = tid; e < kTileK * hd; e += kTileThreads) {
      const int j = e / hd, d = e % hd;
      const bool in = j < nk;
      const int64_t at = (p0 + j) * kvd + int64_t(kh) * hd + d;
      Ks[j * (hd + 1) + d] = in ? kc[at] : 0.0f;
      Vs[j * hd + d] = in ? vc[at] : 0.0f;
    }
    __syncthreads();
    // Scores, the causal mask applied: query i (position pos0 + t0 + i) sees positions <= its own.
    for (int i = warp; i < kTileQ; i += kTileThreads / 32) {
      const int j = lane;
      float sc = -INFINITY;
      if (i < nq && j < nk && p0 + j <= pos0 + t0 + i) {
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot = fmaf(Qs[i * hd + d], Ks[j * (hd + 1) + d], dot);
        sc = dot * scale;
      }
      // Online softmax over this tile (a warp a query: lanes are the tile's keys).
      const float mt = detail::warp_max(sc);
      const float m_old = Ms[i], m_new = fmaxf(m_old, mt);
      const float e = sc == -INFINITY ? 0.0f : expf(sc - m_new);
      const float sum = detail::warp_sum(e);
      Ps[i * (kTileK + 1) + j] = e;
      __syncwarp();
      if (lane == 0) {
        const float corr = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);  // 0 while m_old = -inf
        Cs[i] = corr;
        Ls[i] = Ls[i] * corr + sum;
        Ms[i] = m_new;
      }
    }
    __syncthreads();
    const float corr = Cs[oi];
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int d = od + 8 * m;
      float a = acc[m] * corr;
      if (d < hd)
        for (int j = 0; j < nk; ++j) a = fmaf(Ps[oi * (kTileK + 1) + j], Vs[j * hd + d], a);
      acc[m] = a;
    }
  }
  if (oi >= nq) return;
  const float inv = 1.0f / Ls[oi];  // every query sees at least its own position
  const int64_t at = (t0 + oi) * qd + int64_t(head) * hd;
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const int d = od + 8 * m;
    if (d >= hd) continue;
    float o = acc[m] * inv;
    if (gate) o *= sigmoidf_(gate[at + d]);
    out[at + d] = o;
  }
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
  if (T >= kTiledMinTokens) {
    const int bytes = tile_smem_floats(head_dim) * int(sizeof(float));
    const dim3 grid{unsigned(n_heads), unsigned((T + kTileQ - 1) / kTileQ)};
    detail::with_dims_per_lane(head_dim, [&](auto dpl) {
      constexpr int D = decltype(dpl)::value;
      static const bool init = [] {
        SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_tiled_kernel<D>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 tile_smem_floats(32 * D) * int(sizeof(float))));
        return true;
      }();
      (void)init;
      attention_prefill_tiled_kernel<D><<<grid, kTileThreads, bytes, s>>>(
          d_q, d_k_cache, d_v_cache, pos0, T, head_dim, n_heads, n_kv_heads, scale, d_gate, d_out);
    });
  } else {
    const dim3 grid{unsigned(n_heads), unsigned(T)}, block{detail::kAttnWarps * 32};
    detail::with_dims_per_lane(head_dim, [&](auto dpl) {
      attention_prefill_kernel<decltype(dpl)::value><<<grid, block, 0, s>>>(
          d_q, d_k_cache, d_v_cache, pos0, head_dim, n_heads, n_kv_heads, scale, d_gate, d_out);
    });
  }
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
