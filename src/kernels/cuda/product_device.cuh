// The device code of the fused decode products (matvec.cu, moe_experts.cu), shared by their
// kernels: the dequantising dot product over rows in global or shared memory with its staged
// input, the ring of shared-memory stages filled by TMA bulk copies (the PDL and L2 prefetch
// helpers are in cuda_common.cuh). Not part of the API.
//
// The product loop. A block stages its input x once in shared memory, already multiplied per
// column by a power of two (below) and with the sum of every 16-byte chunk's x values beside it;
// then each warp streams R weight rows in 16-byte loads, lane l taking chunks l, l + 32, ... of
// every row, so one read of x from shared memory serves R rows. A 4-bit code q at bit s of its
// word becomes a float without shifting it down: (word & (15 << s)) | 0x4B000000 is the float
// 2^23 + q 2^s, less 2^23 that is q 2^s exactly, and x was staged times 2^-s, so the product is
// q x. Nibbles 5..7 are first shifted down by 12 (one shift per word), so a code costs one logic
// op, one add and one FMA. The group's affine map is applied per chunk:
// sum (scale q + bias) x = scale sum q x + bias sum x.
// Every sum runs in a fixed order (no atomics), so results are deterministic.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_fp16.h>

#include <cstdint>

namespace swiftlet::cuda::detail {

// Values per 16-byte chunk.
template <int BITS>
__host__ __device__ constexpr int per_chunk() { return 128 / BITS; }

// Where each code of a 32-bit word is masked (see the file comment): the first kCodesLow codes in
// place, the rest after one shift down by kHighShift, so that q 2^s stays below 2^23 (exact):
// 4-bit codes 0..4 at 4e, codes 5..7 at 4e - 12; 8-bit codes 0, 1 at 0, 8 and 2, 3 at 0, 8.
template <int BITS>
constexpr int kCodesLow = BITS == 4 ? 5 : 2;
template <int BITS>
constexpr int kHighShift = BITS == 4 ? 12 : 16;
template <int BITS>
__host__ __device__ constexpr int code_bit(int e) {
  static_assert(BITS == 4 || BITS == 8, "4- and 8-bit codes only");
  return e < kCodesLow<BITS> ? BITS * e : BITS * e - kHighShift<BITS>;
}

// The power of two column i of x is staged times: 2^-s for its code's bit s.
template <int BITS>
__device__ __forceinline__ float prescale(int i) {
  return __uint_as_float(uint32_t(127 - code_bit<BITS>(i % (32 / BITS))) << 23);
}

__device__ __forceinline__ float code(uint32_t masked) { return __uint_as_float(masked | 0x4B000000u) - 8388608.0f; }

// sum q_j x_j over one chunk; xp: the chunk's staged (prescaled) x values.
template <int BITS>
__device__ __forceinline__ float dot_chunk(const uint4& pk, const float* xp) {
  constexpr int kPerWord = 32 / BITS;
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const uint32_t words[4] = {pk.x, pk.y, pk.z, pk.w};
  // Four partial sums, code e of every word into sum e % 4: short FMA chains, so a warp has
  // independent work while one waits.
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t w = words[k], high = w >> kHighShift<BITS>;
    const float* x = xp + kPerWord * k;
#pragma unroll
    for (int e = 0; e < kPerWord; ++e) {
      const uint32_t src = e < kCodesLow<BITS> ? w : high;
      d[e & 3] = fmaf(code(src & (kMask << code_bit<BITS>(e))), x[e], d[e & 3]);
    }
  }
  return (d[0] + d[1]) + (d[2] + d[3]);
}

// Shared-memory layout of a staged row: 4 floats of padding after every 32, so the lanes' 16-byte
// reads of their own chunk hit distinct banks.
__host__ __device__ __forceinline__ int padded(int i) { return i + (i >> 5) * 4; }
// Floats of shared memory for a staged row of n values (n a multiple of the chunk size): the
// padded values, then one sum per chunk.
template <int BITS>
__host__ __device__ constexpr int staged_floats(int n) { return n + (n + 31) / 32 * 4 + n / per_chunk<BITS>(); }

