// The routed experts of one decode token (and the shared expert riding along as one more): the
// act (SiLU(gate x) * up x, optionally with the router's top-k taken inside: warp_topk) and the
// down products added into the residual stream (model-math.md 6), in the three generations of
// decode_products.cuh. Each chosen expert's weights sit in a slot of the VRAM expert cache, found
// through a device table. The T-token forms (a prompt's experts grouped per expert) are in
// matmul.cu.
#include "kernels/cuda/decode_products.cuh"
#include "kernels/cuda/probe.cuh"

#include <algorithm>

namespace swiftlet::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// The top-k inside the act kernel.

// The same top k by one warp, with no block barrier (expert_act_routed runs it in warp 0 while the
// other warps stage x): lane l holds logits l, l + 32, ... (PER of them, E <= 32 PER). The same
// softmax and order (ties to the lower index) as block_topk; the softmax sum runs in another
// order, so the weights may differ from router_topk's in the last bits. Lane 0 writes ids, lanes
// < k the weights.
//
// A probability p >= 0 orders as its bits, so each is a key (bits + 1; 0: no expert, or taken) and
// a round of the selection is two warp reductions (__reduce_max_sync of the lanes' best keys, then
// __reduce_min_sync of the indices holding that key) and the winner lane's new best, by a tree
// over its PER keys that keeps the lower index on ties. (Ten rounds of shuffle argmax over all
// PER values took ~5 us of the act kernel's critical path.)
template <int PER>
__device__ __forceinline__ void warp_topk(const float* __restrict__ lr, int E, int k, bool renormalise, int32_t* ids,
                                          float* weights) {
  static_assert((PER & (PER - 1)) == 0, "PER: a power of two");
  const int lane = threadIdx.x & 31;
  float p[PER];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = lane + 32 * j;
    p[j] = i < E ? __ldcg(lr + i) : -INFINITY;
    m = fmaxf(m, p[j]);
  }
  m = detail::warp_max(m);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const float e = lane + 32 * j < E ? expf(p[j] - m) : 0.0f;
    p[j] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  uint32_t key[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) key[j] = lane + 32 * j < E ? __float_as_uint(p[j] * inv) + 1u : 0u;
  // The lane's best key and its j (the lowest j among equal keys).
  auto best_of = [&](uint32_t& best, int& bj) {
    uint32_t kk[PER];
    int jj[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      kk[j] = key[j];
      jj[j] = j;
    }
#pragma unroll
    for (int w = 1; w < PER; w *= 2)
#pragma unroll
      for (int j = 0; j < PER; j += 2 * w)
        if (kk[j + w] > kk[j]) {  // ties keep the lower block
          kk[j] = kk[j + w];
          jj[j] = jj[j + w];
        }
    best = kk[0];
    bj = jj[0];
  };
  uint32_t best;
  int bj;
  best_of(best, bj);
  float sum = 0.0f;
  for (int r = 0; r < k; ++r) {
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const uint32_t win = __reduce_min_sync(0xffffffffu, best == top ? uint32_t(lane + 32 * bj) : 0xffffffffu);
    const float pv = __uint_as_float(top - 1u);
    sum += pv;
    if (lane == 0) {
      ids[r] = int32_t(win);
      weights[r] = pv;
    }
    if (lane == int(win & 31u)) {
#pragma unroll
      for (int j = 0; j < PER; ++j)
        if (j == bj) key[j] = 0u;  // taken
      best_of(best, bj);
    }
  }
  __syncwarp();
  if (renormalise && lane < k) weights[lane] /= sum;
}

// ---------------------------------------------------------------------------------------------
// Routed (and shared) experts: the FP32 register kernels (any device).

struct Part {  // a matrix of an expert: byte offsets from the slot base, or addresses (base 0)
  size_t data, scales, biases;
};
struct ExpertArgs {
  Part gate, up, down;           // routed experts: offsets in the slot
  Part sh_gate, sh_up, sh_down;  // the shared expert: addresses
  const void* const* table;
  const int32_t* ids;
  int n;      // routed experts
  int parts;  // n, or n + 1 with the shared expert
  int I, H;   // intermediate and hidden sizes
  int gs_in, st_in, gs_out, st_out;
  const float* x;  // [H] for gate/up; act [parts][I] for down
  const float* w;  // [n] routing weights
  const float* sh_gate_logit;
  float* y;  // act [parts][I] for gate/up; h [H] for down
  // expert_act_routed: the router's logits [E]; every block takes the top n itself, block 0 writes
  // them to ids / w for expert_down_add. Null: the ids come from memory.
  const float* logits;
  int E;  // experts
  bool renormalise;
  int32_t* ids_out;
  float* w_out;
  // expert_down: the ids were written two kernels back (router_topk), so they can be read for the
  // L2 prefetch before the wait; not so after expert_act_routed.
  bool ids_early;
  int stages, stage_bytes, ring_off;  // streamed products only (below)
  // The rows forms (expert_act_rows, expert_down_add_rows): token t = blockIdx.y of `tokens` reads
  // and writes its arrays at these strides, in elements: x, y, logits, ids and w (in and out alike),
  // the shared expert's gate logit. One token: 0.
  int64_t x_stride, y_stride, logits_stride, ids_stride, sg_stride;
  int tokens;
};

