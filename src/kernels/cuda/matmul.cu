// Matrix-vector / small matrix-matrix products on affine 4/8-bit (MLX, model-spec.md 5.1) and
// dense F32/F16/BF16 weights, fp32 activations and accumulation.
//
// Decode is memory bound: one warp owns one weight row and streams it in 16-byte loads
// (coalesced: the warp reads 512 contiguous bytes per step), dequantises in registers and dots
// it with up to 8 activation rows at once (staged in shared memory for the quantised formats),
// so the weights are read once per 8 tokens. Larger
// batches loop over blocks of 8 tokens (a tensor-core GEMM for prefill is future work).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_fp16.h>

namespace swiftlet::cuda {

using detail::warp_sum;

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int kMaxTokens = 8;

using detail::load_scale;
using detail::scale_type;

// q as float without an int->float conversion: 2^23 + q has q in its mantissa (q < 2^23).
__device__ __forceinline__ float small_uint_to_float(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

// Columns of X staged in shared memory per step: fewer tokens, wider tiles (<= 37 KB).
template <int NT>
__host__ __device__ constexpr int affine_tile() { return NT <= 4 ? 2048 : 1024; }
// Shared-memory layout of a staged X row: 4 floats of padding after every 32, so the lanes'
// 16-byte reads of their own 32 (4-bit) or 16 (8-bit) values hit distinct banks.
__device__ __forceinline__ int padded(int i) { return i + (i >> 5) * 4; }
template <int NT>
__host__ __device__ constexpr int affine_smem_bytes() { return NT * (affine_tile<NT>() / 32) * 36 * 4; }

// Y[t][r] = sum_c W[r][c] X[t][c] for t < NT. Row r is handled by one warp; the block first
// stages a tile of X's columns in shared memory (reading X straight from global memory with
// each lane at a 128-byte stride made L1 wavefronts, not HBM, the limit).
template <int BITS, int NT>
__device__ __forceinline__ void affine_matvec_body(const uint32_t* __restrict__ w, const void* __restrict__ scales,
                                                   const void* __restrict__ biases, int st, int64_t rows,
                                                   int64_t cols, int gs, const float* __restrict__ x,
                                                   float* __restrict__ y, bool add = false) {
  constexpr int kPerWord = 32 / BITS;
  constexpr int kPerChunk = 4 * kPerWord;  // elements in one 16-byte load
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  constexpr int kTile = affine_tile<NT>();
  constexpr int kTokStride = (kTile / 32) * 36;
  extern __shared__ float4 xs_raw[];
  float* xs = reinterpret_cast<float*>(xs_raw);
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const bool active = r < rows;  // no early return: every thread takes part in the staging

  const uint4* row = reinterpret_cast<const uint4*>(w + (active ? r : 0) * (cols / kPerWord));
  const int64_t groups = cols / gs;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  for (int64_t base = 0; base < cols; base += kTile) {
    const int tile = int(cols - base < kTile ? cols - base : kTile);
    __syncthreads();  // the previous tile is consumed
#pragma unroll
    for (int t = 0; t < NT; ++t)
      for (int i = threadIdx.x; i < tile; i += kThreads) xs[t * kTokStride + padded(i)] = __ldg(x + t * cols + base + i);
    __syncthreads();
    if (!active) continue;
    const int chunks = tile / kPerChunk;
#pragma unroll 2
    for (int ch = lane; ch < chunks; ch += 32) {
      const uint4 pk = __ldg(row + base / kPerChunk + ch);
      const int e0 = ch * kPerChunk;  // column within the tile
      const int64_t gi = r * groups + (base + e0) / gs;  // a chunk never straddles groups (gs % kPerChunk == 0)
      const float sc = load_scale(scales, gi, st);
      const float bi = load_scale(biases, gi, st);
      const uint32_t words[4] = {pk.x, pk.y, pk.z, pk.w};
      float wv[kPerChunk];
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int e = 0; e < kPerWord; ++e)
          wv[k * kPerWord + e] = fmaf(sc, small_uint_to_float((words[k] >> (BITS * e)) & kMask), bi);
      const int sp = padded(e0);  // the chunk's values are contiguous there (kPerChunk <= 32)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xv = reinterpret_cast<const float4*>(xs + t * kTokStride + sp);
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerChunk / 4; ++j) {
          const float4 v = xv[j];
          a = fmaf(wv[4 * j], v.x, a);
          a = fmaf(wv[4 * j + 1], v.y, a);
          a = fmaf(wv[4 * j + 2], v.z, a);
          a = fmaf(wv[4 * j + 3], v.w, a);
        }
        acc[t] += a;
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) y[t * rows + r] = add ? y[t * rows + r] + v : v;
  }
}