// Stages value(i) for i < n (n a multiple of the chunk size) into xs, times prescale, with the
// chunk sums of the unscaled values after the padded row. A warp stages 32 values at a time and
// sums each chunk with shuffles; each thread reads its next kBatch values before it uses any, so
// the reads (on the critical path after the PDL wait) overlap instead of queueing one after
// another. Call from every thread (any block size); ends with a barrier.
template <int BITS, typename F>
__device__ __forceinline__ void stage(float* xs, int n, F value) {
  constexpr int kPer = per_chunk<BITS>();
  constexpr int kBatch = 8;
  float* sums = xs + n + (n + 31) / 32 * 4;
  const int lane = threadIdx.x & 31, step = int(blockDim.x);
  for (int base0 = (threadIdx.x >> 5) * 32; base0 < n; base0 += kBatch * step) {  // warp-uniform
    float v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base0 + b * step + lane;
      v[b] = i < n ? value(i) : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base0 + b * step + lane;
      if (base0 + b * step >= n) break;  // warp-uniform
      if (i < n) xs[padded(i)] = v[b] * prescale<BITS>(i);
      float sum = v[b];
#pragma unroll
      for (int o = kPer / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (i < n && i % kPer == 0) sums[i / kPer] = sum;
    }
  }
  __syncthreads();
}

// The kPer staged values of chunk ch (see stage), from shared memory into registers.
template <int kPer>
__device__ __forceinline__ void load_chunk(const float* xs, int ch, float (&xr)[kPer]) {
  const float4* xv = reinterpret_cast<const float4*>(xs + padded(ch * kPer));
#pragma unroll
  for (int j = 0; j < kPer / 4; ++j) {
    const float4 v = xv[j];
    xr[4 * j] = v.x;
    xr[4 * j + 1] = v.y;
    xr[4 * j + 2] = v.z;
    xr[4 * j + 3] = v.w;
  }
}

// Scale (or bias) i of type st from shared memory (a streamed tile, below).
__device__ __forceinline__ float smem_scale(const void* p, int64_t i, int st) {
  if (st == kScaleBF16) return __uint_as_float(uint32_t(static_cast<const unsigned short*>(p)[i]) << 16);
  if (st == kScaleF32) return static_cast<const float*>(p)[i];
  return __half2float(__ushort_as_half(static_cast<const unsigned short*>(p)[i]));
}

// acc[i] += W_i x for R rows (each by its chunk pointer, scales, biases and first group index),
// lane l taking chunks l, l + 32, ... Rows past the end (!valid) are skipped. SMEM: the rows sit
// in shared memory (a streamed tile) instead of global memory.
template <int BITS, int R, bool SMEM = false>
__device__ __forceinline__ void rows_dot(const uint4* const (&data)[R], const void* const (&scales)[R],
                                         const void* const (&biases)[R], const int64_t (&g0)[R],
                                         const bool (&valid)[R], int n_chunks, int gs, int st, const float* xs,
                                         const float* sums, float (&acc)[R]) {
  constexpr int kPer = per_chunk<BITS>();
  const int lane = threadIdx.x & 31;
#pragma unroll 2
  for (int ch = lane; ch < n_chunks; ch += 32) {
    uint4 pk[R];
    float sc[R], bi[R];
    const int gc = (ch * kPer) / gs;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (!valid[i]) continue;
      if constexpr (SMEM) {
        pk[i] = data[i][ch];
        sc[i] = smem_scale(scales[i], g0[i] + gc, st);
        bi[i] = smem_scale(biases[i], g0[i] + gc, st);
      } else {
        pk[i] = __ldg(data[i] + ch);
        sc[i] = load_scale(scales[i], g0[i] + gc, st);
        bi[i] = load_scale(biases[i], g0[i] + gc, st);
      }
    }
    float xr[kPer];
    load_chunk(xs, ch, xr);
    const float xsum = sums[ch];
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (valid[i]) acc[i] = fmaf(sc[i], dot_chunk<BITS>(pk[i], xr), fmaf(bi[i], xsum, acc[i]));
  }
}