// This block's token's x, y, logits, ids, weights, ids / weights out and shared gate logit.
__device__ __forceinline__ const float* tok_x(const ExpertArgs& a) { return a.x + token_offset(a.x_stride); }
__device__ __forceinline__ float* tok_y(const ExpertArgs& a) { return a.y + token_offset(a.y_stride); }
__device__ __forceinline__ const float* tok_logits(const ExpertArgs& a) {
  return a.logits + token_offset(a.logits_stride);
}
__device__ __forceinline__ const int32_t* tok_ids(const ExpertArgs& a) { return a.ids + token_offset(a.ids_stride); }
__device__ __forceinline__ float tok_w(const ExpertArgs& a, int p) { return a.w[token_offset(a.ids_stride) + p]; }
__device__ __forceinline__ void tok_route_out(const ExpertArgs& a, int p, int32_t id, float w) {
  a.ids_out[token_offset(a.ids_stride) + p] = id;
  a.w_out[token_offset(a.ids_stride) + p] = w;
}
__device__ __forceinline__ float tok_shared_gate(const ExpertArgs& a) {
  return sigmoidf_(a.sh_gate_logit[token_offset(a.sg_stride)]);
}


// Part p's slot base as an integer (0 for the shared expert, whose offsets are addresses).
__device__ __forceinline__ size_t part_base(const ExpertArgs& a, int p) {
  return p < a.n ? reinterpret_cast<size_t>(a.table[tok_ids(a)[p]]) : size_t(0);
}
template <typename T>
__device__ __forceinline__ const T* at(size_t base, size_t off) {
  return reinterpret_cast<const T*>(base + off);
}

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
    const uint4* data[R];
    const void* scales[R];
    const void* biases[R];
    int64_t g0[R];
    bool valid[R];
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const Part& m = i < RP ? gm : um;
      const int64_t r = r0 + (i % RP);
      valid[i] = r < a.I;
      data[i] = at<uint4>(base, m.data) + r * n_chunks;
      scales[i] = at<void>(base, m.scales);
      biases[i] = at<void>(base, m.biases);
      g0[i] = r * groups;
      acc[i] = 0.0f;
    }
    if constexpr (J > 0)
      rows_dot_fixed<BITS, R, J>(data, scales, biases, g0, valid, gc, a.st_in, xs, sums, acc);
    else
      rows_dot<BITS, R>(data, scales, biases, g0, valid, n_chunks, a.gs_in, a.st_in, xs, sums, acc);
