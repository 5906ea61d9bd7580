// fused_matvec: several matrices over one input in one launch, the decode's dense products
// (q/k/v, qkvz + ba, router + the shared expert's gate, an output projection added into the
// residual stream, lm_head), for affine 4/8-bit weights (MLX, model-math.md 8), with the input's
// RMSNorm on the fly. The three generations (decode_products.cuh) and the launch settings; the
// product loop is in product_device.cuh.
#include "kernels/cuda/decode_products.cuh"
#include "kernels/cuda/probe.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace swiftlet::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Several matrices over one input: the FP32 register kernel (any device).

struct Segment {
  const uint4* data;
  const void* scales;
  const void* biases;
  float* y;
  int rows;
  int add;  // y += W x instead of y = W x
  int rg0;  // first row group (of R rows) of this segment
  int64_t y_stride;  // fused_matvec_rows: token t's y at y + t y_stride (t = blockIdx.y)
};

struct MultiArgs {
  Segment seg[kMaxSegments];
  int n_seg, total_rg;
  int cols, gs, st;
  const float* x;
  const float* norm_w;  // null: x as it is
  float eps;
  float* x_out;  // block 0 writes the normed x here (when norm_w)
  int64_t x_stride;  // fused_matvec_rows: token t's x (and x_out) at x + t x_stride (t = blockIdx.y)
  int tokens;        // gridDim.y
  int stages, stage_bytes, ring_off;  // streamed products only (below)
  int tc_rbt;  // the tensor-core kernel's 16-row blocks a tile (fewer than tc_geom's for small matrices)
  int tpb;     // tc_matvec_tokens_kernel: tokens a block (grid row y: tokens y tpb ..), each tile used for all
  int xt_bytes;  // the bytes of one token's staged x there
  int cluster;   // tc_matvec_tokens_kernel: blocks a thread-block cluster that share the staging (1: none)
};

// 1 / sqrt(mean(x^2) + eps) over x[0..n), by the whole block (any size); synchronises it.
__device__ __forceinline__ float block_rms_inv(const float* x, int n, float eps, float* red) {
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
  ss = block_sum(ss, red);
  return rsqrtf(ss / float(n) + eps);
}

// This block's tile i of a's segments (tiles of `rows` rows, numbered from each segment's rg0):
// its segment si and first row r0.
__device__ __forceinline__ void segment_tile(const MultiArgs& a, int i, int rows, int& si, int& r0) {
  const int t = int(blockIdx.x) + i * int(gridDim.x);
  si = 0;
  while (si + 1 < a.n_seg && t >= a.seg[si + 1].rg0) ++si;
  r0 = (t - a.seg[si].rg0) * rows;
}

// The products' input value i: a.x[xo + i] (xo: the token's offset), or RMSNorm of that row when
// a.norm_w (inv: 1 / its rms), also written to a.x_out where `out`.
__device__ __forceinline__ float input_value(const MultiArgs& a, int64_t xo, float inv, int i, bool out) {
  float v = a.x[xo + i];
  if (a.norm_w) {
    v = v * inv * a.norm_w[i];
    if (out && a.x_out) a.x_out[xo + i] = v;
  }
  return v;
}
// Token blockIdx.y's output row of segment sg.
__device__ __forceinline__ float* segment_y(const Segment& sg) { return sg.y + token_offset(sg.y_stride); }
// 1 / rms of a.x when a.norm_w (else 1), by the whole block. `red`: 32 floats of shared memory.
__device__ __forceinline__ float input_rms_inv(const MultiArgs& a, int64_t xo, float* red) {
  return a.norm_w ? block_rms_inv(a.x + xo, a.cols, a.eps, red) : 1.0f;
}

// Stages the products' input (see stage; input_value).
template <int BITS>
__device__ __forceinline__ void stage_input(float* xs, const MultiArgs& a, float* red) {
  const int64_t xo = token_offset(a.x_stride);
  const float inv = input_rms_inv(a, xo, red);
  stage<BITS>(xs, a.cols, [&](int i) { return input_value(a, xo, inv, i, blockIdx.x == 0); });
}

