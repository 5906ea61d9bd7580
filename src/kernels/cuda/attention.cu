// Gated attention (model-math.md 4): RoPE, the per-token prologue (q/k RMSNorm, RoPE, the KV
// cache write), attention over the cache, for one decode token (attention_step: all of it in one
// launch) and for T prompt tokens (attn_prep_rows, attention_prefill: causal, a block per (head,
// 64 query tokens) streaming the cache in tiles through register-tiled products; under 16 tokens a
// block per (head, token)). The per-head device code is shared in mixer_device.cuh; fp32
// throughout.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mixer_device.cuh"

#include <cstdint>
#include <type_traits>

namespace swiftlet::cuda {

using detail::block_sum;
using detail::blocks_for;
using detail::cp_async16;
using detail::cp_async4;
using detail::cp_async_commit;
using detail::cp_async_wait;
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
// A decode batch (attention_step_rows): blockIdx.y is the sequence, its rows at these strides, its
// position d_pos[blockIdx.y] and its caches from its table.
struct AttnRows {
  int64_t p_stride = 0, k_stride = 0, v_stride = 0, out_stride = 0;
  float* const* caches = nullptr;  // [n][2]: K, V; null: the kernel's own
};

template <int DPL>
__global__ void __launch_bounds__(detail::kAttnWarps * 32)
    attention_step_kernel(const float* __restrict__ P, const float* __restrict__ Kp, const float* __restrict__ Vp,
                          const float* __restrict__ qn, const float* __restrict__ kn, int nh, int nkv, int hd,
                          bool gated, int rot, int64_t pos, const int64_t* __restrict__ d_pos, float theta, float eps,
                          float scale, float* __restrict__ kcache, float* __restrict__ vcache,
                          float* __restrict__ out, const __grid_constant__ AttnRows rows) {
  constexpr int kMaxHd = DPL * 32;
  __shared__ float y[kMaxHd], q[kMaxHd], k[kMaxHd];
  const int64_t seq = blockIdx.y;
  if (d_pos) pos = d_pos[seq];  // not the predecessor's (attention_step)
  if (rows.caches) {  // the tables are written before the batch's first kernel
    kcache = rows.caches[2 * seq];
    vcache = rows.caches[2 * seq + 1];
  }
  P += seq * rows.p_stride;
  Kp += seq * rows.k_stride;
  Vp += seq * rows.v_stride;
  out += seq * rows.out_stride;
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
// tile's queries stay in shared memory while the keys and values they see stream through in tiles
// of kTileK positions, each key/value row read once for the whole query tile; a tile's keys come
// in (cp.async) while the previous tile's values are used, its values while its scores are
// computed. Scores and the online softmax in fp32, as attention_head. head_dim is padded with
// zeros to HD (64, 128 or 256) in shared memory. Blocks take the longest query tiles first.
// Register tiles of 8 x 8 a thread (a float4 read from shared memory feeds 32 FMAs at HD 256):
//  - scores: warp w takes queries 8 w .. 8 w + 7 against keys kg + 4 j (j < 8), lane (ds, kg)
//    (kg = lane % 4) summing dims 4 ds + 32 c .. + 3 (c < HD / 32) of all 64 products; three
//    shuffle steps over ds, each halving the rows a lane keeps, leave lane its query R's 8 sums.
//    The lanes of R (kg = 0..3) keep its running max and sum and write the tile's weights
//    exp(score - max) key-major (Pt).
//  - weighted V: thread (pr, pc) accumulates queries 8 pr .. 8 pr + 7 times dims
//    kVec pc + 32 kVec g + e (HD / 32 dims), reading 8 weights and kVec-float V rows a key.
constexpr int kTileQ = 64, kTileK = 32, kTileThreads = 256;
constexpr int kPtStride = kTileQ + 8;    // Pt rows: a warp's weight writes fall in distinct banks
constexpr int64_t kTiledMinTokens = 16;  // shorter prompts: the per-token kernel

__host__ __device__ constexpr int tile_smem_floats(int HD) {
  return (kTileQ + 2 * kTileK) * HD + kTileK * kPtStride + 2 * kTileQ;
}

// One step of a sum across lanes: rows [0, 2 H) of s become [0, H), the lane keeping the half
// selected by `upper` and adding the partner's (lane ^ lane_bit) sums of those rows.
template <int H>
__device__ __forceinline__ void fold_rows(float (&s)[8][8], bool upper, int lane_bit) {
#pragma unroll
  for (int i = 0; i < H; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float send = upper ? s[i][j] : s[i + H][j], keep = upper ? s[i + H][j] : s[i][j];
      s[i][j] = keep + __shfl_xor_sync(0xffffffffu, send, lane_bit);
    }
}

// Rows [0, valid) of src (row stride `stride`, columns [0, hd)) into ROWS shared rows of HD
// floats, asynchronously, by the block's threads: 16-byte copies where vec (hd % 4 == 0, aligned
// rows), else 4-byte ones. Columns hd .. HD and rows valid .. ROWS are filled with zeros.
template <int HD, int ROWS>
__device__ __forceinline__ void tile_load_async(float* dst, const float* __restrict__ src, int64_t stride, int valid,
                                                int hd, bool vec) {
  if (vec) {
    constexpr int kChunks = ROWS * HD / 4;
    static_assert(kChunks % kTileThreads == 0, "whole rounds of 16-byte copies");
#pragma unroll
    for (int c = 0; c < kChunks / kTileThreads; ++c) {
      const int e = int(threadIdx.x) + c * kTileThreads, r = e / (HD / 4), d = 4 * (e % (HD / 4));
      const bool in = r < valid && d < hd;
      cp_async16(dst + r * HD + d, in ? src + r * stride + d : src, in ? 16 : 0);
    }
  } else {
    static_assert(ROWS * HD % kTileThreads == 0, "whole rounds of 4-byte copies");
#pragma unroll 4
    for (int c = 0; c < ROWS * HD / kTileThreads; ++c) {
      const int e = int(threadIdx.x) + c * kTileThreads, r = e / HD, d = e % HD;
      const bool in = r < valid && d < hd;
      cp_async4(dst + r * HD + d, in ? src + r * stride + d : src, in ? 4 : 0);
    }
  }
}

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// N (1, 2 or 4) consecutive floats of shared memory into v.
template <int N>
__device__ __forceinline__ void lds_vec(const float* p, float* v) {
  if constexpr (N == 4) {
    const float4 t = lds4(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else if constexpr (N == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x, v[1] = t.y;
  } else {
    v[0] = p[0];
  }
}

template <int HD>
__global__ void __launch_bounds__(kTileThreads, 1)
    attention_prefill_tiled_kernel(const float* __restrict__ q, const float* __restrict__ kc,
                                   const float* __restrict__ vc, int64_t pos0, int64_t T, int hd, int n_heads, int n_kv,
                                   float scale, const float* __restrict__ gate, float* __restrict__ out, bool vec) {
  constexpr int kDims = HD / 32;               // dims of a query a thread accumulates (weighted V)
  constexpr int kVec = kDims < 4 ? kDims : 4;  // read kVec at a time
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;                       // [kTileQ][HD]
  float* Ks = Qs + kTileQ * HD;         // [kTileK][HD]
  float* Vs = Ks + kTileK * HD;         // [kTileK][HD]
  float* Pt = Vs + kTileK * HD;         // [kTileK][kPtStride]: the tile's weights, key-major
  float* Cs = Pt + kTileK * kPtStride;  // this tile's rescale of a query's earlier sum and output
  float* Ls = Cs + kTileQ;              // a query's final sum
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head = int(blockIdx.x % unsigned(n_heads)), kh = head / (n_heads / n_kv);
  const int64_t n_qt = (T + kTileQ - 1) / kTileQ;
  const int64_t t0 = (n_qt - 1 - int64_t(blockIdx.x / unsigned(n_heads))) * kTileQ;
  const int nq = int(T - t0 < kTileQ ? T - t0 : kTileQ);
  const int64_t qd = int64_t(n_heads) * hd, kvd = int64_t(n_kv) * hd;
  const int64_t last = pos0 + t0 + nq;  // positions [0, last) are seen by some query of the tile
  const int n_kt = int((last + kTileK - 1) / kTileK);
  const float* kh_k = kc + int64_t(kh) * hd;
  const float* kh_v = vc + int64_t(kh) * hd;
  const auto tile_rows = [&](int kt) {
    return int(last - int64_t(kt) * kTileK < kTileK ? last - int64_t(kt) * kTileK : kTileK);
  };

  tile_load_async<HD, kTileQ>(Qs, q + t0 * qd + int64_t(head) * hd, qd, nq, hd, vec);
  tile_load_async<HD, kTileK>(Ks, kh_k, kvd, tile_rows(0), hd, vec);
  cp_async_commit();
  tile_load_async<HD, kTileK>(Vs, kh_v, kvd, tile_rows(0), hd, vec);
  cp_async_commit();

  // Scores: lane (ds, kg); after the sums over ds the lane holds query R (ds's bits reversed).
  const int kg = lane & 3, ds = lane >> 2;
  const int R = 8 * warp + ((ds & 1) << 2 | (ds & 2) | (ds >> 2));
  // R sees positions <= lim_R; m, l: its running max and sum.
  const int64_t lim_R = pos0 + t0 + R < last ? pos0 + t0 + R : last - 1;
  float m = -INFINITY, l = 0.0f;
  // Weighted V: thread (pr, pc); lanes l and l ^ 1 read the same weights, l and l ^ 2 the same V.
  const int pr = (warp & 1) * 4 + ((lane >> 1) & 3), pc = (warp >> 1) * 8 + ((lane & 1) | (lane >> 3) << 1);
  float o[8][kDims];
#pragma unroll
  for (int r = 0; r < 8; ++r)
#pragma unroll
    for (int e = 0; e < kDims; ++e) o[r][e] = 0.0f;

  cp_async_wait<1>();  // Q and the first keys
  __syncthreads();
  for (int kt = 0; kt < n_kt; ++kt) {
    float s[8][8];  // [query 8 warp + i][key kg + 4 j], partial over ds's dims
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) s[i][j] = 0.0f;
    const float* qa = Qs + 8 * warp * HD + 4 * ds;
    const float* ka = Ks + kg * HD + 4 * ds;
#pragma unroll 2
    for (int c = 0; c < HD / 32; ++c) {
      float4 a[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = lds4(qa + i * HD + 32 * c);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 b = lds4(ka + 4 * j * HD + 32 * c);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          s[i][j] = fmaf(a[i].x, b.x, s[i][j]);
          s[i][j] = fmaf(a[i].y, b.y, s[i][j]);
          s[i][j] = fmaf(a[i].z, b.z, s[i][j]);
          s[i][j] = fmaf(a[i].w, b.w, s[i][j]);
        }
      }
    }
    // Sum over ds (lane bits 2, 3, 4): at each step a lane keeps the half of its rows whose row bit
    // (2, 1, 0) equals its ds bit and adds the partner's sums of them.
    fold_rows<4>(s, ds & 1, 4);
    fold_rows<2>(s, ds & 2, 8);
    fold_rows<1>(s, ds & 4, 16);
    // Online softmax of R over the tile, the causal mask applied (lanes kg = 0..3 hold its keys).
    const int64_t p0 = int64_t(kt) * kTileK;
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[0][j] = p0 + kg + 4 * j <= lim_R ? s[0][j] * scale : -INFINITY;
      mt = fmaxf(mt, s[0][j]);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mn = fmaxf(m, mt);
    const float corr = mn == -INFINITY ? 1.0f : expf(m - mn);  // 0 while m = -inf
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float e = s[0][j] == -INFINITY ? 0.0f : expf(s[0][j] - mn);
      Pt[(kg + 4 * j) * kPtStride + R] = e;
      sum += e;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l = l * corr + sum;
    m = mn;
    if (kg == 0) Cs[R] = corr;
    cp_async_wait<0>();  // this tile's values
    __syncthreads();      // weights and values in; the keys used up
    if (kt + 1 < n_kt) {
      tile_load_async<HD, kTileK>(Ks, kh_k + int64_t(kt + 1) * kTileK * kvd, kvd, tile_rows(kt + 1), hd, vec);
      cp_async_commit();
    }
    {
      const float4 c0 = lds4(Cs + 8 * pr), c1 = lds4(Cs + 8 * pr + 4);
      const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int e = 0; e < kDims; ++e) o[r][e] *= c[r];
    }
#pragma unroll 4
    for (int j = 0; j < kTileK; ++j) {
      const float4 w0 = lds4(Pt + j * kPtStride + 8 * pr), w1 = lds4(Pt + j * kPtStride + 8 * pr + 4);
      const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      float v[kDims];
#pragma unroll
      for (int g = 0; g < kDims / kVec; ++g) lds_vec<kVec>(Vs + j * HD + kVec * pc + 32 * kVec * g, v + kVec * g);
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int e = 0; e < kDims; ++e) o[r][e] = fmaf(w[r], v[e], o[r][e]);
    }
    cp_async_wait<0>();  // the next tile's keys
    __syncthreads();      // the keys in; weights and values used up
    if (kt + 1 < n_kt) {
      tile_load_async<HD, kTileK>(Vs, kh_v + int64_t(kt + 1) * kTileK * kvd, kvd, tile_rows(kt + 1), hd, vec);
      cp_async_commit();
    }
  }
  if (kg == 0) Ls[R] = l;  // every query sees at least its own position: l > 0
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int i = 8 * pr + r;
    if (i >= nq) continue;
    const float L = Ls[i];
    const int64_t at = (t0 + i) * qd + int64_t(head) * hd;
#pragma unroll
    for (int g = 0; g < kDims / kVec; ++g)
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int d = kVec * pc + 32 * kVec * g + e;
        if (d >= hd) continue;
        float x = o[r][kVec * g + e] / L;
        if (gate) x *= sigmoidf_(gate[at + d]);
        out[at + d] = x;
      }
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

