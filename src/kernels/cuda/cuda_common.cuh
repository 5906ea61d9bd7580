// Shared by the .cu files: error checking and small device helpers. Not part of the API.
#pragma once

#include "core/dtype.h"
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace swiftlet::cuda::detail {

[[noreturn]] inline void cuda_failed(cudaError_t e, const char* what, const char* file, int line) {
  std::fprintf(stderr, "swiftlet: CUDA error at %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorString(e),
               cudaGetErrorName(e));
  std::abort();
}

[[noreturn]] inline void invariant_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "swiftlet: internal error at %s:%d: %s\n", file, line, what);
  std::abort();
}

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A thread's index in its block and the block's warps (blockDim.x a multiple of 32; 1, 2 or 3-D).
__device__ __forceinline__ int block_thread() {
  return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}
__device__ __forceinline__ int block_warps() { return int(blockDim.x * blockDim.y * blockDim.z) >> 5; }

// Sum over the block (blockDim.x a multiple of 32, at most 1024 threads); every thread gets the
// result. `red` is 32 floats of shared memory; the call synchronises the block.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = block_thread() & 31, warp = block_thread() >> 5, nw = block_warps();
  v = warp_sum(v);
  __syncthreads();  // red may still be read by an earlier call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = block_thread() & 31, warp = block_thread() >> 5, nw = block_warps();
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : -INFINITY;
  return warp_max(v);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x * sigmoidf_(x); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// How an affine matrix's scales and biases are stored, as the kernels are told it.
enum ScaleType : int { kScaleBF16 = 0, kScaleF16 = 1, kScaleF32 = 2 };

inline int scale_type(DType t) {
  switch (t) {
    case DType::BF16: return kScaleBF16;
    case DType::F16: return kScaleF16;
    case DType::F32: return kScaleF32;
    default: invariant_failed("affine scales must be BF16, F16 or F32", __FILE__, __LINE__);
  }
}

// Element i of a scale (or bias) array of type st, as float.
__device__ __forceinline__ float load_scale(const void* p, int64_t i, int st) {
  if (st == kScaleBF16) return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(p) + i)) << 16);
  if (st == kScaleF32) return __ldg(static_cast<const float*>(p) + i);
  return __half2float(__ushort_as_half(__ldg(static_cast<const unsigned short*>(p) + i)));
}

// Where an affine matrix's parts lie from its expert slot's base (ExpertLayout's views hold offsets),
// as the expert kernels take them.
struct AffineOffsets {
  size_t data, scales, biases;
};
inline AffineOffsets offsets_of(const GpuMatrix& m) {
  return {reinterpret_cast<size_t>(m.data), reinterpret_cast<size_t>(m.scales), reinterpret_cast<size_t>(m.biases)};
}
// The matrix a block of a grouped experts' launch multiplies, in the expert slot at slot, and its
// output: a (into ya) where blockIdx.z is 0, else b (into yb): gate and up share the input.
struct SlotMatrix {
  const char *data, *scales, *biases;
  float* y;
};
__device__ __forceinline__ SlotMatrix slot_matrix(const void* slot, const AffineOffsets& a, const AffineOffsets& b,
                                                  float* ya, float* yb) {
  const char* base = static_cast<const char*>(slot);
  const AffineOffsets& o = blockIdx.z == 0 ? a : b;
  return {base + o.data, base + o.scales, base + o.biases, blockIdx.z == 0 ? ya : yb};
}
// Gate and up run in one launch: two matrices of one kind and shape.
inline bool same_kind(const GpuMatrix& a, const GpuMatrix& b) {
  return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.bits == b.bits &&
         a.group_size == b.group_size && a.scale_dtype == b.scale_dtype;
}

// C += A B on the tensor cores (sm_80+): A 16 x 32 unsigned bytes (a0..a3), B 32 x 8 signed bytes
// (b0, b1), C 16 x 8 int32, in PTX's fragment layouts for mma.m16n8k32.
__device__ __forceinline__ void mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

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

// Asynchronous copies global -> shared (cp.async, sm_80+): 16, 8 or 4 bytes; src_bytes 0 fills
// the destination with zeros. A group is committed, then waited for with at most N groups of this
// thread still in flight (a barrier after the wait makes every thread's copies visible).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace swiftlet::cuda::detail

#define SWIFTLET_CUDA_CHECK(call)                                                               \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) ::swiftlet::cuda::detail::cuda_failed(e_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: reports a bad launch configuration at once (not at the next sync).
#define SWIFTLET_CUDA_LAUNCHED() SWIFTLET_CUDA_CHECK(cudaGetLastError())
#define SWIFTLET_CUDA_REQUIRE(cond)                                                     \
  do {                                                                                  \
    if (!(cond)) ::swiftlet::cuda::detail::invariant_failed(#cond, __FILE__, __LINE__); \
  } while (0)