template <int BITS, int R, int J>
__global__ void __launch_bounds__(kThreads) multi_matvec_kernel(const __grid_constant__ MultiArgs a) {
  constexpr int kPer = per_chunk<BITS>();
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  __shared__ float red[32];
  const int cols = a.cols;
  {  // this warp's weight rows into the L2 while the predecessor finishes
    const int lane = threadIdx.x & 31;
    const int64_t row_bytes = int64_t(cols) * BITS / 8, scale_bytes = int64_t(cols / a.gs) * (a.st == kScaleF32 ? 4 : 2);
    for (int rg = int(blockIdx.x) * kWarps + (threadIdx.x >> 5); rg < a.total_rg; rg += int(gridDim.x) * kWarps) {
      int si = 0;
      while (si + 1 < a.n_seg && rg >= a.seg[si + 1].rg0) ++si;
      const Segment& sg = a.seg[si];
      const int r0 = (rg - sg.rg0) * R, nr = sg.rows - r0 < R ? sg.rows - r0 : R;
      prefetch_lines(reinterpret_cast<const char*>(sg.data) + r0 * row_bytes, nr * row_bytes, lane);
      prefetch_lines(static_cast<const char*>(sg.scales) + r0 * scale_bytes, nr * scale_bytes, lane);
      prefetch_lines(static_cast<const char*>(sg.biases) + r0 * scale_bytes, nr * scale_bytes, lane);
    }
  }
  pdl_wait_and_release();
  stage_input<BITS>(xs, a, red);
  const float* sums = xs + cols + (cols + 31) / 32 * 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_chunks = cols / kPer, groups = cols / a.gs;
  int gc[J > 0 ? J : 1];
#pragma unroll
  for (int j = 0; j < (J > 0 ? J : 1); ++j) gc[j] = ((lane + 32 * j) * kPer) / a.gs;
  for (int rg = int(blockIdx.x) * kWarps + warp; rg < a.total_rg; rg += int(gridDim.x) * kWarps) {
    int si = 0;
    while (si + 1 < a.n_seg && rg >= a.seg[si + 1].rg0) ++si;
    const Segment& sg = a.seg[si];
    const int r0 = (rg - sg.rg0) * R;
    WarpRows<R> w;
#pragma unroll
    for (int i = 0; i < R; ++i) w.set(i, r0 + i, sg.rows, sg.data, sg.scales, sg.biases, n_chunks, groups);
    w.template dot<BITS, J>(gc, n_chunks, a.gs, a.st, xs, sums);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float v = warp_sum(w.acc[i]);
      if (lane == 0 && w.valid[i]) {
        float* y = segment_y(sg) + r0 + i;
        *y = sg.add ? *y + v : v;
      }
    }
  }
}

Segment segment_of(const GpuMatrix& m, float* y, bool add) {
  return {static_cast<const uint4*>(m.data), m.scales, m.biases, y, int(m.rows), add ? 1 : 0, 0, 0};
}

// Rows per warp: 2 where every warp of a full grid (2 blocks per SM) still gets a group, else 1.
// Not 4: at ~120 registers only 16 warps fit on an SM, and the product is latency-bound there
// (ncu on the H200: 0.34 instructions issued per scheduler-cycle, 0.6 eligible warps of 3.5).
int rows_per_warp(int64_t rows) {
  const int64_t warps = 2 * int64_t(sm_count()) * kWarps;
  return rows >= 2 * warps ? 2 : 1;
}

template <int BITS, int R>
void launch_multi(MultiArgs a, cudaStream_t s) {
  int groups = 0;
  for (int i = 0; i < a.n_seg; ++i) {
    a.seg[i].rg0 = groups;
    groups += (a.seg[i].rows + R - 1) / R;
  }
  a.total_rg = groups;
  const size_t smem = size_t(staged_floats<BITS>(a.cols)) * 4;
  const dim3 grid(token_blocks(grid_for(groups, R), a.tokens), unsigned(a.tokens));
  switch (fixed_chunks<BITS>(a.cols, R)) {
    case 2: launch_ex(multi_matvec_kernel<BITS, R, 2>, grid, kThreads, smem, s, true, a); break;
    case 4: launch_ex(multi_matvec_kernel<BITS, R, 4>, grid, kThreads, smem, s, true, a); break;
    default: launch_ex(multi_matvec_kernel<BITS, R, 0>, grid, kThreads, smem, s, true, a); break;
  }
  SWIFTLET_CUDA_LAUNCHED();
}

template <int BITS>
void launch_multi_rows(const MultiArgs& a, cudaStream_t s) {
  int64_t rows = 0;
  for (int i = 0; i < a.n_seg; ++i) rows += a.seg[i].rows;
  switch (rows_per_warp(rows)) {
    case 4: launch_multi<BITS, 4>(a, s); break;
    case 2: launch_multi<BITS, 2>(a, s); break;
    default: launch_multi<BITS, 1>(a, s); break;
  }
}

// ---------------------------------------------------------------------------------------------
// The streamed and tensor-core forms (sm_90).

