// The routed experts' act and down products on sm_90 (model-math.md 6; the one-token and rows
// forms of moe_experts.cu, which launches these where the device and the shape take them): the
// streamed act (FP32 dot products over tiles brought into shared memory by bulk copies) and the
// tensor-core act and down (decode_products.cuh's TcWarp). Not part of the API.
#include "kernels/cuda/expert_device.cuh"

namespace swiftlet::cuda {

namespace {

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
    int s0 = 0, u0 = 0;  // tile i's stage and its use of it (i % S, i / S, kept without dividing)
    for (int i = 0; i < mine; i += 2) {
      const int nt = min(2, mine - i);
      int s1 = s0, u1 = u0;  // tile i + 1's
      next_stage(s1, u1);
      stage_wait(bars + s0, u0);
      if (nt == 2) stage_wait(bars + s1, u1);
      if (i == 0) probe(kProbeAct, 7);
      if (i + nt == mine) probe(kProbeAct, 8);
      if (tw.busy) {
        if (nt == 2)
          tile_rows<2>(tw, i, s0, s1);
        else
          tile_rows<1>(tw, i, s0, s1);
      }
      s0 = s1, u0 = u1;  // the next round's first tile
      next_stage(s0, u0);
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
  // The ring's stage after stage s, whose use count u goes up where it wraps.
  __device__ __forceinline__ void next_stage(int& s, int& u) const {
    if (++s == S) s = 0, ++u;
  }
  // The warp's rows of the tiles in stages s0 (and s1 where N = 2), tiles i and i + 1, into
  // part[(i + j) & 3] (TcPlace::rows).
  template <int N>
  __device__ __forceinline__ void tile_rows(const TcWarp& tw, int i, int s0, int s1) const {
    const unsigned char* st[N];
    const void* sc[N][2];
    const void* bi[N][2];
    float* pt[N];
    int row[2];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      st[j] = ring + size_t(j == 0 ? s0 : s1) * a.stage_bytes;
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
      tc_rows<BITS, 2>(rows, rb, fr, gi, dot);  // two accumulator chains: one item in flight a warp
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
  launch_streamed(stream_act_kernel<BITS, NW>, NW, kStreamSmem, tiles, a.tokens, ring_smem(a), s, a);
  return true;
}

template <int BITS>
bool stream_act_bits(const ExpertArgs& a, cudaStream_t s) {
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
bool tc_act_bits(ExpertArgs a, cudaStream_t s) {
  const int kR = tc_act_rows(a, BITS, kTcWarps);
  if (kR == 0 || !experts_aligned(a)) return false;
  if (!plan_ring(a, size_t(tc_staged_bytes(a.H)), tc_act_stage_bytes(a, BITS, kTcWarps), kTcSmem)) return false;
  launch_tc(tc_act_kernel<BITS, kTcWarps>, a.parts * ((a.I + kR - 1) / kR), a.tokens, ring_smem(a), s, a);
  return true;
}

}  // namespace

namespace detail {

bool stream_act(const ExpertArgs& a, int bits, cudaStream_t s) {
  return bits == 4 ? stream_act_bits<4>(a, s) : stream_act_bits<8>(a, s);
}

bool tc_act(const ExpertArgs& a, int bits, cudaStream_t s) {
  return bits == 4 ? tc_act_bits<4>(a, s) : tc_act_bits<8>(a, s);
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

void prepare_sm90_expert_kernels() {
  if (!tuning().capable) return;
  for (const void* k : {reinterpret_cast<const void*>(stream_act_kernel<4, 8>), reinterpret_cast<const void*>(stream_act_kernel<8, 8>),
                        reinterpret_cast<const void*>(stream_act_kernel<4, 16>), reinterpret_cast<const void*>(stream_act_kernel<8, 16>)})
    stream_opt_in(k);
  for (const void* k : {reinterpret_cast<const void*>(tc_act_kernel<4, kTcWarps>), reinterpret_cast<const void*>(tc_act_kernel<8, kTcWarps>),
                        reinterpret_cast<const void*>(tc_down_kernel<4, kTcWarps>), reinterpret_cast<const void*>(tc_down_kernel<8, kTcWarps>)})
    stream_opt_in(k, kTcSmem);
}

}  // namespace detail

#ifdef SWIFTLET_GPU_PROBE
void probe_install_experts(unsigned long long* buf) {
  SWIFTLET_CUDA_CHECK(cudaMemcpyToSymbol(g_probe, &buf, sizeof(buf)));
}
#endif

}  // namespace swiftlet::cuda