#pragma unroll
    for (int i = 0; i < RP; ++i) {
      const float gv = warp_sum(acc[i]);
      const float uv = warp_sum(acc[RP + i]);
      if (lane == 0 && valid[i]) tok_y(a)[int64_t(p) * a.I + r0 + i] = siluf_(gv) * uv;
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

// ---------------------------------------------------------------------------------------------
// The streamed act (sm_90).

// The experts' parts in streaming order: the shared expert (its address known before the wait)
// first, then the routed ones. Returns the part's index in act / ids (the shared expert is n).
__device__ __forceinline__ int part_at(const ExpertArgs& a, int q) {
  const bool sh = a.parts > a.n;
  return sh ? (q == 0 ? a.n : q - 1) : q;
}

// The act's tiles, as ActStream and ActStreamTc (below) share them: kR rows of gate, then the same
// rows of up, of one part, then gate's scales and biases and up's (16-byte aligned); block b takes
// tiles b, b + grid, ... Derived::issue(i) brings tile i into its stage.
template <typename Derived>
struct ActTiles {
  const ExpertArgs& a;
  unsigned char* ring;
  uint64_t* bars;
  const size_t* bases;  // slot base of each routed part
  int kR, groups, S, per_part, mine;
  uint32_t rb, srb, up_off, gs_off, gb_off, us_off, ub_off;
  int issued = 0;  // the issuing thread's (or warp's) count of tiles issued

  __device__ ActTiles(const ExpertArgs& args, unsigned char* r, uint64_t* b, const size_t* bs, int rows, int bits)
      : a(args), ring(r), bars(b), bases(bs), kR(rows) {
    groups = a.H / a.gs_in;
    S = a.stages;
    rb = uint32_t(a.H) * uint32_t(bits) / 8;
    srb = uint32_t(groups) * (a.st_in == kScaleF32 ? 4u : 2u);
    const uint32_t s16 = align16(uint32_t(kR) * srb);
    up_off = uint32_t(kR) * rb;
    gs_off = 2 * up_off;
    gb_off = gs_off + s16;
    us_off = gb_off + s16;
    ub_off = us_off + s16;
    per_part = (a.I + kR - 1) / kR;
    const int total = a.parts * per_part;
    mine = block_tiles(total);
  }
  // Tile i of this block: its part's index q in streaming order and first row.
  __device__ void locate(int i, int& q, int& r0) const {
    const int t = int(blockIdx.x) + i * int(gridDim.x);
    q = t / per_part;
    r0 = (t - q * per_part) * kR;
  }
  // Tile i's sources: its rows of gate and of up (with their places in the stage) and the ranges of
  // their scales and biases.
  __device__ void sources(int i, RowSet (&rows)[2], Range (&ex)[4]) const {
    int q, r0;
    locate(i, q, r0);
    const int p = part_at(a, q);
    const size_t base = p < a.n ? bases[p] : size_t(0);
    const Part& gm = p < a.n ? a.gate : a.sh_gate;
    const Part& um = p < a.n ? a.up : a.sh_up;
    const uint32_t nr = uint32_t(min(kR, a.I - r0));
    rows[0] = {at<char>(base, gm.data) + size_t(r0) * rb, nr, 0};
    rows[1] = {at<char>(base, um.data) + size_t(r0) * rb, nr, up_off};
    ex[0] = {at<char>(base, gm.scales) + size_t(r0) * srb, nr * srb, gs_off};
    ex[1] = {at<char>(base, gm.biases) + size_t(r0) * srb, nr * srb, gb_off};
    ex[2] = {at<char>(base, um.scales) + size_t(r0) * srb, nr * srb, us_off};
    ex[3] = {at<char>(base, um.biases) + size_t(r0) * srb, nr * srb, ub_off};
  }
  // Before the ids are known: the first tiles while they are the shared expert's.
  __device__ void issue_shared() {
    const bool sh = a.parts > a.n;
    while (issued < mine && issued < S && sh && (int(blockIdx.x) + issued * int(gridDim.x)) / per_part == 0)
      static_cast<Derived*>(this)->issue(issued++);
  }
  // Tiles up to `limit` (the ring's depth ahead of the tile being computed).
  __device__ void issue_upto(int limit) {
    while (issued < mine && issued < limit) static_cast<Derived*>(this)->issue(issued++);
  }
};

// expert_act streamed: a tile is NW rows of gate and the same rows of up of one part; warp w
// computes act[p][r0 + w] = SiLU(gate row) * up row. The block's part of the work, as device
// functions of stream_act_kernel (below): the tiles are issued by
// thread 0 (the shared expert's before the PDL wait, the routed ones once `bases` holds their slots).
template <int BITS, int NW>
struct ActStream : ActTiles<ActStream<BITS, NW>> {
  using Base = ActTiles<ActStream<BITS, NW>>;
  using Base::a, Base::ring, Base::bars, Base::S, Base::mine, Base::rb, Base::up_off, Base::gs_off, Base::gb_off,
      Base::us_off, Base::ub_off, Base::groups, Base::locate, Base::issue_upto;

  __device__ ActStream(const ExpertArgs& args, unsigned char* r, uint64_t* b, const size_t* bs)
      : Base(args, r, b, bs, NW, BITS) {}
  __device__ void issue(int i) {  // thread 0
    RowSet rows[2];
    Range ex[4];
    this->sources(i, rows, ex);
    const Range rs[6] = {{rows[0].src, rows[0].nr * rb, rows[0].dst_off}, {rows[1].src, rows[1].nr * rb, rows[1].dst_off},
                         ex[0], ex[1], ex[2], ex[3]};
    issue_stage(ring + size_t(i % S) * a.stage_bytes, bars + i % S, rs, 6);
  }
  // Thread 0, before the ids are known: init, then the shared expert's first tiles.
  __device__ void start() {
    ring_init(bars, S);
    this->issue_shared();
  }
  // Every thread: the block's tiles, x staged in xs; act[p][r] into a.y.
  __device__ void compute(const float* xs) {
    constexpr int kPer = per_chunk<BITS>();
    const float* sums = xs + a.H + (a.H + 31) / 32 * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = a.H / kPer;
    for (int i = 0; i < mine; ++i) {
      stage_wait(bars + i % S, i / S);
      int q, r0;
      locate(i, q, r0);
      const int p = part_at(a, q);
      const unsigned char* st = ring + size_t(i % S) * a.stage_bytes;
      const bool ok = r0 + warp < a.I;
      const uint4* data[2] = {reinterpret_cast<const uint4*>(st + size_t(warp) * rb),
                              reinterpret_cast<const uint4*>(st + up_off + size_t(warp) * rb)};
      const void* scales[2] = {st + gs_off, st + us_off};
      const void* biases[2] = {st + gb_off, st + ub_off};
      const int64_t g0[2] = {int64_t(warp) * groups, int64_t(warp) * groups};
      const bool valid[2] = {ok, ok};
      float acc[2] = {0.0f, 0.0f};
      rows_dot<BITS, 2, true>(data, scales, biases, g0, valid, n_chunks, a.gs_in, a.st_in, xs, sums, acc);
      const float gv = warp_sum(acc[0]), uv = warp_sum(acc[1]);
      if (lane == 0 && ok) tok_y(a)[int64_t(p) * a.I + r0 + warp] = siluf_(gv) * uv;
      __syncthreads();  // every warp is done with the stage
      if (threadIdx.x == 0) issue_upto(i + 1 + S);
    }
  }
};

// Warp 0: the ids (its own top-k of a.logits, or from memory) into ids / wts, then each routed
// part's slot base, one lane per part (parallel loads, not a chain in thread 0), and 0 for the
// shared expert; block 0 writes the routed ids and weights out.
__device__ __forceinline__ void route_warp(const ExpertArgs& a, int32_t* ids, float* wts, size_t* bases) {
  if (a.logits) warp_topk<kActMaxE / 32>(tok_logits(a), a.E, a.n, a.renormalise, ids, wts);
  probe(kProbeAct, 3);  // the top-k
  __syncwarp();
  const int p = threadIdx.x & 31;
  if (p < a.n) {
    const int32_t id = a.logits ? ids[p] : tok_ids(a)[p];
    bases[p] = reinterpret_cast<size_t>(a.table[id]);
    if (a.logits && blockIdx.x == 0) tok_route_out(a, p, id, wts[p]);
  } else if (p < a.parts) {
    bases[p] = 0;  // the shared expert: its offsets are addresses
  }
  __syncwarp();
  probe(kProbeAct, 4);  // the slot bases
}

template <int BITS, int NW>
__global__ void __launch_bounds__(NW * 32, 16 / NW) stream_act_kernel(const __grid_constant__ ExpertArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  __shared__ uint64_t bars[kMaxStages];
  __shared__ int32_t ids[kMaxTopk];
  __shared__ float wts[kMaxTopk];
  __shared__ size_t bases[kMaxParts];
  ActStream<BITS, NW> act(a, reinterpret_cast<unsigned char*>(smem4) + a.ring_off, bars, bases);
  if (threadIdx.x == 0) act.start();
  pdl_wait_and_release();
  if (threadIdx.x < 32) {
    route_warp(a, ids, wts, bases);
    if (threadIdx.x == 0) act.issue_upto(act.S);
  }
  const float* x = tok_x(a);
  stage<BITS>(xs, a.H, [&](int i) { return x[i]; });
  act.compute(xs);
}

// ---------------------------------------------------------------------------------------------
// On the tensor cores (sm_90).

// expert_act on the tensor cores: a tile is kR = 8 rbt rows of gate and the same rows of up of one
// part, gate's then up's (its 16-row blocks: gate's, then up's; with rbt = 1 the one block holds 8
// of each). Issued by warp 0 (start, issue_upto), computed by every warp (compute): tc_act_kernel's
// body.
template <int BITS, int NW>
struct ActStreamTc : ActTiles<ActStreamTc<BITS, NW>> {
  using Base = ActTiles<ActStreamTc<BITS, NW>>;
  using Base::a, Base::ring, Base::bars, Base::S, Base::mine, Base::rb, Base::kR, Base::gs_off,
      Base::gb_off, Base::us_off, Base::ub_off, Base::locate, Base::issue_upto;
  float (*part)[NW * 16];  // [4]
  TcGeom tg;

  __device__ ActStreamTc(const ExpertArgs& args, unsigned char* r, uint64_t* b, const size_t* bs,
                         float (*pt)[NW * 16])
      : Base(args, r, b, bs, 8 * tc_geom(args.H, NW).rbt, BITS), part(pt), tg(tc_geom(args.H, NW)) {}
  __device__ void issue(int i) {  // warp 0
    RowSet rows[2];
    Range ex[4];
    this->sources(i, rows, ex);
    issue_rows(ring + size_t(i % S) * a.stage_bytes, bars + i % S, rows, rb, ex);
  }
  // Warp 0, before the ids are known: init, then the shared expert's first tiles.
  __device__ void start() {
    if ((threadIdx.x & 31) == 0) ring_init(bars, S);
    __syncwarp();
    this->issue_shared();
  }
  // Every thread: the block's tiles, x staged in xt (stage_tc); act[p][r] into a.y. Two tiles a
  // round (one when a single one is left): each warp's products of the two are independent
  // instruction streams, and the round ends with one barrier, after which warp 0 issues the next
  // tiles and warp 1 + j sums tile j's rows. part holds four tiles' sums (a round's readers are
  // done before the round after next writes them).
  __device__ void compute(const unsigned char* xt) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = warp - 1;
    const TcWarp tw(xt, tg);
    for (int i = 0; i < mine; i += 2) {
      const int nt = min(2, mine - i);
      stage_wait(bars + i % S, i / S);
      if (nt == 2) stage_wait(bars + (i + 1) % S, (i + 1) / S);
      if (i == 0) probe(kProbeAct, 7);
      if (i + nt == mine) probe(kProbeAct, 8);
      if (tw.busy) {
        if (nt == 2) tile_rows<2>(tw, i);
        else tile_rows<1>(tw, i);
      }
      int q = 0, r0 = 0;
      if (j >= 0 && j < nt) locate(i + j, q, r0);  // before the barrier, off the summing warp's path
      __syncthreads();  // every warp is done with the stages; the parts are in
      if (warp == 0) {
        issue_upto(i + nt + S);
      } else if (j < nt) {
        const float* pt = part[(i + j) & 3];
        float* y = tok_y(a) + int64_t(part_at(a, q)) * a.I + r0;
        for (int tr = lane; tr < kR && r0 + tr < a.I; tr += 32) {  // gate's row tr, up's row kR + tr
          const float g = tc_row_sum(pt, tr, tg.iters), u = tc_row_sum(pt, kR + tr, tg.iters);
          y[tr] = siluf_(g) * u;
        }
      }
    }
  }
  // The warp's rows of tiles i .. i + N - 1 into part[(i + j) & 3] (TcPlace::rows).
  template <int N>
  __device__ __forceinline__ void tile_rows(const TcWarp& tw, int i) const {
    const unsigned char* st[N];
    const void* sc[N][2];
    const void* bi[N][2];
    float* pt[N];
    int row[2];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      st[j] = ring + size_t((i + j) % S) * a.stage_bytes;
      pt[j] = part[(i + j) & 3];
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {  // tile row rbk 16 + n + 8 k: gate's below kR, then up's
      const int tr = tw.rbk * 16 + tw.n + 8 * k;
      const bool gate = tr < kR;
      row[k] = gate ? tr : tr - kR;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        sc[j][k] = st[j] + (gate ? gs_off : us_off);
        bi[j][k] = st[j] + (gate ? gb_off : ub_off);
      }
    }
    tw.rows<BITS, N>(st, rb, sc, bi, row, tg.groups, a.st_in, pt);
  }
};

