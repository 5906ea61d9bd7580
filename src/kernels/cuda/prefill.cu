// The token mixers for T tokens of a prompt per launch (a GPU prefill runs a whole prompt chunk
// through a layer at once): each equals T calls of its one-token form (ops.cu, forward_ops.cu,
// fused.cu) in token order, state included. Row-major [T][...] buffers; inputs that are columns of
// a wider row take a row stride in floats. The per-head device code is shared with the one-token
// kernels (mixer_device.cuh); fp32 throughout.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mixer_device.cuh"

namespace swiftlet::cuda {

using detail::blocks_for;
using detail::sigmoidf_;
using detail::siluf_;
using detail::softplusf_;

namespace {

constexpr int kScanThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // T rides on gridDim.y

// A thread per channel c steps through the T tokens in order, as T launches of
// conv1d_silu_step_kernel would (the state column of c is the thread's alone).
__global__ void conv1d_silu_scan_kernel(const float* __restrict__ x, int64_t x_stride, const float* __restrict__ w,
                                        float* state, int64_t C, int K, int64_t T, float* __restrict__ u,
                                        int64_t u_stride) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* wc = w + c * K;
  for (int64_t t = 0; t < T; ++t) {
    const float xc = x[t * x_stride + c];
    float acc = wc[K - 1] * xc;
    for (int j = 0; j < K - 1; ++j) acc += wc[j] * state[j * C + c];
    u[t * u_stride + c] = siluf_(acc);
    for (int j = 0; j + 1 < K - 1; ++j) state[j * C + c] = state[(j + 1) * C + c];
    if (K > 1) state[int64_t(K - 2) * C + c] = xc;
  }
}

// Block (row, t): row `row` of token t's q/k heads (l2_norm_qk_kernel for token blockIdx.y).
__global__ void l2_norm_qk_rows_kernel(float* x, int64_t row_stride, int hk, int64_t n, float eps, float q_scale) {
  detail::l2_norm_qk_block(x + int64_t(blockIdx.y) * row_stride, hk, n, eps, q_scale, int(blockIdx.x));
}

// unpack_grouped_kernel for token blockIdx.y: inputs at row strides, outputs packed
// (mixed [T][2 hk dk + hk r dv], z [T][hk r dv], b and a [T][hk r]).
__global__ void unpack_grouped_rows_kernel(const float* __restrict__ P, int64_t p_stride, const float* __restrict__ R,
                                           int64_t r_stride, int hk, int r, int dk, int dv, float* __restrict__ mixed,
                                           float* __restrict__ z, float* __restrict__ b, float* __restrict__ a) {
  const int64_t t = blockIdx.y;
  const int64_t kd = int64_t(hk) * dk, vd = int64_t(hk) * r * dv, C = 2 * kd + vd, nb = int64_t(hk) * r;
  detail::unpack_grouped_at(int64_t(blockIdx.x) * blockDim.x + threadIdx.x, P + t * p_stride, R + t * r_stride, hk, r,
                            dk, dv, mixed + t * C, z + t * vd, b + t * nb, a + t * nb);
}

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

constexpr int kDeltaCols = 32;   // value columns per block (threadIdx.x)
constexpr int kDeltaSlices = 8;  // key rows split over threadIdx.y
constexpr int kDeltaMaxDk = 256;
constexpr int kDeltaRows = kDeltaMaxDk / kDeltaSlices;  // rows per thread, held in registers

// delta_rule_step_kernel over T tokens: block (32 x 8) owns 32 value columns j of one head's state
// S[dk][dv]; thread (x, y) keeps rows y, y + 8, ... of column j in registers for all T tokens,
// reading S once before the first and writing it once after the last.
__global__ void __launch_bounds__(kDeltaCols * kDeltaSlices) delta_rule_scan_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int64_t qkv_stride,
    const float* __restrict__ b, const float* __restrict__ a, int64_t ba_stride, const float* __restrict__ A_log,
    const float* __restrict__ dt_bias, float* S, int hk, int hv, int dk, int dv, int64_t T, float* __restrict__ o) {
  __shared__ float ks[kDeltaMaxDk], qs[kDeltaMaxDk];
  __shared__ float red[kDeltaSlices][kDeltaCols + 1];
  const int h = blockIdx.y, g = h / (hv / hk);
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kDeltaCols + tx;
  const int j = blockIdx.x * kDeltaCols + tx;
  const bool col = j < dv;
  float* Sh = S + int64_t(h) * dk * dv;
  float s_reg[kDeltaRows];
#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = ty + kDeltaSlices * r;
    s_reg[r] = (col && i < dk) ? Sh[int64_t(i) * dv + j] : 0.0f;
  }
  const float A = expf(A_log[h]), dtb = dt_bias[h];

  for (int64_t t = 0; t < T; ++t) {
    __syncthreads();  // the previous token is done with ks, qs and red
    for (int i = tid; i < dk; i += kDeltaCols * kDeltaSlices) {
      ks[i] = k[t * qkv_stride + int64_t(g) * dk + i];
      qs[i] = q[t * qkv_stride + int64_t(g) * dk + i];
    }
    const float beta = sigmoidf_(b[t * ba_stride + h]);
    const float alpha = expf(-A * softplusf_(a[t * ba_stride + h] + dtb));
    __syncthreads();

    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < kDeltaRows; ++r) {
      const int i = ty + kDeltaSlices * r;
      s_reg[r] = s_reg[r] * alpha;
      if (i < dk) part = fmaf(s_reg[r], ks[i], part);
    }
    red[ty][tx] = part;
    __syncthreads();
    float mj = 0.0f;