// y_s = W_s x (or +=) for the segments of a, in tiles of kTileRows rows; block b takes tiles
// b, b + grid, ... Warp w computes rows 2w and 2w + 1 of each tile.
template <int BITS, int NW>
__global__ void __launch_bounds__(NW * 32, 16 / NW) stream_matvec_kernel(const __grid_constant__ MultiArgs a) {
  constexpr int kTileRows = 2 * NW;  // rows of a tile: 2 per warp
  constexpr int kPer = per_chunk<BITS>();
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  unsigned char* ring = reinterpret_cast<unsigned char*>(smem4) + a.ring_off;
  __shared__ uint64_t bars[kMaxStages];
  __shared__ float red[32];
  const int cols = a.cols, groups = cols / a.gs, S = a.stages;
  const uint32_t rb = uint32_t(cols) * BITS / 8, srb = uint32_t(groups) * (a.st == kScaleF32 ? 4u : 2u);
  const uint32_t sc_off = kTileRows * rb, bi_off = sc_off + align16(kTileRows * srb);
  const int mine = block_tiles(a.total_rg);
  auto locate = [&](int i, int& si, int& r0) { segment_tile(a, i, kTileRows, si, r0); };
  auto issue = [&](int i) {
    int si, r0;
    locate(i, si, r0);
    const Segment& sg = a.seg[si];
    const uint32_t nr = uint32_t(min(kTileRows, sg.rows - r0));
    const Range rs[3] = {{reinterpret_cast<const char*>(sg.data) + size_t(r0) * rb, nr * rb, 0},
                         {static_cast<const char*>(sg.scales) + size_t(r0) * srb, nr * srb, sc_off},
                         {static_cast<const char*>(sg.biases) + size_t(r0) * srb, nr * srb, bi_off}};
    issue_stage(ring + size_t(i % S) * a.stage_bytes, bars + i % S, rs, 3);
  };
  if (threadIdx.x == 0) {
    ring_init(bars, S);
    for (int i = 0; i < mine && i < S; ++i) issue(i);
  }
  pdl_wait_and_release();
  stage_input<BITS>(xs, a, red);
  const float* sums = xs + cols + (cols + 31) / 32 * 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_chunks = cols / kPer;
  for (int i = 0; i < mine; ++i) {
    stage_wait(bars + i % S, i / S);
    int si, r0;
    locate(i, si, r0);
    const Segment& sg = a.seg[si];
    const unsigned char* st = ring + size_t(i % S) * a.stage_bytes;
    const uint4* data[2];
    const void* scales[2];
    const void* biases[2];
    int64_t g0[2];
    bool valid[2];
    float acc[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int lr = 2 * warp + k;
      valid[k] = r0 + lr < sg.rows;
      data[k] = reinterpret_cast<const uint4*>(st + size_t(lr) * rb);
      scales[k] = st + sc_off;
      biases[k] = st + bi_off;
      g0[k] = int64_t(lr) * groups;
      acc[k] = 0.0f;
    }
    rows_dot<BITS, 2, true>(data, scales, biases, g0, valid, n_chunks, a.gs, a.st, xs, sums, acc);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float v = warp_sum(acc[k]);
      if (lane == 0 && valid[k]) {
        float* y = segment_y(sg) + r0 + 2 * warp + k;
        *y = sg.add ? *y + v : v;
      }
    }
    __syncthreads();  // every warp is done with the stage
    if (threadIdx.x == 0 && i + S < mine) issue(i + S);
  }
}

// stage_tc of the products' input (input_value; the normed x written to a.x_out where `out`).
// With a norm, where each warp's groups fit in one batch (a row of up to 4 groups a warp), x and
// the norm's weights are read once, into registers, for both the sum of squares and the staging:
// one round of reads after the PDL wait, not two.
template <int BITS>
__device__ __forceinline__ void stage_tc_input(unsigned char* xt, const MultiArgs& a, int64_t xo, float* red,
                                               bool out) {
  constexpr int kBatch = 4;
  const int groups = a.cols / kTcGs, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (!a.norm_w || groups > kBatch * nw) {
    const float inv = input_rms_inv(a, xo, red);
    stage_tc<BITS>(xt, a.cols, [&](int i) { return input_value(a, xo, inv, i, out); });
    return;
  }
  float v[kBatch][2], w[kBatch][2], ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kBatch; ++u)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int G = warp + u * nw, i = G * kTcGs + 32 * h + lane;
      v[u][h] = G < groups ? a.x[xo + i] : 0.0f;
      w[u][h] = G < groups ? a.norm_w[i] : 0.0f;
      ss = fmaf(v[u][h], v[u][h], ss);
    }
  const float inv = rsqrtf(block_sum(ss, red) / float(a.cols) + a.eps);
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int G = warp + u * nw;
    if (G >= groups) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      v[u][h] = v[u][h] * inv * w[u][h];
      if (out && a.x_out) a.x_out[xo + G * kTcGs + 32 * h + lane] = v[u][h];
    }
    stage_tc_group<BITS>(xt, tc_info(xt, a.cols), G, v[u]);
  }
  __syncthreads();
}

