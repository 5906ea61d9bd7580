// Gated DeltaNet (model-math.md 5.1-5.6). One token: the conv + SiLU, the delta rule with the
// gated RMSNorm, and the whole step in one launch (deltanet_step: a thread-block cluster per key
// head). T prompt tokens: the conv and the delta rule scanned over the tokens in order, the state
// on chip. The inputs are the projections in the split layout (both families: Qwen3-Next's rows
// are reordered at load). fp32 throughout.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mixer_device.cuh"
#include "kernels/cuda/probe.cuh"

#include <cooperative_groups.h>

namespace swiftlet::cuda {

using namespace detail;  // cuda_common.cuh's helpers

namespace {

constexpr unsigned kMaxCluster = 8;  // blocks per thread-block cluster (the portable limit)

// Channel c of the causal conv + SiLU (3.4) for input x: SiLU(w_c . [state_c; x]), and the state's
// column c shifted by x (state: [K - 1][C]). The thread owns the column: no barrier.
__device__ __forceinline__ float conv_silu_channel(float x, const float* __restrict__ conv_w, float* state,
                                                   int64_t C, int K, int64_t c) {
  const float* wc = conv_w + c * K;
  float acc = wc[K - 1] * x;
  for (int j = 0; j < K - 1; ++j) acc += wc[j] * state[j * C + c];
  for (int j = 0; j + 1 < K - 1; ++j) state[j * C + c] = state[(j + 1) * C + c];
  if (K > 1) state[int64_t(K - 2) * C + c] = x;
  return siluf_(acc);
}

constexpr int kDnSlices = 8;
constexpr int kDnMaxDv = 128;
constexpr int kDnMaxDk = 256;

// Rows of a state column per thread: ROWS = 16 for dk <= 128, 32 for dk <= 256.
int delta_rows(int dk) { return dk <= 16 * kDnSlices ? 16 : kDnMaxDk / kDnSlices; }

// Thread (j, y) of a delta-rule block loads rows y, y + 8, ... of column j of the head's state Sh
// ([dk][dv]) into registers, every load issued before any is used, so they are in flight together.
// (Before the PDL wait only where the caller knows the predecessor does not write Sh: the
// previous token's step may be it, as in a scan of steps.)
template <int ROWS>
__device__ __forceinline__ void load_state(const float* Sh, int dk, int dv, float (&s_reg)[ROWS]) {
  const int j = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int rr = 0; rr < ROWS; ++rr) {
    const int i = ty + kDnSlices * rr;
    s_reg[rr] = (j < dv && i < dk) ? Sh[int64_t(i) * dv + j] : 0.0f;
  }
}

// The delta rule (3.6 - 3.7) and the gated RMSNorm (3.9) of value head h, one block of (dv rounded
// up to 32) x kDnSlices threads: thread (j, y) holds rows y, y + 8, ... of state column j in s_reg
// (load_state). ks and qs: the head's k and q in shared memory (ready: the caller synchronised);
// v(j) and z(j) give column j's value and gate input. Writes the new state back to Sh.
template <int ROWS, typename V, typename Z>
__device__ __forceinline__ void delta_norm_head(float (&s_reg)[ROWS], const float* ks, const float* qs, V v, Z z,
                                                float beta, float alpha, float* Sh,
                                                const float* __restrict__ norm_w, float eps, int dk, int dv,
                                                float* __restrict__ oh_out) {
  __shared__ float red[kDnSlices][kDnMaxDv + 1];
  __shared__ float oh[kDnMaxDv];
  __shared__ float inv_s;
  const int j = threadIdx.x, ty = threadIdx.y, tid = block_thread();
  const bool col = j < dv;
  float part = 0.0f;
#pragma unroll
  for (int rr = 0; rr < ROWS; ++rr) {
    const int i = ty + kDnSlices * rr;
    s_reg[rr] *= alpha;
    if (i < dk) part = fmaf(s_reg[rr], ks[i], part);
  }
  red[ty][j] = part;
  __syncthreads();
  float mj = 0.0f;
#pragma unroll
  for (int y = 0; y < kDnSlices; ++y) mj += red[y][j];
  const float delta = col ? beta * (v(j) - mj) : 0.0f;
  __syncthreads();
  part = 0.0f;
#pragma unroll
  for (int rr = 0; rr < ROWS; ++rr) {
    const int i = ty + kDnSlices * rr;
    if (i < dk) {
      s_reg[rr] = fmaf(ks[i], delta, s_reg[rr]);
      if (col) Sh[int64_t(i) * dv + j] = s_reg[rr];
      part = fmaf(s_reg[rr], qs[i], part);
    }
  }
  red[ty][j] = part;
  __syncthreads();
  if (ty == 0) {
    float oj = 0.0f;
#pragma unroll
    for (int y = 0; y < kDnSlices; ++y) oj += red[y][j];
    oh[j] = col ? oj : 0.0f;
  }
  __syncthreads();
  if (tid < 32) {
    float ss = 0.0f;
    for (int i = tid; i < dv; i += 32) ss = fmaf(oh[i], oh[i], ss);
    ss = warp_sum(ss);
    if (tid == 0) inv_s = rsqrtf(ss / float(dv) + eps);
  }
  __syncthreads();
  if (ty == 0 && col) oh_out[j] = oh[j] * inv_s * norm_w[j] * siluf_(z(j));
}

__device__ __forceinline__ float delta_alpha(float a, float A_log, float dt_bias) {
  return expf(-expf(A_log) * detail::softplusf_(a + dt_bias));
}

// delta_norm_head for value head blockIdx.x, its q/k/v/z/b/a from the prep's outputs.
template <int ROWS>
__global__ void __launch_bounds__(kDnMaxDv * kDnSlices) delta_norm_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ bb, const float* __restrict__ aa, const float* __restrict__ A_log,
    const float* __restrict__ dt_bias, float* S, const float* __restrict__ z, const float* __restrict__ norm_w,
    float eps, int hk, int hv, int dk, int dv, float* __restrict__ o) {
  __shared__ float ks[kDnMaxDk], qs[kDnMaxDk];
  const int h = blockIdx.x, g = h / (hv / hk);
  pdl_wait_and_release();
  float s_reg[ROWS];
  load_state(S + int64_t(h) * dk * dv, dk, dv, s_reg);
  const int tid = block_thread(), nt = block_warps() * 32;
  for (int i = tid; i < dk; i += nt) {
    ks[i] = k[int64_t(g) * dk + i];
    qs[i] = q[int64_t(g) * dk + i];
  }
  const float beta = sigmoidf_(bb[h]);
  const float alpha = delta_alpha(aa[h], A_log[h], dt_bias[h]);
  __syncthreads();
  const float* vh = v + int64_t(h) * dv;
  const float* zh = z + int64_t(h) * dv;
  delta_norm_head(
      s_reg, ks, qs, [&](int j) { return vh[j]; }, [&](int j) { return zh[j]; }, beta, alpha,
      S + int64_t(h) * dk * dv, norm_w, eps, dk, dv, o + int64_t(h) * dv);
}