// The end of a tc_down row block: each warp's sums for rows n and n + 8 of the block (lanes 4n)
// over its items, then warp 1 adds the warps' sums in order into h[16 rbk + r] (deterministic).
// red: 16 floats a warp, alternating between two by row block, so one barrier does: the next
// block's writes go to the other half, and the one after waits for warp 1 at the next barrier.
__device__ __forceinline__ void tc_down_finish(float (&acc)[2], float* red, float* h, int rbk, int H) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = int(blockDim.x) >> 5, n = lane >> 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
  }
  if ((lane & 3) == 0) {
    red[warp * 16 + n] = acc[0];
    red[warp * 16 + n + 8] = acc[1];
  }
  __syncthreads();
  if (warp == 1 && lane < 16 && rbk * 16 + lane < H) h[rbk * 16 + lane] += sum_by16(red + lane, nw);
}

// expert_down_add on the tensor cores, a block per 16 output rows (grid-stride). Each part's 16 rows
// and their scales and biases come into shared memory by bulk copies (part p of buffer b at
// (b parts + p) a.stage_bytes past a.ring_off; one copy a range, so the copy engine is not fed row
// by row): the shared expert's before the PDL wait, the routed experts' once the ids are known
// (before the wait too where they are two kernels back, ids_early); with two buffers (a.stages)
// the block's next row block loads while one is computed (a decode batch's rows forms give a
// block several). Warp w takes the items (part p, column part: a
// 16 x 256 product) w, w + NW, ..., each warp summing its own in order, then the warps' sums in a
// fixed order (tc_down_finish): deterministic.
template <int BITS, int NW>
__global__ void __launch_bounds__(NW * 32, 16 / NW) tc_down_kernel(const __grid_constant__ ExpertArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* xt = reinterpret_cast<unsigned char*>(smem4);
  unsigned char* st = xt + a.ring_off;
  __shared__ uint64_t bars[4];  // a buffer's shared expert's rows, its routed experts': 2 b, 2 b + 1
  __shared__ size_t bases[kMaxParts];
  __shared__ float coefs[kMaxParts];
  __shared__ float red[2][NW * 16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = NW;
  const int t = lane & 3, n = lane >> 2;
  const uint32_t rb = uint32_t(a.I) * BITS / 8, srb = uint32_t(a.I / a.gs_out) * (a.st_out == kScaleF32 ? 4u : 2u);
  const uint32_t sc_off = 16 * rb, bi_off = sc_off + align16(16 * srb);
  const int n_rb = (a.H + 15) / 16;
  const bool sh = a.parts > a.n;
  // The row blocks of this block: rbk0 + u gridDim.x for its u-th, into buffer u % a.stages (a
  // buffer: every part's 16 rows, a.parts a.stage_bytes); with two buffers the next row block's
  // rows are in flight while one is computed.
  const int rbk0 = int(blockIdx.x), nbuf = a.stages;
  auto rbk_of = [&](int u) { return rbk0 + u * int(gridDim.x); };
  // Part p's ranges for row block rbk (slot base `base`) into buffer b, and their bulk-copied bytes.
  auto ranges = [&](int p, size_t base, int rbk, int b, Range (&r)[3]) {
    const Part& m = p < a.n ? a.down : a.sh_down;
    const uint32_t nr = uint32_t(min(16, a.H - rbk * 16)),
                   off = uint32_t(b * a.parts + p) * uint32_t(a.stage_bytes);
    r[0] = {at<char>(base, m.data) + size_t(rbk) * 16 * rb, nr * rb, off};
    r[1] = {at<char>(base, m.scales) + size_t(rbk) * 16 * srb, nr * srb, off + sc_off};
    r[2] = {at<char>(base, m.biases) + size_t(rbk) * 16 * srb, nr * srb, off + bi_off};
  };
  auto part_bytes = [&](int rbk) {
    const uint32_t nr = uint32_t(min(16, a.H - rbk * 16));
    return ((nr * rb) & ~15u) + 2 * ((nr * srb) & ~15u);
  };
  // Warp 0: the u-th row block's shared expert's ranges (lane 0), and its routed parts' (lane p,
  // from its base); nothing past the last row block.
  auto issue_shared = [&](int u) {
    const int rbk = rbk_of(u), b = u % nbuf;
    if (lane == 0 && sh && rbk < n_rb) {
      Range r[3];
      ranges(a.n, 0, rbk, b, r);
      expect_bytes(&bars[2 * b], part_bytes(rbk));
      for (const Range& x : r) copy_range(st, &bars[2 * b], x);
    }
  };
  auto issue_routed = [&](int u, size_t base) {
    const int rbk = rbk_of(u), b = u % nbuf;
    if (rbk >= n_rb) return;
    if (lane == 0 && a.n > 0) expect_bytes(&bars[2 * b + 1], uint32_t(a.n) * part_bytes(rbk));
    __syncwarp();
    if (lane < a.n) {
      Range r[3];
      ranges(lane, base, rbk, b, r);
      for (const Range& x : r) copy_range(st, &bars[2 * b + 1], x);
    }
  };
  probe(kProbeDown, 0);
  if (warp == 0) {
    if (lane == 0) ring_init(bars, 4);
    __syncwarp();
    for (int u = 0; u < nbuf; ++u) {
      issue_shared(u);
      if (a.ids_early) issue_routed(u, lane < a.n ? part_base(a, lane) : size_t(0));
    }
  }
  probe(kProbeDown, 1);
  pdl_wait_and_release();
  probe(kProbeDown, 2);
  if (warp == 0) {
    const size_t base = lane < a.parts ? part_base(a, lane) : size_t(0);
    if (lane < a.parts) {
      bases[lane] = base;
      coefs[lane] = lane < a.n ? tok_w(a, lane) : tok_shared_gate(a);
    }
    if (!a.ids_early)
      for (int u = 0; u < nbuf; ++u) issue_routed(u, base);
  }
  probe(kProbeDown, 3);
  const float* x = tok_x(a);
  stage_tc<BITS>(xt, a.parts * a.I, [&](int i) { return x[i]; }, 1);  // warp 0 issued; ends with a barrier
  probe(kProbeDown, 4);
  const int gpp = a.I / kTcGs, ipp = (gpp + 3) / 4, items = a.parts * ipp, groups = a.parts * gpp;
  for (int use = 0; rbk_of(use) < n_rb; ++use) {
    const int rbk = rbk_of(use), b = use % nbuf;
    if (use > 0) {  // the last row block's buffer is free (the barrier ending it): the next rows into it
      if (warp == 0) {
        issue_shared(use + nbuf - 1);
        issue_routed(use + nbuf - 1, lane < a.n ? bases[lane] : size_t(0));
      }
      // copy_range's tail bytes (stored by their lane): with two buffers the row block's barrier
      // comes before they are read.
      if (nbuf == 1) __syncthreads();
    }
    if (sh) stage_wait(&bars[2 * b], use / nbuf);
    if (a.n > 0) stage_wait(&bars[2 * b + 1], use / nbuf);
    float acc[2] = {0.0f, 0.0f};
    for (int item = warp; item < items; item += nw) {
      const int p = item / ipp, gi = (item - p * ipp) * 4 + t;
      const bool v = gi < gpp;
      TcFrags fr;
      tc_load(xt, groups, p * gpp + gi, v, fr);
      const unsigned char* rows = st + size_t(b * a.parts + p) * uint32_t(a.stage_bytes);
      float dot[2];
      tc_rows<BITS>(rows, rb, fr, gi, dot);
      if (v) {
        const float c = coefs[p];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t i = int64_t(n + 8 * r) * gpp + gi;
          acc[r] = fmaf(c, fmaf(smem_scale(rows + sc_off, i, a.st_out), dot[r], smem_scale(rows + bi_off, i, a.st_out) * fr.xsum),
                        acc[r]);
        }
      }
    }
    tc_down_finish(acc, red[use & 1], tok_y(a), rbk, a.H);
  }
  probe(kProbeDown, 5);
}