void attention_step(const AttentionSpec& a, const QkvRows& in, int64_t pos, const int64_t* d_pos, float* d_k_cache,
                    float* d_v_cache, float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(a.hd > 0 && a.hd <= 256 && a.rot_dim % 2 == 0 && a.rot_dim <= a.hd);
  SWIFTLET_CUDA_REQUIRE(a.nkv >= 1 && a.nh % a.nkv == 0 && (d_pos || pos >= 0));
  detail::with_dims_per_lane(a.hd, [&](auto dpl) {
    detail::launch(attention_step_kernel<decltype(dpl)::value>, unsigned(a.nh), detail::kAttnWarps * 32, 0, s, in.P,
                   in.Kp, in.Vp, a.d_q_norm, a.d_k_norm, a.nh, a.nkv, a.hd, a.gated, a.rot_dim, pos, d_pos, a.theta,
                   a.eps, a.scale, d_k_cache, d_v_cache, d_out, AttnRows{});
  });
  SWIFTLET_CUDA_LAUNCHED();
}

void attention_step_rows(const AttentionSpec& a, const QkvRows& in, const StepRows& rows, float* d_out,
                         int64_t out_stride, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(a.hd > 0 && a.hd <= 256 && a.rot_dim % 2 == 0 && a.rot_dim <= a.hd);
  SWIFTLET_CUDA_REQUIRE(a.nkv >= 1 && a.nh % a.nkv == 0 && rows.d_pos && rows.d_states && rows.n >= 1 &&
                        rows.n <= 65535);
  const AttnRows r{in.p_stride, in.k_stride, in.v_stride, out_stride, rows.d_states};
  detail::with_dims_per_lane(a.hd, [&](auto dpl) {
    detail::launch(attention_step_kernel<decltype(dpl)::value>, dim3(unsigned(a.nh), unsigned(rows.n)),
                   detail::kAttnWarps * 32, 0, s, in.P, in.Kp, in.Vp, a.d_q_norm, a.d_k_norm, a.nh, a.nkv, a.hd,
                   a.gated, a.rot_dim, int64_t(0), rows.d_pos, a.theta, a.eps, a.scale, nullptr, nullptr, d_out, r);
  });
  SWIFTLET_CUDA_LAUNCHED();
}

