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

#include <algorithm>

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
// A decode batch (deltanet_step_rows): blockIdx.y is the sequence, its inputs and output rows at the
// strides of DeltaNetRows and its states from its table.
struct DeltaNetRows {
  int64_t x_stride = 0, z_stride = 0, ba_stride = 0, o_stride = 0;
  float* const* states = nullptr;  // [n][2]: conv state, S; null: the kernel's own
};

template <int ROWS>
__global__ void __launch_bounds__(kDnMaxDv * kDnSlices, 1)
    deltanet_step_kernel(const __grid_constant__ DeltaNetIn in, const float* __restrict__ conv_w, float* state,
                         const float* __restrict__ A_log, const float* __restrict__ dt_bias, float* S,
                         const float* __restrict__ norm_w, float l2_eps, float q_scale, float eps, int hk, int r,
                         int dk, int dv, int K, bool state_early, float* __restrict__ o,
                         const __grid_constant__ DeltaNetRows rows) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float qk[2 * kDnMaxDk];  // rank 0: q_g then k_g, normalised
  __shared__ float ks[kDnMaxDk], qs[kDnMaxDk], vs[kDnMaxDv];
  __shared__ float red[32];
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int h = blockIdx.x, g = h / r, rank = h % r;  // rank == cluster.block_rank()
  float s_reg[ROWS];  // in flight during the conv (and, state_early, the predecessor's tail)
  const int64_t seq = blockIdx.y;
  if (rows.states) {  // the tables are written before the batch's first kernel
    state = rows.states[2 * seq];
    S = rows.states[2 * seq + 1];
  }
  o += seq * rows.o_stride;
  probe(kProbeDeltaNet, 0);
  if (state_early) load_state(S + int64_t(h) * dk * dv, dk, dv, s_reg);
  const float alog = A_log[h], dtb = dt_bias[h];  // weights: not the predecessor's
  pdl_wait_and_release();
  probe(kProbeDeltaNet, 1);
  if (!state_early) load_state(S + int64_t(h) * dk * dv, dk, dv, s_reg);
  const int tid = block_thread(), nt = block_warps() * 32;
  const int64_t kd = int64_t(hk) * dk, rdv = int64_t(r) * dv, C = 2 * kd + hk * rdv;
  // This head's inputs: q_g, k_g (dk each), v_h, z_h (dv each), b_h, a_h.
  const float* x = in.x + seq * rows.x_stride;
  const float* q_in = x + int64_t(g) * dk;
  const float* k_in = x + kd + int64_t(g) * dk;
  const float* v_in = x + 2 * kd + int64_t(h) * dv;
  const float* z_in = in.z + seq * rows.z_stride + int64_t(h) * dv;
  const float b_in = in.b[seq * rows.ba_stride + h], a_in = in.a[seq * rows.ba_stride + h];
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

namespace {
// deltanet_step's kernel over n rows (DeltaNetRows{} and the states given: one token's).
bool launch_deltanet_step(const DeltaNetSpec& d, const DeltaNetIn& in, int64_t n, float* d_conv_state, float* d_S,
                          bool state_early, float* d_o, const DeltaNetRows& rows, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(d.K >= 1 && d.hk >= 1 && d.hv % d.hk == 0 && n >= 1 && n <= 65535);
  const int r = d.hv / d.hk;
  if (!tuning().capable || r > int(kMaxCluster) || d.dk > kDnMaxDk || d.dv > kDnMaxDv) return false;
  const dim3 block(unsigned((d.dv + 31) / 32 * 32), kDnSlices);
  launch_cluster(delta_rows(d.dk) == 16 ? deltanet_step_kernel<16> : deltanet_step_kernel<32>,
                 dim3(unsigned(d.hv), unsigned(n)), block, 0, s, false, unsigned(r), in, d.d_conv_w, d_conv_state,
                 d.d_A_log, d.d_dt_bias, d_S, d.d_norm_w, d.l2_eps, d.q_scale, d.eps, d.hk, r, d.dk, d.dv, d.K,
                 state_early, d_o, rows);
  SWIFTLET_CUDA_LAUNCHED();
  return true;
}
}  // namespace