// The same for exactly J chunks per lane (cols = 32 J chunks): all R x J weight and scale loads
// are issued before any arithmetic (memory parallelism), and the group of each of the lane's
// chunks (gc) is computed once per kernel. Rows past the end read nothing and add zeros.
template <int BITS, int R, int J>
__device__ __forceinline__ void rows_dot_fixed(const uint4* const (&data)[R], const void* const (&scales)[R],
                                               const void* const (&biases)[R], const int64_t (&g0)[R],
                                               const bool (&valid)[R], const int (&gc)[J], int st, const float* xs,
                                               const float* sums, float (&acc)[R]) {
  constexpr int kPer = per_chunk<BITS>();
  const int lane = threadIdx.x & 31;
  uint4 pk[R][J];
  float sc[R][J], bi[R][J];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (valid[i]) {
        pk[i][j] = __ldg(data[i] + lane + 32 * j);
        sc[i][j] = load_scale(scales[i], g0[i] + gc[j], st);
        bi[i][j] = load_scale(biases[i], g0[i] + gc[j], st);
      } else {
        pk[i][j] = make_uint4(0, 0, 0, 0);
        sc[i][j] = bi[i][j] = 0.0f;
      }
    }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int ch = lane + 32 * j;
    float xr[kPer];
    load_chunk(xs, ch, xr);
    const float xsum = sums[ch];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = fmaf(sc[i][j], dot_chunk<BITS>(pk[i][j], xr), fmaf(bi[i][j], xsum, acc[i]));
  }
}

// R weight rows of one warp for rows_dot / rows_dot_fixed: each row's codes, scales, biases and
// first group, whether it exists, and its sum.
template <int R>
struct WarpRows {
  const uint4* data[R];
  const void* scales[R];
  const void* biases[R];
  int64_t g0[R];
  bool valid[R];
  float acc[R];

  // Row i of the warp is row r of a matrix of `rows` rows starting at codes row0.
  __device__ __forceinline__ void set(int i, int64_t r, int64_t rows, const uint4* row0, const void* s, const void* b,
                                      int n_chunks, int groups) {
    valid[i] = r < rows;
    data[i] = row0 + r * n_chunks;
    scales[i] = s;
    biases[i] = b;
    g0[i] = r * groups;
    acc[i] = 0.0f;
  }

  // acc = W x over the rows: J chunks a lane (gc: their groups), or the general loop for J = 0.
  template <int BITS, int J>
  __device__ __forceinline__ void dot(const int (&gc)[J > 0 ? J : 1], int n_chunks, int gs, int st, const float* xs,
                                      const float* sums) {
    if constexpr (J > 0)
      rows_dot_fixed<BITS, R, J>(data, scales, biases, g0, valid, gc, st, xs, sums, acc);
    else
      rows_dot<BITS, R>(data, scales, biases, g0, valid, n_chunks, gs, st, xs, sums, acc);
  }
};

// ---------------------------------------------------------------------------------------------
// The ring of shared-memory stages the streamed products fill by bulk copies (sm_90).

__host__ __device__ constexpr uint32_t align16(uint32_t n) { return (n + 15) & ~15u; }

// A copy of `bytes` from global src to a stage at dst_off: the 16-byte multiple by a bulk copy,
// the rest (a ragged tile's scales) by thread 0 itself.
struct Range {
  const void* src;
  uint32_t bytes, dst_off;
};

// Thread 0: S mbarriers, each completed by one arrival plus its stage's bytes.
__device__ __forceinline__ void ring_init(uint64_t* bars, int S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = 0; i < S; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + i)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// One bulk copy of `bytes` (a multiple of 16) from global src to shared dst, completing on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#endif
}

// Arms `bar`'s current phase for `total` bytes of bulk copies (with this thread's arrival). The
// block's generic-proxy reads of the stage's last use (ordered by a block barrier) come first.
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(total) : "memory");
#endif
}

// Range r into `stage`: its 16-byte multiple by a bulk copy (counted in expect_bytes), the rest
// by this thread (visible to the block by the barriers before its use).
__device__ __forceinline__ void copy_range(unsigned char* stage, uint64_t* bar, const Range& r) {
  const uint32_t b16 = r.bytes & ~15u;
  if (b16) bulk_copy(stage + r.dst_off, r.src, b16, bar);
  for (uint32_t b = b16; b < r.bytes; ++b) stage[r.dst_off + b] = static_cast<const unsigned char*>(r.src)[b];
}

// Thread 0: copies the ranges into `stage`, completing `bar`'s current phase when all have landed.
__device__ __forceinline__ void issue_stage(unsigned char* stage, uint64_t* bar, const Range* r, int n) {
  uint32_t total = 0;
  for (int k = 0; k < n; ++k) total += r[k].bytes & ~15u;
  expect_bytes(bar, total);
  for (int k = 0; k < n; ++k) copy_range(stage, bar, r[k]);
}

