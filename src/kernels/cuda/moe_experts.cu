// The routed experts of one decode token (and the shared expert riding along as one more): the
// act (SiLU(gate x) * up x, optionally with the router's top-k taken inside: warp_topk) and the
// down products added into the residual stream (model-math.md 6). Each chosen expert's weights sit
// in a slot of the VRAM expert cache, found through a device table. Of decode_products.cuh's three
// generations the FP32 register kernels are here, the streamed and tensor-core ones of sm_90 in
// moe_experts_sm90.cu; the launches below choose. The T-token forms (a prompt's experts grouped per
// expert) are in matmul.cu.
#include "kernels/cuda/expert_device.cuh"

namespace swiftlet::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Routed (and shared) experts: the FP32 register kernels (any device).

// act[p][r] = SiLU(gate_p[r] x) * up_p[r] x. Row group g: part g / per_part, rows RP of it; each
// warp reads RP rows of gate and RP of up.
template <int BITS, int RP, int J>
__global__ void __launch_bounds__(kThreads) expert_act_kernel(const __grid_constant__ ExpertArgs a) {
  constexpr int kPer = per_chunk<BITS>();
  constexpr int R = 2 * RP;
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int H = a.H;
  pdl_wait_and_release();  // the ids come from the predecessor: nothing to prefetch before
  __shared__ size_t bases[kMaxParts];
  __shared__ int32_t ids[kMaxTopk];
  __shared__ float wts[kMaxTopk];
  // Routing here (expert_act_routed): warp 0 takes the top n of the logits, then stages its share
  // of x; the other warps stage x meanwhile.
  if (a.logits && threadIdx.x < 32) warp_topk<kActMaxE / 32>(tok_logits(a), a.E, a.n, a.renormalise, ids, wts);
  const float* x = tok_x(a);
  stage<BITS>(xs, H, [&](int i) { return x[i]; });  // ends with a barrier: ids are visible
  if (threadIdx.x < unsigned(a.parts)) {
    const int p = threadIdx.x;
    if (!a.logits) {
      bases[p] = part_base(a, p);
    } else {
      bases[p] = p < a.n ? reinterpret_cast<size_t>(a.table[ids[p]]) : size_t(0);
      if (blockIdx.x == 0 && p < a.n) tok_route_out(a, p, ids[p], wts[p]);
    }
  }
  __syncthreads();
  const float* sums = xs + H + (H + 31) / 32 * 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_chunks = H / kPer, groups = H / a.gs_in;
  const int per_part = (a.I + RP - 1) / RP, total = a.parts * per_part;
  int gc[J > 0 ? J : 1];
#pragma unroll
  for (int j = 0; j < (J > 0 ? J : 1); ++j) gc[j] = ((lane + 32 * j) * kPer) / a.gs_in;
  for (int rg = int(blockIdx.x) * kWarps + warp; rg < total; rg += int(gridDim.x) * kWarps) {
    const int p = rg / per_part, r0 = (rg - p * per_part) * RP;
    const size_t base = bases[p];
    const Part& gm = p < a.n ? a.gate : a.sh_gate;
    const Part& um = p < a.n ? a.up : a.sh_up;
    WarpRows<R> w;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const Part& m = i < RP ? gm : um;
      w.set(i, r0 + (i % RP), a.I, at<uint4>(base, m.data), at<void>(base, m.scales), at<void>(base, m.biases), n_chunks,
            groups);
    }
    w.template dot<BITS, J>(gc, n_chunks, a.gs_in, a.st_in, xs, sums);
#pragma unroll
    for (int i = 0; i < RP; ++i) {
      const float gv = warp_sum(w.acc[i]);
      const float uv = warp_sum(w.acc[RP + i]);
      if (lane == 0 && w.valid[i]) tok_y(a)[int64_t(p) * a.I + r0 + i] = siluf_(gv) * uv;
    }
  }
}