template <int BITS, int NW>
__global__ void __launch_bounds__(NW * 32, 16 / NW) tc_act_kernel(const __grid_constant__ ExpertArgs a) {
  extern __shared__ float4 smem4[];
  unsigned char* xt = reinterpret_cast<unsigned char*>(smem4);
  __shared__ uint64_t bars[kMaxStages];
  __shared__ int32_t ids[kMaxTopk];
  __shared__ float wts[kMaxTopk];
  __shared__ size_t bases[kMaxParts];
  __shared__ float part[4][NW * 16];
  ActStreamTc<BITS, NW> act(a, xt + a.ring_off, bars, bases, part);
  probe(kProbeAct, 0);
  if (threadIdx.x < 32) act.start();
  probe(kProbeAct, 1);
  pdl_wait_and_release();
  probe(kProbeAct, 2);
  if (threadIdx.x < 32) {
    route_warp(a, ids, wts, bases);
    act.issue_upto(act.S);
  }
  probe(kProbeAct, 5);
  const float* x = tok_x(a);
  stage_tc<BITS>(xt, a.H, [&](int i) { return x[i]; }, 1);  // warp 0 routed; ends with a barrier
  probe(kProbeAct, 6);
  act.compute(xt);
  probe(kProbeAct, 9);
}

bool experts_aligned(const ExpertArgs& a) {
  for (const Part* m : {&a.gate, &a.up, &a.down, &a.sh_gate, &a.sh_up, &a.sh_down})
    if (!a16(m->data) || !a16(m->scales) || !a16(m->biases)) return false;
  return true;
}