#pragma unroll
    for (int y = 0; y < kDeltaSlices; ++y) mj += red[y][tx];
    const float delta = col ? beta * (v[t * qkv_stride + int64_t(h) * dv + j] - mj) : 0.0f;
    __syncthreads();  // red is reused below

    part = 0.0f;
#pragma unroll
    for (int r = 0; r < kDeltaRows; ++r) {
      const int i = ty + kDeltaSlices * r;
      if (i < dk) {
        s_reg[r] = fmaf(ks[i], delta, s_reg[r]);
        part = fmaf(s_reg[r], qs[i], part);
      }
    }
    red[ty][tx] = part;
    __syncthreads();
    if (ty == 0 && col) {
      float oj = 0.0f;
#pragma unroll
      for (int y = 0; y < kDeltaSlices; ++y) oj += red[y][tx];
      o[t * int64_t(hv) * dv + int64_t(h) * dv + j] = oj;
    }
  }

#pragma unroll
  for (int r = 0; r < kDeltaRows; ++r) {
    const int i = ty + kDeltaSlices * r;
    if (col && i < dk) Sh[int64_t(i) * dv + j] = s_reg[r];
  }
}

}  // namespace

void conv1d_silu_scan(const float* d_x, int64_t x_stride, const float* d_conv_w, float* d_state, int64_t C, int K,
                      int64_t T, float* d_u, int64_t u_stride, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(K >= 1 && T >= 0 && x_stride >= C && u_stride >= C);
  if (C == 0 || T == 0) return;
  conv1d_silu_scan_kernel<<<blocks_for(C, kScanThreads), kScanThreads, 0, s>>>(d_x, x_stride, d_conv_w, d_state, C,
                                                                               K, T, d_u, u_stride);
  SWIFTLET_CUDA_LAUNCHED();
}

void l2_norm_qk_rows(float* d_x, int64_t T, int64_t row_stride, int hk, int64_t n, float eps, float q_scale,
                     GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(T >= 0 && T <= kMaxGridY && row_stride >= 2 * hk * n);
  if (T == 0 || hk == 0) return;
  l2_norm_qk_rows_kernel<<<dim3(unsigned(2 * hk), unsigned(T)), 128, 0, s>>>(d_x, row_stride, hk, n, eps, q_scale);
  SWIFTLET_CUDA_LAUNCHED();
}