bool deltanet_step(const DeltaNetSpec& d, const DeltaNetIn& in, float* d_conv_state, float* d_S, float* d_o,
                   GpuStream s, bool state_early) {
  return launch_deltanet_step(d, in, 1, d_conv_state, d_S, state_early, d_o, DeltaNetRows{}, s);
}

bool deltanet_step_rows(const DeltaNetSpec& d, const DeltaNetIn& in, const StepRows& rows, float* d_o, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(rows.d_states);
  const DeltaNetRows r{d.conv_dim(), d.value_dim(), d.hv, d.value_dim(), rows.d_states};
  return launch_deltanet_step(d, in, rows.n, nullptr, nullptr, /*state_early=*/true, d_o, r, s);
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

// The same recurrence as delta_rule_scan_kernel, reorganised per chunk of n <= 64 tokens (with
// gamma_i the cumulative log decay from the chunk's start, D_ij = exp(gamma_i - gamma_j) for j <= i):
//   [U | -W] = (I + L)^{-1} [diag(beta) V | -diag(beta e^gamma) K],   L_ij = beta_i D_ij k_i.k_j (j < i)
//   V' = U - W S,   O = diag(e^gamma) Q S + (D o Q K^T) V',
//   S <- e^{gamma_n} S + K^T diag(e^{gamma_n - gamma}) V'
// (the CPU's delta_rule_chunked, kernels/cpu/delta_net_simd.cpp). Two launches: the first builds
// every chunk's U, -W and D o Q K^T at once (a block per (chunk, value head): nothing in it depends
// on the state); the second carries the state through the chunks in order (a block per (value
// head, 32 state columns), the state slice in shared memory), a few small products a chunk.
// A chunk shorter than 64 is padded with zero rows (beta 0, no decay), which change nothing.

constexpr int kChunkT = 64;     // tokens a chunk
constexpr int kChunkCols = 32;  // state columns a block of the state pass
constexpr int kChunkMaxDk = 128;
constexpr int kChunkThreads = 256;
constexpr int64_t kChunkMinTokens = 16;  // below this the scan (its per-token steps are few)

// The work buffer, for T tokens padded to whole chunks (Tp): X = [U | -W] rows [Tp][hv][dv + dk],
// D o Q K^T [Tp / 64][hv][64][64], the cumulative log decays [Tp][hv].
struct ChunkWork {
  int64_t x, am, gamma, total;  // float offsets
  __host__ __device__ ChunkWork(int64_t T, int hv, int dk, int dv) {
    const int64_t tp = (T + kChunkT - 1) / kChunkT * kChunkT;
    x = 0;
    am = tp * hv * (dv + dk);
    gamma = am + tp * hv * kChunkT;
    total = gamma + tp * hv;
  }
};

constexpr int round4(int n) { return (n + 3) / 4 * 4; }

struct PrepSmem {  // float offsets, for key width dk
  int ld, k, q, l, gamma, eg, beta, total;
  __host__ __device__ explicit PrepSmem(int dk) {
    ld = dk + 1;  // K and Q rows padded: rows i and i + 1 at one d fall in different banks
    k = 0;
    q = k + kChunkT * ld;
    l = q + kChunkT * ld;  // L [64][65]
    gamma = l + kChunkT * (kChunkT + 1);
    eg = gamma + kChunkT;
    beta = eg + kChunkT;
    total = beta + kChunkT;
  }
};

// Phase one, a block per (chunk, value head). Scores as 4 x 4 register tiles (thread (ti, tj):
// rows ti + 16 a, columns tj + 16 b); then the forward substitution, a thread per column of
// [beta V | -beta e^gamma K] with the column's 64 rows in registers (no barrier: columns are
// independent, L is read by all).
__global__ void __launch_bounds__(kChunkThreads) delta_chunk_prep_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int64_t qkv_stride,
    const float* __restrict__ b, const float* __restrict__ a, int64_t ba_stride, const float* __restrict__ A_log,
    const float* __restrict__ dt_bias, int hk, int hv, int dk, int dv, int64_t T, float* __restrict__ work) {
  extern __shared__ float sm[];
  const PrepSmem P(dk);
  const ChunkWork W(T, hv, dk, dv);
  float *Kc = sm + P.k, *Qc = sm + P.q, *Lm = sm + P.l, *gam = sm + P.gamma, *eg = sm + P.eg, *bet = sm + P.beta;
  const int chunk = blockIdx.x, h = blockIdx.y, g = h / (hv / hk), tid = threadIdx.x, ld = P.ld;
  const int64_t t0 = int64_t(chunk) * kChunkT;
  const int n = int(T - t0 < kChunkT ? T - t0 : kChunkT);
  for (int e = tid; e < kChunkT * dk; e += kChunkThreads) {
    const int i = e / dk, d = e % dk;
    const int64_t row = (t0 + i) * qkv_stride + int64_t(g) * dk + d;
    Kc[i * ld + d] = i < n ? k[row] : 0.0f;
    Qc[i * ld + d] = i < n ? q[row] : 0.0f;
  }
  if (tid < kChunkT) {
    const int64_t t = t0 + tid;
    bet[tid] = tid < n ? sigmoidf_(b[t * ba_stride + h]) : 0.0f;
    gam[tid] = tid < n ? -expf(A_log[h]) * softplusf_(a[t * ba_stride + h] + dt_bias[h]) : 0.0f;
  }
  __syncthreads();
  if (tid < 32) {  // inclusive sum of the log decays: a warp, two per lane
    float x0 = gam[2 * tid], x1 = x0 + gam[2 * tid + 1];
    float run = x1;
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, run, off);
      if (tid >= off) run += y;
    }
    const float before = run - x1;
    gam[2 * tid] = before + x0;
    gam[2 * tid + 1] = run;
    eg[2 * tid] = expf(before + x0);
    eg[2 * tid + 1] = expf(run);
  }
  __syncthreads();
  if (tid < n) work[W.gamma + (t0 + tid) * hv + h] = gam[tid];

  // k_i.k_j and q_i.k_j for the 64 x 64 pairs.
  const int ti = tid / 16, tj = tid % 16;
  float kk[4][4] = {}, qk[4][4] = {};
  for (int d = 0; d < dk; ++d) {
    float ki[4], qi[4], kj[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      ki[r] = Kc[(ti + 16 * r) * ld + d];
      qi[r] = Qc[(ti + 16 * r) * ld + d];
      kj[r] = Kc[(tj + 16 * r) * ld + d];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        kk[r][c] = fmaf(ki[r], kj[c], kk[r][c]);
        qk[r][c] = fmaf(qi[r], kj[c], qk[r][c]);
      }
  }
  float* am = work + W.am + (int64_t(chunk) * hv + h) * kChunkT * kChunkT;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = ti + 16 * r, j = tj + 16 * c;
      const float D = j <= i ? expf(gam[i] - gam[j]) : 0.0f;
      Lm[i * (kChunkT + 1) + j] = j < i ? bet[i] * D * kk[r][c] : 0.0f;
      am[i * kChunkT + j] = i < n ? D * qk[r][c] : 0.0f;
    }
  __syncthreads();

  // X <- (I + L)^{-1} X, X's columns: beta V (dv of them), then -beta e^gamma K (dk).
  const int xw = dv + dk;
  for (int c = tid; c < xw; c += kChunkThreads) {
    float x[kChunkT];
#pragma unroll
    for (int i = 0; i < kChunkT; ++i) {
      float r = 0.0f;
      if (i < n)
        r = c < dv ? bet[i] * v[(t0 + i) * qkv_stride + int64_t(h) * dv + c] : -bet[i] * eg[i] * Kc[i * ld + c - dv];
#pragma unroll
      for (int j = 0; j < i; ++j) r = fmaf(-Lm[i * (kChunkT + 1) + j], x[j], r);
      x[i] = r;
    }
    float* out = work + W.x + (t0 * hv + h) * xw + c;
#pragma unroll
    for (int i = 0; i < kChunkT; ++i)
      if (i < n) out[int64_t(i) * hv * xw] = x[i];
  }
}