// Bytes of an ActStream stage: NW rows of gate and of up, their scales and biases.
uint32_t act_stage_bytes(const ExpertArgs& a, int bits, int nw) {
  const uint32_t rb = uint32_t(a.H) * uint32_t(bits) / 8, srb = uint32_t(a.H / a.gs_in) * (a.st_in == kScaleF32 ? 4u : 2u);
  return 2 * uint32_t(nw) * rb + 4 * align16(uint32_t(nw) * srb);
}

template <int BITS, int NW>
bool stream_act_nw(ExpertArgs a, cudaStream_t s) {
  if (!experts_aligned(a)) return false;
  if (!plan_ring(a, size_t(staged_floats<BITS>(a.H)) * 4, act_stage_bytes(a, BITS, NW))) return false;
  const int tiles = a.parts * ((a.I + NW - 1) / NW);
  const auto kernel = stream_act_kernel<BITS, NW>;
  stream_opt_in(reinterpret_cast<const void*>(kernel));
  launch(kernel, dim3(token_blocks(std::min(tiles, sm_count()), a.tokens), unsigned(a.tokens)), NW * 32, ring_smem(a),
         s, a);
  SWIFTLET_CUDA_LAUNCHED();
  return true;
}

template <int BITS>
bool stream_act(const ExpertArgs& a, cudaStream_t s) {
  return tuning().stream_warps == 16 ? stream_act_nw<BITS, 16>(a, s) : stream_act_nw<BITS, 8>(a, s);
}