// The whole DeltaNet step of one token (the prep, then delta_norm_kernel) in one launch: a block
// per value head h, and the r value heads of key head g as one thread-block cluster (sm_90). Block
// rank 0 runs the conv + SiLU and L2 norms of q_g and k_g (it alone shifts their conv state); the
// others read them from its shared memory. Each block runs the conv of its own v channels. Inputs
// as DeltaNetIn. One block an SM (the `, 1`): without it ptxas may aim at two and give the state rows
// 32 registers (ROWS 32: 740 B of spills a thread against 304).
template <int ROWS>
__global__ void __launch_bounds__(kDnMaxDv * kDnSlices, 1)
    deltanet_step_kernel(const __grid_constant__ DeltaNetIn in, const float* __restrict__ conv_w, float* state,
                         const float* __restrict__ A_log, const float* __restrict__ dt_bias, float* S,
                         const float* __restrict__ norm_w, float l2_eps, float q_scale, float eps, int hk, int r,
                         int dk, int dv, int K, bool state_early, float* __restrict__ o) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float qk[2 * kDnMaxDk];  // rank 0: q_g then k_g, normalised
  __shared__ float ks[kDnMaxDk], qs[kDnMaxDk], vs[kDnMaxDv];
  __shared__ float red[32];
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int h = blockIdx.x, g = h / r, rank = h % r;  // rank == cluster.block_rank()
  float s_reg[ROWS];  // in flight during the conv (and, state_early, the predecessor's tail)
  probe(kProbeDeltaNet, 0);
  if (state_early) load_state(S + int64_t(h) * dk * dv, dk, dv, s_reg);
  const float alog = A_log[h], dtb = dt_bias[h];  // weights: not the predecessor's
  pdl_wait_and_release();
  probe(kProbeDeltaNet, 1);
  if (!state_early) load_state(S + int64_t(h) * dk * dv, dk, dv, s_reg);
  const int tid = block_thread(), nt = block_warps() * 32;
  const int64_t kd = int64_t(hk) * dk, rdv = int64_t(r) * dv, C = 2 * kd + hk * rdv;
  // This head's inputs: q_g, k_g (dk each), v_h, z_h (dv each), b_h, a_h.
  const float* q_in = in.x + int64_t(g) * dk;
  const float* k_in = in.x + kd + int64_t(g) * dk;
  const float* v_in = in.x + 2 * kd + int64_t(h) * dv;
  const float* z_in = in.z + int64_t(h) * dv;
  const float b_in = in.b[h], a_in = in.a[h];
  // The conv: rank 0's items [0, 2 dk) are q_g and k_g; every block's next dv items its v channels.
  const int qk_items = rank == 0 ? 2 * dk : 0;
  float ssq = 0.0f, ssk = 0.0f;
  for (int t = tid; t < qk_items + dv; t += nt) {
    if (t >= qk_items) {
      const int i = t - qk_items;
      vs[i] = conv_silu_channel(v_in[i], conv_w, state, C, K, 2 * kd + int64_t(h) * dv + i);
      continue;
    }
    const bool is_q = t < dk;
    const int i = is_q ? t : t - dk;
    const float v = conv_silu_channel(is_q ? q_in[i] : k_in[i], conv_w, state, C, K,
                                      (is_q ? 0 : kd) + int64_t(g) * dk + i);
    qk[t] = v;
    if (is_q)
      ssq = fmaf(v, v, ssq);
    else
      ssk = fmaf(v, v, ssk);
  }
  if (rank == 0) {  // block-uniform
    ssq = block_sum(ssq, red);
    ssk = block_sum(ssk, red);
    const float iq = rsqrtf(ssq + l2_eps) * q_scale, ik = rsqrtf(ssk + l2_eps);
    for (int t = tid; t < 2 * dk; t += nt) qk[t] *= t < dk ? iq : ik;
  }
  probe(kProbeDeltaNet, 2);
  cluster.sync();  // rank 0's q_g, k_g are ready
  const float* qk0 = cluster.map_shared_rank(qk, 0);
  for (int i = tid; i < dk; i += nt) {
    qs[i] = qk0[i];
    ks[i] = qk0[dk + i];
  }
  cluster.sync();  // rank 0's shared memory is read: it may exit
  probe(kProbeDeltaNet, 3);
  delta_norm_head(
      s_reg, ks, qs, [&](int j) { return vs[j]; }, [&](int j) { return z_in[j]; }, sigmoidf_(b_in),
      delta_alpha(a_in, alog, dtb), S + int64_t(h) * dk * dv, norm_w, eps, dk, dv, o + int64_t(h) * dv);
  probe(kProbeDeltaNet, 4);