// Waits until the stage's copies for its use number `use` (0, 1, ...) have landed.
__device__ __forceinline__ void stage_wait(uint64_t* bar, int use) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = smem_addr(bar), parity = uint32_t(use) & 1u;
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(b), "r"(parity)
        : "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// Tensor-core products (the streamed kernels' default on sm_90; mma.sync needs sm_80).
//
// The loop above spends about three instructions on every 4-bit code. Here an integer MMA
// (m16n8k32, A: the weights' codes as unsigned bytes, B: signed bytes, C: int32) takes 16 rows
// times 32 codes at once, and a code costs under half an instruction (unpacking nibbles to bytes).
// The input x is not rounded to 8 bits: per group G of 64 values, x 2^e_G (max |x| 2^e_G in
// [2^21, 2^22)) is rounded to an integer and split into three signed base-256 digits,
// x 2^e_G ~ d0 + 256 d1 + 65536 d2, so each digit's sum sum q d is exact in int32 and the only
// rounding is x's, below 2^-22 of its group's largest value (fp32 keeps 2^-24 of each value).
//
// Which lane holds what (PTX's fragment layouts): lane l = 4 n + t takes rows n and n + 8 of A
// (k slots 4t..4t+3 and 16+4t..16+4t+3) and column n of B (the same slots). Each lane gives its
// own k slots a group of its own: lane t's slots come from group G = 4 it + t of the row (it: the
// warp's part of the columns, 256 of them a part), and B is zero outside column pair 2t, 2t + 1 on
// lane t's slots, holding d0, d1 there in a first MMA and d2, 0 in a second. So C's entries
// (2t, 2t + 1) on lane t, which PTX puts on that same lane, are the digit sums of the lane's own
// codes: no lane exchanges anything, and the group's affine map (scale sum q x + bias sum x) is
// applied per lane. A 16-row block is one warp's 16 x 8 MMAs a group (8 codes a lane a step).
//
// Row layout in shared memory: as in global memory (rows rb bytes apart, rb a multiple of 128 at
// the models' widths), so a tile's rows of a matrix come in one bulk copy: per-row copies into
// padded rows cost ~1.5 us of issue a tile (measured with the phase probe). The lanes of odd
// rows read their 16-byte chunks in rotated order instead (tc_rows), so the 8 lanes of a 16-byte
// load phase (rows n, n + 1; t = 0..3 at 32 bytes apart) still hit distinct banks (4-bit).

constexpr int kTcGs = 64;  // the group size the tensor-core path takes (MLX's default)

// Columns are taken 4 groups (256 values) a part: `iters` parts, and `rbt` 16-row blocks a tile so
// that each of nw warps has one (block, part) pair; 0 when a row has more parts than warps.
struct TcGeom {
  int groups, iters, rbt;
};
__host__ __device__ __forceinline__ TcGeom tc_geom(int cols, int nw) {
  const int g = cols / kTcGs, it = (g + 3) / 4;
  return {g, it, it <= nw ? nw / it : 0};
}
// Bytes of x staged for the tensor cores: 256 a group (8 steps x 2 fragments x 16), then a float2
// (2^-e, sum x) a group.
__host__ __device__ constexpr int tc_staged_bytes(int n) { return n / kTcGs * (256 + 8); }

// Stages one group G of x (v: the lane's values G 64 + lane and G 64 + 32 + lane) as digit
// fragments (above): per step j (8 values) two 16-byte entries, p = 0: {d0 lo, d0 hi, d2 lo, d2 hi}
// and p = 1: {d1 lo, d1 hi, 0, 0}, where lo / hi are the 4 bytes of a lane's k slots 4t.. and
// 16+4t..: values 2b and 2b + 1 of the step for 4-bit codes (a word's low and high nibbles), b and
// 4 + b for 8-bit; and the group's (2^-e, sum x) in info[G]. Every lane of the warp calls it.
template <int BITS>
__device__ __forceinline__ void stage_tc_group(unsigned char* xt, float2* info, int G, const float (&v)[2]) {
  const int lane = threadIdx.x & 31;
  float m = fmaxf(fabsf(v[0]), fabsf(v[1])), s = v[0] + v[1];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  int E = 0;
  frexpf(m, &E);  // m = f 2^E, f in [0.5, 1)
  const int e = m > 0.0f ? max(-100, min(126, 22 - E)) : 0;
  if (lane == 0) info[G] = make_float2(__uint_as_float(uint32_t(127 - e) << 23), s);
  const float up = __uint_as_float(uint32_t(127 + e) << 23);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int c = lane + 32 * h, xi = __float2int_rn(v[h] * up);
    const int d0 = int(int8_t(xi & 0xff)), r1 = (xi - d0) >> 8;
    const int d1 = int(int8_t(r1 & 0xff)), d2 = (r1 - d1) >> 8;
    const int e8 = c & 7;
    const int slot = BITS == 4 ? (e8 & 1) : (e8 >> 2), b = BITS == 4 ? (e8 >> 1) : (e8 & 3);
    unsigned char* f = xt + (size_t(G) * 8 + size_t(c >> 3)) * 32;
    f[slot * 4 + b] = static_cast<unsigned char>(d0);
    f[8 + slot * 4 + b] = static_cast<unsigned char>(d2);
    f[16 + slot * 4 + b] = static_cast<unsigned char>(d1);
    if (e8 == 0) *reinterpret_cast<uint2*>(f + 24) = make_uint2(0, 0);
  }
}
// The info entries (2^-e, sum x) after the n / 64 groups' fragments.
__device__ __forceinline__ float2* tc_info(unsigned char* xt, int n) {
  return reinterpret_cast<float2*>(xt + size_t(n / kTcGs) * 256);
}

