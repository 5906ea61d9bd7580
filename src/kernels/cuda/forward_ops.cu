// Fused per-token steps of the GPU forward pass (model/gpu_forward.cpp) that the generic ops in
// ops.cu would need several launches or host-side index work for: the gated-attention prologue (3.2
// steps 1-4), Qwen3-Next's grouped DeltaNet unpacking (3.4) and the routed experts' weighted sum
// (3.10). Each mirrors a loop of model/qwen3_hybrid.cpp; fp32 throughout.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mixer_device.cuh"

#include <cuda_fp16.h>

namespace swiftlet::cuda {

using detail::block_sum;
using detail::blocks_for;

namespace {

constexpr int kPrepThreads = 256;
constexpr int kMaxHeadDim = detail::kPrepMaxHeadDim;

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

// One thread per element of the qkvz row (and of the ba row): in_proj_qkvz is per key head g [q_g
// (dk) | k_g (dk) | v (r heads of dv) | z (r heads)], in_proj_ba per g [b (r) | a (r)].
__global__ void unpack_grouped_kernel(const float* __restrict__ P, const float* __restrict__ R, int hk, int r, int dk,
                                      int dv, float* __restrict__ mixed, float* __restrict__ z, float* __restrict__ b,
                                      float* __restrict__ a) {
  detail::unpack_grouped_at(int64_t(blockIdx.x) * blockDim.x + threadIdx.x, P, R, hk, r, dk, dv, mixed, z, b, a);
}

__global__ void moe_combine_kernel(float* __restrict__ out, const float* __restrict__ y, const float* __restrict__ w,
                                   int n, int64_t H) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= H) return;
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = fmaf(w[i], y[int64_t(i) * H + d], acc);
  out[d] += acc;
}

// One row of a weight matrix as fp32 (the embedding lookup), one thread per column.
__global__ void dequant_row_kernel(GpuMatrix w, int64_t row, const int32_t* __restrict__ d_row,
                                   float* __restrict__ out) {
  if (d_row) row = d_row[blockIdx.y];
  out += int64_t(blockIdx.y) * w.cols;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= w.cols) return;
  float v;
  switch (w.format) {
    case WeightFormat::F32:
      v = static_cast<const float*>(w.data)[row * w.cols + c];
      break;
    case WeightFormat::BF16:
      v = __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.data)[row * w.cols + c]) << 16);
      break;
    case WeightFormat::F16:
      v = __half2float(static_cast<const __half*>(w.data)[row * w.cols + c]);
      break;
    default: {
      const int per_word = 32 / w.bits;
      const uint32_t word = static_cast<const uint32_t*>(w.data)[row * (w.cols / per_word) + c / per_word];
      const uint32_t q = (word >> (w.bits * int(c % per_word))) & ((1u << w.bits) - 1u);
      const int64_t g = row * (w.cols / w.group_size) + c / w.group_size;
      float sc, bi;
      if (w.scale_dtype == DType::F32) {
        sc = static_cast<const float*>(w.scales)[g];
        bi = static_cast<const float*>(w.biases)[g];
      } else if (w.scale_dtype == DType::BF16) {
        sc = __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.scales)[g]) << 16);
        bi = __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.biases)[g]) << 16);
      } else {
        sc = __half2float(static_cast<const __half*>(w.scales)[g]);
        bi = __half2float(static_cast<const __half*>(w.biases)[g]);
      }
      v = sc * float(q) + bi;
    }
  }
  out[c] = v;
}

// h += add; y = h / sqrt(mean(h^2) + eps) * w   (one row; the residual add fused into the next
// norm)
__global__ void add_rms_norm_kernel(float* __restrict__ h, const float* __restrict__ add, const float* __restrict__ w,
                                    int64_t n, float eps, float* __restrict__ y) {
  __shared__ float red[32];
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = h[i] + add[i];
    h[i] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = h[i] * inv * w[i];
}

// Rows [0, hk) scaled by q_scale, rows [hk, 2 hk) by 1: the DeltaNet's q and k in one launch.
__global__ void l2_norm_qk_kernel(float* x, int hk, int64_t n, float eps, float q_scale) {
  detail::l2_norm_qk_block(x, hk, n, eps, q_scale, int(blockIdx.x));
}

// h[d] += sigmoid(g) shared[d] + sum_i w[i] y[i][d]   (the whole MoE output, 3.10)
__global__ void moe_finish_kernel(float* __restrict__ h, const float* __restrict__ shared,
                                  const float* __restrict__ gate, const float* __restrict__ y,
                                  const float* __restrict__ w, int n, int64_t H) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= H) return;
  float acc = detail::sigmoidf_(*gate) * shared[d];
  for (int i = 0; i < n; ++i) acc = fmaf(w[i], y[int64_t(i) * H + d], acc);
  h[d] += acc;
}