#endif
}

}  // namespace

void delta_rule_norm_step(const float* d_q, const float* d_k, const float* d_v, const float* d_b, const float* d_a,
                          const float* d_A_log, const float* d_dt_bias, float* d_S, const float* d_z,
                          const float* d_norm_w, float eps, int hk, int hv, int dk, int dv, float* d_o, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hk >= 1 && hv % hk == 0);
  if (dk > kDnMaxDk || dv > kDnMaxDv) {
    delta_rule_step(d_q, d_k, d_v, d_b, d_a, d_A_log, d_dt_bias, d_S, hk, hv, dk, dv, d_o, s);
    gated_rms_norm(d_o, d_z, d_norm_w, hv, dv, eps, s);
    return;
  }
  const dim3 block(unsigned((dv + 31) / 32 * 32), kDnSlices);
  launch(delta_rows(dk) == 16 ? delta_norm_kernel<16> : delta_norm_kernel<32>, unsigned(hv), block, 0, s, d_q, d_k, d_v, d_b, d_a, d_A_log, d_dt_bias, d_S, d_z, d_norm_w,
         eps, hk, hv, dk, dv, d_o);
  SWIFTLET_CUDA_LAUNCHED();
}

bool deltanet_step(const DeltaNetIn& in, const float* d_conv_w, float* d_conv_state, const float* d_A_log,
                   const float* d_dt_bias, float* d_S, const float* d_norm_w, float l2_eps, float q_scale, float eps,
                   int hk, int hv, int dk, int dv, int K, float* d_o, GpuStream s, bool state_early) {
  SWIFTLET_CUDA_REQUIRE(K >= 1 && hk >= 1 && hv % hk == 0);
  const int r = hv / hk;
  if (!tuning().capable || r > int(kMaxCluster) || dk > kDnMaxDk || dv > kDnMaxDv) return false;
  const dim3 block(unsigned((dv + 31) / 32 * 32), kDnSlices);
  launch_cluster(delta_rows(dk) == 16 ? deltanet_step_kernel<16> : deltanet_step_kernel<32>, unsigned(hv), block, 0, s, false, unsigned(r), in, d_conv_w, d_conv_state,
                 d_A_log, d_dt_bias, d_S, d_norm_w, l2_eps, q_scale, eps, hk, r, dk, dv, K, state_early, d_o);
  SWIFTLET_CUDA_LAUNCHED();
  return true;
}