// Rows of gate (and of up) in an ActStreamTc tile of nw warps; 0 when the act does not fit.
int tc_act_rows(const ExpertArgs& a, int bits, int nw) {
  if (!tc_shape(a.H, a.gs_in, bits, nw)) return 0;
  return 8 * tc_geom(a.H, nw).rbt;
}
uint32_t tc_act_stage_bytes(const ExpertArgs& a, int bits, int nw) {
  const uint32_t kR = uint32_t(tc_act_rows(a, bits, nw)), rb = uint32_t(a.H) * uint32_t(bits) / 8;
  return 2 * kR * rb + 4 * align16(kR * scale_row_bytes(a.H, a.gs_in, a.st_in));
}

// The down products on the tensor cores: groups of 64 that do not straddle parts, x staged in
// `smem` bytes.
bool tc_down_fits(const ExpertArgs& a, int bits, size_t smem) {
  return (bits == 4 || bits == 8) && a.gs_out == kTcGs && a.I % kTcGs == 0 &&
         size_t(tc_staged_bytes(a.parts * a.I)) <= smem;
}

template <int BITS>
bool tc_act(ExpertArgs a, cudaStream_t s) {
  const int kR = tc_act_rows(a, BITS, kTcWarps);
  if (kR == 0 || !experts_aligned(a)) return false;
  if (!plan_ring(a, size_t(tc_staged_bytes(a.H)), tc_act_stage_bytes(a, BITS, kTcWarps), kTcSmem)) return false;
  launch_tc(tc_act_kernel<BITS, kTcWarps>, a.parts * ((a.I + kR - 1) / kR), a.tokens, ring_smem(a), s, a);
  return true;
}