// The tiles of the tensor-core matvec kernels (tc_matvec_kernel, tc_matvec_tokens_kernel): 16 rbt
// rows of a segment, then their scales and biases (16-byte aligned), in the ring's stages; block b
// takes tiles b, b + grid, ...
template <int BITS, int NW>
struct TcMatvecTiles {
  const MultiArgs& a;
  unsigned char* ring;
  uint64_t* bars;
  TcGeom tg;
  int TR, S, mine;
  uint32_t rb, srb, sc_off, bi_off;
  __device__ TcMatvecTiles(const MultiArgs& args, unsigned char* r, uint64_t* b)
      : a(args), ring(r), bars(b), tg(tc_geom(args.cols, NW)) {
    tg.rbt = a.tc_rbt;
    TR = 16 * tg.rbt;
    S = a.stages;
    mine = block_tiles(a.total_rg);
    rb = uint32_t(a.cols) * BITS / 8;
    srb = uint32_t(tg.groups) * (a.st == kScaleF32 ? 4u : 2u);
    sc_off = uint32_t(TR) * rb;
    bi_off = sc_off + align16(uint32_t(TR) * srb);
  }
  // Tile i of this block: its segment and first row.
  __device__ const Segment& locate(int i, int& r0) const {
    int si;
    segment_tile(a, i, TR, si, r0);
    return a.seg[si];
  }
  __device__ const unsigned char* stage(int i) const { return ring + size_t(i % S) * a.stage_bytes; }
  __device__ void issue(int i) const {  // warp 0
    int r0;
    const Segment& sg = locate(i, r0);
    const uint32_t nr = uint32_t(min(TR, sg.rows - r0));
    const RowSet rows[1] = {{reinterpret_cast<const char*>(sg.data) + size_t(r0) * rb, nr, 0}};
    const Range ex[2] = {{static_cast<const char*>(sg.scales) + size_t(r0) * srb, nr * srb, sc_off},
                         {static_cast<const char*>(sg.biases) + size_t(r0) * srb, nr * srb, bi_off}};
    issue_rows(ring + size_t(i % S) * a.stage_bytes, bars + i % S, rows, rb, ex);
  }
  // Warp 0, before the PDL wait (the weights do not depend on the predecessor): the first stages.
  __device__ void start(bool pr) const {
    const int lane = threadIdx.x & 31;
    if (lane == 0) ring_init(bars, S);
    __syncwarp();
    for (int i = 0; i < mine && i < S; ++i) {
      issue(i);
      if (pr && i == 0) probe(kProbeProduct, 1);
    }
  }
  // The warp's rows of tile i's stage (TcPlace::rows) for the x staged as fr.
  __device__ void rows(const TcPlace& p, const TcFrags& fr, const unsigned char* st, float* part) const {
    const unsigned char* const sts[1] = {st};
    const void* const sc[1][2] = {{st + sc_off, st + sc_off}};
    const void* const bi[1][2] = {{st + bi_off, st + bi_off}};
    const int row[2] = {p.rbk * 16 + p.n, p.rbk * 16 + p.n + 8};
    float* const pt[1] = {part};
    p.rows<BITS, 1>(fr, sts, rb, sc, bi, row, tg.groups, a.st, pt);
  }
  // Row r0 + tr of segment sg for token row y (y_stride apart): its parts' sum stored or added.
  __device__ void store(const Segment& sg, float* y, int r0, int tr, const float* part) const {
    const float sum = tc_row_sum(part, tr, tg.iters);
    float* o = y + r0 + tr;
    *o = sg.add ? *o + sum : sum;
  }
};

// The static shared memory of a tensor-core matvec block for T tokens: the ring's barriers, the
// staging's reduction slots, and each token's row parts of a tile (two, so that the next tile's
// products need not wait for this one's stores).
template <int NW, int T>
struct TcMatvecShared {
  uint64_t bars[kMaxStages];
  float red[32];
  float part[2][T][NW * 16];
};

// y_s = W_s x (or +=) for the segments of a, in tiles of 16 rbt rows.
template <int BITS, int NW>
__global__ void __launch_bounds__(NW * 32, 16 / NW) tc_matvec_kernel(const __grid_constant__ MultiArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* xt = reinterpret_cast<unsigned char*>(smem4);
  __shared__ TcMatvecShared<NW, 1> sh;
  const TcMatvecTiles<BITS, NW> tl(a, xt + a.ring_off, sh.bars);
  const int mine = tl.mine, S = tl.S, TR = tl.TR;
  const int warp = threadIdx.x >> 5;
  // Probed: products of 300 to 1000 tiles (the 80B's in_proj_qkvz: 386), not the lm_head.
  const bool pr = a.total_rg >= 300 && a.total_rg <= 1000;
  if (pr) probe(kProbeProduct, 0);
  if (warp == 0) tl.start(pr);
  if (pr) probe(kProbeProduct, 2);
  pdl_wait_and_release();
  if (pr) probe(kProbeProduct, 3);
  stage_tc_input<BITS>(xt, a, token_offset(a.x_stride), sh.red, blockIdx.x == 0);
  if (pr) probe(kProbeProduct, 4);
  const TcWarp tw(xt, tl.tg);
  for (int i = 0; i < mine; ++i) {
    stage_wait(sh.bars + i % S, i / S);
    if (pr && i == 0) probe(kProbeProduct, 5);
    if (pr && i == mine - 1) probe(kProbeProduct, 6);
    int r0;
    const Segment& sg = tl.locate(i, r0);
    if (tw.busy) tl.rows(tw, tw.fr, tl.stage(i), sh.part[i & 1][0]);
    __syncthreads();  // every warp is done with the stage; the parts are in
    if (warp == 0) {
      if (i + S < mine) tl.issue(i + S);
    } else {
      const int tr = int(threadIdx.x) - 32;
      if (tr < TR && r0 + tr < sg.rows) tl.store(sg, segment_y(sg), r0, tr, sh.part[i & 1][0]);
    }
  }
  if (pr) probe(kProbeProduct, 7);
}