#ifdef SWIFTLET_GPU_PROBE
void probe_install_deltanet(unsigned long long* buf) {
  SWIFTLET_CUDA_CHECK(cudaMemcpyToSymbol(g_probe, &buf, sizeof(buf)));
}
#endif

// ---------------------------------------------------------------------------------------------
// The generic one-token kernels (deltanet_decode's fallback, and the references of the tests) and
// the T-token scans.

namespace {

constexpr int kEltThreads = 256;
constexpr int kScanThreads = 256;

__global__ void conv1d_silu_step_kernel(const float* __restrict__ x, const float* __restrict__ w, float* state,
                                        int64_t C, int K, float* __restrict__ u) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  u[c] = conv_silu_channel(x[c], w, state, C, K, c);
}

// The T outputs at once, a thread per (channel, token): u[t][c] = SiLU(w[K-1] x[t] + sum_{j<K-1}
// w[j] in(t - (K-1) + j)), in(s) being x row s for s >= 0 and state row K-1+s before the chunk,
// summed in conv1d_silu_step's order. The state is read only; conv1d_state_advance moves it on.
__global__ void conv1d_silu_rows_kernel(const float* __restrict__ x, int64_t x_stride, const float* __restrict__ w,
                                        const float* __restrict__ state, int64_t C, int K, int64_t T,
                                        float* __restrict__ u, int64_t u_stride) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float* wc = w + c * K;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float acc = wc[K - 1] * x[t * x_stride + c];
    for (int j = 0; j < K - 1; ++j) {
      const int64_t s = t - (K - 1) + j;
      acc += wc[j] * (s >= 0 ? x[s * x_stride + c] : state[(K - 1 + s) * C + c]);
    }
    u[t * u_stride + c] = siluf_(acc);
  }
}