// Stages value(i), i < n (a multiple of 64), one group a warp at a time (stage_tc_group), the
// warps from first_warp on (an earlier warp may be busy issuing copies meanwhile); each warp reads
// up to kBatch groups' values before it uses any (the reads come right after the PDL wait, on the
// critical path). Call from every thread; ends with a barrier.
template <int BITS, typename F>
__device__ __forceinline__ void stage_tc(unsigned char* xt, int n, F value, int first_warp = 0) {
  constexpr int kBatch = 4;
  const int groups = n / kTcGs, lane = threadIdx.x & 31;
  const int w = int(threadIdx.x >> 5) - first_warp, nw = int(blockDim.x >> 5) - first_warp;
  for (int G0 = w; w >= 0 && G0 < groups; G0 += kBatch * nw) {  // warp-uniform
    float vb[kBatch][2];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int G = G0 + u * nw;
      vb[u][0] = G < groups ? value(G * kTcGs + lane) : 0.0f;
      vb[u][1] = G < groups ? value(G * kTcGs + 32 + lane) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (G0 + u * nw >= groups) break;
      stage_tc_group<BITS>(xt, tc_info(xt, n), G0 + u * nw, vb[u]);
    }
  }
  __syncthreads();
}

// A lane's B fragments for group G (the lane's own: 4 it + t of its warp's column part it), that
// group's 2^-e and sum x. `valid`: the group exists (a row's last part may have fewer than 4).
struct TcFrags {
  uint4 f[8];
  float xinv, xsum;
  bool valid;
};
__device__ __forceinline__ void tc_load(const unsigned char* xt, int groups, int G, bool valid, TcFrags& fr) {
  const int lane = threadIdx.x & 31, t = lane & 3, n = lane >> 2;
  fr.valid = valid;
  const bool active = valid && (n >> 1) == t;
  const uint4* src = reinterpret_cast<const uint4*>(xt + size_t(G) * 256) + (n & 1);
#pragma unroll
  for (int j = 0; j < 8; ++j) fr.f[j] = active ? src[2 * j] : make_uint4(0, 0, 0, 0);
  const float2 info = valid ? reinterpret_cast<const float2*>(xt + size_t(groups) * 256)[G] : make_float2(0.0f, 0.0f);
  fr.xinv = info.x;
  fr.xsum = info.y;
}

template <int N>
__device__ __forceinline__ uint32_t word_of(const uint4 (&w)[N], int k) {  // k: a constant once unrolled
  const uint4& q = w[k >> 2];
  return (k & 3) == 0 ? q.x : (k & 3) == 1 ? q.y : (k & 3) == 2 ? q.z : q.w;
}

// 16-byte loads of a row's group.
template <int BITS>
__host__ __device__ constexpr int tc_loads() { return kTcGs * BITS / 128; }