constexpr int kMaxBlockTokens = 8;
// Blocks of a thread-block cluster that share the tokens kernel's staging (stage_tc_shared).
constexpr int kStageCluster = 4;

// The block's nt tokens t0.. staged (stage_tc_input) by the a.cluster blocks of its thread-block
// cluster together: rank r stages tokens r, r + cluster, ..., then every block copies the others'
// from their shared memory. Each token's x (and the norm's weights) is read from L2 once a
// cluster, not once a block: at 8 tokens, 132 blocks would read ~17 MB a product where its weights
// are 1-14 MB. Cluster 0 writes the normed x. Ends with a cluster barrier (no block leaves while
// another reads its shared memory). sm_90 only, as are the tensor-core products.
template <int BITS>
__device__ __forceinline__ void stage_tc_shared(unsigned char* xt, const MultiArgs& a, int t0, int nt, float* red) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int C = a.cluster, rank = int(cl.block_rank());
  for (int u = rank; u < nt; u += C)
    stage_tc_input<BITS>(xt + size_t(u) * a.xt_bytes, a, int64_t(t0 + u) * a.x_stride, red, int(blockIdx.x) < C);
  cl.sync();
  const int per = a.xt_bytes / 16;  // xt_bytes: a multiple of 16
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nt * per; k += int(blockDim.x)) {
    const int u = k / per;
    if (u % C == rank) continue;
    uint4* mine = reinterpret_cast<uint4*>(xt + size_t(u) * a.xt_bytes) + (k - u * per);
    *mine = *cl.map_shared_rank(mine, u % C);
  }
  cl.sync();
#endif
}

// tc_matvec_kernel for up to kMaxBlockTokens tokens a block (fused_matvec_rows): the tokens are
// the MMAs' columns (tc_col_rows), each tile brought in once and multiplied once for all of them,
// token u's x staged at xt + u xt_bytes; each token's results equal its one-token kernel's.
template <int BITS, int NW>
__global__ void __launch_bounds__(NW * 32, 16 / NW) tc_matvec_tokens_kernel(const __grid_constant__ MultiArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* xt = reinterpret_cast<unsigned char*>(smem4);
  __shared__ TcMatvecShared<NW, kMaxBlockTokens> sh;
  const TcMatvecTiles<BITS, NW> tl(a, xt + a.ring_off, sh.bars);
  const int mine = tl.mine, S = tl.S, TR = tl.TR;
  const int t0 = int(blockIdx.y) * a.tpb, nt = min(a.tpb, a.tokens - t0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 0) tl.start(false);
  pdl_wait_and_release();
  if (a.cluster > 1)
    stage_tc_shared<BITS>(xt, a, t0, nt, sh.red);
  else
    for (int u = 0; u < nt; ++u)
      stage_tc_input<BITS>(xt + size_t(u) * a.xt_bytes, a, int64_t(t0 + u) * a.x_stride, sh.red, blockIdx.x == 0);
  const TcPlace tp(tl.tg);
  TcColFrags fr;
  tc_col_load(xt, a.xt_bytes, nt, tl.tg.groups, tp.it, fr);
  for (int i = 0; i < mine; ++i) {
    stage_wait(sh.bars + i % S, i / S);
    int r0;
    const Segment& sg = tl.locate(i, r0);
    if (tp.busy) {
      const unsigned char* st = tl.stage(i);
      float out[4];
      tc_col_rows<BITS>(st + size_t(tp.rbk) * 16 * tl.rb, tl.rb, fr, tp.it, tl.tg.groups, st + tl.sc_off,
                        st + tl.bi_off, tp.rbk * 16, a.st, out);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int u = 2 * (lane & 3) + (e & 1);
        if (u < nt) sh.part[i & 1][u][warp * 16 + (lane >> 2) + 8 * (e >> 1)] = out[e];
      }
    }
    __syncthreads();  // every warp is done with the stage; the parts are in
    if (warp == 0) {
      if (i + S < mine) tl.issue(i + S);
    } else {
      for (int k = int(threadIdx.x) - 32; k < nt * TR; k += int(blockDim.x) - 32) {
        const int u = k / TR, tr = k - u * TR;
        if (r0 + tr < sg.rows) tl.store(sg, sg.y + int64_t(t0 + u) * sg.y_stride, r0, tr, sh.part[i & 1][u]);
      }
    }
  }
}

template <int BITS, int NW>
bool stream_multi_nw(MultiArgs a, cudaStream_t s) {
  constexpr uint32_t kTileRows = 2 * NW;
  const uint32_t rb = uint32_t(a.cols) * BITS / 8, srb = uint32_t(a.cols / a.gs) * (a.st == kScaleF32 ? 4u : 2u);
  if (!plan_ring(a, size_t(staged_floats<BITS>(a.cols)) * 4, kTileRows * rb + 2 * align16(kTileRows * srb))) return false;
  int tiles = 0;
  for (int i = 0; i < a.n_seg; ++i) {
    if (!a16(a.seg[i].scales) || !a16(a.seg[i].biases)) return false;
    a.seg[i].rg0 = tiles;
    tiles += (a.seg[i].rows + int(kTileRows) - 1) / int(kTileRows);
  }
  a.total_rg = tiles;
  launch_streamed(stream_matvec_kernel<BITS, NW>, NW, kStreamSmem, tiles, a.tokens, ring_smem(a), s, a);
  return true;
}