struct StateSmem {  // float offsets, for key width dk
  int ld, ld4, s, w, q, k, vp, am, eg, f, total;
  __host__ __device__ explicit StateSmem(int dk) {
    ld = dk + 1;        // -W and Q rows (read a row per half-warp)
    ld4 = round4(dk);   // K rows, read as float4
    s = 0;              // S slice [dk][32]
    w = s + dk * kChunkCols;
    q = round4(w + kChunkT * ld);
    k = round4(q + kChunkT * ld);
    vp = k + kChunkT * ld4;            // U, then V' [64][32]
    am = vp + kChunkT * kChunkCols;    // D o Q K^T [64][65]
    eg = am + kChunkT * (kChunkT + 1);
    f = eg + kChunkT;
    total = f + kChunkT;
  }
};

// Phase two, a block per (value head, 32 state columns), the chunks in order. Products over the
// chunk's 64 rows x 32 columns: thread (r, c2) takes rows r + 16 a and columns 2 c2, 2 c2 + 1; the
// state's update: thread (dg, c4) takes key dims 4 dg .. 4 dg + 3 and columns 4 c4 .. 4 c4 + 3.
__global__ void __launch_bounds__(kChunkThreads) delta_chunk_state_kernel(
    const float* __restrict__ q, const float* __restrict__ k, int64_t qkv_stride, float* S, int hk, int hv, int dk,
    int dv, int64_t T, const float* __restrict__ work, float* __restrict__ o) {
  extern __shared__ __align__(16) float sm[];
  const StateSmem L(dk);
  const ChunkWork W(T, hv, dk, dv);
  float *Ss = sm + L.s, *Wn = sm + L.w, *Qc = sm + L.q, *Kc = sm + L.k, *Vp = sm + L.vp, *Am = sm + L.am;
  float *eg = sm + L.eg, *fk = sm + L.f;
  const int h = blockIdx.y, g = h / (hv / hk), j0 = blockIdx.x * kChunkCols, tid = threadIdx.x;
  const int ld = L.ld, ld4 = L.ld4, xw = dv + dk;
  float* Sh = S + int64_t(h) * dk * dv;
  for (int e = tid; e < dk * kChunkCols; e += kChunkThreads)
    Ss[e] = Sh[int64_t(e / kChunkCols) * dv + j0 + e % kChunkCols];
  const int r0 = tid / 16, c2 = 2 * (tid % 16);  // products over the chunk's rows
  const int dg = 4 * (tid / 8), c4 = 4 * (tid % 8);  // the state's update

  for (int64_t t0 = 0, chunk = 0; t0 < T; t0 += kChunkT, ++chunk) {
    const int n = int(T - t0 < kChunkT ? T - t0 : kChunkT);
    __syncthreads();  // the previous chunk is done with every buffer
    if (tid < kChunkT) {
      const float gl = work[W.gamma + (t0 + n - 1) * hv + h];
      const float gi = tid < n ? work[W.gamma + (t0 + tid) * hv + h] : gl;
      eg[tid] = expf(gi);
      fk[tid] = expf(gl - gi);
    }
    const float* xr = work + W.x + (t0 * hv + h) * xw;
    for (int e = tid; e < kChunkT * kChunkCols; e += kChunkThreads) {
      const int i = e / kChunkCols, c = e % kChunkCols;
      Vp[e] = i < n ? xr[int64_t(i) * hv * xw + j0 + c] : 0.0f;
    }
    const float* am = work + W.am + (chunk * hv + h) * kChunkT * kChunkT;
    for (int e = tid; e < kChunkT * kChunkT; e += kChunkThreads) Am[(e / kChunkT) * (kChunkT + 1) + e % kChunkT] = am[e];
    __syncthreads();  // fk is in
    for (int e = tid; e < kChunkT * dk; e += kChunkThreads) {
      const int i = e / dk, d = e % dk;
      const bool in = i < n;
      const int64_t row = (t0 + i) * qkv_stride + int64_t(g) * dk + d;
      Wn[i * ld + d] = in ? xr[int64_t(i) * hv * xw + dv + d] : 0.0f;
      Qc[i * ld + d] = in ? q[row] : 0.0f;
      Kc[i * ld4 + d] = in ? k[row] * fk[i] : 0.0f;
    }
    __syncthreads();
    // V' = U + (-W) S.
    float acc[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      acc[r][0] = Vp[(r0 + 16 * r) * kChunkCols + c2];
      acc[r][1] = Vp[(r0 + 16 * r) * kChunkCols + c2 + 1];
    }
    for (int d = 0; d < dk; ++d) {
      const float2 s = *reinterpret_cast<const float2*>(Ss + d * kChunkCols + c2);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float w = Wn[(r0 + 16 * r) * ld + d];
        acc[r][0] = fmaf(w, s.x, acc[r][0]);
        acc[r][1] = fmaf(w, s.y, acc[r][1]);
      }
    }
    __syncthreads();  // every U is read
#pragma unroll
    for (int r = 0; r < 4; ++r)
      *reinterpret_cast<float2*>(Vp + (r0 + 16 * r) * kChunkCols + c2) = make_float2(acc[r][0], acc[r][1]);
    __syncthreads();
    // O = diag(e^gamma) Q S + (D o Q K^T) V'.
    float qs[4][2] = {}, av[4][2] = {};
    for (int d = 0; d < dk; ++d) {
      const float2 s = *reinterpret_cast<const float2*>(Ss + d * kChunkCols + c2);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float x = Qc[(r0 + 16 * r) * ld + d];
        qs[r][0] = fmaf(x, s.x, qs[r][0]);
        qs[r][1] = fmaf(x, s.y, qs[r][1]);
      }
    }
    for (int j = 0; j < kChunkT; ++j) {
      const float2 y = *reinterpret_cast<const float2*>(Vp + j * kChunkCols + c2);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float x = Am[(r0 + 16 * r) * (kChunkT + 1) + j];
        av[r][0] = fmaf(x, y.x, av[r][0]);
        av[r][1] = fmaf(x, y.y, av[r][1]);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = r0 + 16 * r;
      if (i < n) {
        float* out = o + (t0 + i) * int64_t(hv) * dv + int64_t(h) * dv + j0 + c2;
        out[0] = fmaf(eg[i], qs[r][0], av[r][0]);
        out[1] = fmaf(eg[i], qs[r][1], av[r][1]);
      }
    }
    __syncthreads();  // S is read above and written below
    // S <- e^{gamma_n} S + (diag(e^{gamma_n - gamma}) K)^T V'.
    if (dg < dk) {
      const float egl = eg[n - 1];
      float sv[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(Ss + (dg + r) * kChunkCols + c4);
        sv[r][0] = egl * x.x;
        sv[r][1] = egl * x.y;
        sv[r][2] = egl * x.z;
        sv[r][3] = egl * x.w;
      }
      for (int i = 0; i < kChunkT; ++i) {
        const float4 kv = *reinterpret_cast<const float4*>(Kc + i * ld4 + dg);
        const float4 y = *reinterpret_cast<const float4*>(Vp + i * kChunkCols + c4);
        const float kr[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          sv[r][0] = fmaf(kr[r], y.x, sv[r][0]);
          sv[r][1] = fmaf(kr[r], y.y, sv[r][1]);
          sv[r][2] = fmaf(kr[r], y.z, sv[r][2]);
          sv[r][3] = fmaf(kr[r], y.w, sv[r][3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
        *reinterpret_cast<float4*>(Ss + (dg + r) * kChunkCols + c4) = make_float4(sv[r][0], sv[r][1], sv[r][2], sv[r][3]);
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
  if (dk < 4 || dk > kChunkMaxDk || dk % 4 != 0 || dv % kChunkCols != 0) return false;
  const int64_t bytes = int64_t(std::max(PrepSmem(dk).total, StateSmem(dk).total)) * int64_t(sizeof(float));
  return bytes <= max_smem_per_block();  // dk 128 needs 142 KB: not on sm_86/89
}

int64_t delta_rule_chunked_work_floats(int64_t T, int hv, int dk, int dv) { return ChunkWork(T, hv, dk, dv).total; }

void delta_rule_chunked(const float* d_q, const float* d_k, const float* d_v, int64_t qkv_stride, const float* d_b,
                        const float* d_a, int64_t ba_stride, const float* d_A_log, const float* d_dt_bias, float* d_S,
                        int hk, int hv, int dk, int dv, int64_t T, float* d_work, float* d_o, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(hk >= 1 && hv % hk == 0 && delta_rule_chunked_takes(dk, dv) && T >= 0 && d_work);
  if (T == 0 || hv == 0) return;
  static const bool init = [] {
    const int cap = max_smem_per_block();  // takes() admits only shapes within it
    SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(delta_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             std::min<int>(cap, PrepSmem(kChunkMaxDk).total * int(sizeof(float)))));
    SWIFTLET_CUDA_CHECK(cudaFuncSetAttribute(delta_chunk_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             std::min<int>(cap, StateSmem(kChunkMaxDk).total * int(sizeof(float)))));
    return true;
  }();
  (void)init;
  const dim3 chunks(unsigned((T + kChunkT - 1) / kChunkT), unsigned(hv));
  delta_chunk_prep_kernel<<<chunks, kChunkThreads, PrepSmem(dk).total * sizeof(float), s>>>(
      d_q, d_k, d_v, qkv_stride, d_b, d_a, ba_stride, d_A_log, d_dt_bias, hk, hv, dk, dv, T, d_work);
  SWIFTLET_CUDA_LAUNCHED();
  const dim3 slices(unsigned(dv / kChunkCols), unsigned(hv));
  delta_chunk_state_kernel<<<slices, kChunkThreads, StateSmem(dk).total * sizeof(float), s>>>(
      d_q, d_k, qkv_stride, d_S, hk, hv, dk, dv, T, d_work, d_o);
  SWIFTLET_CUDA_LAUNCHED();
}

void delta_rule_norm_scan(const DeltaNetSpec& d, const float* d_u, int64_t u_stride, const float* d_b, const float* d_a,
                          int64_t ba_stride, float* d_S, const float* d_z, int64_t T, float* d_o, float* d_work,
                          GpuStream s) {
  const float *q = d_u, *k = d_u + d.key_dim(), *v = d_u + 2 * d.key_dim();
  // A prompt's chunks in the WY form where the shapes fit and a work buffer is given; short runs
  // and other shapes as the scan.
  if (d_work && T >= kChunkMinTokens && delta_rule_chunked_takes(d.dk, d.dv))
    delta_rule_chunked(q, k, v, u_stride, d_b, d_a, ba_stride, d.d_A_log, d.d_dt_bias, d_S, d.hk, d.hv, d.dk, d.dv, T,
                       d_work, d_o, s);
  else
    delta_rule_scan(q, k, v, u_stride, d_b, d_a, ba_stride, d.d_A_log, d.d_dt_bias, d_S, d.hk, d.hv, d.dk, d.dv, T, d_o,
                    s);
  gated_rms_norm(d_o, d_z, d.d_norm_w, T * d.hv, d.dv, d.eps, s);
}

}  // namespace swiftlet::cuda