// sum_k q x over the lane's group for rows n and n + 8 (the group's codes of those rows in w0, w8)
// into dot[0], dot[1], the scale and bias not applied. Every lane of the warp calls it. The eight
// steps' MMAs add into C independent accumulators (step j into j % C), summed at the end: exact
// integers, so the same digit sums for any C, and with C = 2 a chain of 4 dependent MMAs instead
// of 8 for a warp that has no other block's products to overlap them with (tc_down_kernel).
template <int BITS, int C = 1>
__device__ __forceinline__ void tc_mma(const uint4 (&w0)[tc_loads<BITS>()], const uint4 (&w8)[tc_loads<BITS>()],
                                       const TcFrags& fr, float (&dot)[2]) {
  int c1s[C][4] = {}, c2s[C][4] = {};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int(&c1)[4] = c1s[j % C];
    int(&c2)[4] = c2s[j % C];
    uint32_t a0, a1, a2, a3;
    if constexpr (BITS == 4) {
      const uint32_t u = word_of(w0, j), v = word_of(w8, j);
      a0 = u & 0x0F0F0F0Fu;
      a2 = (u >> 4) & 0x0F0F0F0Fu;
      a1 = v & 0x0F0F0F0Fu;
      a3 = (v >> 4) & 0x0F0F0F0Fu;
    } else {
      a0 = word_of(w0, 2 * j);
      a2 = word_of(w0, 2 * j + 1);
      a1 = word_of(w8, 2 * j);
      a3 = word_of(w8, 2 * j + 1);
    }
    mma_u8s8(c1, a0, a1, a2, a3, fr.f[j].x, fr.f[j].y);
    mma_u8s8(c2, a0, a1, a2, a3, fr.f[j].z, fr.f[j].w);
  }
  int c1[4], c2[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    c1[e] = c1s[0][e];
    c2[e] = c2s[0][e];
#pragma unroll
    for (int k = 1; k < C; ++k) c1[e] += c1s[k][e], c2[e] += c2s[k][e];
  }
  dot[0] = fmaf(65536.0f, float(c2[0]), fmaf(256.0f, float(c1[1]), float(c1[0]))) * fr.xinv;
  dot[1] = fmaf(65536.0f, float(c2[2]), fmaf(256.0f, float(c1[3]), float(c1[2]))) * fr.xinv;
}

// tc_mma for the lane's group G of the 16-row block at `rows` in shared memory (rb bytes apart).
// Odd rows load chunk q ^ 1 at step q and swap the pair back (see the row layout above).
template <int BITS, int C = 1>
__device__ __forceinline__ void tc_rows(const unsigned char* rows, uint32_t rb, const TcFrags& fr, int G,
                                        float (&dot)[2]) {
  constexpr int kQ = tc_loads<BITS>();
  const int n = (threadIdx.x & 31) >> 2, odd = n & 1;
  uint4 r0[kQ], r8[kQ], w0[kQ], w8[kQ];
  const uint4* p0 = reinterpret_cast<const uint4*>(rows + size_t(n) * rb + size_t(G) * (kTcGs * BITS / 8));
  const uint4* p8 = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(p0) + 8 * size_t(rb));
#pragma unroll
  for (int q = 0; q < kQ; ++q) {
    r0[q] = fr.valid ? p0[q ^ odd] : make_uint4(0, 0, 0, 0);
    r8[q] = fr.valid ? p8[q ^ odd] : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int q = 0; q < kQ; ++q) {
    w0[q] = odd ? r0[q ^ 1] : r0[q];
    w8[q] = odd ? r8[q ^ 1] : r8[q];
  }
  tc_mma<BITS, C>(w0, w8, fr, dot);
}