// Warps per block of the streamed kernels: 8 (two blocks fit on an SM: this kernel's and its
// successor's) or 16.
template <int BITS>
bool stream_multi(const MultiArgs& a, cudaStream_t s) {
  return tuning().stream_warps == 16 ? stream_multi_nw<BITS, 16>(a, s) : stream_multi_nw<BITS, 8>(a, s);
}

template <int BITS>
bool tc_multi(MultiArgs a, cudaStream_t s) {
  constexpr int NW = kTcWarps;
  if (!tc_shape(a.cols, a.gs, BITS, NW)) return false;
  // Several tokens: as many a block as fit beside two stages of the widest tiles (the tokens
  // shared out evenly over the grid rows); one a block where not even two do, or where the scales
  // do not suit tc_col_rows (tc_col_fits).
  const uint32_t rb = uint32_t(a.cols) * BITS / 8, srb = scale_row_bytes(a.cols, a.gs, a.st);
  // 16 bytes past a multiple of 128: tc_col_rows' lanes t = 0..3 read their tokens' group facts
  // (tokens 2t + c) in different banks.
  a.xt_bytes = ((tc_staged_bytes(a.cols) + 127) & ~127) + 16;
  a.tpb = 1;
  if (a.tokens > 1 && tc_col_fits(a.cols / a.gs, a.st)) {
    const size_t stage = size_t(16 * tc_geom(a.cols, NW).rbt) * rb + 2 * align16(uint32_t(16 * tc_geom(a.cols, NW).rbt) * srb);
    const size_t fit = kTcSmem > 2 * stage ? (kTcSmem - 2 * stage) / size_t(a.xt_bytes) : 0;
    const int most = int(std::min<size_t>(fit, kMaxBlockTokens));
    if (most >= 2) {
      const int rows = (a.tokens + most - 1) / most;
      a.tpb = (a.tokens + rows - 1) / rows;
    }
  }
  const int grid_rows = (a.tokens + a.tpb - 1) / a.tpb;
  // Fewer rows a tile (warps idle) where full tiles would leave SMs without one: a small matrix
  // (the router's 513 rows: 17 tiles of 32) then loads over more SMs.
  auto tiles_of = [&](int rbt) {
    int t = 0;
    for (int i = 0; i < a.n_seg; ++i) t += (a.seg[i].rows + 16 * rbt - 1) / (16 * rbt);
    return t;
  };
  a.tc_rbt = tc_geom(a.cols, NW).rbt;
  const int blocks = int(token_blocks(sm_count(), grid_rows));
  while (a.tc_rbt > 1 && tiles_of(a.tc_rbt) < blocks) --a.tc_rbt;
  const int TR = 16 * a.tc_rbt;
  if (!plan_ring(a, size_t(a.tpb) * size_t(a.xt_bytes), uint32_t(TR) * rb + 2 * align16(uint32_t(TR) * srb), kTcSmem))
    return false;
  int tiles = 0;
  for (int i = 0; i < a.n_seg; ++i) {
    if (!a16(a.seg[i].data) || !a16(a.seg[i].scales) || !a16(a.seg[i].biases)) return false;
    a.seg[i].rg0 = tiles;
    tiles += (a.seg[i].rows + TR - 1) / TR;
  }
  a.total_rg = tiles;
  if (a.tpb > 1) {
    // A normed input's staging shared by clusters of kStageCluster blocks (stage_tc_shared) where a
    // block has a token for each of them and a grid row holds two or more clusters (docs/log/batching.md:
    // fewer tokens, or an input without a norm, do not gain).
    const bool share = a.norm_w && a.tpb >= kStageCluster;
    const auto kernel = tc_matvec_tokens_kernel<BITS, NW>;
    const int clustered =
        share ? cluster_blocks(kernel, NW, kTcSmem, tiles, grid_rows, ring_smem(a), kStageCluster) : 0;
    a.cluster = clustered > 0 ? kStageCluster : 1;
    launch_tc(kernel, clustered > 0 ? clustered : tiles, grid_rows, ring_smem(a), s, a,
              clustered > 0 ? unsigned(kStageCluster) : 0u);
  } else
    launch_tc(tc_matvec_kernel<BITS, NW>, tiles, a.tokens, ring_smem(a), s, a);
  return true;
}

}  // namespace

void fused_matvec(const MatvecSegment* segs, int n, const float* d_x, const float* d_norm_w, float eps,
                  float* d_x_out, GpuStream s) {
  fused_matvec_rows(segs, n, 1, d_x, 0, d_norm_w, eps, d_x_out, s);
}