template <int BITS, int NT>
__global__ void __launch_bounds__(kThreads) affine_matvec_kernel(const uint32_t* __restrict__ w,
                                                                 const void* __restrict__ scales,
                                                                 const void* __restrict__ biases, int st,
                                                                 int64_t rows, int64_t cols, int gs,
                                                                 const float* __restrict__ x,
                                                                 float* __restrict__ y, bool add) {
  affine_matvec_body<BITS, NT>(w, scales, biases, st, rows, cols, gs, x, y, add);
}

// The routed experts of one token in one launch: blockIdx.y picks the i-th chosen expert, whose
// slot base comes from the layer's table (table[ids[i]]); blockIdx.z picks matrix a or b (gate
// and up share the input, so both run in one launch). x advances by x_stride per expert (0: one
// input for all), y by rows per expert.
struct AffineOffsets {
  size_t data, scales, biases;
};
template <int BITS>
__global__ void __launch_bounds__(kThreads) grouped_affine_kernel(const void* const* __restrict__ table,
                                                                  const int32_t* __restrict__ ids, AffineOffsets a,
                                                                  AffineOffsets b, int st, int64_t rows,
                                                                  int64_t cols, int gs, const float* __restrict__ x,
                                                                  int64_t x_stride, float* __restrict__ ya,
                                                                  float* __restrict__ yb) {
  const int i = blockIdx.y;
  const char* base = static_cast<const char*>(table[ids[i]]);
  const AffineOffsets& o = blockIdx.z == 0 ? a : b;
  float* y = (blockIdx.z == 0 ? ya : yb) + int64_t(i) * rows;
  affine_matvec_body<BITS, 1>(reinterpret_cast<const uint32_t*>(base + o.data), base + o.scales, base + o.biases, st,
                              rows, cols, gs, x + int64_t(i) * x_stride, y);
}

template <typename T>
__device__ __forceinline__ float elem_to_float(T v);
template <>
__device__ __forceinline__ float elem_to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float elem_to_float<uint16_t>(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
template <>
__device__ __forceinline__ float elem_to_float<__half>(__half v) { return __half2float(v); }

// Dense rows (F32, BF16 as uint16_t bits, F16). VEC: 16-byte loads (needs cols * sizeof(T) % 16
// == 0 so every row starts aligned); otherwise one element per lane per step.
template <typename T, bool VEC, int NT>
__global__ void __launch_bounds__(kThreads) dense_matvec_kernel(const T* __restrict__ w, int64_t rows, int64_t cols,
                                                                const float* __restrict__ x,
                                                                float* __restrict__ y, bool add) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const T* row = w + r * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  if constexpr (VEC) {
    constexpr int kPer = 16 / sizeof(T);
    const int64_t chunks = cols / kPer;
#pragma unroll 2
    for (int64_t ch = lane; ch < chunks; ch += 32) {
      union {
        uint4 u;
        T e[kPer];
      } pk;
      pk.u = __ldg(reinterpret_cast<const uint4*>(row) + ch);
      float wv[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) wv[j] = elem_to_float<T>(pk.e[j]);
      const int64_t c0 = ch * kPer;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float* xt = x + t * cols + c0;
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) a = fmaf(wv[j], __ldg(xt + j), a);
        acc[t] += a;
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wv = elem_to_float<T>(row[c]);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] = fmaf(wv, __ldg(x + t * cols + c), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) y[t * rows + r] = add ? y[t * rows + r] + v : v;
  }
}


template <typename T, int NT>
void launch_dense(const GpuMatrix& w, const float* x, float* y, bool add, cudaStream_t s) {
  const unsigned grid = detail::blocks_for(w.rows, kRowsPerBlock);
  const T* d = static_cast<const T*>(w.data);
  if ((w.cols * int64_t(sizeof(T))) % 16 == 0)
    dense_matvec_kernel<T, true, NT><<<grid, kThreads, 0, s>>>(d, w.rows, w.cols, x, y, add);
  else
    dense_matvec_kernel<T, false, NT><<<grid, kThreads, 0, s>>>(d, w.rows, w.cols, x, y, add);
}

template <int NT>
void launch_matvec(const GpuMatrix& w, const float* x, float* y, bool add, cudaStream_t s) {
  const unsigned grid = detail::blocks_for(w.rows, kRowsPerBlock);
  switch (w.format) {
    case WeightFormat::F32: launch_dense<float, NT>(w, x, y, add, s); break;
    case WeightFormat::BF16: launch_dense<uint16_t, NT>(w, x, y, add, s); break;
    case WeightFormat::F16: launch_dense<__half, NT>(w, x, y, add, s); break;
    case WeightFormat::Affine: {
      const int st = scale_type(w.scale_dtype);
      const auto* d = static_cast<const uint32_t*>(w.data);
      if (w.bits == 4)
        affine_matvec_kernel<4, NT><<<grid, kThreads, affine_smem_bytes<NT>(), s>>>(d, w.scales, w.biases, st, w.rows, w.cols,
                                                              w.group_size, x, y, add);
      else
        affine_matvec_kernel<8, NT><<<grid, kThreads, affine_smem_bytes<NT>(), s>>>(d, w.scales, w.biases, st, w.rows, w.cols,
                                                              w.group_size, x, y, add);
      break;
    }
  }
  SWIFTLET_CUDA_LAUNCHED();
}