void attn_prep_rows(const AttentionSpec& a, const QkvRows& in, int64_t pos0, int64_t T, float* d_q, float* d_gate,
                    float* d_k_cache, float* d_v_cache, GpuStream s) {
  const int nh = a.nh, nkv = a.nkv, hd = a.hd;
  SWIFTLET_CUDA_REQUIRE(hd > 0 && hd <= detail::kPrepMaxHeadDim && a.rot_dim % 2 == 0 && a.rot_dim <= hd);
  SWIFTLET_CUDA_REQUIRE(pos0 >= 0 && T >= 0 && T <= kMaxGridY);
  SWIFTLET_CUDA_REQUIRE(in.p_stride >= int64_t(nh) * hd * (a.gated ? 2 : 1) && in.k_stride >= int64_t(nkv) * hd &&
                        in.v_stride >= int64_t(nkv) * hd);
  SWIFTLET_CUDA_REQUIRE(!a.gated || d_gate);
  if (T == 0 || nh + nkv == 0) return;
  attn_prep_rows_kernel<<<dim3(unsigned(nh + nkv), unsigned(T)), 256, 0, s>>>(
      in.P, in.p_stride, in.Kp, in.k_stride, in.Vp, in.v_stride, a.d_q_norm, a.d_k_norm, nh, nkv, hd, a.gated,
      a.rot_dim, pos0, a.theta, a.eps, d_q, d_gate, d_k_cache, d_v_cache);
  SWIFTLET_CUDA_LAUNCHED();
}