namespace {
// unpack_deltanet_grouped for T tokens: qkvz rows at qkvz_stride, ba rows at ba_stride, into
// mixed [T][conv_dim], z [T][value_dim], b and a [T][hv] (hv = hk r).
void unpack_deltanet_grouped_rows(const float* d_qkvz, int64_t qkvz_stride, const float* d_ba, int64_t ba_stride,
                                  int hk, int r, int dk, int dv, int64_t T, float* d_mixed, float* d_z, float* d_b,
                                  float* d_a, GpuStream s) {
  const int64_t n = int64_t(hk) * (2 * int64_t(dk) + 2 * int64_t(r) * dv);
  const int64_t n_ba = int64_t(hk) * 2 * r;
  SWIFTLET_CUDA_REQUIRE(T >= 0 && T <= kMaxGridY && qkvz_stride >= n && ba_stride >= n_ba);
  if (T == 0) return;
  const dim3 grid(blocks_for(n > n_ba ? n : n_ba, 256), unsigned(T));
  unpack_grouped_rows_kernel<<<grid, 256, 0, s>>>(d_qkvz, qkvz_stride, d_ba, ba_stride, hk, r, dk, dv, d_mixed, d_z,
                                                  d_b, d_a);
  SWIFTLET_CUDA_LAUNCHED();
}
}  // namespace

void deltanet_prep_grouped_rows(const float* d_qkvz, int64_t qkvz_stride, const float* d_ba, int64_t ba_stride,
                                const float* d_conv_w, float* d_conv_state, int hk, int r, int dk, int dv, int K,
                                float eps, float q_scale, int64_t T, float* d_mixed, float* d_u, float* d_z,
                                float* d_b, float* d_a, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(K >= 1 && hk >= 1 && r >= 1);
  const int64_t kd = int64_t(hk) * dk, C = 2 * kd + int64_t(hk) * r * dv;
  unpack_deltanet_grouped_rows(d_qkvz, qkvz_stride, d_ba, ba_stride, hk, r, dk, dv, T, d_mixed, d_z, d_b, d_a, s);
  conv1d_silu_scan(d_mixed, C, d_conv_w, d_conv_state, C, K, T, d_u, C, s);
  l2_norm_qk_rows(d_u, T, C, hk, dk, eps, q_scale, s);
}

void delta_rule_scan(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                     const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                     int hk, int hv, int dk, int dv, int64_t T, float* d_o, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hk >= 1 && hv % hk == 0);
  SWIFTLET_CUDA_REQUIRE(dk >= 1 && dk <= kDeltaMaxDk && dv >= 1);
  SWIFTLET_CUDA_REQUIRE(T >= 0);
  if (T == 0 || hv == 0) return;
  const dim3 grid(blocks_for(dv, kDeltaCols), unsigned(hv)), block(kDeltaCols, kDeltaSlices);
  delta_rule_scan_kernel<<<grid, block, 0, s>>>(d_q, d_k, d_v, qkv_stride, d_b, d_a, ba_stride, d_A_log, d_dt_bias,
                                                d_S, hk, hv, dk, dv, T, d_o);
  SWIFTLET_CUDA_LAUNCHED();
}

void delta_rule_norm_scan(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                          const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                          const float* d_z, const float* d_norm_w, float eps, int hk, int hv, int dk, int dv, int64_t T,
                          float* d_o, GpuStream s) {
  delta_rule_scan(d_q, d_k, d_v, qkv_stride, d_b, d_a, ba_stride, d_A_log, d_dt_bias, d_S, hk, hv, dk, dv, T, d_o, s);
  gated_rms_norm(d_o, d_z, d_norm_w, T * hv, dv, eps, s);
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