void fused_matvec_rows(const MatvecSegment* segs, int n, int tokens, const float* d_x, int64_t x_stride,
                       const float* d_norm_w, float eps, float* d_x_out, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(n >= 0 && n <= kMaxSegments);
  SWIFTLET_CUDA_REQUIRE(!d_norm_w || d_x_out);
  SWIFTLET_CUDA_REQUIRE(tokens >= 1 && tokens <= 65535);
  int first = -1;
  bool fusable = true;
  for (int i = 0; i < n; ++i) {
    if (segs[i].w.rows == 0) continue;
    if (first < 0) first = i;
    fusable = fusable && affine_fusable(segs[i].w) && same_shape_kind(segs[i].w, segs[first].w);
  }
  if (first < 0) {  // nothing to multiply; the norm may still be wanted
    SWIFTLET_CUDA_REQUIRE(!d_norm_w);
    return;
  }
  const GpuMatrix& w0 = segs[first].w;
  const int bits = w0.bits;
  if (fusable) {
    const size_t smem = size_t(bits == 4 ? staged_floats<4>(int(w0.cols)) : staged_floats<8>(int(w0.cols))) * 4;
    fusable = smem <= kMaxSmem;
  }
  if (!fusable) {  // token by token, segment by segment
    for (int t = 0; t < tokens; ++t) {
      const float* x = d_x + t * x_stride;
      if (d_norm_w) {
        rms_norm(x, d_norm_w, 1, segs[first].w.cols, eps, d_x_out + t * x_stride, s);
        x = d_x_out + t * x_stride;
      }
      for (int i = 0; i < n; ++i) {
        if (segs[i].w.rows == 0) continue;
        float* y = segs[i].d_y + t * segs[i].y_stride;
        if (segs[i].add)
          matmul_add(segs[i].w, x, y, s);
        else
          matmul(segs[i].w, x, 1, y, s);
      }
    }
    return;
  }
  MultiArgs a{};
  for (int i = 0; i < n; ++i) {
    if (segs[i].w.rows == 0) continue;
    const GpuMatrix& m = segs[i].w;
    a.seg[a.n_seg] = segment_of(m, segs[i].d_y, segs[i].add);
    a.seg[a.n_seg++].y_stride = segs[i].y_stride;
  }
  a.cols = int(w0.cols);
  a.gs = w0.group_size;
  a.st = scale_type(w0.scale_dtype);
  a.x = d_x;
  a.norm_w = d_norm_w;
  a.eps = eps;
  a.x_out = d_x_out;
  a.x_stride = x_stride;
  a.tokens = tokens;
  if (tc_on() && (bits == 4 ? tc_multi<4>(a, s) : tc_multi<8>(a, s))) return;
  if (streaming() && (bits == 4 ? stream_multi<4>(a, s) : stream_multi<8>(a, s))) return;
  if (bits == 4)
    launch_multi_rows<4>(a, s);
  else
    launch_multi_rows<8>(a, s);
}

void prepare_fused_kernels() {
  const void* kernels[] = {
      reinterpret_cast<const void*>(multi_matvec_kernel<4, 1, 0>), reinterpret_cast<const void*>(multi_matvec_kernel<4, 1, 2>),
      reinterpret_cast<const void*>(multi_matvec_kernel<4, 1, 4>), reinterpret_cast<const void*>(multi_matvec_kernel<4, 2, 0>),
      reinterpret_cast<const void*>(multi_matvec_kernel<4, 2, 2>), reinterpret_cast<const void*>(multi_matvec_kernel<4, 2, 4>),
      reinterpret_cast<const void*>(multi_matvec_kernel<4, 4, 0>), reinterpret_cast<const void*>(multi_matvec_kernel<4, 4, 2>),
      reinterpret_cast<const void*>(multi_matvec_kernel<4, 4, 4>), reinterpret_cast<const void*>(multi_matvec_kernel<8, 1, 0>),
      reinterpret_cast<const void*>(multi_matvec_kernel<8, 1, 2>), reinterpret_cast<const void*>(multi_matvec_kernel<8, 1, 4>),
      reinterpret_cast<const void*>(multi_matvec_kernel<8, 2, 0>), reinterpret_cast<const void*>(multi_matvec_kernel<8, 2, 2>),
      reinterpret_cast<const void*>(multi_matvec_kernel<8, 2, 4>), reinterpret_cast<const void*>(multi_matvec_kernel<8, 4, 0>),
      reinterpret_cast<const void*>(multi_matvec_kernel<8, 4, 2>), reinterpret_cast<const void*>(multi_matvec_kernel<8, 4, 4>)};
  for (const void* k : kernels) occupancy(k, 0);
  for (const void* k : {reinterpret_cast<const void*>(stream_matvec_kernel<4, 8>), reinterpret_cast<const void*>(stream_matvec_kernel<8, 8>),
                        reinterpret_cast<const void*>(stream_matvec_kernel<4, 16>), reinterpret_cast<const void*>(stream_matvec_kernel<8, 16>)})
    if (tuning().capable) stream_opt_in(k);
  for (const void* k : {reinterpret_cast<const void*>(tc_matvec_kernel<4, kTcWarps>), reinterpret_cast<const void*>(tc_matvec_kernel<8, kTcWarps>),
                        reinterpret_cast<const void*>(tc_matvec_tokens_kernel<4, kTcWarps>),
                        reinterpret_cast<const void*>(tc_matvec_tokens_kernel<8, kTcWarps>)})
    if (tuning().capable) stream_opt_in(k, kTcSmem);
  detail::prepare_expert_kernels();
  (void)tuning();
  (void)sm_count();
}