void attention_prefill(const AttentionSpec& a, const float* d_q, const float* d_gate, const float* d_k_cache,
                       const float* d_v_cache, int64_t pos0, int64_t T, float* d_out, GpuStream s) {
  const int n_heads = a.nh, n_kv_heads = a.nkv, head_dim = a.hd;
  const float scale = a.scale;
  if (!a.gated) d_gate = nullptr;
  SWIFTLET_CUDA_REQUIRE(pos0 >= 0 && T >= 0 && T <= kMaxGridY);
  SWIFTLET_CUDA_REQUIRE(n_kv_heads >= 1 && n_heads % n_kv_heads == 0);
  SWIFTLET_CUDA_REQUIRE(head_dim >= 1 && head_dim <= 256);
  if (T == 0 || n_heads == 0) return;
  const int hd_padded = head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;  // the tiled kernel's HD
  if (T >= kTiledMinTokens && tile_smem_floats(hd_padded) * int(sizeof(float)) <= detail::max_smem_per_block()) {
    const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = head_dim % 4 == 0 && aligned(d_q) && aligned(d_k_cache) && aligned(d_v_cache);
    const unsigned grid = unsigned((T + kTileQ - 1) / kTileQ * n_heads);
    const auto run = [&](auto hd_c) {
      constexpr int HD = decltype(hd_c)::value;
      constexpr int bytes = tile_smem_floats(HD) * int(sizeof(float));
      static const bool init = [] {
        SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_tiled_kernel<HD>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        return true;
      }();
      (void)init;
      attention_prefill_tiled_kernel<HD><<<grid, kTileThreads, bytes, s>>>(
          d_q, d_k_cache, d_v_cache, pos0, T, head_dim, n_heads, n_kv_heads, scale, d_gate, d_out, vec);
    };
    if (hd_padded == 64)
      run(std::integral_constant<int, 64>{});
    else if (hd_padded == 128)
      run(std::integral_constant<int, 128>{});
    else
      run(std::integral_constant<int, 256>{});
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
