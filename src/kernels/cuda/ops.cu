// Norms, element-wise ops, RoPE, gated-attention decode and the Gated DeltaNet
// decode step (model-spec.md sections 3.1 - 3.10). Each mirrors a scalar loop of
// kernels/cpu/ops_ref.cpp or model/qwen3_hybrid.cpp; fp32 throughout.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mixer_device.cuh"

namespace swiftlet::cuda {

using detail::block_sum;
using detail::blocks_for;
using detail::sigmoidf_;
using detail::siluf_;
using detail::softplusf_;
using detail::warp_sum;

namespace {

constexpr int kNormThreads = 256;
constexpr int kEltThreads = 256;

// --- norms ------------------------------------------------------------------------------------

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, int64_t n, float eps,
                                float* y) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* yr = y + int64_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

__global__ void l2_norm_kernel(float* x, int64_t n, float eps, float scale) {
  __shared__ float red[32];
  float* xr = x + int64_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss + eps) * scale;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

// o <- w * rmsnorm(o) * SiLU(z), one block per head.
__global__ void gated_rms_norm_kernel(float* o, const float* __restrict__ z, const float* __restrict__ w,
                                      int64_t dv, float eps) {
  __shared__ float red[32];
  float* oh = o + int64_t(blockIdx.x) * dv;
  const float* zh = z + int64_t(blockIdx.x) * dv;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dv; i += blockDim.x) ss = fmaf(oh[i], oh[i], ss);
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(dv) + eps);
  for (int64_t i = threadIdx.x; i < dv; i += blockDim.x) oh[i] = oh[i] * inv * w[i] * siluf_(zh[i]);
}

// --- element-wise -----------------------------------------------------------------------------

__global__ void silu_mul_kernel(const float* g, const float* u, int64_t n, float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = siluf_(g[i]) * u[i];
}

__global__ void axpy_kernel(float* y, const float* __restrict__ x, int64_t n, float a, const float* d_a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaf(d_a ? *d_a : a, x[i], y[i]);
}

__global__ void add_sigmoid_scaled_kernel(float* y, const float* __restrict__ x, const float* __restrict__ gate,
                                          int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaf(sigmoidf_(*gate), x[i], y[i]);
}

// --- RoPE -------------------------------------------------------------------------------------

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

// --- attention decode -------------------------------------------------------------------------

constexpr int kAttnWarps = detail::kAttnWarps;

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

// --- Gated DeltaNet ---------------------------------------------------------------------------

__global__ void conv1d_silu_step_kernel(const float* __restrict__ x, const float* __restrict__ w, float* state,
                                        int64_t C, int K, float* __restrict__ u) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* wc = w + c * K;
  const float xc = x[c];
  float acc = wc[K - 1] * xc;
  for (int j = 0; j < K - 1; ++j) acc += wc[j] * state[j * C + c];
  u[c] = siluf_(acc);
  // Each thread owns its channel's column of the state, so the shift needs no barrier.
  for (int j = 0; j + 1 < K - 1; ++j) state[j * C + c] = state[(j + 1) * C + c];
  if (K > 1) state[int64_t(K - 2) * C + c] = xc;
}

}  // namespace

void rms_norm(const float* d_x, const float* d_w, int64_t rows, int64_t n, float eps, float* d_y, GpuStream s) {
  if (rows == 0) return;
  rms_norm_kernel<<<unsigned(rows), kNormThreads, 0, s>>>(d_x, d_w, n, eps, d_y);
  SWIFTLET_CUDA_LAUNCHED();
}

void l2_norm_rows(float* d_x, int64_t rows, int64_t n, float eps, float scale, GpuStream s) {
  if (rows == 0) return;
  l2_norm_kernel<<<unsigned(rows), kNormThreads, 0, s>>>(d_x, n, eps, scale);
  SWIFTLET_CUDA_LAUNCHED();
}

void gated_rms_norm(float* d_o, const float* d_z, const float* d_w, int64_t heads, int64_t dv, float eps,
                    GpuStream s) {
  if (heads == 0) return;
  gated_rms_norm_kernel<<<unsigned(heads), 128, 0, s>>>(d_o, d_z, d_w, dv, eps);
  SWIFTLET_CUDA_LAUNCHED();
}

void silu_mul(const float* d_g, const float* d_u, int64_t n, float* d_y, GpuStream s) {
  if (n == 0) return;
  silu_mul_kernel<<<blocks_for(n, kEltThreads), kEltThreads, 0, s>>>(d_g, d_u, n, d_y);
  SWIFTLET_CUDA_LAUNCHED();
}

void axpy(float* d_y, const float* d_x, int64_t n, float a, const float* d_a, GpuStream s) {
  if (n == 0) return;
  axpy_kernel<<<blocks_for(n, kEltThreads), kEltThreads, 0, s>>>(d_y, d_x, n, a, d_a);
  SWIFTLET_CUDA_LAUNCHED();
}

void add_sigmoid_scaled(float* d_y, const float* d_x, const float* d_gate, int64_t n, GpuStream s) {
  if (n == 0) return;
  add_sigmoid_scaled_kernel<<<blocks_for(n, kEltThreads), kEltThreads, 0, s>>>(d_y, d_x, d_gate, n);
  SWIFTLET_CUDA_LAUNCHED();
}

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

void conv1d_silu_step(const float* d_x, const float* d_conv_w, float* d_state, int64_t C, int K, float* d_u,
                      GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(K >= 1);
  if (C == 0) return;
  conv1d_silu_step_kernel<<<blocks_for(C, kEltThreads), kEltThreads, 0, s>>>(d_x, d_conv_w, d_state, C, K, d_u);
  SWIFTLET_CUDA_LAUNCHED();
}

void delta_rule_step(const float* d_q, const float* d_k, const float* d_v, const float* d_b, const float* d_a,
                     const float* d_A_log, const float* d_dt_bias, float* d_S, int hk, int hv, int dk, int dv,
                     float* d_o, GpuStream s) {
  // One token of the scan (prefill.cu): the same kernel, the state read and written once.
  delta_rule_scan(d_q, d_k, d_v, 0, d_b, d_a, 0, d_A_log, d_dt_bias, d_S, hk, hv, dk, dv, 1, d_o, s);
}

}  // namespace swiftlet::cuda