using LaunchFn = void (*)(const GpuMatrix&, const float*, float*, bool, cudaStream_t);
constexpr LaunchFn kLaunch[kMaxTokens + 1] = {nullptr,          launch_matvec<1>, launch_matvec<2>,
                                              launch_matvec<3>, launch_matvec<4>, launch_matvec<5>,
                                              launch_matvec<6>, launch_matvec<7>, launch_matvec<8>};

}  // namespace

void matmul(const GpuMatrix& w, const float* d_x, int64_t n, float* d_y, GpuStream s) {
  if (w.format == WeightFormat::Affine) {
    SWIFTLET_CUDA_REQUIRE(w.bits == 4 || w.bits == 8);
    SWIFTLET_CUDA_REQUIRE(w.group_size > 0 && w.group_size % (128 / w.bits) == 0);
    SWIFTLET_CUDA_REQUIRE(w.cols % w.group_size == 0);
  }
  if (w.rows == 0 || n == 0) return;
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens) {
    const int nt = int(n - t0 < kMaxTokens ? n - t0 : kMaxTokens);
    kLaunch[nt](w, d_x + t0 * w.cols, d_y + t0 * w.rows, false, s);
  }
}

void matmul_add(const GpuMatrix& w, const float* d_x, float* d_y, GpuStream s) {
  if (w.format == WeightFormat::Affine) {
    SWIFTLET_CUDA_REQUIRE(w.bits == 4 || w.bits == 8);
    SWIFTLET_CUDA_REQUIRE(w.group_size > 0 && w.group_size % (128 / w.bits) == 0);
    SWIFTLET_CUDA_REQUIRE(w.cols % w.group_size == 0);
  }
  if (w.rows == 0) return;
  kLaunch[1](w, d_x, d_y, true, s);
}


namespace {
AffineOffsets offsets_of(const GpuMatrix& m) {
  return {reinterpret_cast<size_t>(m.data), reinterpret_cast<size_t>(m.scales), reinterpret_cast<size_t>(m.biases)};
}
void check_expert_matrix(const GpuMatrix& m) {
  SWIFTLET_CUDA_REQUIRE(m.format == WeightFormat::Affine && (m.bits == 4 || m.bits == 8));
  SWIFTLET_CUDA_REQUIRE(m.group_size > 0 && m.group_size % (128 / m.bits) == 0 && m.cols % m.group_size == 0);
}
}  // namespace

void expert_gate_up(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n, const float* d_x,
                    float* d_g, float* d_u, GpuStream s) {
  check_expert_matrix(l.gate);
  check_expert_matrix(l.up);
  SWIFTLET_CUDA_REQUIRE(l.gate.rows == l.up.rows && l.gate.cols == l.up.cols && l.gate.bits == l.up.bits &&
                        l.gate.group_size == l.up.group_size && l.gate.scale_dtype == l.up.scale_dtype);
  if (n == 0) return;
  const dim3 grid(detail::blocks_for(l.gate.rows, kRowsPerBlock), unsigned(n), 2);
  const int st = scale_type(l.gate.scale_dtype);
  if (l.gate.bits == 4)
    grouped_affine_kernel<4><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, offsets_of(l.gate), offsets_of(l.up), st, l.gate.rows, l.gate.cols, l.gate.group_size, d_x,
        0, d_g, d_u);
  else
    grouped_affine_kernel<8><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, offsets_of(l.gate), offsets_of(l.up), st, l.gate.rows, l.gate.cols, l.gate.group_size, d_x,
        0, d_g, d_u);
  SWIFTLET_CUDA_LAUNCHED();
}

void expert_down(const ExpertLayout& l, const void* const* d_table, const int32_t* d_ids, int n, const float* d_act,
                 float* d_y, GpuStream s) {
  check_expert_matrix(l.down);
  if (n == 0) return;
  const dim3 grid(detail::blocks_for(l.down.rows, kRowsPerBlock), unsigned(n), 1);
  const int st = scale_type(l.down.scale_dtype);
  const AffineOffsets o = offsets_of(l.down);
  if (l.down.bits == 4)
    grouped_affine_kernel<4><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, o, o, st, l.down.rows, l.down.cols, l.down.group_size, d_act, l.down.cols, d_y, nullptr);
  else
    grouped_affine_kernel<8><<<grid, kThreads, affine_smem_bytes<1>(), s>>>(
        d_table, d_ids, o, o, st, l.down.rows, l.down.cols, l.down.group_size, d_act, l.down.cols, d_y, nullptr);
  SWIFTLET_CUDA_LAUNCHED();
}

}  // namespace swiftlet::cuda