// moe_finish_kernel for token blockIdx.y of a prompt.
__global__ void moe_finish_rows_kernel(float* __restrict__ h, const float* __restrict__ shared,
                                       const float* __restrict__ gate, const float* __restrict__ y,
                                       const float* __restrict__ w, int k, int64_t H) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (d >= H) return;
  float acc = detail::sigmoidf_(gate[t]) * shared[t * H + d];
  for (int j = 0; j < k; ++j) acc = fmaf(w[t * k + j], y[(t * k + j) * H + d], acc);
  h[t * H + d] += acc;
}

__global__ void set_step_kernel(int32_t* a, int32_t av, int64_t* b, int64_t bv) {
  *a = av;
  *b = bv;
}

}  // namespace

void dequant_row(const GpuMatrix& w, int64_t row, float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(row >= 0 && row < w.rows);
  dequant_row_kernel<<<blocks_for(w.cols, 256), 256, 0, s>>>(w, row, nullptr, d_out);
  SWIFTLET_CUDA_LAUNCHED();
}

void dequant_row_at(const GpuMatrix& w, const int32_t* d_row, float* d_out, GpuStream s) {
  dequant_row_kernel<<<blocks_for(w.cols, 256), 256, 0, s>>>(w, 0, d_row, d_out);
  SWIFTLET_CUDA_LAUNCHED();
}

void dequant_rows(const GpuMatrix& w, const int32_t* d_rows, int64_t n, float* d_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(n <= 65535);
  if (n == 0) return;
  dequant_row_kernel<<<dim3(blocks_for(w.cols, 256), unsigned(n)), 256, 0, s>>>(w, 0, d_rows, d_out);
  SWIFTLET_CUDA_LAUNCHED();
}

void moe_finish_rows(float* d_h, const float* d_shared, const float* d_gate, const float* d_y, const float* d_w,
                     int64_t T, int k, int64_t H, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(T <= 65535);
  if (T == 0) return;
  moe_finish_rows_kernel<<<dim3(blocks_for(H, 256), unsigned(T)), 256, 0, s>>>(d_h, d_shared, d_gate, d_y, d_w, k, H);
  SWIFTLET_CUDA_LAUNCHED();
}

void add_rms_norm(float* d_h, const float* d_add, const float* d_w, int64_t n, float eps, float* d_y, GpuStream s) {
  add_rms_norm_kernel<<<1, 1024, 0, s>>>(d_h, d_add, d_w, n, eps, d_y);
  SWIFTLET_CUDA_LAUNCHED();
}

void l2_norm_qk(float* d_x, int hk, int64_t n, float eps, float q_scale, GpuStream s) {
  l2_norm_qk_kernel<<<unsigned(2 * hk), 128, 0, s>>>(d_x, hk, n, eps, q_scale);
  SWIFTLET_CUDA_LAUNCHED();
}

void moe_finish(float* d_h, const float* d_shared, const float* d_gate, const float* d_y, const float* d_w, int n,
                int64_t H, GpuStream s) {
  moe_finish_kernel<<<blocks_for(H, 256), 256, 0, s>>>(d_h, d_shared, d_gate, d_y, d_w, n, H);
  SWIFTLET_CUDA_LAUNCHED();
}

void set_step(int32_t* d_i32, int32_t a, int64_t* d_i64, int64_t b, GpuStream s) {
  set_step_kernel<<<1, 1, 0, s>>>(d_i32, a, d_i64, b);
  SWIFTLET_CUDA_LAUNCHED();
}

void graph_capture_begin(GpuStream s) {
  SWIFTLET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
}
GpuGraph graph_capture_end(GpuStream s) {
  cudaGraph_t g;
  SWIFTLET_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  SWIFTLET_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  SWIFTLET_CUDA_CHECK(cudaGraphDestroy(g));
  return e;
}
void graph_launch(GpuGraph g, GpuStream s) { SWIFTLET_CUDA_CHECK(cudaGraphLaunch(g, s)); }
void graph_destroy(GpuGraph g) {
  if (g) SWIFTLET_CUDA_CHECK(cudaGraphExecDestroy(g));
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

void unpack_deltanet_grouped(const float* d_qkvz, const float* d_ba, int hk, int r, int dk, int dv, float* d_mixed,
                             float* d_z, float* d_b, float* d_a, GpuStream s) {
  const int64_t n = int64_t(hk) * (2 * int64_t(dk) + 2 * int64_t(r) * dv);
  const int64_t n_ba = int64_t(hk) * 2 * r;
  unpack_grouped_kernel<<<blocks_for(n > n_ba ? n : n_ba, 256), 256, 0, s>>>(d_qkvz, d_ba, hk, r, dk, dv, d_mixed, d_z,
                                                                             d_b, d_a);
  SWIFTLET_CUDA_LAUNCHED();
}

void moe_combine(float* d_out, const float* d_y, const float* d_w, int n, int64_t H, GpuStream s) {
  if (n == 0 || H == 0) return;
  moe_combine_kernel<<<blocks_for(H, 256), 256, 0, s>>>(d_out, d_y, d_w, n, H);
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