bool tc_down(ExpertArgs a, int bits, cudaStream_t s) {
  if (!tc_down_fits(a, bits, kTcSmem) || !experts_aligned(a)) return false;
  // x staged, then each part's 16 rows with their scales and biases (tc_down_kernel).
  a.ring_off = int((size_t(tc_staged_bytes(a.parts * a.I)) + 127) & ~size_t(127));
  const uint32_t rb = uint32_t(a.I) * uint32_t(bits) / 8;
  a.stage_bytes = int(16 * rb + 2 * align16(16 * scale_row_bytes(a.I, a.gs_out, a.st_out)));
  // Two buffers of the parts' rows where they fit (a.stages: the next row block's in flight), else one.
  const size_t buffer = size_t(a.parts) * size_t(a.stage_bytes);
  a.stages = size_t(a.ring_off) + 2 * buffer <= kTcSmem ? 2 : 1;
  const size_t smem = size_t(a.ring_off) + size_t(a.stages) * buffer;
  if (smem > kTcSmem) return false;
  launch_tc(bits == 4 ? tc_down_kernel<4, kTcWarps> : tc_down_kernel<8, kTcWarps>, (a.H + 15) / 16, a.tokens, smem, s,
            a);
  return true;
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
      reinterpret_cast<const void*>(expert_act_kernel<4, 1, 0>),  reinterpret_cast<const void*>(expert_act_kernel<4, 1, 2>),
      reinterpret_cast<const void*>(expert_act_kernel<4, 1, 4>),  reinterpret_cast<const void*>(expert_act_kernel<4, 2, 0>),
      reinterpret_cast<const void*>(expert_act_kernel<4, 2, 2>),  reinterpret_cast<const void*>(expert_act_kernel<8, 1, 0>),
      reinterpret_cast<const void*>(expert_act_kernel<8, 2, 0>),  reinterpret_cast<const void*>(expert_down_kernel<4, 1>),
      reinterpret_cast<const void*>(expert_down_kernel<4, 2>),    reinterpret_cast<const void*>(expert_down_kernel<8, 1>),
      reinterpret_cast<const void*>(expert_down_kernel<8, 2>)};
  for (const void* k : kernels) occupancy(k, 0);
  for (const void* k : {reinterpret_cast<const void*>(stream_act_kernel<4, 8>), reinterpret_cast<const void*>(stream_act_kernel<8, 8>),
                        reinterpret_cast<const void*>(stream_act_kernel<4, 16>), reinterpret_cast<const void*>(stream_act_kernel<8, 16>)})
    if (tuning().capable) stream_opt_in(k);
  for (const void* k : {reinterpret_cast<const void*>(tc_act_kernel<4, kTcWarps>), reinterpret_cast<const void*>(tc_act_kernel<8, kTcWarps>),
                        reinterpret_cast<const void*>(tc_down_kernel<4, kTcWarps>), reinterpret_cast<const void*>(tc_down_kernel<8, kTcWarps>)})
    if (tuning().capable) stream_opt_in(k, kTcSmem);
}
}  // namespace detail

#ifdef SWIFTLET_GPU_PROBE
void probe_install_experts(unsigned long long* buf) {
  SWIFTLET_CUDA_CHECK(cudaMemcpyToSymbol(g_probe, &buf, sizeof(buf)));
}
#endif

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
  if (tc_on() && (bits == 4 ? tc_act<4>(a, s) : tc_act<8>(a, s))) return;
  if (streaming() && (bits == 4 ? stream_act<4>(a, s) : stream_act<8>(a, s))) return;
  const size_t smem = size_t(bits == 4 ? staged_floats<4>(a.H) : staged_floats<8>(a.H)) * 4;
  // One row of gate and one of up per warp (two of each need ~120 registers: fewer warps per SM).
  const bool two = false;
  const dim3 grid(token_blocks(grid_for(int64_t(a.parts) * ((a.I + (two ? 1 : 0)) / (two ? 2 : 1)), two ? 4 : 2), a.tokens),
                  unsigned(a.tokens));
  // Rows of gate and up per warp: 2 RP; the fixed-chunk loop where the shape allows.
  if (bits == 4) {
    const int J = fixed_chunks<4>(a.H, two ? 4 : 2);
    if (J == 2)
      launch_ex(two ? expert_act_kernel<4, 2, 2> : expert_act_kernel<4, 1, 2>, grid, kThreads, smem, s, true, a);
    else if (J == 4 && !two)
      launch_ex(expert_act_kernel<4, 1, 4>, grid, kThreads, smem, s, true, a);
    else
      launch_ex(two ? expert_act_kernel<4, 2, 0> : expert_act_kernel<4, 1, 0>, grid, kThreads, smem, s, true, a);
  } else {
    launch_ex(two ? expert_act_kernel<8, 2, 0> : expert_act_kernel<8, 1, 0>, grid, kThreads, smem, s, true, a);
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
  const bool two = false;  // one row per warp: ~40 registers, many warps per SM
  const dim3 grid(token_blocks(grid_for(two ? (a.H + 1) / 2 : a.H, two ? 2 : 1), a.tokens), unsigned(a.tokens));
  if (bits == 4)
    launch_ex(two ? expert_down_kernel<4, 2> : expert_down_kernel<4, 1>, grid, kThreads, smem, s, true, a);
  else
    launch_ex(two ? expert_down_kernel<8, 2> : expert_down_kernel<8, 1>, grid, kThreads, smem, s, true, a);
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