// The state after the chunk: row j = in(T - (K-1) + j), rows in increasing order (a row still
// to come from the old state lies T rows further on).
__global__ void conv1d_state_advance_kernel(const float* __restrict__ x, int64_t x_stride, float* state, int64_t C,
                                            int K, int64_t T) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int j = 0; j < K - 1; ++j) {
    const int64_t s = T - (K - 1) + j;
    state[j * C + c] = s >= 0 ? x[s * x_stride + c] : state[(K - 1 + s) * C + c];
  }
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

// ---- the delta rule over a prompt's tokens in chunks of 64 (the WY / UT form) ----
//
// The same recurrence as delta_rule_scan_kernel, reorganised per chunk of n <= 64 tokens (with
// gamma_i the cumulative log decay from the chunk's start, D_ij = exp(gamma_i - gamma_j) for j <= i):
//   [U | -W] = (I + L)^{-1} [diag(beta) V | -diag(beta e^gamma) K],   L_ij = beta_i D_ij k_i.k_j (j < i)
//   V' = U - W S,   O = diag(e^gamma) Q S + (D o Q K^T) V',
//   S <- e^{gamma_n} S + K^T diag(e^{gamma_n - gamma}) V'
// (the CPU's delta_rule_chunked, kernels/cpu/delta_net_avx2.cpp). A block owns one value head's
// 32 state columns for the whole prompt, the state slice in shared memory; each chunk is a few
// small matrix products and a forward substitution over its rows instead of n dependent steps.

constexpr int kChunkT = 64;     // tokens a chunk
constexpr int kChunkCols = 32;  // state columns a block
constexpr int kChunkMaxDk = 128;
constexpr int kChunkThreads = 256;
constexpr int64_t kChunkMinTokens = 16;  // below this the scan (its per-token steps are few)

struct ChunkSmem {  // float offsets into the dynamic shared memory, for key width dk
  int kq_ld, x_ld, s, k, q, l, a, x, gamma, eg, beta, total;
  __host__ __device__ explicit ChunkSmem(int dk) {
    kq_ld = dk + 1;               // K and Q rows padded: threads reading rows i, j at one d differ in bank
    x_ld = kChunkCols + dk + 1;   // X = [U | -W] rows
    s = 0;                        // S slice [dk][32]
    k = s + dk * kChunkCols;      // K [64][dk+1]
    q = k + kChunkT * kq_ld;      // Q [64][dk+1]
    l = q + kChunkT * kq_ld;      // L [64][65]
    a = l + kChunkT * (kChunkT + 1);  // D o Q K^T [64][65]
    x = a + kChunkT * (kChunkT + 1);  // X [64][x_ld]
    gamma = x + kChunkT * x_ld;
    eg = gamma + kChunkT;
    beta = eg + kChunkT;
    total = beta + kChunkT;
  }
};