// The tensor-core product of up to 8 tokens at once: a column of B is a token, and the 32 k slots
// of each MMA come from one group of the row, lane (n, t) giving the group's 8-value steps 2t and
// 2t + 1 (4-bit: the row's 8 bytes from 8t on in the group; 8-bit: 16 bytes from 16t), B the
// token's digits of those values as staged by stage_tc_group. A group is two MMAs a digit; C's
// entries on lane (n, t) are rows n and n + 8 times tokens 2t and 2t + 1, the same exact digit sums
// as the one-token form's, folded and summed over the part's 4 groups with its arithmetic in its
// order (tc_fold), so each token's products equal its one-token ones bit for bit. A 16-row block
// of a 4-group part costs 24 MMAs for all 8 tokens, against 16 a token in the one-token form.
//
// Bank conflicts: the rows of a stage lie rb bytes apart (a multiple of 128), so the lanes of rows
// n = 0..3 (a half warp's 8-byte loads, 4-bit) read their group at the same banks; row n reads the
// part's groups rotated by n & 3 instead (8-bit: 16-byte loads, a quarter warp's rows n, n + 1:
// odd rows swap group pairs) and the registers are put back in order with selects.
struct TcColFrags {
  uint32_t b[4][2][3][2];  // the part's group g, step s, digit (d0, d1, d2), k slots (lo, hi)
  // The lane's tokens 2t + c: their groups' (2^-e, sum x) at info + c step, for c < present.
  const float2* info;
  uint32_t step, present;
};
// Token u's x staged (stage_tc) at xt + u xt_bytes, nt tokens; it: the warp's column part.
__device__ __forceinline__ void tc_col_load(const unsigned char* xt, int xt_bytes, int nt, int groups, int it,
                                            TcColFrags& f) {
  const int lane = threadIdx.x & 31, t = lane & 3, n = lane >> 2;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    const int G = 4 * it + g;
    const bool mine = G < groups && n < nt;
    const uint4* src = reinterpret_cast<const uint4*>(xt + size_t(mine ? n : 0) * xt_bytes) +
                       (size_t(mine ? G : 0) * 8 + 2 * size_t(t)) * 2;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint4 p0 = mine ? src[2 * s] : make_uint4(0, 0, 0, 0), p1 = mine ? src[2 * s + 1] : make_uint4(0, 0, 0, 0);
      f.b[g][s][0][0] = p0.x, f.b[g][s][0][1] = p0.y;
      f.b[g][s][1][0] = p1.x, f.b[g][s][1][1] = p1.y;
      f.b[g][s][2][0] = p0.z, f.b[g][s][2][1] = p0.w;
    }
  }
  f.info = reinterpret_cast<const float2*>(xt + size_t(2 * t) * xt_bytes + size_t(groups) * 256);
  f.step = uint32_t(xt_bytes) / 8;
  f.present = uint32_t(min(max(nt - 2 * t, 0), 2));
}

// Half h of a word of two 16-bit scales (or biases) of type st.
__device__ __forceinline__ float scale_of2(uint32_t word, int h, int st) {
  const uint32_t v = h ? word >> 16 : word & 0xffffu;
  return st == kScaleBF16 ? __uint_as_float(v << 16) : __half2float(__ushort_as_half(static_cast<unsigned short>(v)));
}

// The warp's 16-row block at `rows` (rows rb bytes apart) of column part `it` times the tokens of f:
// out[2 k + c] is row n + 8 k (of the block) for token 2t + c, scaled with the scales and biases of
// type st at sc / bi (row r's group G at r groups + G; the block's first row there: row0). Needs
// 16-bit scales and groups % 4 == 0 (tc_col_fits): a row's scales of groups 2h and 2h + 1 of the
// part are one 4-byte load (shared-memory loads that meet in a bank: rows n, n + 2, ... 64 bytes
// apart; a load a pair halves them).
__host__ __device__ constexpr bool tc_col_fits(int groups, int st) { return st != kScaleF32 && groups % 4 == 0; }
template <int BITS>
__device__ __forceinline__ void tc_col_rows(const unsigned char* rows, uint32_t rb, const TcColFrags& f, int it,
                                            int groups, const void* sc, const void* bi, int row0, int st,
                                            float (&out)[4]) {
  constexpr int kW = BITS / 2;  // words of a lane's share of a group's row
  const int lane = threadIdx.x & 31, t = lane & 3, n = lane >> 2;
  const bool in = 4 * it < groups;
  uint32_t w[2][4][kW];  // row n + 8 k, group g, word
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const unsigned char* r = rows + size_t(n + 8 * k) * rb + size_t(4 * it) * (kTcGs * BITS / 8) + t * (2 * BITS);
    uint32_t raw[4][kW];
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // load q reads group (q + n) & 3 (4-bit), q ^ (n & 1) (8-bit)
      const int g = BITS == 4 ? (q + n) & 3 : q ^ (n & 1);
      const bool ok = 4 * it + g < groups;
      if constexpr (BITS == 4) {
        const uint2 v = ok ? *reinterpret_cast<const uint2*>(r + g * 32) : make_uint2(0, 0);
        raw[q][0] = v.x, raw[q][1] = v.y;
      } else {
        const uint4 v = ok ? *reinterpret_cast<const uint4*>(r + g * 64) : make_uint4(0, 0, 0, 0);
        raw[q][0] = v.x, raw[q][1] = v.y, raw[q][2] = v.z, raw[q][3] = v.w;
      }
    }
