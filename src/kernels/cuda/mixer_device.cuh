// The per-block (or per-element) device code of the token-mixer kernels, shared by their one-token
// forms and their T-token forms (attention.cu, deltanet.cu, norms.cu): each kernel is a thin
// wrapper that points these at its token's rows. Not part of the API.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

#include <cstdint>
#include <type_traits>

namespace swiftlet::cuda::detail {

constexpr int kPrepMaxHeadDim = 1024;  // attn_prep_head's largest head_dim
constexpr int kAttnWarps = 8;          // attention_head's warps per block
constexpr int kAttnBatch = 4;          // positions a warp of attention_head loads at once

// One head's RMSNorm (weight w) and RoPE on its first rot dims at position pos (3.2 steps 2-3), by
// the whole block: dst[i] for i < hd from src. y: hd floats of shared memory (scratch); dst may be
// shared or global memory (the caller synchronises before reading it from other threads).
__device__ __forceinline__ void norm_rope_head(const float* __restrict__ src, const float* __restrict__ w, int hd,
                                               int rot, int64_t pos, float theta, float eps, float* y, float* dst) {
  __shared__ float red[32];
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) ss = fmaf(src[i], src[i], ss);
  ss = block_sum(ss, red);  // also the barrier before y is written (an earlier call may read it)
  const float inv = rsqrtf(ss / float(hd) + eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) y[i] = src[i] * inv * w[i];
  __syncthreads();
  const int half = rot / 2;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float v = y[i];
    if (i < rot) {
      // As the CPU (and transformers): inverse frequency and angle in fp32 (model-math.md 4).
      const int f = i < half ? i : i - half;
      const float invf = 1.0f / powf(theta, float(2 * f) / float(rot));
      const float angle = float(pos) * invf;
      const float c = cosf(angle), s = sinf(angle);
      v = i < half ? y[i] * c - y[i + half] * s : y[i] * c + y[i - half] * s;
    }
    dst[i] = v;
  }
}

// One block of attn_prep (3.2 steps 1-4) for one token at position pos: block b < nh is query head
// b, block nh + j key/value head j. P, Kp, Vp, q and gate point at the token's rows; the caches
// at row 0 (the token's row is pos). hd <= kPrepMaxHeadDim, even rot <= hd.
__device__ __forceinline__ void attn_prep_head(const float* __restrict__ P, const float* __restrict__ Kp,
                                               const float* __restrict__ Vp, const float* __restrict__ qn,
                                               const float* __restrict__ kn, int nh, int nkv, int hd, bool gated,
                                               int rot, int64_t pos, float theta, float eps, float* __restrict__ q,
                                               float* __restrict__ gate, float* __restrict__ kcache,
                                               float* __restrict__ vcache, int b) {
  float* kdst = kcache + pos * int64_t(nkv) * hd;
  float* vdst = vcache + pos * int64_t(nkv) * hd;
  __shared__ float y[kPrepMaxHeadDim];
  const bool is_q = b < nh;
  const int j = is_q ? b : b - nh;
  const float* src = is_q ? P + int64_t(j) * hd * (gated ? 2 : 1) : Kp + int64_t(j) * hd;
  norm_rope_head(src, is_q ? qn : kn, hd, rot, pos, theta, eps, y, is_q ? q + int64_t(j) * hd : kdst + int64_t(j) * hd);
  if (is_q && gated)
    for (int i = threadIdx.x; i < hd; i += blockDim.x) gate[int64_t(j) * hd + i] = src[hd + i];
  if (!is_q)
    for (int i = threadIdx.x; i < hd; i += blockDim.x) vdst[int64_t(j) * hd + i] = Vp[int64_t(j) * hd + i];
}

// Row `row` of one token's q and k (2 hk rows of n at x, q first) L2-normalised, q rows (row < hk)
// also scaled by q_scale; one block.
__device__ __forceinline__ void l2_norm_qk_block(float* x, int hk, int64_t n, float eps, float q_scale, int row) {
  __shared__ float red[32];
  float* xr = x + int64_t(row) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss + eps) * (row < hk ? q_scale : 1.0f);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

// One query head (q: its hd values) of one token against cache positions [0, n_pos) of kv head kh,
// one block of kAttnWarps warps. Warp w takes positions w, w + 8, ...; lane l holds dims l + 32 i
// (i < DPL; dims past hd are zero). Each warp keeps an online softmax (running max, sum, weighted
// V); the block merges them. gate (or null) and out: the head's hd values. With k_last / v_last
// non-null, position n_pos - 1 is read from them instead of the caches.
template <int DPL>
__device__ __forceinline__ void attention_head(const float* q, const float* __restrict__ kc,
                                               const float* __restrict__ vc, int64_t n_pos, int hd, int kh, int n_kv,
                                               float scale, const float* __restrict__ gate, float* __restrict__ out,
                                               const float* k_last = nullptr, const float* v_last = nullptr) {
  constexpr int kMaxHd = DPL * 32;
  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps];
  __shared__ float sm_acc[kAttnWarps][kMaxHd];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kvd = int64_t(n_kv) * hd;

  float qr[DPL], acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? q[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  // kAttnBatch positions at a time (p, p + 8, ...): their K and V rows are loaded before any is
  // used, so the loads are in flight together; then the online softmax takes them in order.
  for (int64_t p0 = warp; p0 < n_pos; p0 += kAttnWarps * kAttnBatch) {
    float kr[kAttnBatch][DPL], vr[kAttnBatch][DPL];
#pragma unroll
    for (int u = 0; u < kAttnBatch; ++u) {
      const int64_t p = p0 + int64_t(u) * kAttnWarps;
      const bool last = p == n_pos - 1;
      const float* kp = last && k_last ? k_last : kc + p * kvd + int64_t(kh) * hd;
      const float* vp = last && v_last ? v_last : vc + p * kvd + int64_t(kh) * hd;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const bool in = p < n_pos && lane + 32 * i < hd;
        kr[u][i] = in ? kp[lane + 32 * i] : 0.0f;
        vr[u][i] = in ? vp[lane + 32 * i] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kAttnBatch; ++u) {
      if (p0 + int64_t(u) * kAttnWarps >= n_pos) break;
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) d = fmaf(qr[i], kr[u][i], d);
      const float sc = warp_sum(d) * scale;
      const float mn = fmaxf(m, sc);
      const float corr = expf(m - mn);  // 0 on the first position (m = -inf)
      const float e = expf(sc - mn);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[i] = fmaf(e, vr[u][i], acc[i] * corr);
      l = l * corr + e;
      m = mn;
    }
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();

  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm_m[w]);
  float L = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) L += sm_m[w] == -INFINITY ? 0.0f : sm_l[w] * expf(sm_m[w] - M);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm_m[w] != -INFINITY) o = fmaf(sm_acc[w][d], expf(sm_m[w] - M), o);
    o /= L;
    if (gate) o *= sigmoidf_(gate[d]);
    out[d] = o;
  }
}

// Calls f(std::integral_constant<int, D>{}) with D = ceil(head_dim / 32) in 1..8: the dims each lane
// of attention_head holds, a template argument of the attention kernels (host side).
template <typename F>
inline void with_dims_per_lane(int head_dim, F&& f) {
  switch ((head_dim + 31) / 32) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: invariant_failed("head_dim must be 1..256", __FILE__, __LINE__);
  }
}

}  // namespace swiftlet::cuda::detail
