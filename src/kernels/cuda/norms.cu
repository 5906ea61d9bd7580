// Norms and element-wise ops (model-math.md 3, 5.2, 5.6, 6): RMSNorm, the L2 norms of the
// DeltaNet's q and k, the gated RMSNorm, SiLU * up, and the MoE's weighted sums (the routed
// experts' outputs and the gated shared expert added into the residual stream), for one token and
// for T tokens. Each mirrors a scalar loop of kernels/cpu/ops_ref.cpp or model/qwen3_hybrid.cpp;
// fp32 throughout.
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
constexpr int64_t kMaxGridY = 65535;  // T rides on gridDim.y

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

// Block (row, t): row `row` of token t's q/k heads (l2_norm_qk_kernel for token blockIdx.y).
__global__ void l2_norm_qk_rows_kernel(float* x, int64_t row_stride, int hk, int64_t n, float eps, float q_scale) {
  detail::l2_norm_qk_block(x + int64_t(blockIdx.y) * row_stride, hk, n, eps, q_scale, int(blockIdx.x));
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

__global__ void moe_combine_kernel(float* __restrict__ out, const float* __restrict__ y, const float* __restrict__ w,
                                   int n, int64_t H) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= H) return;
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = fmaf(w[i], y[int64_t(i) * H + d], acc);
  out[d] += acc;
}

// h[t][d] += sigmoid(g[t]) shared[t][d] + sum_j w[t][j] y[t k + j][d] for token t = blockIdx.y (the
// whole MoE output, 3.10).
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

void add_rms_norm(float* d_h, const float* d_add, const float* d_w, int64_t n, float eps, float* d_y, GpuStream s) {
  add_rms_norm_kernel<<<1, 1024, 0, s>>>(d_h, d_add, d_w, n, eps, d_y);
  SWIFTLET_CUDA_LAUNCHED();
}

void l2_norm_qk(float* d_x, int hk, int64_t n, float eps, float q_scale, GpuStream s) {
  l2_norm_qk_kernel<<<unsigned(2 * hk), 128, 0, s>>>(d_x, hk, n, eps, q_scale);
  SWIFTLET_CUDA_LAUNCHED();
}

void l2_norm_qk_rows(float* d_x, int64_t T, int64_t row_stride, int hk, int64_t n, float eps, float q_scale,
                     GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(T >= 0 && T <= kMaxGridY && row_stride >= 2 * hk * n);
  if (T == 0 || hk == 0) return;
  l2_norm_qk_rows_kernel<<<dim3(unsigned(2 * hk), unsigned(T)), 128, 0, s>>>(d_x, row_stride, hk, n, eps, q_scale);
  SWIFTLET_CUDA_LAUNCHED();
}

void moe_combine(float* d_out, const float* d_y, const float* d_w, int n, int64_t H, GpuStream s) {
  if (n == 0 || H == 0) return;
  moe_combine_kernel<<<blocks_for(H, 256), 256, 0, s>>>(d_out, d_y, d_w, n, H);
  SWIFTLET_CUDA_LAUNCHED();
}

void moe_finish_rows(float* d_h, const float* d_shared, const float* d_gate, const float* d_y, const float* d_w,
                     int64_t T, int k, int64_t H, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(T <= 65535);
  if (T == 0) return;
  moe_finish_rows_kernel<<<dim3(blocks_for(H, 256), unsigned(T)), 256, 0, s>>>(d_h, d_shared, d_gate, d_y, d_w, k, H);
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