// h[r] += sum_p coef_p down_p[r] act[p]: coef_p = w[p] for the routed experts, sigmoid of the
// shared expert's gate logit for the shared one. Each warp owns R output rows; its lanes share out
// the chunks of all parts, so the sum over experts stays in one warp (no atomics).
// Prefetches into the L2 the down rows the warps of this block will take in down_rows (same
// grid-stride order over all warps of the grid), of every part, base(p) giving each part's slot.
template <int BITS, int R, typename Base>
__device__ __forceinline__ void prefetch_down_rows(const ExpertArgs& a, Base base_of) {
  const int lane = threadIdx.x & 31, nw = int(blockDim.x) >> 5;
  const int64_t row_bytes = int64_t(a.I) * BITS / 8, scale_bytes = int64_t(a.I / a.gs_out) * (a.st_out == kScaleF32 ? 4 : 2);
  for (int rg = int(blockIdx.x) * nw + (threadIdx.x >> 5); rg < (a.H + R - 1) / R; rg += int(gridDim.x) * nw) {
    const int r0 = rg * R, nr = a.H - r0 < R ? a.H - r0 : R;
    for (int p = 0; p < a.parts; ++p) {
      const size_t base = base_of(p);
      const Part& m = p < a.n ? a.down : a.sh_down;
      prefetch_lines(at<char>(base, m.data) + r0 * row_bytes, nr * row_bytes, lane);
      prefetch_lines(at<char>(base, m.scales) + r0 * scale_bytes, nr * scale_bytes, lane);
      prefetch_lines(at<char>(base, m.biases) + r0 * scale_bytes, nr * scale_bytes, lane);
    }
  }
}

// h[r] += sum_p coefs[p] down_p[r] act[p] for the rows of this block's warps (grid-stride over all
// warps of the grid, R rows each); act staged in xs (see stage), bases / coefs per part.
template <int BITS, int R>
__device__ __forceinline__ void down_rows(const ExpertArgs& a, const size_t* bases, const float* coefs,
                                          const float* xs, float* h) {
  constexpr int kPer = per_chunk<BITS>();
  const int n_in = a.parts * a.I;
  const float* sums = xs + n_in + (n_in + 31) / 32 * 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = int(blockDim.x) >> 5;
  const int part_chunks = a.I / kPer, groups = a.I / a.gs_out;
  const int total = a.parts * part_chunks;
  const int n_rg = (a.H + R - 1) / R;
  for (int rg = int(blockIdx.x) * nw + warp; rg < n_rg; rg += int(gridDim.x) * nw) {
    const int r0 = rg * R;
    bool valid[R];
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      valid[i] = r0 + i < a.H;
      acc[i] = 0.0f;
    }
#pragma unroll 2
    for (int t = lane; t < total; t += 32) {
      const int p = t / part_chunks, ch = t - p * part_chunks;
      const size_t base = bases[p];
      const Part& m = p < a.n ? a.down : a.sh_down;
      const uint4* data = at<uint4>(base, m.data);
      const int gc = (ch * kPer) / a.gs_out;
      uint4 pk[R];
      float sc[R], bi[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (!valid[i]) continue;
        const int64_t r = r0 + i;
        pk[i] = __ldg(data + r * part_chunks + ch);
        sc[i] = load_scale(at<void>(base, m.scales), r * groups + gc, a.st_out);
        bi[i] = load_scale(at<void>(base, m.biases), r * groups + gc, a.st_out);
      }
      float xr[kPer];
      load_chunk(xs, t, xr);
      const float xsum = sums[t], c = coefs[p];
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (valid[i]) acc[i] = fmaf(c, fmaf(sc[i], dot_chunk<BITS>(pk[i], xr), bi[i] * xsum), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float v = warp_sum(acc[i]);
      if (lane == 0 && valid[i]) h[r0 + i] += v;
    }
  }
}

// Threads < parts: each part's slot base and its coefficient in h (routing weight, or the shared
// expert's sigmoid gate); visible to the block after its next barrier.
__device__ __forceinline__ void down_parts(const ExpertArgs& a, size_t* bases, float* coefs) {
  if (threadIdx.x < unsigned(a.parts)) {
    const int p = threadIdx.x;
    bases[p] = part_base(a, p);
    coefs[p] = p < a.n ? tok_w(a, p) : tok_shared_gate(a);
  }
}

template <int BITS, int R>
__global__ void __launch_bounds__(kThreads) expert_down_kernel(const __grid_constant__ ExpertArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  __shared__ size_t bases[kMaxParts];
  __shared__ float coefs[kMaxParts];
  // The ids two kernels back (complete): this warp's rows of every part into the L2.
  if (a.ids_early) prefetch_down_rows<BITS, R>(a, [&](int p) { return part_base(a, p); });
  pdl_wait_and_release();
  down_parts(a, bases, coefs);
  const float* x = tok_x(a);
  stage<BITS>(xs, a.parts * a.I, [&](int i) { return x[i]; });
  down_rows<BITS, R>(a, bases, coefs, xs, tok_y(a));
}