__global__ void __launch_bounds__(kChunkThreads) delta_rule_chunked_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int64_t qkv_stride,
    const float* __restrict__ b, const float* __restrict__ a, int64_t ba_stride, const float* __restrict__ A_log,
    const float* __restrict__ dt_bias, float* S, int hk, int hv, int dk, int dv, int64_t T, float* __restrict__ o) {
  extern __shared__ float sm[];
  const ChunkSmem L(dk);
  float *Ss = sm + L.s, *Kc = sm + L.k, *Qc = sm + L.q, *Lm = sm + L.l, *Am = sm + L.a, *X = sm + L.x;
  float *gamma = sm + L.gamma, *eg = sm + L.eg, *beta = sm + L.beta;
  const int h = blockIdx.y, g = h / (hv / hk), j0 = blockIdx.x * kChunkCols, tid = threadIdx.x;
  const int xw = kChunkCols + dk, ld = L.kq_ld, xl = L.x_ld, ml = kChunkT + 1;
  float* Sh = S + int64_t(h) * dk * dv;
  for (int e = tid; e < dk * kChunkCols; e += kChunkThreads)
    Ss[e] = Sh[int64_t(e / kChunkCols) * dv + j0 + e % kChunkCols];
  const float A = expf(A_log[h]), dtb = dt_bias[h];

  for (int64_t t0 = 0; t0 < T; t0 += kChunkT) {
    const int n = int(T - t0 < kChunkT ? T - t0 : kChunkT);
    __syncthreads();  // the previous chunk is done with everything
    for (int e = tid; e < n * dk; e += kChunkThreads) {
      const int i = e / dk, d = e % dk;
      const int64_t row = (t0 + i) * qkv_stride + int64_t(g) * dk + d;
      Kc[i * ld + d] = k[row];
      Qc[i * ld + d] = q[row];
    }
    if (tid < n) {
      const int64_t t = t0 + tid;
      beta[tid] = sigmoidf_(b[t * ba_stride + h]);
      gamma[tid] = -A * softplusf_(a[t * ba_stride + h] + dtb);  // this token's log decay, summed below
    }
    __syncthreads();
    if (tid == 0) {
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) {
        acc += gamma[i];
        gamma[i] = acc;
        eg[i] = expf(acc);
      }
    }
    __syncthreads();
    // L, D o Q K^T, and the right-hand sides [beta V | -beta e^gamma K].
    for (int e = tid; e < n * n; e += kChunkThreads) {
      const int i = e / n, j = e % n;
      float lij = 0.0f, aij = 0.0f;
      if (j <= i) {
        const float D = expf(gamma[i] - gamma[j]);
        float kk = 0.0f, qk = 0.0f;
        for (int d = 0; d < dk; ++d) {
          const float kj = Kc[j * ld + d];
          kk = fmaf(Kc[i * ld + d], kj, kk);
          qk = fmaf(Qc[i * ld + d], kj, qk);
        }
        if (j < i) lij = beta[i] * D * kk;
        aij = D * qk;
      }
      Lm[i * ml + j] = lij;
      Am[i * ml + j] = aij;
    }
    for (int e = tid; e < n * xw; e += kChunkThreads) {
      const int i = e / xw, c = e % xw;
      X[i * xl + c] = c < kChunkCols ? beta[i] * v[(t0 + i) * qkv_stride + int64_t(h) * dv + j0 + c]
                                     : -beta[i] * eg[i] * Kc[i * ld + (c - kChunkCols)];
    }
    __syncthreads();
    // X <- (I + L)^{-1} X: row by row, each row's columns in parallel.
    for (int i = 1; i < n; ++i) {
      for (int c = tid; c < xw; c += kChunkThreads) {
        float x = X[i * xl + c];
        for (int j = 0; j < i; ++j) x = fmaf(-Lm[i * ml + j], X[j * xl + c], x);
        X[i * xl + c] = x;
      }
      __syncthreads();
    }
    // beta is used up: it holds e^{gamma_n - gamma_i} for the state's update from here on.
    const float gl = gamma[n - 1];
    if (tid < n) beta[tid] = expf(gl - gamma[tid]);
    // V' = U - W S, over the U columns (the W columns hold -W).
    for (int e = tid; e < n * kChunkCols; e += kChunkThreads) {
      const int i = e / kChunkCols, c = e % kChunkCols;
      float x = X[i * xl + c];
      for (int d = 0; d < dk; ++d) x = fmaf(X[i * xl + kChunkCols + d], Ss[d * kChunkCols + c], x);
      X[i * xl + c] = x;
    }
    __syncthreads();
    // O = diag(e^gamma) Q S + (D o Q K^T) V'.
    for (int e = tid; e < n * kChunkCols; e += kChunkThreads) {
      const int i = e / kChunkCols, c = e % kChunkCols;
      float qs = 0.0f, av = 0.0f;
      for (int d = 0; d < dk; ++d) qs = fmaf(Qc[i * ld + d], Ss[d * kChunkCols + c], qs);
      for (int j = 0; j <= i; ++j) av = fmaf(Am[i * ml + j], X[j * xl + c], av);
      o[(t0 + i) * int64_t(hv) * dv + int64_t(h) * dv + j0 + c] = fmaf(eg[i], qs, av);
    }
    __syncthreads();  // S is read above and written below
    // S <- e^{gamma_n} S + K^T diag(e^{gamma_n - gamma}) V'.
    const float egl = expf(gl);
    for (int e = tid; e < dk * kChunkCols; e += kChunkThreads) {
      const int d = e / kChunkCols, c = e % kChunkCols;
      float x = egl * Ss[e];
      for (int i = 0; i < n; ++i) x = fmaf(Kc[i * ld + d] * beta[i], X[i * xl + c], x);
      Ss[e] = x;
    }
  }
  __syncthreads();
  for (int e = tid; e < dk * kChunkCols; e += kChunkThreads)
    Sh[int64_t(e / kChunkCols) * dv + j0 + e % kChunkCols] = Ss[e];
}

}  // namespace

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
  // One token of the scan: the same kernel, the state read and written once.
  delta_rule_scan(d_q, d_k, d_v, 0, d_b, d_a, 0, d_A_log, d_dt_bias, d_S, hk, hv, dk, dv, 1, d_o, s);
}