#pragma unroll
    for (int g = 0; g < 4; ++g)
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if constexpr (BITS == 4) {  // group g came with load (g - n) & 3
          const uint32_t h = (n & 1) ? raw[(g + 3) & 3][j] : raw[g][j];
          const uint32_t h2 = (n & 1) ? raw[(g + 1) & 3][j] : raw[(g + 2) & 3][j];
          w[k][g][j] = (n & 2) ? h2 : h;
        } else {
          w[k][g][j] = (n & 1) ? raw[g ^ 1][j] : raw[g][j];
        }
      }
  }
  float pair[4], half[2][4];  // group 2h's products, then groups 2h and 2h + 1 summed
  uint32_t scw[2], biw[2];     // rows n and n + 8: the scales and biases of groups 2h, 2h + 1
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    if ((g & 1) == 0) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int64_t i = int64_t(row0 + n + 8 * k) * groups + 4 * it + g;
        scw[k] = in ? *reinterpret_cast<const uint32_t*>(static_cast<const unsigned short*>(sc) + i) : 0u;
        biw[k] = in ? *reinterpret_cast<const uint32_t*>(static_cast<const unsigned short*>(bi) + i) : 0u;
      }
    }
    int d[3][4] = {};
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      uint32_t a0, a1, a2, a3;
      if constexpr (BITS == 4) {
        const uint32_t u = w[0][g][s], x8 = w[1][g][s];
        a0 = u & 0x0F0F0F0Fu;
        a2 = (u >> 4) & 0x0F0F0F0Fu;
        a1 = x8 & 0x0F0F0F0Fu;
        a3 = (x8 >> 4) & 0x0F0F0F0Fu;
      } else {
        a0 = w[0][g][2 * s];
        a2 = w[0][g][2 * s + 1];
        a1 = w[1][g][2 * s];
        a3 = w[1][g][2 * s + 1];
      }
#pragma unroll
      for (int q = 0; q < 3; ++q) mma_u8s8(d[q], a0, a1, a2, a3, f.b[g][s][q][0], f.b[g][s][q][1]);
    }
    const int G = 4 * it + g;
    float2 info[2];
#pragma unroll
    for (int c = 0; c < 2; ++c)
      info[c] = G < groups && uint32_t(c) < f.present ? f.info[c * f.step + G] : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float scale = scale_of2(scw[k], g & 1, st), bias = scale_of2(biw[k], g & 1, st);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 2 * k + c;
        // d0 + 256 d1 is exact in int32 (|d0|, |d1| < 2^21) and rounds once, as tc_mma's fmaf does
        const float dot = fmaf(65536.0f, float(d[2][e]), float(d[0][e] + 256 * d[1][e])) * info[c].x;
        const float v = G < groups ? fmaf(scale, dot, bias * info[c].y) : 0.0f;
        if (g & 1) half[g >> 1][e] = pair[e] + v;
        else pair[e] = v;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = half[0][e] + half[1][e];
}

// Rows of a tile for tc_rows: nr rows of rb bytes from src to dst_off (contiguous in both).
struct RowSet {
  const char* src;
  uint32_t nr, dst_off;
};

// Warp 0, every lane: the row sets into `stage`, one bulk copy a set (lane k takes set k), and the
// ranges `extra` (lane 0), completing `bar`'s current phase when all have landed. The counts are
// compile-time, so the lane's set is picked from registers, not from a local array.
template <int NS, int NE>
__device__ __forceinline__ void issue_rows(unsigned char* stage, uint64_t* bar, const RowSet (&sets)[NS], uint32_t rb,
                                           const Range (&extra)[NE]) {
  static_assert(NS <= 32, "a lane a set");
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    uint32_t total = 0;
#pragma unroll
    for (int k = 0; k < NS; ++k) total += sets[k].nr * rb;
#pragma unroll
    for (int k = 0; k < NE; ++k) total += extra[k].bytes & ~15u;
    expect_bytes(bar, total);
#pragma unroll
    for (int k = 0; k < NE; ++k) copy_range(stage, bar, extra[k]);
  }
  __syncwarp();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  RowSet mine = sets[0];
#pragma unroll
  for (int k = 1; k < NS; ++k)
    if (lane == k) mine = sets[k];
  if (lane < NS && mine.nr > 0) bulk_copy(stage + mine.dst_off, mine.src, mine.nr * rb, bar);
}

}  // namespace swiftlet::cuda::detail