Part part_of(const GpuMatrix& m) {
  return {reinterpret_cast<size_t>(m.data), reinterpret_cast<size_t>(m.scales), reinterpret_cast<size_t>(m.biases)};
}

ExpertArgs expert_args(const ExpertLayout& l, const void* const* table, const int32_t* ids, int n,
                       const SharedExpert* sh) {
  ExpertArgs a{};
  a.gate = part_of(l.gate);
  a.up = part_of(l.up);
  a.down = part_of(l.down);
  if (sh) {
    a.sh_gate = part_of(sh->gate);
    a.sh_up = part_of(sh->up);
    a.sh_down = part_of(sh->down);
    a.sh_gate_logit = sh->d_gate_logit;
  }
  a.table = table;
  a.ids = ids;
  a.n = n;
  a.parts = n + (sh ? 1 : 0);
  a.I = int(l.gate.rows);
  a.H = int(l.gate.cols);
  a.gs_in = l.gate.group_size;
  a.st_in = scale_type(l.gate.scale_dtype);
  a.gs_out = l.down.group_size;
  a.st_out = scale_type(l.down.scale_dtype);
  a.ids_early = true;
  a.tokens = 1;
  return a;
}

}  // namespace

namespace detail {
void prepare_expert_kernels() {
  const void* kernels[] = {
      reinterpret_cast<const void*>(expert_act_kernel<4, 1, 0>), reinterpret_cast<const void*>(expert_act_kernel<4, 1, 2>),
      reinterpret_cast<const void*>(expert_act_kernel<4, 1, 4>), reinterpret_cast<const void*>(expert_act_kernel<8, 1, 0>),
      reinterpret_cast<const void*>(expert_down_kernel<4, 1>),   reinterpret_cast<const void*>(expert_down_kernel<8, 1>)};
  for (const void* k : kernels) occupancy(k, 0);
  prepare_sm90_expert_kernels();
}
}  // namespace detail

bool experts_fusable(const ExpertLayout& l, int n, const SharedExpert* sh) {
  if (!(affine_fusable(l.gate) && affine_fusable(l.up) && affine_fusable(l.down))) return false;
  if (!same_shape_kind(l.gate, l.up) || l.gate.rows != l.up.rows || l.down.cols != l.gate.rows ||
      l.down.rows != l.gate.cols || l.gate.bits != l.down.bits)
    return false;
  if (sh) {
    if (!(affine_fusable(sh->gate) && affine_fusable(sh->up) && affine_fusable(sh->down))) return false;
    if (!same_shape_kind(sh->gate, l.gate) || !same_shape_kind(sh->up, l.up) || !same_shape_kind(sh->down, l.down))
      return false;
    if (sh->gate.rows != l.gate.rows || sh->up.rows != l.up.rows || sh->down.rows != l.down.rows) return false;
    if (!sh->d_gate_logit) return false;
  }
  const int parts = n + (sh ? 1 : 0);
  if (parts > kMaxParts) return false;
  const int bits = l.gate.bits;
  auto floats = [&](int m) { return bits == 4 ? staged_floats<4>(m) : staged_floats<8>(m); };
  return size_t(floats(int(l.gate.cols))) * 4 <= kMaxSmem &&
         size_t(floats(parts * int(l.down.cols))) * 4 <= kMaxSmem;
}

namespace {
void launch_act(ExpertArgs& a, int bits, cudaStream_t s) {
  if (tc_on() && tc_act(a, bits, s)) return;
  if (streaming() && stream_act(a, bits, s)) return;
  const size_t smem = size_t(bits == 4 ? staged_floats<4>(a.H) : staged_floats<8>(a.H)) * 4;
  // One row of gate and one of up per warp (two of each need ~120 registers: fewer warps per SM).
  const dim3 grid(token_blocks(grid_for(int64_t(a.parts) * a.I, 2), a.tokens), unsigned(a.tokens));
  if (bits == 4) {
    // The fixed-chunk loop where the shape allows.
    const int J = fixed_chunks<4>(a.H, 2);
    if (J == 2)
      launch_ex(expert_act_kernel<4, 1, 2>, grid, kThreads, smem, s, true, a);
    else if (J == 4)
      launch_ex(expert_act_kernel<4, 1, 4>, grid, kThreads, smem, s, true, a);
    else
      launch_ex(expert_act_kernel<4, 1, 0>, grid, kThreads, smem, s, true, a);
  } else {
    launch_ex(expert_act_kernel<8, 1, 0>, grid, kThreads, smem, s, true, a);
  }
  SWIFTLET_CUDA_LAUNCHED();
}
}  // namespace