void conv1d_silu_scan(const float* d_x, int64_t x_stride, const float* d_conv_w, float* d_state, int64_t C, int K,
                      int64_t T, float* d_u, int64_t u_stride, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(K >= 1 && T >= 0 && x_stride >= C && u_stride >= C);
  if (C == 0 || T == 0) return;
  const dim3 grid(blocks_for(C, kScanThreads), unsigned(T < 65535 ? T : 65535));
  conv1d_silu_rows_kernel<<<grid, kScanThreads, 0, s>>>(d_x, x_stride, d_conv_w, d_state, C, K, T, d_u, u_stride);
  SWIFTLET_CUDA_LAUNCHED();
  conv1d_state_advance_kernel<<<blocks_for(C, kScanThreads), kScanThreads, 0, s>>>(d_x, x_stride, d_state, C, K, T);
  SWIFTLET_CUDA_LAUNCHED();
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

bool delta_rule_chunked_takes(int dk, int dv) {
  return dk >= 1 && dk <= kChunkMaxDk && dv % kChunkCols == 0;
}

void delta_rule_chunked(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                        const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                        int hk, int hv, int dk, int dv, int64_t T, float* d_o, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hk >= 1 && hv % hk == 0 && delta_rule_chunked_takes(dk, dv) && T >= 0);
  if (T == 0 || hv == 0) return;
  const int bytes = ChunkSmem(dk).total * int(sizeof(float));
  static const bool init = [] {
    SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(delta_rule_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             ChunkSmem(kChunkMaxDk).total * int(sizeof(float))));
    return true;
  }();
  (void)init;
  const dim3 grid(unsigned(dv / kChunkCols), unsigned(hv));
  delta_rule_chunked_kernel<<<grid, kChunkThreads, bytes, s>>>(d_q, d_k, d_v, qkv_stride, d_b, d_a, ba_stride, d_A_log,
                                                             d_dt_bias, d_S, hk, hv, dk, dv, T, d_o);
  SWIFTLET_CUDA_LAUNCHED();
}

void delta_rule_norm_scan(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                          const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                          const float* d_z, const float* d_norm_w, float eps, int hk, int hv, int dk, int dv, int64_t T,
                          float* d_o, GpuStream s) {
  // A prompt's chunks in the WY form where the shapes fit; short runs and other shapes as the scan.
  if (T >= kChunkMinTokens && delta_rule_chunked_takes(dk, dv))
    delta_rule_chunked(d_q, d_k, d_v, qkv_stride, d_b, d_a, ba_stride, d_A_log, d_dt_bias, d_S, hk, hv, dk, dv, T, d_o,
                       s);
  else
    delta_rule_scan(d_q, d_k, d_v, qkv_stride, d_b, d_a, ba_stride, d_A_log, d_dt_bias, d_S, hk, hv, dk, dv, T, d_o, s);
  gated_rms_norm(d_o, d_z, d_norm_w, T * hv, dv, eps, s);
}

}  // namespace swiftlet::cuda