void set_fused_launch(bool pdl, int blocks_per_sm) {
  tuning().pdl = pdl && tuning().capable;
  tuning().blocks_per_sm = blocks_per_sm;
}

void set_streamed_products(bool on, int warps) {
  tuning().stream = on && tuning().capable;
  tuning().stream_warps = warps == 8 ? 8 : 16;
}
bool streamed_products() { return streaming(); }
void set_tensor_core_products(bool on) { tuning().tc = on && tuning().capable; }
bool tensor_core_products() { return tc_on(); }

}  // namespace swiftlet::cuda
#ifdef SWIFTLET_GPU_PROBE
namespace swiftlet::cuda {
namespace {
unsigned long long* probe_buf = nullptr;
constexpr size_t kProbeWords = size_t(kProbeKinds) * kProbeBlocks * 2 * kProbeMarks;
}  // namespace

void probe_begin() {
  if (!probe_buf) SWIFTLET_CUDA_CHECK(cudaMalloc(&probe_buf, kProbeWords * 8));
  SWIFTLET_CUDA_CHECK(cudaMemset(probe_buf, 0, kProbeWords * 8));
  SWIFTLET_CUDA_CHECK(cudaMemcpyToSymbol(g_probe, &probe_buf, sizeof(probe_buf)));
  probe_install_experts(probe_buf);
  probe_install_deltanet(probe_buf);
}

std::string probe_end() {
  SWIFTLET_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long* none = nullptr;
  SWIFTLET_CUDA_CHECK(cudaMemcpyToSymbol(g_probe, &none, sizeof(none)));
  probe_install_experts(none);
  probe_install_deltanet(none);
  std::vector<unsigned long long> h(kProbeWords);
  SWIFTLET_CUDA_CHECK(cudaMemcpy(h.data(), probe_buf, kProbeWords * 8, cudaMemcpyDeviceToHost));
  struct Kind {
    const char* name;
    int wait;  // the mark after the PDL wait: time 0 is the first block's
    std::vector<const char*> marks;
  };
  const Kind kinds[kProbeKinds] = {
      {"tc_act (top-k + experts gate/up)", 2,
       {"entry", "shared tiles issued", "PDL wait", "top-k", "slot bases", "routed tiles issued", "x staged",
        "first tile in", "last tile in", "end"}},
      {"tc_down", 2, {"entry", "shared rows issued", "PDL wait", "routed rows issued", "act staged", "end"}},
      {"tc_matvec (300-1000 tiles: qkvz)", 3,
       {"entry", "first tile issued", "tiles issued", "PDL wait", "x normed + staged", "first tile in",
        "last tile in", "end"}},
      {"deltanet_step", 1, {"entry", "PDL wait", "conv + q/k norms", "q/k shared", "end"}},
  };
  std::string out;
  char line[256];
  for (int k = 0; k < kProbeKinds; ++k) {
    auto at = [&](int b) { return &h[(size_t(k) * kProbeBlocks + size_t(b)) * 2 * kProbeMarks]; };
    std::vector<int> blocks;
    for (int b = 0; b < kProbeBlocks; ++b)
      if (at(b)[0]) blocks.push_back(b);
    if (blocks.empty()) continue;
    unsigned long long t0 = ~0ull;
    for (int b : blocks) t0 = std::min(t0, at(b)[kinds[k].wait]);
    std::snprintf(line, sizeof line,
                  "probe %s, %zu blocks: us after the first block's PDL wait returned (min / median / max), "
                  "kcycles since the block's entry (median)\n",
                  kinds[k].name, blocks.size());
    out += line;
    for (size_t m = 0; m < kinds[k].marks.size(); ++m) {
      std::vector<double> us, kc;
      for (int b : blocks) {
        const unsigned long long* e = at(b);
        if (!e[m]) continue;
        us.push_back((double(e[m]) - double(t0)) / 1000.0);
        kc.push_back(double(e[kProbeMarks + m] - e[kProbeMarks]) / 1000.0);
      }
      if (us.empty()) continue;
      std::sort(us.begin(), us.end());
      std::sort(kc.begin(), kc.end());
      std::snprintf(line, sizeof line, "  %-22s %7.2f %7.2f %7.2f us   %7.2f kcyc\n", kinds[k].marks[m], us.front(),
                    us[us.size() / 2], us.back(), kc[kc.size() / 2]);
      out += line;
    }
  }
  return out;
}
}  // namespace swiftlet::cuda
#endif