void expert_act(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n,
                const SharedExpert* sh, const float* d_x, float* d_act, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(experts_fusable(l, n, sh));
  ExpertArgs a = expert_args(l, d_table, d_ids, n, sh);
  if (a.parts == 0) return;
  a.x = d_x;
  a.y = d_act;
  launch_act(a, l.gate.bits, s);
}

bool expert_act_routes(int E, int k) { return E >= 1 && E <= kActMaxE && k >= 1 && k <= kMaxTopk && k <= E; }

void expert_act_routed(const ExpertLayout& l, const void* const* d_table, const float* d_logits, int E, int k,
                       bool renormalise, const SharedExpert* sh, const float* d_x, int32_t* d_ids, float* d_w,
                       float* d_act, GpuStream s) {
  expert_act_routed_rows(l, d_table, d_logits, E, k, renormalise, sh, d_x, 1, d_ids, d_w, d_act, s);
}

void expert_act_routed_rows(const ExpertLayout& l, const void* const* d_table, const float* d_logits, int E, int k,
                            bool renormalise, const SharedExpert* sh, const float* d_x, int tokens, int32_t* d_ids,
                            float* d_w, float* d_act, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(experts_fusable(l, k, sh) && expert_act_routes(E, k));
  SWIFTLET_CUDA_REQUIRE(tokens >= 1 && tokens <= 65535);
  // Its own top-k of each token's E logits; ids and weights written out.
  ExpertArgs a = expert_args(l, d_table, nullptr, k, sh);
  a.y = d_act;
  a.logits = d_logits;
  a.E = E;
  a.renormalise = renormalise;
  a.ids_out = d_ids;
  a.w_out = d_w;
  a.x = d_x;
  a.tokens = tokens;
  a.x_stride = a.H;
  a.y_stride = int64_t(a.parts) * a.I;
  a.logits_stride = E;
  a.ids_stride = k;
  launch_act(a, l.gate.bits, s);
}

void expert_down_add(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, const float* d_w, int n,
                     const SharedExpert* sh, const float* d_act, float* d_h, GpuStream s, bool ids_early) {
  expert_down_add_rows(l, d_table, d_ids, d_w, n, sh, d_act, 1, d_h, s, ids_early);
}

void expert_down_add_rows(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, const float* d_w,
                          int n, const SharedExpert* sh, const float* d_act, int tokens, float* d_h, GpuStream s,
                          bool ids_early) {
  SWIFTLET_CUDA_REQUIRE(experts_fusable(l, n, sh));
  SWIFTLET_CUDA_REQUIRE(tokens >= 1 && tokens <= 65535);
  ExpertArgs a = expert_args(l, d_table, d_ids, n, sh);
  a.ids_early = ids_early;
  a.tokens = tokens;
  a.x_stride = int64_t(a.parts) * a.I;
  a.y_stride = a.H;
  a.ids_stride = n;
  a.sg_stride = 1;
  if (a.parts == 0) return;
  a.x = d_act;
  a.w = d_w;
  a.y = d_h;
  const int bits = l.down.bits;
  const int n_in = a.parts * a.I;
  if (tc_on() && tc_down(a, bits, s)) return;
  const size_t smem = size_t(bits == 4 ? staged_floats<4>(n_in) : staged_floats<8>(n_in)) * 4;
  // One row per warp: ~40 registers, many warps per SM.
  const dim3 grid(token_blocks(grid_for(a.H, 1), a.tokens), unsigned(a.tokens));
  if (bits == 4)
    launch_ex(expert_down_kernel<4, 1>, grid, kThreads, smem, s, true, a);
  else
    launch_ex(expert_down_kernel<8, 1>, grid, kThreads, smem, s, true, a);
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
