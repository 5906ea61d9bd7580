// The device code of the fused decode products (fused.cu), shared by its kernels: PDL and L2
// prefetch helpers, the dequantising dot product over rows in global or shared memory with its
// staged input, the ring of shared-memory stages filled by TMA bulk copies, and a grid-wide
// barrier. Not part of the API.
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

// Programmatic Dependent Launch (sm_90): a kernel launched with the PDL attribute may start while
// its predecessor finishes; it prefetches what does not depend on the predecessor (its weights)
// and then waits (griddepcontrol.wait: the predecessor has completed and its writes are visible).
// Each fused kernel lets its successor start only after its own wait, so when a kernel starts,
// the kernel two back has completed (expert_down reads the top-k ids that way before waiting).
// Without the attribute both instructions are no-ops.
__device__ __forceinline__ void pdl_wait_and_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// The lanes of a warp prefetch [p, p + bytes) into the L2, one 128-byte line each.
__device__ __forceinline__ void prefetch_lines(const void* p, int64_t bytes, int lane) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = int64_t(lane) * 128; o < bytes; o += 32 * 128) prefetch_l2(c + o);
}

// Values per 16-byte chunk.
template <int BITS>
__host__ __device__ constexpr int per_chunk() { return 128 / BITS; }

// The bit position each code of a word is masked at (see the file comment): 4-bit codes 0..4 at
// 4e, codes 5..7 at 4e - 12 after the shift; 8-bit codes 0, 1 at 0, 8 and codes 2, 3 at 0, 8 after
// >> 16 (q 2^s stays below 2^23: exact).
template <int BITS>
__device__ __forceinline__ float prescale(int i) {
  if constexpr (BITS == 4) {
    const int e = i & 7;
    const int s = e <= 4 ? 4 * e : 4 * e - 12;
    return __uint_as_float(uint32_t(127 - s) << 23);
  } else {
    const int s = (i & 1) * 8;
    return __uint_as_float(uint32_t(127 - s) << 23);
  }
}

__device__ __forceinline__ float code(uint32_t masked) { return __uint_as_float(masked | 0x4B000000u) - 8388608.0f; }

// sum q_j x_j over one chunk; xp: the chunk's staged (prescaled) x values.
template <int BITS>
__device__ __forceinline__ float dot_chunk(const uint4& pk, const float* xp) {
  const uint32_t words[4] = {pk.x, pk.y, pk.z, pk.w};
  // Four partial sums: short FMA chains, so a warp has independent work while one waits.
  float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t w = words[k];
    if constexpr (BITS == 4) {
      const uint32_t w2 = w >> 12;
      const float* x = xp + 8 * k;
      d0 = fmaf(code(w & 0xFu), x[0], d0);
      d1 = fmaf(code(w & 0xF0u), x[1], d1);
      d2 = fmaf(code(w & 0xF00u), x[2], d2);
      d3 = fmaf(code(w & 0xF000u), x[3], d3);
      d0 = fmaf(code(w & 0xF0000u), x[4], d0);
      d1 = fmaf(code(w2 & 0xF00u), x[5], d1);
      d2 = fmaf(code(w2 & 0xF000u), x[6], d2);
      d3 = fmaf(code(w2 & 0xF0000u), x[7], d3);
    } else {
      const uint32_t w2 = w >> 16;
      const float* x = xp + 4 * k;
      d0 = fmaf(code(w & 0xFFu), x[0], d0);
      d1 = fmaf(code(w & 0xFF00u), x[1], d1);
      d2 = fmaf(code(w2 & 0xFFu), x[2], d2);
      d3 = fmaf(code(w2 & 0xFF00u), x[3], d3);
    }
  }
  return (d0 + d1) + (d2 + d3);
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

// ---------------------------------------------------------------------------------------------
// The ring of shared-memory stages the streamed products fill by bulk copies (sm_90).

__host__ __device__ constexpr uint32_t align16(uint32_t n) { return (n + 15) & ~15u; }

// A copy of `bytes` from global src to a stage at dst_off: the 16-byte multiple by a bulk copy,
// the rest (a ragged tile's scales) by thread 0 itself.
struct Range {
  const void* src;
  uint32_t bytes, dst_off;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// Thread 0: S mbarriers, each completed by one arrival plus its stage's bytes.
__device__ __forceinline__ void ring_init(uint64_t* bars, int S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = 0; i < S; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bars + i)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Thread 0: copies the ranges into `stage`, completing `bar`'s current phase when all have landed.
__device__ __forceinline__ void issue_stage(unsigned char* stage, uint64_t* bar, const Range* r, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t total = 0;
  for (int k = 0; k < n; ++k) total += r[k].bytes & ~15u;
  // The block's generic-proxy reads of this stage's last use (ordered by a block barrier) come
  // before the async proxy's writes.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(total) : "memory");
  for (int k = 0; k < n; ++k) {
    const uint32_t b16 = r[k].bytes & ~15u;
    if (b16)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       smem_u32(stage + r[k].dst_off)),
                   "l"(r[k].src), "r"(b16), "r"(smem_u32(bar))
                   : "memory");
    for (uint32_t b = b16; b < r[k].bytes; ++b)  // visible to the block by the barriers before its use
      stage[r[k].dst_off + b] = static_cast<const unsigned char*>(r[k].src)[b];
  }
#endif
}

// Waits until the stage's copies for its use number `use` (0, 1, ...) have landed.
__device__ __forceinline__ void stage_wait(uint64_t* bar, int use) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = smem_u32(bar), parity = uint32_t(use) & 1u;
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(b), "r"(parity)
        : "memory");
#endif
}

// A barrier across the grid (every block resident: grid <= SMs, one block each). bar[0] counts
// arrivals, bar[1] is the generation; both persist across launches (the count returns to 0).
// Writes before the barrier are visible to every block after it (fences around the atomics; read
// such data with __ldcg, not the non-coherent path).
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      unsigned g = gen;
      while (g == gen) {
        __nanosleep(32);
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(bar + 1) : "memory");
      }
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace swiftlet::cuda::detail
